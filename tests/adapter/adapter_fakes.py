"""A fake engine for unit tests of the layers above llama.cpp: byte-level tokens, scripted scores.

It is typed against what its users need of an engine: the decision model's ``ScoringEngine`` and the scheduler's
``JobRunner`` (a test checks both), so that a change to either protocol shows here."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from decision_adapter.engine.plan import JobSpec, Limits, Plan, plan_job
from decision_adapter.engine.readout import NodeRead, PromptScore, ScoreStats, common_prefix, prompt_score

CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CONTROL = ("<|im_start|>", "<|im_end|>")


class FakeEngine:
    """Tokens are UTF-8 bytes, control texts are ids 256+; each label's logit is minus its index."""

    chat_template = CHATML
    bos_text = ""
    eos_text = "<|im_end|>"
    control_texts = CONTROL
    user_defined_texts: tuple[str, ...] = ()
    ctx_tokens = 4096
    train_ctx_tokens = 8192
    max_piece_bytes = 12  # the longest control text
    architecture = "fake"
    layout = "exact"
    versions = {"llama_cpp_python": "fake", "llama_cpp": "fake"}
    kernel_info = {"cpu_variant": "fake", "cpu_features": []}
    memory_info = {"memory": "plain", "window": 0, "reuse": {}}

    @property
    def vocabulary(self) -> "FakeEngine":
        """The fake is its own vocabulary (``tokenize``, ``piece``, the special texts) and its own runner."""
        return self

    @property
    def runner(self) -> "FakeEngine":
        return self

    def __init__(self, model_path: Path, *, on_score: Callable[[], None] | None = None,
                 logits: Callable[[int], list[float]] | None = None):
        self.model_path = str(model_path)
        self.resident_tokens = 0
        self.head: tuple[int, ...] = ()
        self.on_score = on_score
        self.logits = logits or (lambda n: [-float(i) for i in range(n)])
        self.calls = 0
        self.scoring = threading.Event()

    def tokenize(self, text: str, *, special: bool = False, bos: bool = False) -> list[int]:
        out: list[int] = []
        i = 0
        while i < len(text):
            for n, control in enumerate(CONTROL if special else ()):
                if text.startswith(control, i):
                    out.append(256 + n)
                    i += len(control)
                    break
            else:
                out.extend(text[i].encode("utf-8"))
                i += 1
        return out

    def fewest_tokens(self, text: str) -> int:
        return -(-len(text.encode("utf-8")) // self.max_piece_bytes)

    def piece(self, token: int) -> bytes:
        return CONTROL[token - 256].encode() if token >= 256 else bytes([token])

    def keep_resident(self, tokens: Sequence[int]) -> None:
        self.resident_tokens = len(tokens)
        self.head = tuple(tokens)

    limits = Limits(batch_tokens=512, cells=4096, sequences=32)

    def job_spec(self, prompts, tries, state=None, stems=None) -> JobSpec:
        """As the real engine's: the resident head where every prompt starts with it, then the state, and each
        prompt's stem past it."""
        common = min(common_prefix(prompts), min(len(p) for p in prompts) - 1)
        head = len(self.head) if all(tuple(p[:len(self.head)]) == self.head for p in prompts) else 0
        end = max(head, common if state is None else min(state[1], common))
        own = tuple(max(end, min(s, len(p) - 1)) for s, p in zip(stems, prompts)) if stems else ()
        return JobSpec(tuple(map(tuple, prompts)), tuple(tries), head, end,
                       stems=own if any(s > end for s in own) else ())

    def plan(self, spec: JobSpec):
        return plan_job(spec, self.limits)

    lock = threading.Lock()

    def answer_from_cache(self, spec: JobSpec, *, touch: bool = True):
        return None  # the fake keeps no cache: every job reaches step()

    def foresee(self, spec: JobSpec, plan: Plan, ahead: frozenset[bytes]) -> Plan:
        return plan  # nothing is ever cached

    def begin(self, spec: JobSpec, plan: Plan | None = None) -> "FakeJob":
        plan = plan or self.plan(spec)
        return FakeJob(spec, plan.tokens, plan)

    def abort(self) -> None:
        self.aborted = True

    def reset_abort(self) -> None:
        self.aborted = False

    def step(self, job: "FakeJob") -> bool:
        job.result = self._score(job.spec)
        job.decoded_tokens = job.tokens
        return False

    def abandon(self, job: "FakeJob") -> None:
        job.result = None

    def finish(self, job: "FakeJob") -> tuple[list[PromptScore], ScoreStats]:
        return job.result

    def close(self) -> None:
        self.closed = True

    def _score(self, spec: JobSpec) -> tuple[list[PromptScore], ScoreStats]:
        prompts, tries = spec.prompts, spec.tries
        self.calls += 1
        self.state_end = spec.state_end
        self.scoring.set()
        if self.on_score is not None:
            self.on_score()
        scores = []
        for trie in tries:
            logits = self.logits(len(trie.sequences))
            reads = {node: NodeRead((0.0,) * len(children), 0.0, -1) for node, children in trie.children.items()}
            reads[()] = NodeRead(tuple(logits[i] for i in range(len(trie.children[()]))), 0.0, -1)
            scores.append(prompt_score(trie, reads))
        stats = ScoreStats(self.resident_tokens, 0, 0, tuple(len(p) for p in prompts), 0, 0.001, 0.0001)
        return scores, stats


@dataclass
class FakeJob:
    spec: JobSpec
    tokens: int
    plan: Plan
    result: object = None
    decoded_tokens: int = 0
    compute_s: float = 0.0


def fake_model_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "fake.gguf").write_bytes(b"GGUF fake model for tests")
    return folder


def fake_decision_model(engine, max_prompt_tokens: int, max_request_tokens: int, *, queue_tokens: int = 100_000,
                        runtime: dict | None = None):
    """A DecisionModel over a fake engine, with its own scheduler; close() it when done."""
    from decision_adapter.decisions.model import DecisionModel, Limits as DecisionLimits
    from decision_adapter.decisions.model_files import ModelIdentity
    from decision_adapter.engine.scheduler import Scheduler

    identity = ModelIdentity("fake.gguf", 25, "0" * 64, None, None, False)
    return DecisionModel(engine, Scheduler(engine.runner, queue_tokens=queue_tokens), identity,
                         DecisionLimits(max_prompt_tokens=max_prompt_tokens, max_request_tokens=max_request_tokens),
                         runtime or {})
