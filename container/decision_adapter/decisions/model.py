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
from dataclasses import dataclass, replace
from typing import Any, Protocol, Sequence, runtime_checkable

from ..engine.errors import PlanError, TooLarge
from ..engine.plan import JobSpec, Plan
from ..engine.readout import LabelTrie, PromptScore, ScoreStats
from ..errors import InputError, Loc
from .calibration import Calibration
from .debias import DEFAULT_FLOOR, DEFAULT_STRENGTH, MODES, OFF, PRIORS, DebiasMode, Row, compose, content_free
from .labels import MAX_OPTIONS, PAIRED, SINGLE
from .literals import literal_pattern
from .model_files import ModelIdentity
from .prompt import DEFAULT_STYLE, DIGITS, STYLES, ChatTemplate, PromptLayout, PromptStyle, TemplateError, state_segment

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
    train_ctx_tokens: int
    max_piece_bytes: int

    @property
    def resident_tokens(self) -> int: ...

    def tokenize(self, text: str, *, special: bool = False, bos: bool = False) -> list[int]: ...

    def piece(self, token: int) -> bytes: ...

    def keep_resident(self, tokens: Sequence[int]) -> None: ...

    def job_spec(self, prompts: Sequence[Sequence[int]], tries: Sequence[LabelTrie],
                 state: tuple[int, int] | None = None) -> JobSpec: ...

    def plan(self, spec: JobSpec) -> Plan: ...

    def answer_from_cache(self, spec: JobSpec) -> tuple[list[PromptScore], ScoreStats] | None: ...

    def close(self) -> None: ...


@runtime_checkable
class JobScheduler(Protocol):
    """What the decision model needs of a scheduler: submit a job with a deadline, wait for its result."""

    def submit_all(self, jobs: Sequence[tuple[JobSpec, Plan]], *, deadline: float | None = None,
                   by_tokens: bool = True, allowed_s: float | None = None) -> list[Any]: ...

    def result(self, ticket: Any) -> tuple[list[PromptScore], ScoreStats]: ...

    def cancel(self, ticket: Any) -> None: ...

    def stop(self, timeout_s: float = 30.0) -> bool: ...


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
    debias: str | None = None  # a name in debias.PRIORS (requests: MODES); None: the server's default (ADAPTER_DEBIAS)
    show_prior: bool = False  # the answer reports the prior's own distribution


@dataclass(frozen=True)
class PriorJob:
    """The prompts of one content-free state (and, for a label prior, one replacement of the question) for every
    question of a request whose debias mode averages it: each is the request's prompt (options, ordering, labels,
    and for a state prior the question) with the state replaced; and their job."""

    state: str
    prompts: tuple[int, ...]  # for each of its prompts, the index of the request's prompt it stands for
    spec: JobSpec
    plan: Plan
    question: str | None = None  # the question's replacement (a label prior); None: the question kept

    @property
    def key(self) -> tuple[str, str | None]:
        return self.state, self.question


@dataclass(frozen=True)
class Prepared:
    """A request rendered, tokenized and planned: one prompt per ordering of each question's options, and the
    job that scores them (``spec``, with ``plan``, its plan as if nothing were cached)."""

    questions: tuple[Question, ...]
    tokens: tuple[tuple[int, ...], ...]
    request_tokens: int  # what the plan decodes when nothing is cached: the state once, each prompt's own tokens
    state: tuple[int, int]  # the span of tokens every prompt has whatever its question: its state
    tries: tuple[LabelTrie, ...]
    orders: tuple[tuple[int, ...], ...]  # for each prompt, the option (request index) shown at each position
    owners: tuple[int, ...]  # for each prompt, the index of its question
    digests: tuple[str, ...]  # for each question, the SHA-256 of its rendered prompts (NUL between orderings)
    spec: JobSpec
    plan: Plan
    priors: tuple[PriorJob, ...] = ()  # the content-free priors' jobs, one per content-free prompt kind
    # The questions with a state prior whose state carries no content (an empty state, N/A, ...:
    # ``debias.content_free``): the prior's prompt would be (nearly) their own, and their content sits in the
    # question. No prior is scored for them, and they are answered as with debias off.
    no_prior: frozenset[int] = frozenset()
    loc: Loc = ()  # where errors about the request as a whole point (the decision, or the decisions)


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
    # What the softmax (and the temperature) apply to: option_logits, minus the prior's log-probabilities (floored,
    # raised to the strength) when debiased.
    adjusted_logits: tuple[float, ...] = ()
    debias: dict[str, Any] | None = None  # the debiasing applied ({"mode", "states", "strength", "floor"}), if any
    prior: tuple[float, ...] | None = None  # the prior's own distribution over the options, when debiased


@dataclass(frozen=True)
class Limits:
    max_prompt_tokens: int
    max_request_tokens: int


@dataclass(frozen=True)
class Readouts:
    """What the engine read for a prepared request: a score per prompt of its answer's job and of each prior job
    (in ``Prepared.priors`` order), with each job's stats."""

    scores: list[PromptScore]
    stats: ScoreStats
    prior_scores: tuple[list[PromptScore], ...]
    prior_stats: tuple[ScoreStats, ...]
    queue_s: float
    jobs: int  # jobs queued in the scheduler (0: answered from the cache)


@dataclass(frozen=True)
class Answered:
    """A scored request: one result per question, what the engine did, and how long the job waited."""

    results: list[Scored]
    stats: ScoreStats
    queue_s: float
    prior_stats: tuple[ScoreStats, ...] = ()  # the prior jobs' (none answered from the cache: zero tokens)
    jobs: int = 0  # jobs this request queued in the scheduler (0: answered from the cache)

    @property
    def prior_tokens(self) -> int:
        """Tokens decoded for the priors: 0 when the cache held them."""
        return sum(s.shared_tokens + sum(s.own_tokens) + s.readout_tokens for s in self.prior_stats)

    @property
    def prior_s(self) -> float:
        return math.fsum(s.prefill_s + s.readout_s for s in self.prior_stats)


def prompt_layout(engine: ScoringEngine, style: PromptStyle) -> PromptLayout:
    """The model's prompt layout for ``style``, rendered once from its chat template (its ``version`` is what a
    calibration is bound to); ModelIncompatible when the template cannot render a decision."""
    try:
        return PromptLayout(ChatTemplate(engine.chat_template, bos_token=engine.bos_text, eos_token=engine.eos_text),
                            style)
    except TemplateError as exc:
        raise ModelIncompatible(str(exc)) from None


class DecisionModel:
    def __init__(self, engine: ScoringEngine, scheduler: JobScheduler, identity: ModelIdentity, limits: Limits,
                 runtime: dict[str, Any], *, served_id: str = "", layout: PromptLayout | None = None,
                 calibration: Calibration | None = None, default_permutations: int = 1,
                 default_debias: str = "off", default_strength: float = DEFAULT_STRENGTH,
                 default_floor: float = DEFAULT_FLOOR, owns_engine: bool = True):
        self.engine = engine
        self.owns_engine = owns_engine  # False: the engine was handed in (tests, benchmarks) and outlives the model
        self.scheduler = scheduler
        self.served_id = served_id or identity.file.removesuffix(".gguf")
        self.identity = identity
        self.limits = limits
        self.calibration = calibration  # a calibration.json fitted for this GGUF, prompt and orderings, if any
        self.default_permutations = default_permutations  # ADAPTER_PERMUTATIONS
        self.default_debias = MODES[default_debias]  # ADAPTER_DEBIAS
        self.default_strength = default_strength  # ADAPTER_DEBIAS_STRENGTH: alpha where no calibration fits one
        self.default_floor = default_floor  # ADAPTER_DEBIAS_FLOOR
        self.layout = layout or prompt_layout(engine, STYLES[DEFAULT_STYLE])
        self.prompt_version = self.layout.version
        # Every prompt is head + state + question + tail; the head and the tail are the template's own text, so
        # their special tokens are parsed; the state and the question are the request's, tokenized as text.
        self._head_tokens = tuple(engine.tokenize(self.layout.head, special=True, bos=True))
        self._tail_tokens = tuple(engine.tokenize(self.layout.tail, special=True))
        # The content-free states the priors put in place of the state (debias.PRIORS): fixed text, tokenized once.
        self._content_free_tokens = {text: tuple(engine.tokenize(state_segment(text)))
                                     for mode in PRIORS.values() for text in mode.states}
        # What request validation refuses in text the model reads: the texts of the model's special tokens.
        self.control_tokens = literal_pattern(engine.control_texts)  # linear in the text whatever their number
        self.prompt_ceiling = min(limits.max_prompt_tokens, engine.ctx_tokens - 2, engine.train_ctx_tokens)
        self._label_tokens = self._check_labels()
        self._tries: dict[tuple[str, ...], LabelTrie] = {}
        engine.keep_resident(self._head_tokens)
        self.model_info = {**identity.as_dict(), **runtime, "prompt_version": self.prompt_version}
        self.text_bytes_per_token: float | None = None  # measured by the probe

    def close(self) -> None:
        """Stop the scheduler (its queued jobs run first) and free the engine where this model owns it, once no
        job can run on it: a scheduler thread that will not end keeps the engine (a leak, never a decode on freed
        memory)."""
        if self.scheduler.stop() and self.owns_engine:
            self.engine.close()

    # ---- start-up checks -----------------------------------------------------------------------

    def _check_labels(self) -> dict[str, tuple[int, ...]]:
        """Each label's tokens where the answer begins (after the tail); fails unless appending a label keeps
        the tail's tokens, the label's tokens spell it exactly, single labels are one token each, and no label's
        tokens are a prefix of another's."""
        tail = self.layout.tail
        base = list(self._tail_tokens)
        found: dict[str, tuple[int, ...]] = {}
        digits = DIGITS if self.layout.style.score_digits else ()
        for label in SINGLE + PAIRED + digits:
            tokens = self.engine.tokenize(tail + label, special=True)
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
        """The whole prompt's text (its SHA-256 is the answer's ``prompt_sha256``)."""
        return self.layout.render(self.layout.user_payload(state, question, labels, options))

    def prepare(self, questions: Sequence[Question]) -> Prepared:
        """Tokenize and plan the questions over their one state; refuse over-budget prompts before any
        evaluation, in bounded memory: the state is sized from its bytes before it is tokenized (once), then each
        question's prompt in each ordering is tokenized on its own, stopping at the first over a limit. The
        text is validated already (the protocols refuse the model's special tokens where they parse it)."""
        if len({q.state for q in questions}) != 1:
            raise ValueError("the questions of one request share one state")
        first = questions[0]
        where = first.loc[:-1] if len(questions) > 1 else first.loc
        ceiling = self.prompt_ceiling
        head, tail = self._head_tokens, self._tail_tokens
        state_text = state_segment(first.state)
        fixed = len(head) + len(tail) + 1  # every prompt also has at least one token of its own question
        self._bound(first.loc, state_text, ceiling - fixed)
        state = tuple(self.engine.tokenize(state_text))
        if len(head) + len(state) + len(tail) + 1 > ceiling:
            raise InputError(first.loc, f"renders to a prompt of more than {len(head) + len(state) + len(tail)} "
                             f"tokens, over the limit of {ceiling}", kind="value_error.prompt_too_long")
        request_tokens = len(state)  # the head is resident: never decoded for a request
        if request_tokens > self.limits.max_request_tokens:
            raise self._over_request(where, request_tokens)
        head_bytes, state_bytes, tail_bytes = (t.encode("utf-8") for t in (self.layout.head, state_text,
                                                                            self.layout.tail))
        tokens, tries, orders, owners, digests = [], [], [], [], []
        for i, q in enumerate(questions):
            digest = hashlib.sha256()
            for k, order in enumerate(orderings(q.option_keys or q.options, q.permutations or self.default_permutations)):
                labels = self.labels(len(order), q.kind)
                text = self.layout.question_segment(q.question, labels, [q.options[j] for j in order])
                self._bound(q.loc, text, ceiling - len(head) - len(state) - len(tail))
                own = tuple(self.engine.tokenize(text)) + tail
                prompt_tokens = len(head) + len(state) + len(own)
                if prompt_tokens > ceiling:
                    raise InputError(q.loc, f"renders to a prompt of {prompt_tokens} tokens, over the limit of "
                                     f"{ceiling}", kind="value_error.prompt_too_long")
                trie = self.trie(len(order), q.kind)
                request_tokens += len(own) + sum(len(path) for path in trie.inner_nodes)
                if request_tokens > self.limits.max_request_tokens:
                    raise self._over_request(where, request_tokens)
                tokens.append(head + state + own)
                tries.append(trie)
                orders.append(order)
                owners.append(i)
                digest.update(b"\0" if k else b"")
                for part in (head_bytes, state_bytes, text.encode("utf-8"), tail_bytes):
                    digest.update(part)
            digests.append(digest.hexdigest())
        span = (len(head), len(head) + len(state))
        spec = self.engine.job_spec(tokens, tries, span)
        plan = self._plan(where, spec)
        priors, no_prior, request_tokens = self._priors(questions, tokens, tries, orders, owners, span, where,
                                                         request_tokens)
        return Prepared(tuple(questions), tuple(tokens), request_tokens, span, tuple(tries), tuple(orders),
                        tuple(owners), tuple(digests), spec, plan, tuple(priors), frozenset(no_prior), where)

    def _priors(self, questions: Sequence[Question], tokens: list[tuple[int, ...]], tries: list[LabelTrie],
                orders: list[tuple[int, ...]], owners: list[int], span: tuple[int, int], where: Loc,
                request_tokens: int) -> tuple[list[PriorJob], set[int], int]:
        """The prior jobs: each content-free prompt kind once, with the prompts (options, ordering, tail, and for a
        state prior the question) of every question whose mode averages it; the questions with a state prior, if
        the state carries no content (none is scored for them: ``Prepared.no_prior``); and ``request_tokens`` with
        the priors' tokens added, counted as if none were cached, so that what is refused never depends on the
        cache."""
        head, tail, ceiling = self._head_tokens, self._tail_tokens, self.prompt_ceiling
        members: dict[tuple[str, str | None], list[tuple[int, tuple[int, ...]]]] = {}
        no_prior: set[int] = set()
        for i, q in enumerate(questions):
            mode = self.debias_mode(q)
            if not mode.active:
                continue
            if mode.question is None and content_free(q.state):
                no_prior.add(i)
                continue
            mine = [k for k, owner in enumerate(owners) if owner == i]
            if mode.question is None:  # a state prior: the question's own tokens after the state
                own = {k: tokens[k][span[1]:] for k in mine}
            else:  # a label prior: the question replaced, the options in each ordering kept
                own = {k: tuple(self.engine.tokenize(self.layout.question_segment(
                    mode.question, self.labels(len(orders[k]), q.kind), [q.options[j] for j in orders[k]]))) + tail
                    for k in mine}
            prompts = {(text, k): head + self._content_free_tokens[text] + own[k] for text in mode.states
                       for k in mine}
            for text in mode.states:
                members.setdefault((text, mode.question), []).extend((k, prompts[text, k]) for k in mine)
        priors = []
        for (text, question_text), rows in members.items():
            free = self._content_free_tokens[text]
            request_tokens += len(free)
            for k, prompt in rows:
                if len(prompt) > ceiling:
                    raise InputError(questions[owners[k]].loc, f"renders to a prior prompt of {len(prompt)} tokens, "
                                     f"over the limit of {ceiling}", kind="value_error.prompt_too_long")
                request_tokens += len(prompt) - len(head) - len(free) + sum(len(path) for path in tries[k].inner_nodes)
                if request_tokens > self.limits.max_request_tokens:
                    raise self._over_request(where, request_tokens)
            prior_spec = self.engine.job_spec([prompt for _, prompt in rows], [tries[k] for k, _ in rows],
                                              (len(head), len(head) + len(free)))
            priors.append(PriorJob(text, tuple(k for k, _ in rows), prior_spec, self._plan(where, prior_spec),
                                   question_text))
        return priors, no_prior, request_tokens

    def debias_mode(self, question: Question) -> DebiasMode:
        """The question's debias mode: its own, or the server's default."""
        return PRIORS[question.debias] if question.debias is not None else self.default_debias

    def _plan(self, where: Loc, spec: JobSpec) -> Plan:
        try:
            return self.engine.plan(spec)
        except PlanError as exc:
            raise InputError(where, str(exc), kind="value_error.request_too_large") from None

    def _bound(self, loc: Loc, text: str, room: int) -> None:
        """Refuse ``text`` without tokenizing it when its bytes alone prove it longer than ``room`` tokens (no
        token spells more than the vocabulary's longest piece): tokenizing is then bounded in time and memory."""
        at_least = -(-len(text.encode("utf-8")) // self.engine.max_piece_bytes)
        if at_least > room:
            raise InputError(loc, f"renders to a prompt of more than {self.prompt_ceiling} tokens (this text alone "
                             f"is at least {at_least}), over the limit of {self.prompt_ceiling}",
                             kind="value_error.prompt_too_long")

    @staticmethod
    def _too_large(loc: Loc, exc: TooLarge) -> InputError:
        return InputError(loc, f"needs {exc.tokens} tokens of evaluation, about {exc.needed_s:.0f} s at the "
                          f"{exc.tokens_per_s:.0f} tokens/s this server measures; a request here may take "
                          f"{exc.allowed_s:.0f} s (about {exc.allowed_tokens} tokens): split it into smaller "
                          f"requests", kind="value_error.request_too_slow")

    def _over_request(self, loc: Loc, tokens: int) -> InputError:
        return InputError(loc, f"needs at least {tokens} tokens of evaluation, over the request limit of "
                          f"{self.limits.max_request_tokens}", kind="value_error.request_too_long")

    def score(self, prepared: Prepared, deadline: float | None = None, *, by_tokens: bool = True,
              allowed_s: float | None = None) -> Answered:
        """Score through the scheduler before ``deadline`` (``time.monotonic()``; None: none) and compose each
        question's answer (``readouts``, then ``debias.compose``). Raises what ``readouts`` raises."""
        read = self.readouts(prepared, deadline, by_tokens=by_tokens, allowed_s=allowed_s)
        return Answered(self._results(prepared, read), read.stats, read.queue_s, read.prior_stats, read.jobs)

    def readouts(self, prepared: Prepared, deadline: float | None = None, *, by_tokens: bool = True,
                 allowed_s: float | None = None) -> Readouts:
        """What the engine reads for the request's jobs, through the scheduler. A request whose every answer is
        cached is answered at once, without queueing. Raises the scheduler's Busy (the queue is full, or the work
        cannot be done before the deadline), DeadlineExceeded or ScoringFailed, and an InputError when its own work
        needs more than ``allowed_s`` (what any request may take on this server) at the measured speed.
        ``by_tokens=False``: no admission by the token budget (a Batch Transform mini-batch). A request's jobs are
        its answer's and, for debiased questions, one per content-free prompt kind of the prior; each job the cache
        answers whole (a warm prior, an identical repeat) costs nothing, the others are queued together and
        admitted as one."""
        jobs = [(prepared.spec, prepared.plan), *((p.spec, p.plan) for p in prepared.priors)]
        done = [self.engine.answer_from_cache(spec) for spec, _ in jobs]
        missing = [i for i, d in enumerate(done) if d is None]
        queue_s = 0.0
        if missing:
            try:
                tickets = self.scheduler.submit_all([jobs[i] for i in missing], deadline=deadline,
                                                    by_tokens=by_tokens, allowed_s=allowed_s)
            except TooLarge as exc:
                raise self._too_large(prepared.loc, exc) from None
            try:
                for i, ticket in zip(missing, tickets):
                    done[i] = self.scheduler.result(ticket)
            except BaseException:
                for ticket in tickets:
                    self.scheduler.cancel(ticket)
                raise
            queue_s = tickets[0].queue_s
        (scores, stats), *priors = done
        return Readouts(scores, stats, tuple(p[0] for p in priors), tuple(p[1] for p in priors), queue_s,
                        len(missing))

    @staticmethod
    def question_rows(prepared: Prepared, read: Readouts, i: int,
                      mode: DebiasMode) -> tuple[list[Row], dict[str, list[Row]], bool]:
        """Question ``i``'s readouts as ``debias.compose`` takes them: its answer's rows (one per ordering), its
        prior's rows per content-free state of ``mode`` (none for a question whose prior would be its own prompt),
        and whether its labels are single tokens (first-token logits) or chains (label log-probabilities)."""
        mine = [k for k, owner in enumerate(prepared.owners) if owner == i]
        single = all(prepared.tries[k].depth == 1 for k in mine)

        def values(score: PromptScore) -> Sequence[float]:
            return score.first_token_logits if single else score.label_logprobs

        answer = [(values(read.scores[k]), prepared.orders[k]) for k in mine]
        prior: dict[str, list[Row]] = {}
        if mode.active and i not in prepared.no_prior:
            jobs = {p.key: (p, found) for p, found in zip(prepared.priors, read.prior_scores)}
            for text in mode.states:
                job, found = jobs[text, mode.question]
                prior[text] = [(values(found[j]), prepared.orders[k]) for j, k in enumerate(job.prompts)
                               if prepared.owners[k] == i]
        return answer, prior, single

    def _results(self, prepared: Prepared, read: Readouts) -> list[Scored]:
        """One result per question, in the request's option order (``debias.compose``): the orderings averaged,
        the prior (floored, raised to its strength) divided out, then the temperature, if calibrated, and the
        softmax. The strength and the temperature come from the calibration when it was fitted for this question's
        orderings and mode; otherwise the server's defaults apply, without a temperature."""
        results = []
        for i, question in enumerate(prepared.questions):
            mine = [k for k, owner in enumerate(prepared.owners) if owner == i]
            n = len(prepared.orders[mine[0]])
            kind = question.kind
            mode = self.debias_mode(question)
            answer, prior, single = self.question_rows(prepared, read, i, mode)
            readout = (READOUT_SINGLE if single else READOUT_CHAIN) + (
                f"; averaged in log space over {len(mine)} orderings of the options" if len(mine) > 1 else "")
            applied = mode if prior else MODES[OFF]
            if mode.active and not prior:
                readout += (f"; not debiased ({mode.name}): the state carries no content (a content-free state), so "
                            f"a state prior would be this prompt itself; no prior is divided out and it is answered "
                            f"as with debias off")
            # A temperature (and a strength) fitted on answers averaged over K orderings, or debiased otherwise,
            # means nothing here.
            calibration = self.calibration
            asked = question.permutations or self.default_permutations
            if calibration is not None and calibration.permutations != asked:
                readout += (f"; not calibrated: calibration.json was fitted with {calibration.permutations} "
                            f"orderings, this question asked for {asked}")
                calibration = None
            elif calibration is not None and calibration.debias != applied.name:
                readout += (f"; not calibrated: calibration.json was fitted with debias {calibration.debias!r}"
                            f"{' (a file from before strengths were fitted)' if calibration.strengths is None else ''}"
                            f", this question is answered with {applied.name!r}")
                calibration = None
            if calibration is not None:
                strength, floor = calibration.strength(kind, self.default_strength), calibration.floor
            else:
                strength, floor = self.default_strength, self.default_floor
            composed = compose(answer, n, [row for text in applied.states for row in prior.get(text, ())],
                               strength=strength, floor=floor,
                               temperature=calibration.temperature(kind) if calibration else 1.0)
            debias = None
            if prior:
                what = "the state" if mode.question is None else "the state and the question"
                readout += (f"; debiased ({mode.name}): a {mode.kind} prior, scored the same way with "
                            f"{what} replaced by content-free text ({len(mode.states)} state"
                            f"{'s' if len(mode.states) > 1 else ''}, averaged in log space)"
                            + (f", mixed with the uniform ({floor:g} of it)" if floor else "")
                            + f", raised to the strength {strength:g} and subtracted")
                debias = {**mode.describe(), "strength": strength, "floor": floor}
            results.append(Scored(
                probabilities=composed.probabilities,
                option_logits=composed.logits,
                prompt_sha256=prepared.digests[i],
                input_tokens=sum(len(prepared.tokens[k]) for k in mine),
                readout=readout,
                label_mass=math.fsum(read.scores[k].label_mass for k in mine) / len(mine),
                top_token_is_label=all(read.scores[k].top_token_is_label for k in mine),
                calibration=calibration.describe(kind) if calibration else None,
                adjusted_logits=composed.adjusted,
                debias=debias,
                prior=composed.prior))
        return results

    def probe(self) -> Scored:
        """Score a fixed decision; start-up is not complete until this gives a proper distribution. A second
        one over a state of about a micro-batch gives the scheduler its first measure of the decode speed at the
        size that matters for admission (the first decision alone is mostly fixed costs)."""
        question = Question(("probe",), PROBE_STATE, PROBE_QUESTION, PROBE_OPTIONS,
                            tuple(("probe", "options", i) for i in range(3)), ("probe", "state"),
                            ("probe", "question"), debias="off")  # the answer's own cost, without a prior's
        prepared = self.prepare([question])
        [result] = self.score(prepared).results
        room = min(512, self.prompt_ceiling // 2, self.limits.max_request_tokens // 2)
        long_state = " ".join(f"({i}) {PROBE_STATE}" for i in range(1, max(2, room // 25)))
        try:
            self.score(self.prepare([replace(question, state=long_state)]))
        except InputError:
            pass  # limits too tight for it: the speed is measured on requests instead
        # Request text per evaluated token, for sizing Batch Transform payloads: the probe's state and question
        # text over what the plan decodes for them under the server's default debias mode, the first prior's
        # tokens counted (a record of a question not seen before pays it; a JSON record adds ids and keys: more
        # bytes per token).
        text = state_segment(PROBE_STATE) + self.layout.question_segment(PROBE_QUESTION, SINGLE[:3], PROBE_OPTIONS)
        charged = self.prepare([replace(question, debias=None)]).request_tokens
        self.text_bytes_per_token = len(text.encode("utf-8")) / charged
        p = result.probabilities
        if len(p) != 3 or not all(math.isfinite(x) and 0.0 <= x <= 1.0 for x in p) or abs(sum(p) - 1.0) > 1e-6:
            raise ModelIncompatible(f"the probe decision gave no proper distribution: {p}")
        return result
