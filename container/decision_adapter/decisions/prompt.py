"""How a decision becomes text: the GGUF's own chat template, the prompt style and the payload layout.

The user payload puts the state first, so that every question about one state shares a prompt prefix,
then the question, then the options labelled ``A``, ``B``, ... The prompt ends where the model's
answer begins; the readout is the model's next-token distribution there.

The template is rendered once, at load, with a placeholder where the user payload goes: what comes before it
(the head) and after it (the tail) are fixed text, and every prompt is head + state + question + tail. User
text never goes through the template, so it cannot change how the prompt begins or ends (a ``<think>`` in a
state does not open a thinking block), and a template that prints today's date prints the date of the load.

A ``PromptStyle`` is everything else about the wording: the system instruction, the closing line, worked
examples shown as earlier turns of the conversation (part of the resident head, so evaluated once at load),
and whether score levels are labelled with digits. The styles below are the candidates measured on the
benchmark model (docs/benchmarks.md, "Prompt"); ``DEFAULT_STYLE`` is the one that measured best, and each
style's ``version`` is what a calibration is bound to.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Sequence

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .labels import labels_for

SYSTEM_INSTRUCTION = (
    "You are a decision model. Read the state, then answer the question by choosing exactly one of the "
    "labelled options. Reply with the option's label only.")
EXACT_INSTRUCTION = (
    "You are a decision model. Read the state, then answer the question by choosing exactly one of the "
    "labelled options. Reply with only the option's label: one uppercase letter, or a digit for a score level.")
STATE_HEADING = "State:\n"
QUESTION_HEADING = "\n\nQuestion:\n"
ANSWER_LINE = "Answer with the label of one option."
_SENTINEL = "\x00decision-adapter-user-payload\x00"
DIGITS = tuple("0123456789")


@dataclass(frozen=True)
class Example:
    """A worked decision shown before the real one, with the label of its answer."""

    state: str
    question: str
    options: tuple[str, ...]
    answer: int
    kind: str | None = None


# Varied answers (B, A, C) and kinds, so that no position or letter is taught; not taken from any benchmark.
EXAMPLES = (
    Example("The customer writes that the parcel arrived crushed and the lamp inside is broken. They want a "
            "new one sent.", "Which team should handle this message?",
            ("Billing: payments, invoices and refunds", "Shipping: damaged, late or lost parcels",
             "Sales: questions before a purchase"), 1),
    Example("Invoice 118 of 2 May shows a card payment of 40 EUR, received the same day.",
            "Has invoice 118 been paid?", ("Yes: the state shows the payment", "No"), 0, "noul"),
    Example("'This is the third time I write about the same bug. I am furious and I will cancel today.'",
            "How upset is the writer?", ("Calm", "Annoyed", "Very angry"), 2, "score"),
)


@dataclass(frozen=True)
class PromptStyle:
    name: str
    instruction: str = SYSTEM_INSTRUCTION
    examples: tuple[Example, ...] = ()
    score_digits: bool = False
    answer_line: str = ANSWER_LINE  # the ask after the options ("": none; the instruction says it already)

    def labels(self, n_options: int, kind: str | None) -> tuple[str, ...]:
        if self.score_digits and kind == "score" and n_options <= len(DIGITS):
            return DIGITS[:n_options]
        return labels_for(n_options)


STYLES = {style.name: style for style in (
    PromptStyle("plain"),
    PromptStyle("lean", answer_line=""),
    PromptStyle("examples", examples=EXAMPLES),
    PromptStyle("exact", instruction=EXACT_INSTRUCTION),
    PromptStyle("exact-examples", instruction=EXACT_INSTRUCTION, examples=EXAMPLES),
    PromptStyle("exact-examples-digits", instruction=EXACT_INSTRUCTION, examples=EXAMPLES, score_digits=True),
)}
DEFAULT_STYLE = "lean"  # measured: plain's accuracy or better, 8 tokens fewer (docs/benchmarks.md)

# The words a question gets where the request leaves them out (System One): its instruction by type, and the
# two options of a yes-or-no question. Part of the prompt version.
DEFAULT_INSTRUCTIONS = {
    "noul": "Is the following true for the state?",
    "choice": "Which option fits the state best?",
    "score": "Which level fits the state best?",
}
NOUL_OPTIONS = ("Yes", "No")


class ModelIncompatible(RuntimeError):
    """The model cannot serve decisions (its template, its labels, its probe); raised at start-up."""


class TemplateError(ValueError):
    """The GGUF's chat template cannot render the decision prompt."""


def state_text(state: Any) -> str:
    """A state as the model reads it: strings verbatim, JSON objects and arrays in their key order."""
    return state if isinstance(state, str) else json_text(state)


RENDER_PIECE = 4096  # most items one json.dumps call renders


def json_text(value: Any) -> str:
    """``json.dumps(value, ensure_ascii=False)``, rendered in pieces so that the GIL changes hands while a large
    value is rendered (one call holds it throughout: 0.2 s and more for a 6 MiB state). No call renders more than
    about ``RENDER_PIECE`` items: a flat array or object (of numbers, strings, booleans, nulls and flat arrays and
    objects) is rendered that many items a call, and in one that holds deeper arrays or objects each of those is
    rendered the same way on its own (the nesting is bounded by ``server.bodies.MAX_DEPTH``). The same text:
    ``json.dumps`` joins items with ``", "`` and keys with ``": "``."""
    parts: list[str] = []
    _render(value, parts)
    return "".join(parts)


def _render(value: Any, parts: list[str]) -> None:
    kind = type(value)
    if kind is not list and kind is not dict or not value:
        parts.append(json.dumps(value, ensure_ascii=False))
        return
    is_dict = kind is dict
    parts.append("{" if is_dict else "[")
    run: list[Any] = []  # items (or key and item pairs) waiting to be rendered by one call
    weight = 0
    first = True
    for item in value.items() if is_dict else value:
        child = item[1] if is_dict else item
        of = type(child)
        if of is not list and of is not dict or not child:
            cost = 1
        elif len(child) <= RENDER_PIECE and not _NESTING & set(map(type, child.values() if of is dict else child)):
            cost = len(child) + 1  # a flat array or object: rendered with the run
        else:
            if run:
                first = _flush(run, is_dict, parts, first)
                weight = 0
            parts.append(("" if first else ", ") + (json.dumps(item[0], ensure_ascii=False) + ": " if is_dict else ""))
            first = False
            _render(child, parts)
            continue
        if run and weight + cost > RENDER_PIECE:
            first = _flush(run, is_dict, parts, first)
            weight = 0
        run.append(item)
        weight += cost
    if run:
        _flush(run, is_dict, parts, first)
    parts.append("}" if is_dict else "]")


_NESTING = {list, dict}


def _flush(run: list[Any], is_dict: bool, parts: list[str], first: bool) -> bool:
    """Render the items waiting in ``run`` with one call, after a separator unless they come ``first``."""
    text = json.dumps(dict(run) if is_dict else run, ensure_ascii=False)[1:-1]
    parts.append(text if first else ", " + text)
    run.clear()
    return False


def state_segment(state: str) -> str:
    """The state as the prompt holds it after the head: the state and the question heading."""
    return f"{state}{QUESTION_HEADING}"


def question_segment(question: str, labels: Sequence[str], options: Sequence[str],
                     answer_line: str = ANSWER_LINE) -> str:
    """The question as the prompt holds it after the state: the question, the labelled options, the ask."""
    lines = "\n".join(f"{label}. {text}" for label, text in zip(labels, options))
    return f"{question}\n\nOptions:\n{lines}" + (f"\n\n{answer_line}" if answer_line else "")


def question_stem(question: str) -> str:
    """What every ordering of a question's options has in common at the start of its ``question_segment``: the
    question and the options' heading (the options' own lines start with the first label, whatever the order)."""
    return f"{question}\n\nOptions:\n"


def user_payload(state: str, question: str, labels: Sequence[str], options: Sequence[str],
                 answer_line: str = ANSWER_LINE) -> str:
    return f"{STATE_HEADING}{state_segment(state)}{question_segment(question, labels, options, answer_line)}"


class ChatTemplate:
    """Renders messages with a model's Jinja chat template, as the Hugging Face tokenizers do."""

    def __init__(self, source: str | None, *, bos_token: str = "", eos_token: str = ""):
        if not source:
            raise TemplateError("the model has no chat template (GGUF key tokenizer.chat_template)")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now(timezone.utc).strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"the model's chat template does not parse: {exc}") from None
        self._bos, self._eos = bos_token, eos_token
        self.system_role = self._accepts_system_role()

    def render(self, messages: list[dict[str, str]]) -> str:
        try:
            return self._template.render(messages=messages, add_generation_prompt=True,
                                         enable_thinking=False, bos_token=self._bos, eos_token=self._eos)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"the model's chat template failed: {exc}") from None

    def _accepts_system_role(self) -> bool:
        try:
            self.render([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
        except TemplateError:
            return False
        return True


class PromptLayout:
    """The text around the user payload, rendered once: ``head`` (template head, system instruction, worked
    examples, the state heading) and ``tail`` (the end of the user turn and the opening of the answer, with a
    thinking block the template leaves open closed). ``render(payload)`` is the template's rendering of a user
    message ``payload``."""

    def __init__(self, template: ChatTemplate, style: PromptStyle = STYLES[DEFAULT_STYLE]):
        self.template = template
        self.style = style
        rendered = self._render(_SENTINEL)
        at = rendered.find(_SENTINEL)
        if at < 0:
            raise TemplateError("the model's chat template does not keep the user message verbatim")
        self.prefix = rendered[:at]
        self.tail = close_thinking(rendered)[at + len(_SENTINEL):]
        self.head = self.prefix + STATE_HEADING

    def _render(self, payload: str) -> str:
        turns: list[dict[str, str]] = []
        for example in self.style.examples:
            labels = self.style.labels(len(example.options), example.kind)
            turns += [{"role": "user", "content": user_payload(example.state, example.question, labels,
                                                               example.options, self.style.answer_line)},
                      {"role": "assistant", "content": labels[example.answer]}]
        turns.append({"role": "user", "content": payload})
        if self.template.system_role:
            messages = [{"role": "system", "content": self.style.instruction}, *turns]
        else:
            messages = [{**turns[0], "content": f"{self.style.instruction}\n\n{turns[0]['content']}"}, *turns[1:]]
        return self.template.render(messages)

    def render(self, payload: str) -> str:
        return self.prefix + payload + self.tail

    def question_segment(self, question: str, labels: Sequence[str], options: Sequence[str]) -> str:
        return question_segment(question, labels, options, self.style.answer_line)

    def question_stem(self, question: str) -> str:
        return question_stem(question)

    def user_payload(self, state: str, question: str, labels: Sequence[str], options: Sequence[str]) -> str:
        return user_payload(state, question, labels, options, self.style.answer_line)

    @property
    def version(self) -> str:
        """What a calibration is bound to: the style's name and a digest of everything that makes a prompt: the
        style, the head and tail the template gave (a date it prints included), the payload's layout with each
        label set, and the words a question gets by default."""
        digest = hashlib.sha256()
        placeholders = [("choice", 3), ("score", 3), ("noul", 2), ("choice", 27)]
        parts = [repr(self.style), self.prefix, self.tail, repr(DEFAULT_INSTRUCTIONS), repr(NOUL_OPTIONS)]
        parts += [self.render(self.user_payload("<state>", "<question>", self.style.labels(n, kind),
                                                [f"<option {i}>" for i in range(n)])) for kind, n in placeholders]
        for part in parts:
            digest.update(part.encode("utf-8") + b"\0")
        return f"{self.style.name}-{digest.hexdigest()[:12]}"


def close_thinking(rendered: str) -> str:
    """A generation prompt that leaves a thinking block open would put the answer inside it: close it."""
    if rendered.rfind("<think>") > rendered.rfind("</think>"):
        return rendered + "\n</think>\n\n"
    return rendered


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)
