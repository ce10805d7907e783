"""Orderings that share their stem (issue 36): a question's orderings, and its prior's, decode the question once.

What is held: the plan decodes a stem once for the consecutive prompts that share it; each prompt's own
micro-batches are those of the prompt decoded whole, the one its stem ends in split at a multiple of ``STEM_ROWS``
rows from its first; a prompt no neighbour shares its stem with is not split at all; and on the real embedded
model, every prompt's readout of a request (both protocols, K = 1, 2 and 4, debias off and on: the answer's job
and the prior's) is bit for bit what an independent slow path reads: the prompt decoded whole and alone with
llama.cpp's own calls on one sequence, as before stems (its own tokens not split), with no fork, restore, cache or
cut.
"""

from __future__ import annotations

import llama_cpp as llama
import numpy as np
import pytest

from decision_adapter.engine.plan import STEM_ROWS, Cut, Decode, Fork, JobSpec, Limits, plan_job, stem_split
from decision_adapter.engine.readout import LabelTrie
from decision_adapter.protocols import decision_schema, systemone
from decision_adapter.protocols.fields import RequestContext

LIMITS = Limits(batch_tokens=16, cells=512, sequences=8)
TRIE = LabelTrie.build([(90,), (91,), (92,)])


def own_decodes(plan, prompt: int) -> list[tuple[int, tuple[int, ...]]]:
    """(position, tokens) of the micro-batches that the prompt's sequence holds when ``prompt``'s answer position
    is read: those decoded since the sequence was forked from the state, less those a cut dropped."""
    held: list[tuple[int, tuple[int, ...]]] = []
    for step in plan.steps:
        if isinstance(step, Fork) and step.dst == 1:
            held = []
        elif isinstance(step, Cut) and step.seq == 1:
            held = [(pos, tokens[:step.tokens - pos]) for pos, tokens in held if pos < step.tokens]
        elif isinstance(step, Decode) and step.chunks[0].seq == 1:
            chunk = step.chunks[0]
            held.append((chunk.pos, chunk.tokens))
            if chunk.read is not None and chunk.read.prompt == prompt:
                return held
    raise AssertionError(f"prompt {prompt} is never read")


def spec_of(prompts, stems, state_end=4) -> JobSpec:
    return JobSpec(tuple(map(tuple, prompts)), (TRIE,) * len(prompts), 0, state_end, stems=tuple(stems))


def merged(decodes: list[tuple[int, tuple[int, ...]]], origin: int, size: int) -> list[tuple[int, tuple[int, ...]]]:
    """Micro-batches that together make one of ``size`` tokens counted from ``origin`` joined again."""
    out: list[tuple[int, tuple[int, ...]]] = []
    for pos, tokens in decodes:
        if out and (pos - origin) % size and out[-1][0] + len(out[-1][1]) == pos:
            out[-1] = (out[-1][0], out[-1][1] + tokens)
        else:
            out.append((pos, tokens))
    return out


# Two questions over one state of 4 tokens, micro-batches of 16: the first with a stem of 11 tokens in three
# orderings (split after 8: a multiple of STEM_ROWS), the second with a stem of 21 tokens (split in its second
# micro-batch, after 16 + 0: at that micro-batch's first token) in two; the third prompt's rest spans two.
STATE = [1, 2, 3, 4]
Q1 = list(range(10, 21))
Q2 = list(range(30, 51))
PROMPTS = [STATE + Q1 + [50, 51, 52, 53, 54], STATE + Q1 + [52, 50, 51, 54, 53, 55],
           STATE + Q1 + [51, 52, 50] + list(range(70, 90)), STATE + Q2 + [60, 61], STATE + Q2 + [61, 60, 62]]
STEMS = [15, 15, 15, 25, 25]
SPLITS = [12, 12, 12, 20, 20]


def test_a_stem_is_decoded_once_for_the_prompts_that_share_it():
    plan = plan_job(spec_of(PROMPTS, STEMS), LIMITS)
    assert [stem_split(s, 4, LIMITS.batch_tokens) for s in STEMS] == SPLITS
    assert all((s - 4) % LIMITS.batch_tokens % STEM_ROWS == 0 for s in SPLITS)
    stems = (12 - 4) + (20 - 4)
    rests = sum(len(p) - s for p, s in zip(PROMPTS, SPLITS))
    assert plan.tokens == plan.shared_tokens + stems + rests
    assert plan.own_tokens == (8 + 8, 9, 26, 16 + 7, 8)
    assert sum(isinstance(s, Fork) and s.src == 0 for s in plan.steps) == 2  # one fork of the state per stem
    assert [s for s in plan.steps if isinstance(s, Cut)] == [Cut(1, 12), Cut(1, 12), Cut(1, 20)]


@pytest.mark.parametrize("i", range(len(PROMPTS)))
def test_each_prompt_decodes_the_micro_batches_of_the_prompt_decoded_whole_split_at_its_stem(i):
    """The first prompt of a stem is decoded whole; each next one holds that prompt's micro-batches cut at the
    stem and decodes its rest from there: split at its stem, the same micro-batches as the prompt decoded whole."""
    plan = plan_job(spec_of(PROMPTS, STEMS), LIMITS)
    together = own_decodes(plan, i)
    whole = own_decodes(plan_job(spec_of([PROMPTS[i]], ()), LIMITS), 0)
    assert merged(together, 4, LIMITS.batch_tokens) == whole
    first_of_stem = i == 0 or STEMS[i - 1] != STEMS[i]
    assert (together == whole) if first_of_stem else SPLITS[i] in [pos for pos, _ in together]


def test_a_stem_costs_no_llama_decode_of_its_own():
    """One llama_decode per micro-batch of what each prompt decodes: the state's (1); the first question's first
    ordering whole (1), the others' rests (2 and 3); the second question's first ordering whole (2), the other's
    rest (1). Splitting the stems off would add a decode for each first ordering whose stem ends inside a
    micro-batch (the first question's)."""
    plan = plan_job(spec_of(PROMPTS, STEMS), LIMITS)
    assert sum(isinstance(s, Decode) for s in plan.steps) == 1 + (1 + 2 + 3) + (2 + 1)


@pytest.mark.parametrize("i", range(len(PROMPTS)))
def test_a_stem_no_other_prompt_shares_is_not_split_off(i):
    """One ordering (K = 1, or a prior's one prompt): the prompt's own micro-batches are the whole prompt's, with
    no Cut; the split would only add a llama_decode."""
    alone = plan_job(spec_of([PROMPTS[i]], [STEMS[i]]), LIMITS)
    assert own_decodes(alone, 0) == own_decodes(plan_job(spec_of([PROMPTS[i]], ()), LIMITS), 0)
    assert not any(isinstance(s, Cut) for s in alone.steps)
    # Next to a prompt of another stem, the same.
    other = 3 if i < 3 else 0
    pair = plan_job(spec_of([PROMPTS[i], PROMPTS[other]], [STEMS[i], STEMS[other]]), LIMITS)
    assert own_decodes(pair, 0) == own_decodes(alone, 0) and not any(isinstance(s, Cut) for s in pair.steps)


def test_without_stems_a_prompt_is_decoded_whole_from_the_state_as_before():
    plan = plan_job(spec_of(PROMPTS, ()), LIMITS)
    assert not any(isinstance(s, Cut) for s in plan.steps)
    assert plan.own_tokens == tuple(len(p) - 4 for p in PROMPTS)
    assert own_decodes(plan, 2) == [(4, tuple(PROMPTS[2][4:20])), (20, tuple(PROMPTS[2][20:36])),
                                    (36, tuple(PROMPTS[2][36:]))]


def test_a_stem_shorter_than_stem_rows_is_not_split_off():
    plan = plan_job(spec_of([STATE + [7, 8, 9, 50], STATE + [7, 8, 9, 51]], [7, 7]), LIMITS)
    assert plan.own_tokens == (4, 4) and not any(isinstance(s, Cut) for s in plan.steps)


def test_prompts_with_equal_stem_lengths_but_other_tokens_do_not_share():
    other = STATE + [99] + Q1[1:] + [50, 51]
    plan = plan_job(spec_of([PROMPTS[0], other], [15, 15]), LIMITS)
    assert plan.own_tokens == (len(PROMPTS[0]) - 4, len(other) - 4)
    assert not any(isinstance(s, Cut) for s in plan.steps)


def test_a_stem_must_leave_a_token_of_its_own():
    with pytest.raises(ValueError, match="stem"):
        plan_job(spec_of([STATE + [5, 6]], [6]), LIMITS)


# ---- the real engine against an independent slow path ----------------------------------------------------------

def slow_first_token_logits(engine, prompt, head: int, state_end: int, labels) -> tuple[float, ...]:
    """The answer position's logits of ``labels``, the prompt decoded whole and alone on sequence 0 from empty
    memory with llama.cpp's calls, as before stems: each run (head, state, its own tokens) in micro-batches from
    its own first token."""
    batch_tokens = engine.limits.batch_tokens
    ctx = engine.model.ctx
    batch = llama.llama_batch_init(batch_tokens, 0, 1)
    try:
        llama.llama_memory_clear(llama.llama_get_memory(ctx), False)
        bounds = sorted({0, head, state_end, len(prompt)})
        for begin, end in zip(bounds, bounds[1:]):
            for start in range(begin, end, batch_tokens):
                part = prompt[start:min(end, start + batch_tokens)]
                for j, token in enumerate(part):
                    batch.token[j], batch.pos[j], batch.n_seq_id[j] = token, start + j, 1
                    batch.seq_id[j][0] = 0
                    batch.logits[j] = start + j == len(prompt) - 1
                batch.n_tokens = len(part)
                assert llama.llama_decode(ctx, batch) == 0
        row = np.ctypeslib.as_array(llama.llama_get_logits_ith(ctx, batch.n_tokens - 1), shape=(engine.model.n_vocab,))
        return tuple(float(row[t]) for t in labels)
    finally:
        llama.llama_batch_free(batch)
        llama.llama_memory_clear(llama.llama_get_memory(ctx), False)


@pytest.fixture
def model(app):
    return app.extensions["decision_adapter"].readiness.model


STATE_TEXT = ("The customer writes that the March invoice charged the annual plan twice, that the login page has "
              "been failing since Tuesday, and that they are considering the enterprise tier next quarter.")
ROUTE = {"billing": "Payments, invoices and refunds.", "tech": "Bugs, outages and integrations.",
         "sales": "Questions before a purchase.", "legal": "Contracts and compliance.", "other": "Anything else."}


def questions_of(model, protocol: str, k: int, debias: str):
    context = RequestContext.of(model, max_decisions=4)
    if protocol == "decision":
        body = {"decisions": [
            {"id": "route", "state": STATE_TEXT, "question": "Which team should handle this first?",
             "options": [{"id": key, "description": text} for key, text in ROUTE.items()],
             "permutations": k, "debias": debias},
            {"id": "urgent", "state": STATE_TEXT, "question": "How urgent is this?",
             "options": [{"id": "low"}, {"id": "medium"}, {"id": "high"}], "permutations": k, "debias": debias}]}
        parsed, _ = decision_schema.parse(body, context)
        return [p.question for p in parsed]
    body = {"model": "jev-latest", "state": STATE_TEXT, "x_permutations": k, "x_debias": debias,
            "questions": {"route": {"type": "choice", "instructions": "Which team should handle this first?",
                                    "criteria": ROUTE},
                          "refund": {"type": "noul", "instructions": "Does the customer want money back?"}}}
    _, _, items = systemone.parse(body, context)
    return [item.question for item in items]


@pytest.mark.parametrize("debias", ["off", "empty"])
@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("protocol", ["decision", "systemone"])
def test_every_ordering_and_prior_reads_as_the_prompt_decoded_alone(model, protocol, k, debias):
    engine = model.engine
    prepared = model.prepare(questions_of(model, protocol, k, debias))
    jobs = [prepared.spec, *(p.spec for p in prepared.priors)]
    for spec in jobs:
        engine.forget(spec)
    read = model.readouts(prepared)
    assert len(jobs) == (2 if debias == "empty" else 1) and read.jobs == len(jobs)
    for spec, scores, stats in zip(jobs, (read.scores, *read.prior_scores), (read.stats, *read.prior_stats)):
        assert spec.stems, "every prompt has its question as a stem"
        # the stem once per question: its orderings after the first decode only their options and answer position
        splits = [stem_split(s, spec.state_end, engine.limits.batch_tokens) for s in spec.stems]
        whole = sum(len(p) - spec.state_end for p in spec.prompts)
        assert sum(stats.own_tokens) == whole - sum(s - spec.state_end for i, s in enumerate(splits)
                                                    if i and splits[i - 1] == s
                                                    and spec.prompts[i][:s] == spec.prompts[i - 1][:s])
        assert sum(stats.own_tokens) < whole if k > 1 else sum(stats.own_tokens) == whole  # K = 1: nothing shared
        with engine.runner.lock:
            for prompt, trie, score in zip(spec.prompts, spec.tries, scores):
                want = slow_first_token_logits(engine, prompt, spec.head, spec.state_end, trie.children[()])
                firsts = trie.children[()]
                got = tuple(score.first_token_logits[[label[0] for label in trie.sequences].index(t)]
                            for t in firsts)
                assert got == want
