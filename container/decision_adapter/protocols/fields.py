"""Field types both protocols' request models share: text the model can read, JSON values, the context.

Every string of a request is checked here once, where pydantic validates it, so that the error names
the field: a lone UTF-16 surrogate (``"\\ud800"`` in JSON) is not text and cannot be tokenized or
written back, and text shown to the model must not hold its control tokens. Every number inside a
JSON value must be finite (``1e400`` parses to infinity, which JSON cannot carry back). Nesting depth is
bounded before parsing (``bodies.check_depth``), so the walks here are shallow and iterative.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo
from pydantic import WithJsonSchema
from pydantic_core import InitErrorDetails, PydanticCustomError

from ..decisions.debias import MODES
from ..decisions.model import DecisionModel

SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class RequestContext:
    """What validation needs beyond the body: the model's control tokens, limits, the served model id."""

    control_tokens: re.Pattern[str] | None = None  # texts the model would parse as its control tokens
    max_decisions: int = 64
    served_id: str = ""

    @classmethod
    def of(cls, model: DecisionModel, max_decisions: int) -> "RequestContext":
        return cls(control_tokens=model.control_tokens, max_decisions=max_decisions, served_id=model.served_id)


class StrictModel(BaseModel):
    """A request object: exact JSON types (no "1" for 1, no 1 for "1") and no unknown fields."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


def printable(text: str) -> str:
    """``text`` with lone surrogates written as ``\\udXXX``, so that an error message quoting it is UTF-8."""
    return SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def string_problem(text: str, context: Any, *, shown: bool) -> PydanticCustomError | None:
    """Why ``text`` cannot be taken, or None: a lone surrogate, or (if the model reads it) a control token."""
    if found := SURROGATE.search(text):
        return PydanticCustomError(
            "string_surrogate", "holds a lone surrogate {code}, which is not text (send UTF-8 or a surrogate pair)",
            {"code": f"\\u{ord(found.group()):04x}"})
    control = getattr(context, "control_tokens", None)
    if shown and control is not None and (found := control.search(text)):
        return PydanticCustomError("control_token", "{problem}",
                                   {"problem": f"contains the model's control token {found.group(0)!r}"})
    return None


def _readable(value: str, info: ValidationInfo) -> str:
    if problem := string_problem(value, info.context, shown=True):
        raise problem
    return value


def _echoable(value: str, info: ValidationInfo) -> str:
    if problem := string_problem(value, info.context, shown=False):
        raise problem
    return value


def _non_empty(value: Any) -> Any:
    if not isinstance(value, str) or not value.strip():
        raise PydanticCustomError("non_empty_string", "must be a non-empty string")
    return value


def check_json(value: Any, info: ValidationInfo) -> Any:
    """Walk a JSON value (its depth is already bounded): keys and strings readable, numbers finite."""
    problems: list[InitErrorDetails] = []
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), value)]
    while stack and not problems:
        loc, item = stack.pop()
        if isinstance(item, str):
            if problem := string_problem(item, info.context, shown=True):
                problems.append(InitErrorDetails(type=problem, loc=loc, input=printable(item)))
        elif isinstance(item, float) and not math.isfinite(item):
            problems.append(InitErrorDetails(type=PydanticCustomError(
                "finite_number", "must be a finite number (JSON has no infinity or NaN)"), loc=loc, input=None))
        elif isinstance(item, dict):
            for key, child in reversed(item.items()):
                if problem := string_problem(key, info.context, shown=True):
                    problems.append(InitErrorDetails(type=problem, loc=loc + (printable(key),), input=printable(key)))
                    break
                stack.append((loc + (key,), child))
        elif isinstance(item, list):
            stack.extend((loc + (i,), child) for i, child in reversed(list(enumerate(item))))
    if problems:
        raise ValidationError.from_exception_data("JSON value", problems)
    return value


# Text the model reads: a string without lone surrogates or control tokens.
Text = Annotated[str, AfterValidator(_readable)]
# Text the model reads that must say something.
NonEmptyText = Annotated[str, BeforeValidator(_non_empty), AfterValidator(_readable),
                         Field(min_length=1, pattern=r"\S")]
# A caller's name that is echoed back but never shown to the model (a decision id, a question id).
NonEmptyName = Annotated[str, BeforeValidator(_non_empty), AfterValidator(_echoable),
                         Field(min_length=1, pattern=r"\S")]



def _structured_type(value: Any) -> Any:
    if not isinstance(value, (str, dict, list)):
        raise PydanticCustomError("string_type", "Input should be a string, an object or an array"
                                  + (", not null" if value is None else ""))
    return value


STRUCTURED_SCHEMA = {"anyOf": [{"type": "string"}, {"type": "object"}, {"type": "array"}]}
# A string, or a JSON object or array shown to the model as JSON (System One's instructions and criteria).
Structured = Annotated[Any, BeforeValidator(_structured_type), AfterValidator(check_json),
                       WithJsonSchema(STRUCTURED_SCHEMA)]


# A debias mode by name (decisions/debias.py): the request's ``debias`` / System One's ``x_debias``.
DebiasName = Literal[tuple(MODES)]  # type: ignore[valid-type]
DEBIAS_DESCRIPTION = ("Content-free calibration (default ADAPTER_DEBIAS): 'off', or a mode that scores the prompt "
                      "with its content replaced by content-free input (the model's prior, cached per prompt) and "
                      "divides it out of the answer at a strength, after order averaging and before any "
                      "temperature; a question whose state is that content-free input is answered as with 'off'. "
                      + "; ".join(
                          f"'{m.name}': {m.description}" for m in MODES.values()) + ".")
