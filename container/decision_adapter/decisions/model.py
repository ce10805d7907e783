"""The decision model: a request's questions prepared, scored through the scheduler, and combined into answers.

``DecisionModel`` is what the protocols (the walkthrough's decision schema, System One) call: ``prepare`` (the
``Preparer``: rendering with the model's chat template, label checks at load, token budgets before anything is
evaluated), then ``score``: the request's jobs through the engine's scheduler (the one scoring path, for
requests, the start-up probe and the benchmarks alike), combined into probabilities (``combine``); or ``dry_run``:
what scoring would do now (each prompt's text and tokens, what the cache would serve, what the jobs would decode
and what admission would say), decoding nothing. It never
imports llama.cpp: the engine and the scheduler are handed in, typed by what this module needs of them
(``ScoringEngine``, ``JobScheduler``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol, Sequence, runtime_checkable

from ..engine.errors import TooLarge
from ..engine.plan import JobSpec, Plan
from ..engine.readout import LabelTrie, PromptScore, ScoreStats
from ..engine.scheduler import Admission
from ..errors import InputError, Loc
from .calibration import Calibration
from .combine import Answered, Defaults, Readouts, Scored, combine
from .debias import DEFAULT_FLOOR, DEFAULT_STRENGTH, MODES
from .labels import MAX_OPTIONS
from .decision_file import DecisionFile
from .letter import LetterReadout
from .literals import literal_pattern
from .model_files import ModelIdentity
from .prepare import Limits, Prepared, Preparer, Question, QuestionSource, Tokenizer, orderings
from .prompt import (DEFAULT_STYLE, STYLES, ChatTemplate, ModelIncompatible, PromptLayout, PromptStyle,
                     TemplateError)

__all__ = ["Answered", "DecisionModel", "DryPrompt", "DryRun", "JobScheduler", "Limits", "ModelIncompatible", "Prepared", "Question", "QuestionSource",
           "Readouts", "Scored", "ScoringEngine", "orderings", "prompt_layout"]


class Vocabulary(Tokenizer, Protocol):
    bos_text: str
    eos_text: str
    control_texts: tuple[str, ...]


@runtime_checkable
class ScoringEngine(Protocol):
    """What the decision model needs of an engine: its vocabulary and template, the resident head, and jobs."""

    vocabulary: Vocabulary
    chat_template: str | None
    ctx_tokens: int
    train_ctx_tokens: int
    layout: str  # how its jobs are laid out (engine.plan): every result's model reports it
    memory_info: dict[str, Any]  # its memory kind and the reuse that applies (engine.memory_kind)

    @property
    def resident_tokens(self) -> int: ...

    def keep_resident(self, tokens: Sequence[int]) -> None: ...

    def job_spec(self, prompts: Sequence[Sequence[int]], tries: Sequence[LabelTrie],
                 state: tuple[int, int] | None = None, stems: Sequence[int] | None = None) -> JobSpec: ...

    def plan(self, spec: JobSpec) -> Plan: ...

    def answer_from_cache(self, spec: JobSpec, *, touch: bool = True) -> tuple[list[PromptScore], ScoreStats] | None: ...

    def close(self) -> None: ...


@runtime_checkable
class JobScheduler(Protocol):
    """What the decision model needs of a scheduler: submit a job with a deadline, wait for its result."""

    def submit_all(self, jobs: Sequence[tuple[JobSpec, Plan]], *, deadline: float | None = None,
                   by_tokens: bool = True, allowed_s: float | None = None) -> list[Any]: ...

    def assess(self, jobs: Sequence[tuple[JobSpec, Plan]], *, deadline: float | None = None,
               by_tokens: bool = True, allowed_s: float | None = None) -> Admission: ...

    def result(self, ticket: Any) -> tuple[list[PromptScore], ScoreStats]: ...

    def cancel(self, ticket: Any) -> None: ...

    def stop(self, timeout_s: float = 30.0) -> bool: ...

    @property
    def alive(self) -> bool: ...


def prompt_layout(engine: ScoringEngine, style: PromptStyle) -> PromptLayout:
    """The model's prompt layout for ``style``, rendered once from its chat template (its ``version`` is what a
    calibration is bound to); ModelIncompatible when the template cannot render a decision."""
    vocabulary = engine.vocabulary
    try:
        return PromptLayout(ChatTemplate(engine.chat_template, bos_token=vocabulary.bos_text,
                                         eos_token=vocabulary.eos_text), style)
    except TemplateError as exc:
        raise ModelIncompatible(str(exc)) from None


@dataclass(frozen=True)
class DryPrompt:
    """One prompt a question would be scored with: its whole rendered text (the exact text whose SHA-256 is the
    answer's ``prompt_sha256`` when the question has one ordering), its tokens (the head's included), and the
    options it shows, in label order (indices into the request's options)."""

    text: str
    tokens: int
    order: tuple[int, ...]


@dataclass(frozen=True)
class DryRun:
    """What scoring a prepared request would do now, decoding nothing (``DecisionModel.dry_run``). Its figures are
    those the real run then reports, as long as nothing else changes the cache or the queue in between:
    ``cached_tokens`` is the answer's ``ScoreStats.cached_tokens`` (the resident head is never counted),
    ``decode_tokens`` the answer's ``ScoreStats.evaluated_tokens`` plus ``Answered.prior_tokens``."""

    prompts: tuple[tuple[DryPrompt, ...], ...]  # for each question, one per ordering, in Prepared's order
    digests: tuple[str, ...]  # for each question, its prompt_sha256 (NUL between its orderings' texts)
    cached_tokens: int  # the answer's tokens the cache would serve: its state, or the whole prompts it answers
    decode_tokens: int  # what the request's jobs would decode (the answer's and its priors'): what admission charges
    readout_tokens: int  # of those, the answer's label-path tokens (labels of several tokens)
    prior_tokens: int  # of those, the priors' jobs' (0 when the cache answers them)
    queued_tokens: int  # the tokens queued and running ahead of it (0 when it would not be queued)
    tokens_per_s: float | None  # the speed admission reckons with (None before the first job)
    estimate_s: float | None  # admission's estimate: the tokens ahead and its own at that speed (None: no speed)
    refusal: Exception | None  # what scoring would raise now (Busy, TooSlow, or an InputError: too large); None
    fewer: tuple[str | None, ...] = ()  # for each question, why fewer orderings than the default (Prepared.fewer)

    @property
    def admitted(self) -> bool:
        return self.refusal is None

    @property
    def prompt_tokens(self) -> int:
        """Every prompt's tokens, the head's included: the answers' ``input_tokens`` summed."""
        return sum(p.tokens for prompts in self.prompts for p in prompts)


class DecisionModel:
    def __init__(self, engine: ScoringEngine, scheduler: JobScheduler, identity: ModelIdentity, limits: Limits,
                 runtime: dict[str, Any], *, served_id: str = "", layout: PromptLayout | None = None,
                 calibration: Calibration | None = None, default_permutations: int = 1,
                 default_debias: str = "off", default_strength: float = DEFAULT_STRENGTH,
                 default_floor: float = DEFAULT_FLOOR, owns_engine: bool = True,
                 decision: DecisionFile | None = None):
        self.engine = engine
        self.owns_engine = owns_engine  # False: the engine was handed in (tests, benchmarks) and outlives the model
        self.scheduler = scheduler
        self.served_id = served_id or identity.file.removesuffix(".gguf")
        self.identity = identity
        self.limits = limits
        self.calibration = calibration  # a calibration.json fitted for this GGUF, prompt and orderings, if any
        self.defaults = Defaults(default_strength, default_floor)  # ADAPTER_DEBIAS_STRENGTH, ADAPTER_DEBIAS_FLOOR
        # What request validation refuses in text the model reads: the texts of the model's special tokens.
        self.control_tokens = literal_pattern(engine.vocabulary.control_texts)  # linear whatever their number
        # The model kind, chosen once from the file: a decision GGUF is answered by its type's rules
        # (decisions.letter), any other GGUF by this adapter's own readout. Every step that differs is bound here.
        self.letter: LetterReadout | None = None
        if decision is None:
            self.layout: PromptLayout | None = layout or prompt_layout(engine, STYLES[DEFAULT_STYLE])
            self.prompt_version = self.layout.version
            self.preparer: Any = Preparer(engine, engine.vocabulary, self.layout, limits,
                                          default_permutations=default_permutations,  # ADAPTER_PERMUTATIONS
                                          default_debias=MODES[default_debias])  # ADAPTER_DEBIAS
            self.kind_info: dict[str, Any] = {"kind": "chat", "rules": "decision-adapter (its own prompt and readout)"}
            self._combine = self._own_combine
            self._prompt_text = self._own_prompt_text
            self.max_options = MAX_OPTIONS
        else:
            self.letter = LetterReadout(decision, engine, engine.vocabulary, limits, engine.vocabulary.control_texts,
                                         self.defaults)
            self.layout = None
            self.prompt_version = self.letter.version
            self.preparer = self.letter.preparer
            self.kind_info = self.letter.describe()
            self._combine = self.letter.combine
            self._prompt_text = self.letter.text
            self.max_options = self.letter.max_options
        engine.keep_resident(self.preparer.head_tokens)
        self._model_info = {**identity.as_dict(), **runtime, "prompt_version": self.prompt_version, **self.kind_info}
        self.text_bytes_per_token: float | None = None  # measured by the start-up probe

    @property
    def model_info(self) -> dict[str, Any]:
        """What every answer and /ping say of the model; its memory's reuse read now (a refused cut turns
        prefixes and stems off while the server runs)."""
        return {**self._model_info, **self.engine.memory_info}

    @property
    def prompt_ceiling(self) -> int:
        """Most tokens one rendered prompt may have: the setting, the context and the training context."""
        return self.preparer.ceiling

    @property
    def default_permutations(self) -> int:
        return self.preparer.default_permutations

    def close(self) -> None:
        """Stop the scheduler (its queued jobs run first) and free the engine where this model owns it, once no
        job can run on it: a scheduler thread that will not end keeps the engine (a leak, never a decode on freed
        memory)."""
        if self.scheduler.stop() and self.owns_engine:
            self.engine.close()

    def labels(self, n_options: int, kind: str | None = None) -> tuple[str, ...]:
        return self.preparer.labels(n_options, kind)

    def trie(self, n_options: int, kind: str | None = None) -> LabelTrie:
        return self.preparer.trie(n_options, kind)

    def render(self, state: str, question: str, labels: Sequence[str], options: Sequence[str]) -> str:
        """The whole prompt's text (its SHA-256 is the answer's ``prompt_sha256``); this adapter's own readout."""
        if self.layout is None:
            raise TypeError("a decision GGUF's prompts are its template's: see prompt_text")
        return self.layout.render(self.layout.user_payload(state, question, labels, options))

    def prompt_text(self, prepared: Prepared, k: int) -> str:
        """Prompt ``k`` of a prepared request, its whole text as it was hashed."""
        return self._prompt_text(prepared, k)

    def _own_combine(self, prepared: Prepared, read: Readouts) -> list[Scored]:
        return combine(prepared, read, self.calibration, self.defaults)

    def _own_prompt_text(self, prepared: Prepared, k: int) -> str:
        q, order = prepared.questions[prepared.owners[k]], prepared.orders[k]
        return self.render(q.state, q.question, self.labels(len(order), q.kind), [q.options[j] for j in order])

    def prepare(self, questions: Sequence[Question], allowed_s: float | None = None) -> Prepared:
        """Render, tokenize, budget and plan the questions over their one state (``Preparer.prepare``), held to
        what any request may take here (``allowed_s``: admission's estimate of the work, as ``score`` will hold it;
        None: not checked here). The server's default number of orderings is a preference: where it would take the
        request over its token budget or that time, the questions that did not ask for a number get the largest
        that fits (at least 1), and ``Prepared.fewer`` says why (``_fewer_orderings``); a request's own number that
        does not fit the token budget is refused, naming the largest that would. Time only chooses the default's
        number here: work too slow with one ordering each, or with the request's own numbers, is admission's
        refusal (``score``'s 4xx, and what a dry run reports), never this one's."""
        sizing = allowed_s if self._default_applies(questions) else None
        try:
            return self._fitting(questions, sizing)
        except InputError as exc:
            if exc.kind not in ORDERINGS_MATTER:
                raise
            return self._fewer_orderings(questions, sizing, exc)

    def _default_applies(self, questions: Sequence[Question]) -> bool:
        """Whether the server's default number of orderings, more than one, applies to one of ``questions``."""
        return self.default_permutations > 1 and any(q.permutations is None for q in questions)

    def _fitting(self, questions: Sequence[Question], allowed_s: float | None) -> Prepared:
        """The questions prepared, and their work within ``allowed_s`` by admission's cost model (the ``TooLarge``
        that ``score`` would meet, as its 4xx), or the InputError that says which limit they are over."""
        prepared = self.preparer.prepare(questions)
        if allowed_s is not None:
            jobs, _, missing = self._jobs(prepared, touch=False)
            refusal = self.scheduler.assess([jobs[i] for i in missing], allowed_s=allowed_s,
                                            by_tokens=False).refusal
            if isinstance(refusal, TooLarge):
                raise too_large(prepared.loc, refusal)
        return prepared

    def _fewer_orderings(self, questions: Sequence[Question], allowed_s: float | None,
                         refused: InputError) -> Prepared:
        """``refused`` (over the token budget, or too slow for any deadline here) with fewer orderings: the
        questions on the server's default get the largest number that fits, the same for all of them; a question
        that asked for its own number keeps it. Where even one ordering each does not fit and a question asked for
        more than one, the request is refused naming at most how many would fit (found from the bound below
        its work, ``within_budget``); else ``refused`` stands."""
        default = self.default_permutations
        if self._default_applies(questions):  # one ordering each is held to the token budget alone (``prepare``)
            found = largest_fitting(default - 1, lambda k: self._fitting(
                [q if q.permutations is not None else replace(q, permutations=k) for q in questions],
                allowed_s if k > 1 else None))
            if found is not None:
                k, prepared = found

                def why(q: Question) -> str:
                    return (f"{min(k, len(q.options))} of the server's {min(default, len(q.options))} orderings "
                            f"(ADAPTER_PERMUTATIONS): with {default}, the request {refused.msg}")

                return replace(prepared, fewer=tuple(why(q) if q.permutations is None and k < len(q.options)
                                                     else None for q in questions))
        asked = max((q.permutations or 1 for q in questions), default=1)
        if asked > 1:
            found = largest_fitting(asked - 1, lambda k: self.preparer.within_budget(
                [replace(q, permutations=min(k, q.permutations or 1)) for q in questions]))
            fits = (f"at most {found[0]} orderings would fit" if found is not None
                    else "not even one ordering would fit")
            raise InputError(refused.loc, f"{refused.msg}, with the {asked} orderings the request asks for "
                             f"(permutations, x_permutations); {fits}", kind=refused.kind)
        raise refused

    def score(self, prepared: Prepared, deadline: float | None = None, *, by_tokens: bool = True,
              allowed_s: float | None = None) -> Answered:
        """Score through the scheduler before ``deadline`` (``time.monotonic()``; None: none) and combine each
        question's answer (``readouts``, then ``combine``). Raises what ``readouts`` raises."""
        read = self.readouts(prepared, deadline, by_tokens=by_tokens, allowed_s=allowed_s)
        results = self._combine(prepared, read)
        return Answered(results, read.stats, read.queue_s, read.prior_stats, read.jobs)

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
        jobs, done, missing = self._jobs(prepared)
        queue_s = 0.0
        if missing:
            try:
                tickets = self.scheduler.submit_all([jobs[i] for i in missing], deadline=deadline,
                                                    by_tokens=by_tokens, allowed_s=allowed_s)
            except TooLarge as exc:
                raise too_large(prepared.loc, exc) from None
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

    def dry_run(self, prepared: Prepared, deadline: float | None = None, *, by_tokens: bool = True,
                allowed_s: float | None = None) -> DryRun:
        """What ``score`` would do now with the same arguments, decoding and queueing nothing: each prompt's
        rendered text and tokens, the tokens the cache would serve, what the request's jobs would decode (each job
        the cache answers whole: nothing; the others as the scheduler foresees them, ``Scheduler.assess``), and
        what admission would say, as ``readouts`` would raise it (a request too large for any deadline here: the
        same InputError)."""
        jobs, done, missing = self._jobs(prepared, touch=False)
        admission = self.scheduler.assess([jobs[i] for i in missing], deadline=deadline, by_tokens=by_tokens,
                                          allowed_s=allowed_s)
        plans = dict(zip(missing, admission.plans))
        answer = plans.get(0)
        if answer is None:
            cached, readout = done[0][1].cached_tokens, 0
        else:  # as Runner.finish counts them: the state restored, and the whole prompts answered (no own token)
            spec = prepared.spec
            cached = answer.cached_tokens + sum(len(prompt) - spec.head
                                                for prompt, own in zip(spec.prompts, answer.own_tokens) if own == 0)
            readout = answer.readout_tokens
        refusal: Exception | None = admission.refusal
        if isinstance(refusal, TooLarge):
            refusal = too_large(prepared.loc, refusal)
        return DryRun(tuple(tuple(self._dry_prompt(prepared, k) for k in prepared.prompts_of(i))
                            for i in range(len(prepared.questions))),
                      prepared.digests, cached, admission.tokens, readout,
                      sum(plan.tokens for i, plan in plans.items() if i > 0), admission.queued_tokens,
                      admission.tokens_per_s, admission.estimate_s, refusal, prepared.fewer)

    def _jobs(self, prepared: Prepared, *, touch: bool = True) -> tuple[list[tuple[JobSpec, Plan]], list[Any],
                                                                        list[int]]:
        """The request's jobs (its answer's, then its priors'), what the cache answers of them whole (None where
        it does not), and the indices of those it does not: the jobs to queue. ``touch=False``: looked up without
        using the cache (a dry run)."""
        jobs = [(prepared.spec, prepared.plan), *((p.spec, p.plan) for p in prepared.priors)]
        done = [self.engine.answer_from_cache(spec, touch=touch) for spec, _ in jobs]
        return jobs, done, [i for i, d in enumerate(done) if d is None]

    def _dry_prompt(self, prepared: Prepared, k: int) -> DryPrompt:
        """Prompt ``k`` rendered again from its question, ordering and labels (the text ``prepare`` hashed)."""
        return DryPrompt(self.prompt_text(prepared, k), len(prepared.tokens[k]), prepared.orders[k])


# The refusals a smaller number of orderings can lift: the request's token budget and what it may take in time.
ORDERINGS_MATTER = ("value_error.request_too_long", "value_error.request_too_slow")


def largest_fitting(most: int, attempt: Any) -> tuple[int, Any] | None:
    """The largest k in 1 .. ``most`` for which ``attempt(k)`` prepares (and its result), by bisection: work grows
    with the orderings, so whatever fits with k fits with fewer. None when even 1 does not. Any refusal other than
    those fewer orderings can lift goes up."""
    found, low, high = None, 1, most
    while low <= high:
        k = (low + high) // 2
        try:
            found, low = (k, attempt(k)), k + 1
        except InputError as exc:
            if exc.kind not in ORDERINGS_MATTER:
                raise
            high = k - 1
    return found


def too_large(loc: Loc, exc: TooLarge) -> InputError:
    """Work that can never fit what a request may take here: a 4xx saying what it needs, never a retryable 503."""
    return InputError(loc, f"needs {exc.tokens} tokens of evaluation, about {exc.needed_s:.0f} s at the "
                      f"{exc.tokens_per_s:.0f} tokens/s this server measures; a request here may take "
                      f"{exc.allowed_s:.0f} s (about {exc.allowed_tokens} tokens): split it into smaller "
                      f"requests", kind="value_error.request_too_slow")
