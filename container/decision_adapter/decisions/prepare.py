"""Preparing a request: its questions rendered, tokenized, held to the budgets and planned, before any evaluation.

Every prompt is head + state + question + tail: the head and the tail are the template's own text (their special
tokens parsed), tokenized once at load; the state and each question in each ordering of its options are the
request's, tokenized as text, each on its own so that a boundary never depends on the other questions. A text is
sized from its bytes before it is tokenized (``Tokenizer.fewest_tokens``: a token holding a given byte spells at
most so many bytes, read from the vocabulary at load), so a prompt over the limit is refused in bounded time and
memory: 660 KB of prose was tokenized whole (150,000 tokens) under the bound of the longest piece alone. Each question's debias mode and ordering count are
resolved here once and carried on ``Prepared``; a question whose mode has a prior gets the prior's prompts (the
state, and for a label prior the question too, replaced by content-free text) in a job of their own.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from ..engine.errors import PlanError
from ..engine.plan import JobSpec, Plan
from ..engine.readout import LabelTrie, common_prefix
from ..errors import InputError, Loc
from .debias import PRIORS, DebiasMode, content_free
from .labels import PAIRED, SINGLE
from .literals import literal_pattern
from .prompt import DIGITS, ModelIncompatible, PromptLayout, state_segment


class Tokenizer(Protocol):
    user_defined_texts: tuple[str, ...]

    def fewest_tokens(self, text: str) -> int: ...

    def tokenize(self, text: str, *, special: bool = False, bos: bool = False) -> list[int]: ...

    def piece(self, token: int) -> bytes: ...


def text_tokens(tokenizer: Tokenizer, user_defined: re.Pattern[str] | None, text: str) -> list[int]:
    """``text`` (the request's) tokenized as text. llama.cpp splits a user-defined added token's text out of any
    text, special texts parsed or not (llama-vocab.cpp, ``tokenizer_st_partition``); so each occurrence of one
    (``user_defined``: their pattern) is cut (``cut_inside``) and the pieces are tokenized on their own: none becomes
    the token. A text without one is tokenized whole."""
    if user_defined is None:
        return tokenizer.tokenize(text)
    cuts, match = [], user_defined.search(text)
    while match:
        cuts.append(match.start() + cut_inside(match.group()))
        match = user_defined.search(text, match.start() + 1)
    return tokenized_in_pieces(tokenizer, text, cuts)


def cut_inside(literal: str) -> int:
    """Where to cut a user-defined added token's text so that neither piece holds it: where a run of letters in it
    ends before a character that is no letter or space (a word boundary of the BPE pre-tokenizers: ``<tool`` |
    ``_call>``), else after its first character."""
    return next((i for i in range(1, len(literal)) if literal[i - 1].isalpha()
                 and not (literal[i].isalpha() or literal[i].isspace())), 1)


def tokenized_in_pieces(tokenizer: Tokenizer, text: str, cuts: Sequence[int], *, special: bool = False) -> list[int]:
    """``text`` cut at ``cuts`` and each piece tokenized on its own (whole when there are no cuts)."""
    if not cuts:
        return tokenizer.tokenize(text, special=special)
    bounds = [0, *sorted(set(cuts)), len(text)]
    return [token for a, b in zip(bounds, bounds[1:]) for token in tokenizer.tokenize(text[a:b], special=special)]


def scored_priors(questions: Sequence[Question], modes: Sequence[DebiasMode]) -> tuple[list[int], set[int]]:
    """Which questions get a prior scored (their mode has one), and which of those with a state prior do not: their
    state carries no content (``debias.content_free``), so the prior's prompt would be (nearly) their own
    (``Prepared.no_prior``). Every readout's preparer selects its priors' questions here."""
    scored, no_prior = [], set()
    for i, (q, mode) in enumerate(zip(questions, modes)):
        if not mode.active:
            continue
        if mode.question is None and content_free(q.state):
            no_prior.add(i)
        else:
            scored.append(i)
    return scored, no_prior


def planned(engine: Any, where: Loc, spec: JobSpec) -> Plan:
    """The engine's plan of a job; a job no plan can hold is the request's 4xx (``request_too_large``) at ``where``."""
    try:
        return engine.plan(spec)
    except PlanError as exc:
        raise InputError(where, str(exc), kind="value_error.request_too_large") from None


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


@dataclass(frozen=True)
class Limits:
    max_prompt_tokens: int
    max_request_tokens: int


@dataclass(frozen=True)
class QuestionSource:
    """A question as the request sent it, for rules that render the request's own JSON values (a decision GGUF's
    template, ``decisions.letter``): its id, its System One type, its instructions, the state and each option's key
    and description as sent (JSON values; a description left out is None). The decision schema sends a choice."""

    id: str
    type: str  # noul, choice or score
    instructions: Any
    state: Any
    options: tuple[tuple[str, Any], ...]  # (key, description) in the request's order; noul: true, then false


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
    source: QuestionSource | None = field(default=None, compare=False)  # as sent (decision GGUFs render it)


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
    request_tokens: int  # what the plans decode when nothing is cached: the state once, each prompt's own, priors
    state: tuple[int, int]  # the span of tokens every prompt has whatever its question: its state
    tries: tuple[LabelTrie, ...]
    orders: tuple[tuple[int, ...], ...]  # for each prompt, the option (request index) shown at each position
    owners: tuple[int, ...]  # for each prompt, the index of its question
    digests: tuple[str, ...]  # for each question, the SHA-256 of its rendered prompts (NUL between orderings)
    spec: JobSpec
    plan: Plan
    modes: tuple[DebiasMode, ...]  # for each question, its debias mode (its own, or the server's default)
    permutations: tuple[int, ...]  # for each question, the orderings it asked for (its own, or the default)
    priors: tuple[PriorJob, ...] = ()  # the content-free priors' jobs, one per content-free prompt kind
    # The questions with a state prior whose state carries no content (an empty state, N/A, ...:
    # ``debias.content_free``): the prior's prompt would be (nearly) their own, and their content sits in the
    # question. No prior is scored for them, and they are answered as with debias off.
    no_prior: frozenset[int] = frozenset()
    loc: Loc = ()  # where errors about the request as a whole point (the decision, or the decisions)
    # For each question scored in fewer orderings than the server's default because the default would not fit
    # (``DecisionModel.prepare``): why; None where it got what it asked for or the default. (): none fewer.
    fewer: tuple[str | None, ...] = ()

    def fewer_orderings(self, question: int) -> str | None:
        """Why question ``question`` got fewer orderings than the server's default, or None."""
        return self.fewer[question] if self.fewer else None

    def prompts_of(self, question: int) -> list[int]:
        """The indices of question ``question``'s prompts (one per ordering)."""
        return [k for k, owner in enumerate(self.owners) if owner == question]


def label_tokens(tokenizer: Tokenizer, layout: PromptLayout, tail_tokens: Sequence[int]) -> dict[str, tuple[int, ...]]:
    """Each label's tokens where the answer begins (after the tail), checked at start-up: appending a label keeps
    the tail's tokens, the label's tokens spell it exactly, single labels are one token each, and no label's
    tokens are a prefix of another's; ModelIncompatible otherwise."""
    base = list(tail_tokens)
    found: dict[str, tuple[int, ...]] = {}
    digits = DIGITS if layout.style.score_digits else ()
    for label in SINGLE + PAIRED + digits:
        tokens = tokenizer.tokenize(layout.tail + label, special=True)
        if tokens[:len(base)] != base:
            raise ModelIncompatible(f"appending the answer label {label!r} changes how the prompt tokenizes")
        own = tuple(tokens[len(base):])
        spelled = b"".join(tokenizer.piece(t) for t in own).decode("utf-8", "replace")
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


class Budget:
    """The tokens a request makes the model evaluate, counted as its prompts are tokenized: over the request
    limit, the request is refused at once."""

    def __init__(self, limit: int, where: Loc):
        self.limit, self.where, self.tokens = limit, where, 0

    def add(self, tokens: int, *, check: bool = True) -> None:
        self.tokens += tokens
        if check:
            self.check(self.tokens)

    def check(self, tokens: int) -> None:
        """Refuse the request when ``tokens`` (what it makes the model evaluate, or a bound below that) are over the
        limit."""
        if tokens > self.limit:
            raise InputError(self.where, f"needs at least {tokens} tokens of evaluation, over the request "
                             f"limit of {self.limit}", kind="value_error.request_too_long")


class Assembly:
    """One job's prompts put together as they are tokenized, whichever readout rendered them (this adapter's own
    prompt, a decision GGUF's template): per prompt its tokens, where its state ends (its span: the tokens every
    question over the same state has), where its stem ends (what its orderings share) and its label trie, the
    request's ``Budget`` fed as each is added (the state once, each prompt's own tokens and label paths), and the
    job's spec: its state the prompts' span, each prompt laid out from it, whatever else the request holds."""

    def __init__(self, engine: Any, budget: Budget, head: int, *, check: bool = True):
        self.engine, self.budget, self.head, self.check = engine, budget, head, check
        self.tokens: list[tuple[int, ...]] = []
        self.tries: list[LabelTrie] = []
        self.spans: list[int] = []
        self.stems: list[int] = []

    def add(self, tokens: Sequence[int], trie: LabelTrie, span: int, stem: int | None = None) -> None:
        """A prompt of ``tokens`` whose state ends at ``span`` and whose stem (None: none) at ``stem``; refused at
        once (the budget's InputError) when it takes the request over its limit."""
        if not self.spans:
            self.budget.add(span - self.head, check=self.check)  # the head is resident: never decoded for a request
        self.budget.add(len(tokens) - span + sum(len(path) for path in trie.inner_nodes), check=self.check)
        self.tokens.append(tuple(tokens))
        self.tries.append(trie)
        self.spans.append(span)
        self.stems.append(span if stem is None else stem)

    def spec(self) -> JobSpec:
        """The job of the prompts added: its state their span (the shortest, where a template made them differ), each
        prompt's stem kept where it reaches past it."""
        span = min(self.spans)
        return self.engine.job_spec(self.tokens, self.tries, (self.head, span), self.stems)


class Preparer:
    """Turns a request's questions into a ``Prepared``, or an ``InputError`` naming the field over a limit."""

    def __init__(self, engine: Any, tokenizer: Tokenizer, layout: PromptLayout, limits: Limits, *,
                 default_permutations: int, default_debias: DebiasMode):
        self.engine = engine  # job_spec and plan (decisions.model.ScoringEngine)
        self.tokenizer = tokenizer
        self.layout = layout
        self.limits = limits
        self.default_permutations = default_permutations
        self.default_debias = default_debias
        self.user_defined = literal_pattern(tokenizer.user_defined_texts)
        self.head_tokens = tuple(tokenizer.tokenize(layout.head, special=True, bos=True))
        self.tail_tokens = tuple(tokenizer.tokenize(layout.tail, special=True))
        # The content-free states the priors put in place of the state (debias.PRIORS): fixed text, tokenized once.
        self.content_free_tokens = {text: tuple(tokenizer.tokenize(state_segment(text)))
                                    for mode in PRIORS.values() for text in mode.states}
        self.ceiling = min(limits.max_prompt_tokens, engine.ctx_tokens - 2, engine.train_ctx_tokens)
        self.label_tokens = label_tokens(tokenizer, layout, self.tail_tokens)
        self._tries: dict[tuple[str, ...], LabelTrie] = {}

    def labels(self, n_options: int, kind: str | None = None) -> tuple[str, ...]:
        return self.layout.style.labels(n_options, kind)

    def trie(self, n_options: int, kind: str | None = None) -> LabelTrie:
        labels = self.labels(n_options, kind)
        if labels not in self._tries:
            self._tries[labels] = LabelTrie.build(self.label_tokens[label] for label in labels)
        return self._tries[labels]

    def debias_mode(self, question: Question) -> DebiasMode:
        return PRIORS[question.debias] if question.debias is not None else self.default_debias

    def prepare(self, questions: Sequence[Question]) -> Prepared:
        """Tokenize and plan the questions over their one state, stopping at the first over a limit: the state
        is sized from its bytes, tokenized once, then each question's prompt in each ordering on its own. The text
        is validated already (the protocols refuse the model's special tokens where they parse it)."""
        if len({q.state for q in questions}) != 1:
            raise ValueError("the questions of one request share one state")
        first = questions[0]
        where = first.loc[:-1] if len(questions) > 1 else first.loc
        head, tail = self.head_tokens, self.tail_tokens
        state_text = state_segment(first.state)
        self._bound(first.loc, state_text, self.ceiling - len(head) - len(tail) - 1)  # and 1 question token
        state = tuple(self._text(state_text))
        if len(head) + len(state) + len(tail) + 1 > self.ceiling:
            raise self._too_long(first.loc, f"a prompt of more than {len(head) + len(state) + len(tail)} tokens")
        budget = Budget(self.limits.max_request_tokens, where)
        answer = Assembly(self.engine, budget, len(head))
        fixed = tuple(t.encode("utf-8") for t in (self.layout.head, state_text, self.layout.tail))
        orders, owners, digests = [], [], []
        permutations = tuple(q.permutations or self.default_permutations for q in questions)
        span = (len(head), len(head) + len(state))
        for i, q in enumerate(questions):
            digest = hashlib.sha256()
            stem = self._stem_tokens(q.question)
            for k, order in enumerate(orderings(q.option_keys or q.options, permutations[i])):
                text = self.layout.question_segment(q.question, self.labels(len(order), q.kind),
                                                    [q.options[j] for j in order])
                self._bound(q.loc, text, self.ceiling - len(head) - len(state) - len(tail))
                own = tuple(self._text(text)) + tail
                if len(head) + len(state) + len(own) > self.ceiling:
                    raise self._too_long(q.loc, f"a prompt of {len(head) + len(state) + len(own)} tokens")
                answer.add(head + state + own, self.trie(len(order), q.kind), span[1],
                           span[1] + common_prefix([own, stem]))
                orders.append(order)
                owners.append(i)
                digest.update(b"\0" if k else b"")
                for part in (fixed[0], fixed[1], text.encode("utf-8"), fixed[2]):
                    digest.update(part)
            digests.append(digest.hexdigest())
        tokens, tries, stems = answer.tokens, answer.tries, [stem - span[1] for stem in answer.stems]
        spec = answer.spec()
        plan = self._plan(where, spec)
        modes = tuple(self.debias_mode(q) for q in questions)
        priors, no_prior = self._priors(questions, modes, tokens, tries, orders, owners, span, where, budget, stems)
        # What the plans decode: the budget above counted each ordering's stem again (a bound on it, checked while
        # tokenizing); the plans decode a stem once for a question's orderings.
        planned = plan.tokens + sum(p.plan.tokens for p in priors)
        return Prepared(tuple(questions), tuple(tokens), planned, span, tuple(tries), tuple(orders),
                        tuple(owners), tuple(digests), spec, plan, modes, permutations, tuple(priors),
                        frozenset(no_prior), where)

    def within_budget(self, questions: Sequence[Question]) -> None:
        """Raise what ``prepare`` raises for ``questions`` (the state's tokens are shared by every prompt here, so
        preparing is already linear in the request: no cheaper bound is needed)."""
        self.prepare(questions)

    def _priors(self, questions: Sequence[Question], modes: Sequence[DebiasMode], tokens: list[tuple[int, ...]],
                tries: list[LabelTrie], orders: list[tuple[int, ...]], owners: list[int], span: tuple[int, int],
                where: Loc, budget: Budget, stems: list[int]) -> tuple[list[PriorJob], set[int]]:
        """The prior jobs: each content-free prompt kind once, with the prompts (options, ordering, tail, and for a
        state prior the question) of every question whose mode averages it; and the questions with a state prior
        whose state carries no content (none is scored for them: ``Prepared.no_prior``). Their tokens go into the
        budget as if none were cached, so that what is refused never depends on the cache. ``stems``: the length
        of each prompt's stem (its question, shared by its orderings); a label prior's is its replacement's."""
        head, tail = self.head_tokens, self.tail_tokens
        members: dict[tuple[str, str | None], list[tuple[int, tuple[int, ...]]]] = {}
        scored, no_prior = scored_priors(questions, modes)
        for i in scored:
            q, mode = questions[i], modes[i]
            mine = [k for k, owner in enumerate(owners) if owner == i]
            if mode.question is None:  # a state prior: the question's own tokens after the state
                own = {k: tokens[k][span[1]:] for k in mine}
                stem = {k: stems[k] for k in mine}
            else:  # a label prior: the question replaced, the options in each ordering kept
                own = {k: tuple(self._text(self.layout.question_segment(
                    mode.question, self.labels(len(orders[k]), q.kind), [q.options[j] for j in orders[k]]))) + tail
                    for k in mine}
                replaced = self._stem_tokens(mode.question)
                stem = {k: common_prefix([own[k], replaced]) for k in mine}
            for text in mode.states:
                members.setdefault((text, mode.question), []).extend(
                    (k, head + self.content_free_tokens[text] + own[k], stem[k]) for k in mine)
        priors = []
        for (text, question_text), rows in members.items():
            state_end = len(head) + len(self.content_free_tokens[text])
            prior = Assembly(self.engine, budget, len(head), check=False)  # its state: checked with its first prompt
            for k, prompt, stem in rows:
                if len(prompt) > self.ceiling:
                    raise self._too_long(questions[owners[k]].loc, f"a prior prompt of {len(prompt)} tokens")
                prior.add(prompt, tries[k], state_end, state_end + stem)
                budget.check(budget.tokens)
            prior_spec = prior.spec()
            priors.append(PriorJob(text, tuple(k for k, _, _ in rows), prior_spec, self._plan(where, prior_spec),
                                   question_text))
        return priors, no_prior

    def _stem_tokens(self, question: str) -> tuple[int, ...]:
        """The tokens of what every ordering of ``question``'s options starts with; a prompt's stem is as much of
        them as its own tokens begin with (a token the first option's line merges with is left to the rest)."""
        return tuple(self._text(self.layout.question_stem(question)))

    def _text(self, text: str) -> list[int]:
        return text_tokens(self.tokenizer, self.user_defined, text)

    def _plan(self, where: Loc, spec: JobSpec) -> Plan:
        return planned(self.engine, where, spec)

    def _bound(self, loc: Loc, text: str, room: int) -> None:
        """Refuse ``text`` without tokenizing it when its bytes alone prove it longer than ``room`` tokens."""
        at_least = self.tokenizer.fewest_tokens(text)
        if at_least > room:
            raise self._too_long(loc, f"a prompt of more than {self.ceiling} tokens (this text alone is at least "
                                 f"{at_least})")

    def _too_long(self, loc: Loc, what: str) -> InputError:
        return InputError(loc, f"renders to {what}, over the limit of {self.ceiling}",
                          kind="value_error.prompt_too_long")
