"""The decision model: prompts, label checks, token budgets and probabilities, over an engine and its scheduler.

``DecisionModel`` is what the protocols (the walkthrough's decision schema, System One) call. It renders
each question with the model's chat template, keeps the fixed head resident in the engine, checks the
budgets before anything is evaluated, scores through the engine's scheduler (the one scoring path, for
requests, the start-up probe and the benchmarks alike) and turns the label log-probabilities into
probabilities. It never imports llama.cpp: the engine and the scheduler are handed in, typed by what this
module needs of them (``ScoringEngine``, ``JobScheduler``).
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

from ..engine.errors import PlanError
from ..engine.plan import JobSpec, Plan
from ..engine.readout import LabelTrie, PromptScore, ScoreStats, common_prefix, log_sum_exp, softmax
from ..errors import InputError, Loc
from .calibration import Calibration
from .labels import MAX_OPTIONS, PAIRED, SINGLE
from .model_files import ModelIdentity
from .prompt import DIGITS, QUESTION_HEADING, STYLES, ChatTemplate, PromptLayout, PromptStyle, TemplateError, \
    user_payload

READOUT_SINGLE = ("softmax over the declared answer labels' logits at the first answer position "
                  "(last prompt position); no tokens generated")
READOUT_CHAIN = ("chain rule over each label's tokens, every step the full-vocabulary probability of the label's "
                 "next token, then normalised over the declared labels; option_logits are those log-probabilities; "
                 "no tokens generated")

PROBE_STATE = "Customer asks to reset a forgotten password and says the reset email never arrived."
PROBE_QUESTION = "Which queue should handle this request?"
PROBE_OPTIONS = ("Account access and authentication support.", "Billing and payment support.",
                 "Sales and product evaluation.")


def orderings(keys: Sequence[str], k: int) -> list[tuple[int, ...]]:
    """The orderings a question is scored in, as option indices: the request's order for k = 1; for k >= 2 the
    canonical order (by key, then by position) and k evenly spaced cyclic shifts of it, so that the orderings,
    and with them the answer, depend on the option set alone. k is capped at the number of options."""
    n = len(keys)
    if k <= 1:
        return [tuple(range(n))]
    canonical = sorted(range(n), key=lambda i: (keys[i], i))
    k = min(k, n)
    return [tuple(canonical[(j + (step * n) // k) % n] for j in range(n)) for step in range(k)]


class ModelIncompatible(RuntimeError):
    """The model cannot serve decisions (template or labels); raised at start-up."""


@runtime_checkable
class ScoringEngine(Protocol):
    """What the decision model needs of an engine: its vocabulary and template, the resident head, and jobs."""

    chat_template: str | None
    bos_text: str
    eos_text: str
    control_texts: tuple[str, ...]
    ctx_tokens: int

    @property
    def resident_tokens(self) -> int: ...

    def tokenize(self, text: str, *, whole_prompt: bool = True) -> list[int]: ...

    def piece(self, token: int) -> bytes: ...

    def keep_resident(self, tokens: Sequence[int]) -> None: ...

    def job_spec(self, prompts: Sequence[Sequence[int]], tries: Sequence[LabelTrie],
                 state: tuple[int, int] | None = None) -> JobSpec: ...

    def plan(self, spec: JobSpec) -> Plan: ...

    def begin(self, spec: JobSpec, plan: Plan | None = None) -> Any: ...

    def close(self) -> None: ...


@runtime_checkable
class JobScheduler(Protocol):
    """What the decision model needs of a scheduler: submit a job with a deadline, wait for its result."""

    def submit(self, job: Any, timeout_s: float | None) -> Any: ...

    def result(self, ticket: Any) -> tuple[list[PromptScore], ScoreStats]: ...

    def stop(self, timeout_s: float = 30.0) -> None: ...


@dataclass(frozen=True)
class Question:
    """One question as the model will read it; ``loc`` names it in error messages."""

    loc: Loc
    state: str
    question: str
    options: tuple[str, ...]
    option_locs: tuple[Loc, ...]
    state_loc: Loc
    question_loc: Loc
    option_keys: tuple[str, ...] = ()  # what orders the options canonically: ids or names (default: the texts)
    permutations: int | None = None  # orderings averaged: 1 is the request's order; None: the server's default
    kind: str | None = None  # noul, choice or score (System One); the calibration is per kind


@dataclass(frozen=True)
class Prepared:
    """A request rendered, tokenized and planned: one prompt per ordering of each question's options, and the
    job that scores them (``spec``, with ``plan``, its plan as if nothing were cached)."""

    questions: tuple[Question, ...]
    prompts: tuple[str, ...]
    tokens: tuple[tuple[int, ...], ...]
    request_tokens: int
    state: tuple[int, int]  # the span of tokens every prompt has whatever its question: its state
    tries: tuple[LabelTrie, ...]
    orders: tuple[tuple[int, ...], ...]  # for each prompt, the option (request index) shown at each position
    owners: tuple[int, ...]  # for each prompt, the index of its question
    spec: JobSpec
    plan: Plan


@dataclass(frozen=True)
class Scored:
    probabilities: tuple[float, ...]
    option_logits: tuple[float, ...]
    prompt_sha256: str
    input_tokens: int
    readout: str
    label_mass: float  # full-vocabulary probability the labels' first tokens hold at the answer position
    top_token_is_label: bool
    calibration: dict[str, Any] | None = None  # the calibration applied to the probabilities, if any


@dataclass(frozen=True)
class Limits:
    max_prompt_tokens: int
    max_request_tokens: int


@dataclass(frozen=True)
class Answered:
    """A scored request: one result per question, what the engine did, and how long the job waited."""

    results: list[Scored]
    stats: ScoreStats
    queue_s: float


class DecisionModel:
    def __init__(self, engine: ScoringEngine, scheduler: JobScheduler, identity: ModelIdentity, limits: Limits,
                 runtime: dict[str, Any], *, served_id: str = "", style: PromptStyle | None = None,
                 calibration: Calibration | None = None, default_permutations: int = 1):
        self.engine = engine
        self.scheduler = scheduler
        self.served_id = served_id or identity.file.removesuffix(".gguf")
        self.identity = identity
        self.limits = limits
        self.calibration = calibration  # a calibration.json fitted for this GGUF and prompt, if any
        self.default_permutations = default_permutations  # ADAPTER_PERMUTATIONS
        try:
            self.layout = PromptLayout(ChatTemplate(engine.chat_template, bos_token=engine.bos_text,
                                                    eos_token=engine.eos_text), style or STYLES["plain"])
            head = self.layout.head
        except TemplateError as exc:
            raise ModelIncompatible(str(exc)) from None
        self._head = head
        self._head_tokens = engine.tokenize(head)
        # What request validation refuses in text the model reads: the texts of the model's control tokens.
        self.control_tokens = (re.compile("|".join(re.escape(t) for t in engine.control_texts))
                               if engine.control_texts else None)
        self._label_tokens = self._check_labels()
        self._tries: dict[tuple[str, ...], LabelTrie] = {}
        engine.keep_resident(self._head_tokens)
        self.model_info = {**identity.as_dict(), **runtime}

    def close(self) -> None:
        """Stop the scheduler (its queued jobs run first) and free the engine."""
        self.scheduler.stop()
        self.engine.close()

    # ---- start-up checks -----------------------------------------------------------------------

    def _check_labels(self) -> dict[str, tuple[int, ...]]:
        """Each label's tokens where the answer begins; fails unless appending a label keeps the prompt's
        tokens, the label's tokens spell it exactly, single labels are one token each, and no label's
        tokens are a prefix of another's."""
        probe = self.render(PROBE_STATE, PROBE_QUESTION, SINGLE[:3], PROBE_OPTIONS)
        base = self.engine.tokenize(probe)
        found: dict[str, tuple[int, ...]] = {}
        digits = DIGITS if self.layout.style.score_digits else ()
        for label in SINGLE + PAIRED + digits:
            tokens = self.engine.tokenize(probe + label)
            if tokens[:len(base)] != base:
                raise ModelIncompatible(f"appending the answer label {label!r} changes how the prompt tokenizes")
            own = tuple(tokens[len(base):])
            spelled = b"".join(self.engine.piece(t) for t in own).decode("utf-8", "replace")
            if spelled != label:
                raise ModelIncompatible(f"the answer label {label!r} does not round-trip (tokens spell {spelled!r})")
            if (label in SINGLE or label in digits) and len(own) != 1:
                raise ModelIncompatible(f"the answer label {label!r} is {len(own)} tokens, not one")
            found[label] = own
        for labels in (SINGLE, PAIRED, digits) if digits else (SINGLE, PAIRED):
            try:
                LabelTrie.build(found[label] for label in labels)
            except ValueError as exc:
                raise ModelIncompatible(f"answer labels {labels[0]}..{labels[-1]}: {exc}") from None
        return found

    def labels(self, n_options: int, kind: str | None = None) -> tuple[str, ...]:
        return self.layout.style.labels(n_options, kind)

    def trie(self, n_options: int, kind: str | None = None) -> LabelTrie:
        labels = self.labels(n_options, kind)
        if labels not in self._tries:
            self._tries[labels] = LabelTrie.build(self._label_tokens[label] for label in labels)
        return self._tries[labels]

    # ---- requests ------------------------------------------------------------------------------

    max_options = MAX_OPTIONS

    def render(self, state: str, question: str, labels: Sequence[str], options: Sequence[str]) -> str:
        return self.layout.render(user_payload(state, question, labels, options))

    def prepare(self, questions: Sequence[Question]) -> Prepared:
        """Render, tokenize and plan; refuse over-budget prompts before any evaluation. The text is validated
        already (the protocols refuse the model's control tokens where they parse the request)."""
        owners, orders = [], []
        for i, q in enumerate(questions):
            for order in orderings(q.option_keys or q.options, q.permutations or self.default_permutations):
                owners.append(i)
                orders.append(order)
        prompts = tuple(self.render(questions[i].state, questions[i].question,
                                    self.labels(len(order), questions[i].kind),
                                    [questions[i].options[j] for j in order]) for i, order in zip(owners, orders))
        tokens = tuple(tuple(self.engine.tokenize(p)) for p in prompts)
        ceiling = min(self.limits.max_prompt_tokens, self.engine.ctx_tokens - 2)
        for i, t in zip(owners, tokens):
            if len(t) > ceiling:
                raise InputError(questions[i].loc, f"renders to a prompt of {len(t)} tokens, over the limit of "
                                 f"{ceiling}", kind="value_error.prompt_too_long")
        resident = min(self.engine.resident_tokens, common_prefix(tokens))
        shared = common_prefix(tokens) if len(tokens) > 1 else resident
        request_tokens = (shared - resident) + sum(len(t) - shared for t in tokens)
        if request_tokens > self.limits.max_request_tokens:
            raise InputError(questions[0].loc[:-1] if len(questions) > 1 else questions[0].loc,
                             f"needs {request_tokens} tokens of evaluation, over the request limit of "
                             f"{self.limits.max_request_tokens}", kind="value_error.request_too_long")
        # Questions over one state (a System One request, shared decisions) tokenize its prefix once.
        prefixes = {state: self._state_prefix(state) for state in dict.fromkeys(q.state for q in questions)}
        spans = [self._span(prefixes[questions[i].state], t) for i, t in zip(owners, tokens)]
        span = (min(s for s, _ in spans), min(e for _, e in spans))
        tries = tuple(self.trie(len(order), questions[i].kind) for i, order in zip(owners, orders))
        spec = self.engine.job_spec(tokens, tries, span)
        try:
            plan = self.engine.plan(spec)
        except PlanError as exc:
            raise InputError(questions[0].loc[:-1] if len(questions) > 1 else questions[0].loc, str(exc),
                             kind="value_error.request_too_large") from None
        return Prepared(tuple(questions), prompts, tokens, request_tokens, span, tries, tuple(orders), tuple(owners),
                        spec, plan)

    def state_span(self, state: str, tokens: Sequence[int]) -> tuple[int, int]:
        """Where a prompt's state begins and ends in its tokens: after the head, up to and including the
        question heading, as far as the prompt keeps those tokens. The span does not depend on the
        question: it is the prefix the state cache keeps and every question of the state forks from."""
        return self._span(self._state_prefix(state), tokens)

    def _state_prefix(self, state: str) -> list[int]:
        return self.engine.tokenize(self._head + state + QUESTION_HEADING)

    def _span(self, state_prefix: Sequence[int], tokens: Sequence[int]) -> tuple[int, int]:
        start = common_prefix([self._head_tokens, tokens])
        return start, max(start, common_prefix([state_prefix, tokens]))

    def score(self, prepared: Prepared, timeout_s: float | None = None) -> Answered:
        """Score through the scheduler within ``timeout_s`` (None: no deadline). Raises the scheduler's Busy
        (the queue is full), DeadlineExceeded or ScoringFailed."""
        ticket = self.scheduler.submit(self.engine.begin(prepared.spec, prepared.plan), timeout_s)
        scores, stats = self.scheduler.result(ticket)
        return Answered(self._results(prepared, scores), stats, ticket.queue_s)

    def _results(self, prepared: Prepared, scores: Sequence[PromptScore]) -> list[Scored]:
        """One result per question, in the request's option order: a question scored in several orderings has
        each ordering's label log-probabilities aligned back to its options and averaged, then the softmax."""
        results = []
        for i in range(len(prepared.questions)):
            mine = [k for k, owner in enumerate(prepared.owners) if owner == i]
            n = len(prepared.orders[mine[0]])
            single = all(prepared.tries[k].depth == 1 for k in mine)
            aligned = [[0.0] * n for _ in mine]
            for row, k in zip(aligned, mine):
                values = scores[k].first_token_logits if single else scores[k].label_logprobs
                for position, option in enumerate(prepared.orders[k]):
                    row[option] = values[position] - (log_sum_exp(values) if len(mine) > 1 else 0.0)
            logits = tuple(math.fsum(row[o] for row in aligned) / len(mine) for o in range(n))
            prompts = [prepared.prompts[k] for k in mine]
            kind = prepared.questions[i].kind
            calibrated = self.calibration.probabilities(logits, kind) if self.calibration else softmax(logits)
            results.append(Scored(
                probabilities=tuple(calibrated),
                option_logits=logits,
                prompt_sha256=hashlib.sha256("\0".join(prompts).encode("utf-8")).hexdigest(),
                input_tokens=sum(len(prepared.tokens[k]) for k in mine),
                readout=(READOUT_SINGLE if single else READOUT_CHAIN) + (
                    f"; averaged in log space over {len(mine)} orderings of the options" if len(mine) > 1 else ""),
                label_mass=math.fsum(scores[k].label_mass for k in mine) / len(mine),
                top_token_is_label=all(scores[k].top_token_is_label for k in mine),
                calibration=self.calibration.describe(kind) if self.calibration else None))
        return results

    def probe(self) -> Scored:
        """Score a fixed decision; start-up is not complete until this gives a proper distribution."""
        question = Question(("probe",), PROBE_STATE, PROBE_QUESTION, PROBE_OPTIONS,
                            tuple(("probe", "options", i) for i in range(3)), ("probe", "state"),
                            ("probe", "question"))
        [result] = self.score(self.prepare([question])).results
        p = result.probabilities
        if len(p) != 3 or not all(math.isfinite(x) and 0.0 <= x <= 1.0 for x in p) or abs(sum(p) - 1.0) > 1e-6:
            raise ModelIncompatible(f"the probe decision gave no proper distribution: {p}")
        return result
