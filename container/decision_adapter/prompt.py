"""How a decision becomes text: the GGUF's own chat template, the fixed instruction and the payload layout.

The user payload puts the state first, so that every question about one state shares a prompt prefix,
then the question, then the options labelled ``A``, ``B``, ... The prompt ends where the model's
answer begins; the readout is the model's next-token distribution there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Sequence

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Names the prompt below: a calibration is fitted for one version (calibration.json) and refused for another.
PROMPT_VERSION = "2026-12-01.1"
SYSTEM_INSTRUCTION = (
    "You are a decision model. Read the state, then answer the question by choosing exactly one of the "
    "labelled options. Reply with the option's label only.")
STATE_HEADING = "State:\n"
QUESTION_HEADING = "\n\nQuestion:\n"
_SENTINEL = "\x00decision-adapter-user-payload\x00"


class TemplateError(ValueError):
    """The GGUF's chat template cannot render the decision prompt."""


def state_text(state: Any) -> str:
    """A state as the model reads it: strings verbatim, JSON objects and arrays in their key order."""
    return state if isinstance(state, str) else json.dumps(state, ensure_ascii=False)


def user_payload(state: str, question: str, labels: Sequence[str], options: Sequence[str]) -> str:
    lines = "\n".join(f"{label}. {text}" for label, text in zip(labels, options))
    return (f"{STATE_HEADING}{state}{QUESTION_HEADING}{question}\n\nOptions:\n{lines}\n\n"
            f"Answer with the label of one option.")


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


@dataclass(frozen=True)
class PromptLayout:
    """The rendered text around the user payload; the head is the same for every decision."""

    template: ChatTemplate

    def render(self, payload: str) -> str:
        if self.template.system_role:
            messages = [{"role": "system", "content": SYSTEM_INSTRUCTION}, {"role": "user", "content": payload}]
        else:
            messages = [{"role": "user", "content": f"{SYSTEM_INSTRUCTION}\n\n{payload}"}]
        return self.template.render(messages)

    @property
    def head(self) -> str:
        """Everything before the state: template head, system instruction and the state heading."""
        rendered = self.render(_SENTINEL)
        at = rendered.find(_SENTINEL)
        if at < 0:
            raise TemplateError("the model's chat template does not keep the user message verbatim")
        return rendered[:at] + STATE_HEADING


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)
