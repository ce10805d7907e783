"""The letter readout of decision GGUFs (types ``lev`` and ``openjev``): a peer of this adapter's own readout.

A decision GGUF is answered by its type's rules, as llama.cpp's server (b11361+) answers it, on the weights the
bundled llama.cpp runs unchanged:

- the prompt is the file's ``tokenizer.chat_template.systemone`` template, rendered in a sandboxed Jinja
  environment with the request's own JSON values (``id``, ``type``, ``instructions``, ``state``, ``options`` of
  ``{key, description, label?}``, ``images``), then tokenized whole with special tokens parsed and no BOS added
  (the template writes what the model expects); user text cannot carry control tokens (the protocols refuse it),
  and the text of a user-defined added token (Qwen2.5's ``<tool_call>``) in a request's value is read as text, as on
  the plain route (``LetterPreparer.prompt_tokens``; llama-server would make it the token);
- the options are labelled with the type's label set (``LetterRules.labels``) and read as the logits of those
  labels' single tokens at the last prompt position;
- each variant is a softmax in float64 at the file's temperature for the question type and option-count bucket;
  lev shows a choice twice (forward and reversed) and averages the two; lev reads ``noul`` from 9 rating labels
  ``A..I`` as ``sum(p_i * i / 8)``, openjev shows ``noul`` true first;
- the answers' confidences are TypeSafe's published formulas.

This adapter's order averaging and debiasing apply only when a request asks for them (``x_permutations`` /
``permutations``, ``x_debias`` / ``debias``; the server's defaults, ADAPTER_PERMUTATIONS and ADAPTER_DEBIAS, are for
plain models): K orderings (``prepare.orderings``) replace the type's variants, each read by the type's softmax
and averaged as the type averages its variants; a prior is the same prompts rendered with the state (and, for a label
prior, the instructions) replaced by content-free text, read the same way, floored, raised to the strength and
divided out. A score's levels and lev's ratings keep their order (more than one ordering is refused there). No
``calibration.json``: the file's temperatures are its calibration. ``combine_question`` is pure; the arithmetic is in small functions
(``variant_probabilities``, ``average_variants``, ``lev_noul``, ...) whose every sum runs in the order llama.cpp's
runs it, so the same logits give the same bits.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import string
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import jinja2
import numpy as np
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..engine.memory_kind import MemoryKind
from ..engine.readout import LabelTrie, common_prefix, softmax
from ..errors import InputError
from .combine import Defaults, Readouts, Scored
from .debias import MODES, OFF, DebiasMode, floored
from .decision_file import DecisionFile
from .literals import literal_pattern
from .prepare import (Assembly, Budget, Limits, Prepared, PriorJob, Question, QuestionSource, Tokenizer, cut_inside,
                      orderings, planned, scored_priors, tokenized_in_pieces)
from .prompt import ModelIncompatible, TemplateError

LEV_RATINGS = 9  # lev reads noul from a rating scale: A = certainly no .. I = certainly yes
OPENJEV_LABELS = tuple(string.ascii_uppercase + string.ascii_lowercase)
LEV_CODES = tuple(string.ascii_uppercase) + tuple(a + b for a in string.ascii_uppercase for b in string.ascii_uppercase)
MAX_LABELS = 255


# ---- the type's rules: labels, variants, buckets, temperatures, answers (pure) ----------------------------------

@dataclass(frozen=True)
class LetterRules:
    """One letter-readout type's rules over a vocabulary: its label texts (those it may use, in order) and the
    file's temperatures."""

    type: str
    labels: tuple[str, ...]
    temperatures: Mapping[str, float] = field(default_factory=dict)

    @property
    def max_options(self) -> int:
        return len(self.labels)

    @property
    def noul_true_first(self) -> bool:
        return self.type == "openjev"

    @property
    def shows_labels(self) -> bool:
        """lev's template is handed each option's label; openjev's template letters the options itself."""
        return self.type == "lev"

    def outputs(self, question_type: str, n_options: int) -> int:
        """How many labels are read: lev's noul reads 9 ratings, every other question one label per option."""
        return LEV_RATINGS if self.type == "lev" and question_type == "noul" else n_options

    def variants(self, question_type: str, n_options: int) -> int:
        """lev shows a choice in two orders (forward, then reversed) to cancel its preference for the first label."""
        return 2 if self.type == "lev" and question_type == "choice" and n_options > 1 else 1

    def bucket(self, n_options: int) -> str:
        if self.type == "lev":
            return "small" if n_options <= 8 else "mid" if n_options <= 26 else "large"
        return "2" if n_options <= 2 else "3_5" if n_options <= 5 else "6_10" if n_options <= 10 else "11"

    def temperature(self, question_type: str, n_options: int) -> float:
        """The file's temperature for ``<type>.<bucket>``, else for ``<type>``, else 1."""
        for name in (f"{question_type}.{self.bucket(n_options)}", question_type):
            if name in self.temperatures:
                return self.temperatures[name]
        return 1.0

    def describe(self) -> str:
        order = ("each choice read forward and reversed, the two averaged; noul from 9 rating labels A..I as "
                 "sum(p_i*i/8)" if self.type == "lev" else "noul shown true first")
        return (f"decision GGUF rules ({self.type}): the file's systemone template, softmax in float64 at the file's "
                f"temperature over the logits of the type's single-token labels at the last prompt position; "
                f"{order}; no tokens generated")


def rules_for(decision: DecisionFile, tokenizer: Tokenizer) -> LetterRules:
    """The type's label set on this vocabulary, checked at load: openjev needs each of ``A-Z a-z`` to be one
    token; lev takes ``A..Z`` then ``AA..ZZ``, those that are one token, at most 255."""
    if decision.type == "openjev":
        for label in OPENJEV_LABELS:
            if len(tokenizer.tokenize(label)) != 1:
                raise ModelIncompatible(f"decision label {label!r} is not a single token (openjev needs A-Z a-z)")
        labels = OPENJEV_LABELS
    else:
        labels = tuple(code for code in LEV_CODES if len(tokenizer.tokenize(code)) == 1)[:MAX_LABELS]
        if len(labels) < LEV_RATINGS:
            raise ModelIncompatible(f"lev needs at least {LEV_RATINGS} single-token labels; this vocabulary has "
                                    f"{len(labels)}")
    return LetterRules(decision.type, labels, dict(decision.temperatures))


def variant_probabilities(logits: Sequence[float], temperature: float) -> list[float]:
    """One variant's softmax as llama.cpp computes it: the distance to the top logit in float32, the rest in
    float64 at ``temperature``; returns each output's weight over the sum."""
    s = np.asarray(logits, dtype=np.float32)
    top = s.max()
    weights = [float(np.exp(np.float64(x - top) / np.float64(temperature))) for x in s]
    total = 0.0
    for w in weights:
        total += w
    return [w / total for w in weights]


def average_aligned(variants: Sequence[Sequence[float]], orders: Sequence[Sequence[int]], n: int) -> list[float]:
    """The variants' distributions averaged in the request's option order: variant ``v`` shows option
    ``orders[v][position]`` at each position; summed in variant order, as llama.cpp sums its variants (for lev's
    forward and reversed pair the same additions as ``average_variants``, so the same bits)."""
    count = len(variants)
    out = [0.0] * n
    for p, order in zip(variants, orders):
        for position, option in enumerate(order):
            out[option] += p[position] / count
    return out


def average_variants(variants: Sequence[Sequence[float]]) -> list[float]:
    """The variants' distributions averaged, each in its variant's position order mapped back (the second
    variant shows the outputs reversed), summed in variant order as llama.cpp sums them."""
    n, count = len(variants[0]), len(variants)
    out = [0.0] * n
    for v, p in enumerate(variants):
        for i in range(n):
            out[i if v == 0 else n - 1 - i] += p[i] / count
    return out


def lev_noul(ratings: Sequence[float]) -> float:
    """lev's noul: the expected rating over 0 (certainly no) .. n-1 (certainly yes), scaled to 0..1."""
    expected, n = 0.0, len(ratings)
    for i, p in enumerate(ratings):
        expected += p * i / (n - 1)
    return expected


def choice_confidence(p: Sequence[float]) -> float:
    """max(0, (p_max - 1/n) / (1 - 1/n))."""
    if len(p) < 2:
        return 1.0
    uniform = 1.0 / len(p)
    return max(0.0, (max(p) - uniform) / (1.0 - uniform))


def expected_score(p: Sequence[float]) -> float:
    expected = 0.0
    for i, x in enumerate(p):
        expected += i * x
    return expected


def score_confidence(p: Sequence[float]) -> float:
    """max(0, 1 - mean distance to the modal level / that of a uniform distribution about the centre)."""
    n = len(p)
    if n < 2:
        return 1.0
    mode = max(range(n), key=p.__getitem__)
    dist = spread = 0.0
    for i in range(n):
        dist += p[i] * abs(i - mode)
        spread += abs(i - (n - 1) / 2.0) / n
    return max(0.0, 1.0 - dist / spread)


# ---- the file's template ----------------------------------------------------------------------------------------

def llama_tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
                 separators: Sequence[str] | None = None, sort_keys: bool = False) -> str:
    """``tojson`` as llama.cpp's Jinja runtime writes it (common/jinja, ``value_to_json``): keys in the value's own
    order, non-ASCII text as is, the escapes of ``json.dumps(ensure_ascii=False)`` (``\\" \\\\ \\b \\f \\n \\r \\t``,
    other control characters as ``\\u00xx``), items joined by ", " and keys by ": " (by "," with an indent), and
    floats as C++ streams print a double (six significant digits: 0.1, 3.14159, 1e+20). Like llama.cpp, it refuses
    ``ensure_ascii`` and ``sort_keys``, so a template that asks for them fails at load instead of answering
    differently from llama-server."""
    if ensure_ascii:
        raise TemplateError("tojson ensure_ascii=true is not implemented by llama.cpp's renderer")
    if sort_keys:
        raise TemplateError("tojson sort_keys=true is not implemented by llama.cpp's renderer")
    item_sep = separators[0] if separators else ("," if indent is not None and indent >= 0 else ", ")
    key_sep = separators[1] if separators and len(separators) > 1 else ": "
    out: list[str] = []
    _to_json(value, 0, indent if isinstance(indent, int) and not isinstance(indent, bool) else None,
             item_sep, key_sep, out)
    return "".join(out)


def _to_json(value: Any, level: int, indent: int | None, item_sep: str, key_sep: str, out: list[str]) -> None:
    newline = "\n" if indent is not None and indent >= 0 else ""
    pad = " " * (indent * level) if indent else ""
    inner = " " * (indent * (level + 1)) if indent else ""
    if value is None or isinstance(value, jinja2.Undefined):
        out.append("null")
    elif isinstance(value, bool):
        out.append("true" if value else "false")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        out.append("%g" % value)
    elif isinstance(value, str):
        out.append(json.dumps(value, ensure_ascii=False))
    elif isinstance(value, (list, tuple)):
        out.append("[")
        if value:
            out.append(newline)
            for i, item in enumerate(value):
                out.append(inner)
                _to_json(item, level + 1, indent, item_sep, key_sep, out)
                out.append((item_sep if i < len(value) - 1 else "") + newline)
            out.append(pad)
        out.append("]")
    elif isinstance(value, dict):
        out.append("{")
        if value:
            out.append(newline)
            for i, (key, item) in enumerate(value.items()):
                out.append(inner + json.dumps(str(key), ensure_ascii=False) + key_sep)
                _to_json(item, level + 1, indent, item_sep, key_sep, out)
                out.append((item_sep if i < len(value) - 1 else "") + newline)
            out.append(pad)
        out.append("}")
    else:
        out.append("null")


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


class SystemOneTemplate:
    """The file's ``systemone`` template in a sandboxed Jinja environment (no attribute access to Python
    internals, no mutation of the values it is given), with llama.cpp's ``tojson`` and ``raise_exception``."""

    def __init__(self, source: str):
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = llama_tojson
        env.globals["raise_exception"] = _raise
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise ModelIncompatible(f"the file's systemone template does not parse: {exc}") from None

    def render(self, values: Mapping[str, Any]) -> str:
        try:
            return self._template.render(**values)
        except (jinja2.TemplateError, TemplateError) as exc:
            raise TemplateError(f"the file's systemone template failed: {exc}") from None


def sort_keys(value: Any) -> Any:
    """Every object's keys sorted (lev was trained on sorted keys), by code point: the byte order of UTF-8."""
    if isinstance(value, dict):
        return {key: sort_keys(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [sort_keys(item) for item in value]
    return value


# ---- preparing a request ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shown:
    """One option as the template shows it: its index in the request, its key and its description as sent."""

    index: int
    key: str
    description: Any


def shown_options(rules: LetterRules, question: Question) -> list[Shown]:
    """The options in the order the type shows them in its first variant: a noul question's false then true
    (openjev: true first), every other in the request's order."""
    source = question.source
    assert source is not None
    entries = [Shown(i, key, description) for i, (key, description) in enumerate(source.options)]
    if source.type == "noul":
        by_key = {e.key: e for e in entries}
        entries = [by_key["true"], by_key["false"]] if rules.noul_true_first else [by_key["false"], by_key["true"]]
    return entries


def render_values(rules: LetterRules, question: Question, shown: Sequence[Shown]) -> dict[str, Any]:
    """What the template is given for one variant: the request's JSON values, lev's keys sorted."""
    source = question.source
    assert source is not None
    options = []
    for position, entry in enumerate(shown):
        option: dict[str, Any] = {"key": entry.key, "description": entry.description}
        if rules.shows_labels:
            option["label"] = rules.labels[position]
        options.append(option)
    values: dict[str, Any] = {"id": source.id, "type": source.type, "instructions": source.instructions,
                              "state": source.state, "options": options}
    if rules.type == "lev":
        values = sort_keys(values)
    values["images"] = []
    return values


# Two questions unlike in every field a template is given but the state (id, type, instructions, options' keys and
# descriptions, the first of each starting with another kind of character): where their prompts over one state part
# is where the state's span ends (``LetterPreparer._span``).
SENTINELS = (QuestionSource("sentinel-a", "choice", "Which one?", None, (("alpha", None), ("beta", "b"))),
             QuestionSource("~9", "noul", "\n(9) zulu", None, (("true", None), ("false", None))))
# What the tokens a prompt has past its state may lose where the real state's last tokens merge with them, in a bound
# below a request's work (``LetterPreparer._bound_below``).
BOUNDARY_SLACK = 4

# Put around each user-defined added token's text in a request's values while rendering, to find where it lands in
# the prompt: two of Unicode's noncharacters U+FDD0..U+FDEF that the prompt does not hold (tojson and templates pass
# them through as they are); a prompt holding all 32 is tokenized whole, as llama-server tokenizes it.
MARKS = tuple(chr(c) for c in range(0xFDD0, 0xFDF0))


def marked(value: Any, pattern: Any, marks: tuple[str, str]) -> Any:
    """``value`` (a template's values) with every match of ``pattern`` in its strings, keys included, put between
    the two ``marks``; the objects' key order kept."""
    if isinstance(value, str):
        return pattern.sub(lambda m: marks[0] + m.group() + marks[1], value)
    if isinstance(value, dict):
        return {marked(key, pattern, marks): marked(item, pattern, marks) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [marked(item, pattern, marks) for item in value]
    return value


def unmarked(text: str, marks: tuple[str, str]) -> tuple[str, list[tuple[int, int]]]:
    """The text without its marks, and the spans (in it) that were marked; ValueError when the marks do not pair
    (a template that cut a value)."""
    out, spans, start, position = [], [], None, 0
    for piece in re.split(f"([{marks[0]}{marks[1]}])", text):
        if piece == marks[0]:
            if start is not None:
                raise ValueError("nested marks")
            start = position
        elif piece == marks[1]:
            if start is None:
                raise ValueError("a mark closed that was not opened")
            spans.append((start, position))
            start = None
        else:
            out.append(piece)
            position += len(piece)
    if start is not None:
        raise ValueError("a mark left open")
    return "".join(out), spans


class LetterPreparer:
    """A request's questions rendered with the file's template, tokenized, budgeted and planned: a ``Prepared``
    the scheduler runs like any other (``orders``: the options each variant shows, in label order)."""

    def __init__(self, engine: Any, tokenizer: Tokenizer, rules: LetterRules, template: SystemOneTemplate,
                 limits: Limits, control_texts: Sequence[str]):
        self.engine = engine  # job_spec and plan (decisions.model.ScoringEngine)
        self.tokenizer = tokenizer
        self.rules = rules
        self.template = template
        self.limits = limits
        self.default_permutations = 1
        self.ceiling = min(limits.max_prompt_tokens, engine.ctx_tokens - 2, engine.train_ctx_tokens)
        self.label_tokens = {label: tokenizer.tokenize(label)[0] for label in rules.labels}
        self._tries: dict[int, LabelTrie] = {}
        self.user_defined = literal_pattern(tokenizer.user_defined_texts)
        self.head_tokens = self._head(control_texts)

    def labels(self, n_outputs: int, kind: str | None = None) -> tuple[str, ...]:
        return self.rules.labels[:n_outputs]

    def trie(self, n_outputs: int, kind: str | None = None) -> LabelTrie:
        if n_outputs not in self._tries:
            self._tries[n_outputs] = LabelTrie.build((self.label_tokens[label],)
                                                     for label in self.rules.labels[:n_outputs])
        return self._tries[n_outputs]

    def _head(self, control_texts: Sequence[str]) -> tuple[int, ...]:
        """The tokens every prompt starts with whatever the request: the common prefix of two unlike renderings,
        cut after its last control token (text after a special token tokenizes on its own, so no request can
        merge into it); kept resident, decoded once at load."""
        def sample(state: Any, sentinel: QuestionSource) -> list[int]:
            q = Question(("probe",), "", "", ("", ""), (), (), (), kind=sentinel.type,
                         source=dataclasses.replace(sentinel, state=state))
            text = self.template.render(render_values(self.rules, q, shown_options(self.rules, q)))
            return self.tokenizer.tokenize(text, special=True)

        # unlike in every field (id and type too: a template may show them before its last control token)
        a = sample("Alpha state.", SENTINELS[0])
        b = sample({"z": [1, 2]}, SENTINELS[1])
        shared = a[:common_prefix([a, b])]
        controls = {self.tokenizer.tokenize(text, special=True)[0] for text in control_texts
                    if len(self.tokenizer.tokenize(text, special=True)) == 1}
        last = max((i for i, token in enumerate(shared) if token in controls), default=-1)
        return tuple(shared[:last + 1])

    def prepare(self, questions: Sequence[Question]) -> Prepared:
        """Render each question in each of its variants, tokenize, hold to the budgets and plan one job over all
        the prompts (what they share is decoded once), and one job per content-free prompt kind of the priors the
        request asks for. Before any prompt is rendered with the state, a bound below the request's work, from the
        prompts rendered with an empty state, refuses a request that cannot fit (its state is rendered into every
        prompt: a long state asked many questions in many orders would otherwise be rendered and tokenized whole,
        hundreds of times, only to be refused). Each prompt's state span is where every question over its state
        would differ (``_span``): its layout depends on its own values, not on the other questions."""
        if len({q.state for q in questions}) != 1:
            raise ValueError("the questions of one request share one state")
        first = questions[0]
        where = first.loc[:-1] if len(questions) > 1 else first.loc
        modes, shown = [], []
        for q in questions:
            if q.source is None:
                raise ValueError("a decision GGUF renders the request's own values: Question.source is needed")
            n = len(q.options)
            if n > self.rules.max_options:
                raise InputError(q.option_locs[-1] if q.option_locs else q.loc,
                                 f"has {n} options; this decision model ({self.rules.type}) has "
                                 f"{self.rules.max_options} single-token labels, so at most "
                                 f"{self.rules.max_options} options", kind="value_error.too_many_options")
            modes.append(self._mode(q))
            shown.append(self._orders(q))
        budget = Budget(self.limits.max_request_tokens, where)
        self._bound_below(questions, shown, budget)
        span = self._span(first.source)
        answer = Assembly(self.engine, budget, len(self.head_tokens))
        orders, owners, digests, variants = [], [], [], []
        for i, q in enumerate(questions):
            digest = hashlib.sha256()
            prompts = []
            for v, order in enumerate(shown[i]):
                values = render_values(self.rules, q, order)
                text = self.template.render(values)
                prompts.append(self._tokens(q, values, text, "a prompt"))
                orders.append(tuple(e.index for e in order))
                owners.append(i)
                digest.update(b"\0" if v else b"")
                digest.update(text.encode("utf-8"))
            for tokens, stem in zip(prompts, self._stems(prompts)):
                answer.add(tokens, self.trie(self.rules.outputs(q.source.type, len(q.options))),
                           common_prefix([tokens, span]), stem)
            digests.append(digest.hexdigest())
            variants.append(len(shown[i]))
        spec = answer.spec()
        plan = planned(self.engine, where, spec)
        priors, no_prior = self._priors(questions, modes, orders, owners, answer.tries, where, budget)
        return Prepared(tuple(questions), tuple(answer.tokens), budget.tokens, (spec.head, spec.state_end),
                        tuple(answer.tries), tuple(orders), tuple(owners), tuple(digests), spec, plan, tuple(modes),
                        tuple(variants), tuple(priors), frozenset(no_prior), where)

    def _span(self, source: QuestionSource, **replaced: Any) -> tuple[int, ...]:
        """The tokens every prompt over ``source``'s state (``replaced``: with these values in its place, a prior's)
        begins with whatever its question: the common prefix of two sentinel questions unlike in every field the
        template is given but the state, rendered with it (a question's own prompt may share less, where its first
        own text merges with the state's last token). The resident head where the template will not render them."""
        state = dataclasses.replace(source, **replaced)
        renders = []
        for sentinel in SENTINELS:
            q = Question(("sentinel",), "", "", tuple(k for k, _ in sentinel.options), (), (), (),
                         kind=sentinel.type, source=dataclasses.replace(sentinel, state=state.state))
            try:
                values = render_values(self.rules, q, shown_options(self.rules, q))
                renders.append(self.prompt_tokens(values, self.template.render(values)))
            except (TemplateError, KeyError):
                return self.head_tokens
        return tuple(renders[0][:common_prefix(renders)])

    def _stems(self, prompts: Sequence[tuple[int, ...]]) -> list[int | None]:
        """Where each of a question's variants stops sharing its tokens with the others (none for one variant, and
        none on a memory whose stems are split in every prompt's layout: a letter prompt's stem is not its own,
        it depends on its question's other variants)."""
        if len(prompts) < 2 or getattr(self.engine, "memory", MemoryKind()).splits_stems:
            return [None] * len(prompts)
        shared = common_prefix(prompts)
        return [min(shared, len(p) - 1) for p in prompts]

    def within_budget(self, questions: Sequence[Question]) -> None:
        """Raise what ``prepare`` raises from its bound below the request's work, rendering no prompt with the
        state: the search for the largest number of orderings that would fit asks this (a bound below the work:
        the number it finds is at most what fits, and its refusal says "at most")."""
        first = questions[0]
        where = first.loc[:-1] if len(questions) > 1 else first.loc
        self._bound_below(questions, [self._orders(q) for q in questions],
                          Budget(self.limits.max_request_tokens, where))

    def _bound_below(self, questions: Sequence[Question], shown: Sequence[Sequence[Sequence[Shown]]],
                     budget: Budget) -> None:
        """Refuse a request whose work, bounded from below without rendering its state into any prompt, is over
        the limit: the state's fewest tokens (from its bytes), once, and each prompt's own tokens as the prompt
        rendered with an empty state has them past that state (less a few, where the real state's last tokens may
        merge with them); stops at the first prompt that takes the bound over."""
        source = questions[0].source
        assert source is not None
        state_text = source.state if isinstance(source.state, str) else llama_tojson(source.state)
        bound = self.tokenizer.fewest_tokens(state_text)
        empty = self._span(source, state="")
        for q, orders in zip(questions, shown):
            light = dataclasses.replace(q, source=dataclasses.replace(q.source, state=""))
            for order in orders:
                values = render_values(self.rules, light, order)
                tokens = self.prompt_tokens(values, self.template.render(values))
                bound += max(0, len(tokens) - common_prefix([tokens, empty]) - BOUNDARY_SLACK)
                budget.check(bound)

    def _mode(self, q: Question) -> DebiasMode:
        """The prior the question asks for; none unless it asks (the server's ADAPTER_DEBIAS is for plain models)."""
        return MODES[OFF] if q.debias is None else MODES[q.debias]

    def _orders(self, q: Question) -> list[list[Shown]]:
        """The options as each variant shows them: the type's variants, or the K orderings the question asks for
        (``orderings``: the canonical order by key and K evenly spaced shifts of it; K = 1 the type's first order)."""
        source = q.source
        assert source is not None
        shown = shown_options(self.rules, q)
        if q.permutations is None:
            return [shown if v == 0 else shown[::-1] for v in range(self.rules.variants(source.type, len(shown)))]
        if q.permutations > 1 and (source.type == "score" or self.rules.outputs(source.type, len(shown))
                                   != len(shown)):
            what = ("a score's levels keep their order" if source.type == "score" else
                    f"{self.rules.type} reads noul from its {LEV_RATINGS} rating labels, not from options it shows")
            raise InputError(q.loc, f"permutations {q.permutations} is not available for this question of a decision "
                             f"GGUF: {what}", kind="value_error.not_supported")
        return [[shown[j] for j in order] for order in orderings([e.key for e in shown], q.permutations)]

    def _tokens(self, q: Question, values: Mapping[str, Any], text: str, what: str) -> tuple[int, ...]:
        self._bound(q, text)
        prompt = tuple(self.prompt_tokens(values, text))
        if len(prompt) > self.ceiling:
            raise self._too_long(q, f"{what} of {len(prompt)} tokens")
        return prompt

    def prompt_tokens(self, values: Mapping[str, Any], text: str) -> list[int]:
        """``text``, the template rendered with ``values``, tokenized with special texts parsed, but a user-defined
        added token's text that comes from the request's values read as text, as on the plain route: rendered again
        with those occurrences marked to find them, and each cut inside (``prepare.cut_inside``). The template's own
        text keeps its tokens. Without such an occurrence (SmolLM2 has no user-defined token): tokenized whole."""
        if self.user_defined is None or self.user_defined.search(text) is None:
            return self.tokenizer.tokenize(text, special=True)
        free = [mark for mark in MARKS if mark not in text][:2]
        try:
            if len(free) < 2:
                raise ValueError("the prompt holds every mark")
            plain, spans = unmarked(self.template.render(marked(values, self.user_defined, (free[0], free[1]))),
                                    (free[0], free[1]))
        except ValueError:
            plain, spans = "", []
        if plain != text:
            # The template changed what it was given (a filter on the values), or the prompt holds all 32 marks: no
            # occurrence can be told from the template's own, so the prompt is tokenized as llama-server does.
            return self.tokenizer.tokenize(text, special=True)
        return tokenized_in_pieces(self.tokenizer, text, [start + cut_inside(text[start:end]) for start, end in spans],
                                   special=True)

    def _priors(self, questions: Sequence[Question], modes: Sequence[DebiasMode], orders: Sequence[tuple[int, ...]],
                owners: Sequence[int], tries: Sequence[LabelTrie], where: Any,
                budget: Budget) -> tuple[list[PriorJob], set[int]]:
        """One job per content-free prompt kind (a state, and for a label prior the question's replacement): every
        variant of every question whose mode averages it, rendered by the template with the state (and the
        instructions) replaced, each laid out from its own span (``_span`` of the replaced values). A state prior of a
        state that carries no content is not scored (``no_prior``). Their tokens count against the request's budget
        as if nothing were cached."""
        members: dict[tuple[str, str | None], tuple[Assembly, tuple[int, ...], list[int]]] = {}
        scored, no_prior = scored_priors(questions, modes)
        for i in scored:
            q, mode = questions[i], modes[i]
            source = q.source
            assert source is not None
            by_index = {e.index: e for e in shown_options(self.rules, q)}
            instructions = source.instructions if mode.question is None else mode.question
            for text in mode.states:
                replaced = dataclasses.replace(q, source=dataclasses.replace(source, state=text,
                                                                             instructions=instructions))
                if (text, mode.question) not in members:
                    members[text, mode.question] = (Assembly(self.engine, budget, len(self.head_tokens)),
                                                    self._span(source, state=text), [])
                job, span, rows = members[text, mode.question]
                mine = [k for k, owner in enumerate(owners) if owner == i]
                prompts = []
                for k in mine:
                    values = render_values(self.rules, replaced, [by_index[j] for j in orders[k]])
                    prompts.append(self._tokens(q, values, self.template.render(values), "a prior prompt"))
                for k, tokens, stem in zip(mine, prompts, self._stems(prompts)):
                    job.add(tokens, tries[k], common_prefix([tokens, span]), stem)
                    rows.append(k)
        priors = []
        for (text, question_text), (job, _, rows) in members.items():
            spec = job.spec()
            priors.append(PriorJob(text, tuple(rows), spec, planned(self.engine, where, spec), question_text))
        return priors, no_prior

    def _bound(self, q: Question, text: str) -> None:
        at_least = self.tokenizer.fewest_tokens(text)
        if at_least > self.ceiling:
            raise self._too_long(q, f"more than {self.ceiling} tokens (its text alone is at least {at_least})")

    def _too_long(self, q: Question, what: str) -> InputError:
        return InputError(q.loc, f"renders to {what}, over the limit of {self.ceiling}",
                          kind="value_error.prompt_too_long")


# ---- combining -----------------------------------------------------------------------------------------------------

def read_distribution(rules: LetterRules, prepared: Prepared, scores: Sequence[Any], prompts: Sequence[int],
                      temperature: float) -> list[float]:
    """One question's distribution from its prompts' readouts: each variant's softmax at the file's temperature,
    averaged in the request's option order (lev's noul: over its rating labels, read from one variant)."""
    per_variant = [variant_probabilities(score.first_token_logits, temperature) for score in scores]
    q = prepared.questions[prepared.owners[prompts[0]]]
    assert q.source is not None
    if rules.outputs(q.source.type, len(q.options)) != len(q.options):  # lev's noul: the 9 ratings
        return average_variants(per_variant)
    return average_aligned(per_variant, [prepared.orders[k] for k in prompts], len(q.options))


def divide_prior(p: Sequence[float], priors: Sequence[Sequence[float]], strength: float,
                 floor: float) -> tuple[list[float], list[float], tuple[float, ...]]:
    """``p`` with the prior divided out: the priors' distributions (one per content-free state) averaged in log
    space, mixed with the uniform (``floor``), raised to ``strength``; returns the probabilities, the adjusted log
    values they are the softmax of, and the prior's own distribution."""
    n = len(p)
    log_prior = [math.fsum(math.log(max(prior[j], 1e-300)) for prior in priors) / len(priors) for j in range(n)]
    shown = tuple(softmax(log_prior))
    adjusted = [math.log(max(x, 1e-300)) - strength * f for x, f in zip(p, floored(log_prior, floor))]
    return list(softmax(adjusted)), adjusted, shown


def combine_question(rules: LetterRules, prepared: Prepared, read: Readouts, i: int,
                     defaults: Defaults | None = None) -> Scored:
    """Question ``i``'s answer by the type's rules: each variant's softmax at the file's temperature, the variants
    averaged, the prior divided out where the question asked for one, then the answer's own figures
    (``Scored.answer``): noul, or the choice's or score's confidence."""
    q = prepared.questions[i]
    assert q.source is not None
    kind, n = q.source.type, len(q.options)
    mine = prepared.prompts_of(i)
    temperature = rules.temperature(kind, n)
    dist = read_distribution(rules, prepared, [read.scores[k] for k in mine], mine, temperature)
    readout = rules.describe() + f"; temperature {temperature:g} ({kind}, {n} options: bucket {rules.bucket(n)})"
    if q.permutations is not None:
        readout += (f"; {len(mine)} ordering{'s' if len(mine) > 1 else ''} of the options asked for "
                    f"(permutations), averaged in place of the type's variants")
    mode = prepared.modes[i]
    debias, prior_shown, adjusted = None, None, ()
    if mode.active and i in prepared.no_prior:
        readout += (f"; not debiased ({mode.name}): the state carries no content, so a state prior would be this "
                    f"prompt itself")
    elif mode.active:
        jobs = {p.key: (p, found) for p, found in zip(prepared.priors, read.prior_scores)}
        priors = []
        for text in mode.states:
            job, found = jobs[text, mode.question]
            rows = [(found[j], k) for j, k in enumerate(job.prompts) if prepared.owners[k] == i]
            priors.append(read_distribution(rules, prepared, [s for s, _ in rows], [k for _, k in rows],
                                            temperature))
        strength, floor = (defaults.strength, defaults.floor) if defaults is not None else (1.0, 0.0)
        dist, adjusted, prior_shown = divide_prior(dist, priors, strength, floor)
        what = "the state" if mode.question is None else "the state and the instructions"
        readout += (f"; debiased ({mode.name}): the same prompts with {what} replaced by content-free text, read the "
                    f"same way, mixed with the uniform ({floor:g} of it), raised to the strength {strength:g} and "
                    f"divided out")
        debias = {**mode.describe(), "strength": strength, "floor": floor}
    first = prepared.orders[mine[0]]
    logits = read.scores[mine[0]].first_token_logits
    answer: dict[str, float]
    if kind == "noul" and rules.type == "lev":
        noul = lev_noul(dist)
        probabilities: tuple[float, ...] = (noul, 1.0 - noul)  # the request's order: true, false
        option_logits = tuple(logits)  # the 9 ratings' logits, A..I
        answer = {"noul": noul}
        if prior_shown is not None:
            prior_noul = lev_noul(prior_shown)
            prior_shown = (prior_noul, 1.0 - prior_noul)
    else:
        raw = [0.0] * n
        for position, index in enumerate(first):
            raw[index] = logits[position]
        probabilities, option_logits = tuple(dist), tuple(raw)
        if kind == "noul":
            answer = {"noul": probabilities[0]}  # the request's first option is true
        elif kind == "score":
            answer = {"score": expected_score(dist), "confidence": score_confidence(dist)}
        else:
            answer = {"confidence": choice_confidence(dist)}
    return Scored(
        probabilities=probabilities,
        option_logits=option_logits,
        prompt_sha256=prepared.digests[i],
        input_tokens=sum(len(prepared.tokens[k]) for k in mine),
        readout=readout,
        label_mass=sum(read.scores[k].label_mass for k in mine) / len(mine),
        top_token_is_label=all(read.scores[k].top_token_is_label for k in mine),
        adjusted_logits=tuple(adjusted),
        debias=debias,
        prior=prior_shown,
        answer=answer,
        temperature=temperature,
        orderings=len(mine))


class LetterReadout:
    """The model kind of a letter-readout decision GGUF: its rules, its template, and how it prepares and combines
    a request (what ``DecisionModel`` delegates to)."""

    kind = "decision-gguf"

    def __init__(self, decision: DecisionFile, engine: Any, tokenizer: Tokenizer, limits: Limits,
                 control_texts: Sequence[str], defaults: Defaults | None = None):
        self.decision = decision
        self.defaults = defaults  # the strength and floor of a prior a request asks for (ADAPTER_DEBIAS_*)
        self.rules = rules_for(decision, tokenizer)
        self.template = SystemOneTemplate(decision.template)
        self.preparer = LetterPreparer(engine, tokenizer, self.rules, self.template, limits, control_texts)
        self.version = f"{decision.type}-" + hashlib.sha256(
            (decision.template + "\0" + json.dumps(dict(decision.temperatures), sort_keys=True)).encode()
        ).hexdigest()[:12]

    @property
    def max_options(self) -> int:
        return self.rules.max_options

    def combine(self, prepared: Prepared, read: Readouts) -> list[Scored]:
        return [combine_question(self.rules, prepared, read, i, self.defaults)
                for i in range(len(prepared.questions))]

    def text(self, prepared: Prepared, k: int) -> str:
        """Prompt ``k``'s whole text, rendered again (what ``prepare`` hashed)."""
        q = prepared.questions[prepared.owners[k]]
        by_index = {e.index: e for e in shown_options(self.rules, q)}
        return self.template.render(render_values(self.rules, q, [by_index[j] for j in prepared.orders[k]]))

    def describe(self) -> dict[str, Any]:
        """What the model identity says of the rules: the kind, the type and its temperatures."""
        return {"kind": self.kind, "decision_type": self.decision.type,
                "rules": f"llama-server {self.decision.type} (letter readout)",
                "decision_temperatures": dict(self.decision.temperatures),
                "labels": len(self.rules.labels)}
