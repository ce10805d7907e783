"""The exact readout on the real model, against an independent path.

The adapter reads a label of several tokens by the chain rule over forked copies of the prompt, every step a
full-vocabulary probability. Here the labels are scored with llama.cpp's API directly, on a context of their
own: the prompt decoded in the adapter's micro-batch shapes, then the first token of every label decoded on a
copy of the prompt, and each label's log-probability summed from full-vocabulary log-softmaxes in double
precision. Logits depend on the micro-batch shape (this 135M model turns the rounding of a 1-row against a
26-row micro-batch into 0.005 of a probability at 255 options), so the first tokens are decoded side by side as
the adapter does, and once more each alone, where the difference is bounded by that measured sensitivity.
"""

from __future__ import annotations

import math

import llama_cpp as llama
import numpy as np
import pytest

from decision_adapter.decisions.model import Question
from decision_adapter.decisions.model_files import find_gguf

STATE = "A customer of a cloud service writes in to ask which of the teams should handle the request."


def options(n: int) -> list[dict]:
    return [{"id": f"team_{i}", "description": f"Team number {i}."} for i in range(n)]


class IndependentScorer:
    def __init__(self, model_path: str, threads: int, batch_tokens: int):
        params = llama.llama_model_default_params()
        self.model = llama.llama_model_load_from_file(model_path.encode(), params)
        self.vocab = llama.llama_model_get_vocab(self.model)
        self.n_vocab = llama.llama_vocab_n_tokens(self.vocab)
        cparams = llama.llama_context_default_params()
        cparams.n_ctx, cparams.n_batch, cparams.n_ubatch, cparams.n_seq_max = 8192, batch_tokens, batch_tokens, 32
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_DISABLED; cparams.type_k = cparams.type_v = 0
        cparams.kv_unified = True
        self.ctx = llama.llama_init_from_model(self.model, cparams)
        self.batch = llama.llama_batch_init(batch_tokens, 0, 1)
        self.batch_tokens = batch_tokens

    def _decode(self, seq: int, tokens, pos: int, want_last: bool):
        for start in range(0, len(tokens), self.batch_tokens):
            part = tokens[start:start + self.batch_tokens]
            for j, token in enumerate(part):
                self.batch.token[j], self.batch.pos[j], self.batch.n_seq_id[j] = token, pos + start + j, 1
                self.batch.seq_id[j][0] = seq
                self.batch.logits[j] = want_last and start + j == len(tokens) - 1
            self.batch.n_tokens = len(part)
            assert llama.llama_decode(self.ctx, self.batch) == 0
        if want_last:  # the last token's row in the last micro-batch
            return self._log_softmax_at((len(tokens) - 1) % self.batch_tokens)
        return None

    def _log_softmax_at(self, index: int) -> np.ndarray:
        values = np.ctypeslib.as_array(llama.llama_get_logits_ith(self.ctx, index), shape=(self.n_vocab,))
        values = values.astype(np.float64)
        return values - (values.max() + math.log(np.exp(values - values.max()).sum()))

    def label_probabilities(self, tokens, spans, labels) -> tuple[list[float], list[float]]:
        """P(label) / sum P(label') for labels of two tokens, P(label) = P(first) * P(second | first): with every
        first token's fork decoded side by side in one batch, and with each decoded alone (the prompt is decoded
        once, on sequence 0, and each fork copied from it)."""
        memory = llama.llama_get_memory(self.ctx)
        llama.llama_memory_clear(memory, False)
        pieces = list(zip([0, *spans], [*spans, len(tokens)]))
        for i, (a, b) in enumerate(pieces):
            root = self._decode(0, tokens[a:b], a, want_last=i == len(pieces) - 1)
        firsts = list(dict.fromkeys(label[0] for label in labels))
        return (self._chain(memory, root, len(tokens), labels, [firsts]),
                self._chain(memory, root, len(tokens), labels, [[first] for first in firsts]))

    def _chain(self, memory, root, position: int, labels, groups) -> list[float]:
        after: dict[int, np.ndarray] = {}
        for group in groups:
            for seq, first in enumerate(group, start=1):
                llama.llama_memory_seq_cp(memory, 0, seq, -1, -1)
                self.batch.token[seq - 1], self.batch.pos[seq - 1], self.batch.n_seq_id[seq - 1] = first, position, 1
                self.batch.seq_id[seq - 1][0], self.batch.logits[seq - 1] = seq, True
            self.batch.n_tokens = len(group)
            assert llama.llama_decode(self.ctx, self.batch) == 0
            after.update({first: self._log_softmax_at(i) for i, first in enumerate(group)})
            for seq in range(1, len(group) + 1):
                llama.llama_memory_seq_rm(memory, seq, -1, -1)
        logprobs = [root[first] + after[first][second] for first, second in labels]
        top = max(logprobs)
        weights = [math.exp(x - top) for x in logprobs]
        return [w / sum(weights) for w in weights]

    def close(self) -> None:
        llama.llama_batch_free(self.batch)
        llama.llama_free(self.ctx)
        llama.llama_model_free(self.model)


@pytest.fixture(scope="module")
def independent(settings):
    scorer = IndependentScorer(str(find_gguf(settings.model_dir)), settings.threads, settings.batch_tokens)
    yield scorer
    scorer.close()


@pytest.fixture(scope="module")
def patient_app(settings, engine):
    """255 options are about 4,000 tokens: a minute on 2 busy cores, past the 55 s a real-time request gets."""
    from adapter_apps import close_app
    from decision_adapter.server.app import create_app

    app = create_app(settings.replace(request_timeout_s=900), engine)
    yield app
    close_app(app)


@pytest.mark.parametrize("n", [27, 255])
def test_chain_rule_readout_equals_each_label_scored_on_its_own(patient_app, independent, n):
    app = patient_app
    decision = {"id": "route", "state": STATE, "question": "Which team should handle it?", "options": options(n)}
    response = app.test_client().post("/invocations", json={"decision": decision})
    assert response.status_code == 200, response.get_data(as_text=True)
    result = response.get_json()["result"]

    model = app.extensions["decision_adapter"].readiness.model
    prepared = model.prepare([Question(("decision",), STATE, decision["question"],
                                       tuple(o["description"] for o in decision["options"]), (), (), ())])
    [tokens] = prepared.tokens
    start, end = prepared.state
    sequences = model.trie(n).sequences
    assert {len(s) for s in sequences} == {2}
    side_by_side, each_alone = independent.label_probabilities(tokens, [start, end], sequences)

    assert max(abs(a - b) for a, b in zip(result["probabilities"], side_by_side)) <= 1e-12
    assert max(abs(a - b) for a, b in zip(result["probabilities"], each_alone)) <= 0.01


def test_a_model_without_preference_does_not_favour_uneven_label_branches():
    """The chain rule with per-node normalisation gave C0 = 1.43 x A0 at 27 options for a model with no
    preference; with full-vocabulary steps, equal logits give equal probabilities."""
    from decision_adapter.engine.readout import LabelTrie, NodeRead, softmax

    trie = LabelTrie.build([(a, d) for a in (1, 2, 3) for d in range(10, 20)][:27])  # C has 7 children, A and B 10
    reads = {node: NodeRead((0.0,) * len(kids), math.log(50_000), 0) for node, kids in trie.children.items()}
    p = softmax(trie.logprobs(reads))
    assert max(p) == pytest.approx(min(p), rel=1e-12)
