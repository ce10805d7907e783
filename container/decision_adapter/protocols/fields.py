"""Field types both protocols' request models share: text the model can read, JSON values, the context; and the
``x_request`` both protocols' answers carry (``RequestIdentity``).

Every string of a request is checked here once, where pydantic validates it, so that the error names
the field: a lone UTF-16 surrogate (``"\\ud800"`` in JSON) is not text and cannot be tokenized or
written back, and text shown to the model must not hold its control tokens. Every number inside a
JSON value must be finite (``1e400`` parses to infinity, which JSON cannot carry back). Nesting depth is
bounded before parsing (``bodies.check_depth``), so the walks here are shallow and iterative, and they keep
nothing per item.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, Iterator, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo
from pydantic import model_validator
from pydantic import WithJsonSchema
from pydantic_core import InitErrorDetails, PydanticCustomError

from ..decisions.debias import MODES
from ..decisions.model import DecisionModel

SURROGATE = re.compile("[\ud800-\udfff]")
# Unicode's noncharacters (U+FDD0..U+FDEF and the last two code points of every plane): reserved for a program's
# internal use, never text to interchange; this adapter marks places in prompts with them (decisions.letter).
NONCHARACTERS = "\ufdd0-\ufdef" + "".join(chr(plane << 16 | 0xFFFE) + chr(plane << 16 | 0xFFFF) for plane in range(17))
# What no request string may hold: a lone surrogate (not text) or a noncharacter.
NOT_TEXT = re.compile(f"[\ud800-\udfff{NONCHARACTERS}]")


@dataclass(frozen=True)
class RequestContext:
    """What validation needs beyond the body: the model's control tokens, limits, the served model id."""

    control_tokens: re.Pattern[str] | None = None  # texts the model would parse as its control tokens
    max_decisions: int = 64
    served_id: str = ""
    names_shown: bool = False  # ids are rendered into the prompt (a decision GGUF's template is given them)

    @classmethod
    def of(cls, model: DecisionModel, max_decisions: int) -> "RequestContext":
        return cls(control_tokens=model.control_tokens, max_decisions=max_decisions, served_id=model.served_id,
                   names_shown=model.letter is not None)


class StrictModel(BaseModel):
    """A request object: exact JSON types (no "1" for 1, no 1 for "1") and no unknown fields."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _first_unknown_field_only(cls, data: Any) -> Any:
        """pydantic reports every unknown field, each an error object: an object of hundreds of thousands of them
        would cost hundreds of MB and seconds to refuse. Only the first (in the body's order) is reported."""
        if not isinstance(data, dict) or len(data) <= len(cls.model_fields) + 1:
            return data
        unknown = data.keys() - cls.model_fields.keys()
        if len(unknown) <= 1:
            return data
        first = next(key for key in data if key in unknown)
        kept = {key: data[key] for key in cls.model_fields if key in data}
        kept[first] = data[first]
        return kept


def printable(text: str) -> str:
    """``text`` with lone surrogates written as ``\\udXXX``, so that an error message quoting it is UTF-8."""
    return SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def string_problem(text: str, context: Any, *, shown: bool) -> PydanticCustomError | None:
    """Why ``text`` cannot be taken, or None: a lone surrogate, a noncharacter, or (if the model reads it) a control
    token."""
    if found := NOT_TEXT.search(text):
        if SURROGATE.match(found.group()):
            return PydanticCustomError(
                "string_surrogate", "holds a lone surrogate {code}, which is not text (send UTF-8 or a surrogate pair)",
                {"code": f"\\u{ord(found.group()):04x}"})
        return PydanticCustomError(
            "string_noncharacter", "holds the noncharacter {code}, which Unicode reserves for a program's own use: "
            "it is not text", {"code": f"U+{ord(found.group()):04X}"})
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
    if problem := string_problem(value, info.context, shown=names_shown(info.context)):
        raise problem
    return value


def names_shown(context: Any) -> bool:
    """Whether the model reads the request's ids (a decision GGUF's template renders them): then they are text it
    reads, checked for its control tokens like any other."""
    return bool(getattr(context, "names_shown", False))


def _non_empty(value: Any) -> Any:
    if not isinstance(value, str) or not value.strip():
        raise PydanticCustomError("non_empty_string", "must be a non-empty string")
    return value


def check_json(value: Any, info: ValidationInfo) -> Any:
    """A JSON value whose keys and strings are readable and whose numbers are finite; else the first problem,
    located (``json_problem``)."""
    if problem := json_problem(value, info.context):
        raise ValidationError.from_exception_data("JSON value", [problem])
    return value


def json_problem(value: Any, context: Any) -> InitErrorDetails | None:
    """The first key, string or number of ``value`` that cannot be taken (a lone surrogate, a noncharacter, the
    model's control token, a number that is not finite), in document order and located from ``value``; None if
    there is none.

    Two walks, both iterative: ``_clean`` checks the value with the work per item in C (``map`` and ``filter``
    over each large container), keeping one reference per container still to check; only when it finds
    something does ``_first_problem`` walk item by item, with one iterator per level of nesting (at most
    ``bodies.MAX_DEPTH``), to say where. Neither keeps anything else per item."""
    searches = [NOT_TEXT.search]
    control = getattr(context, "control_tokens", None)
    if control is not None:
        searches.append(control.search)
    if _clean(value, searches):
        return None
    return _first_problem(value, context, searches)


SMALL = 16  # a container this short is checked item by item: the bulk calls cost more than they save


def _clean(value: Any, searches: list[Any]) -> bool:
    """Whether no key or string of ``value`` matches ``searches`` and every number is finite."""
    pending = [value]
    while pending:
        item = pending.pop()
        kind = type(item)
        if kind is str:
            if any(search(item) for search in searches):
                return False
            continue
        if kind is float:
            if not math.isfinite(item):
                return False
            continue
        if kind is not dict and kind is not list or not item:
            continue
        if kind is dict:
            if any(any(map(search, item)) for search in searches):
                return False
            values = item.values()
        else:
            values = item
        if len(item) <= SMALL:
            pending.extend(values)
            continue
        kinds = set(map(type, values))
        if float in kinds and not all(map(math.isfinite, filter(float.__instancecheck__, values))):
            return False
        if str in kinds and any(any(map(search, filter(str.__instancecheck__, values))) for search in searches):
            return False
        if list in kinds:
            pending.extend(filter(list.__instancecheck__, values))
        if dict in kinds:
            pending.extend(filter(dict.__instancecheck__, values))
    return True


def _first_problem(value: Any, context: Any, searches: list[Any]) -> InitErrorDetails | None:
    """The first problem in document order, walked item by item with the path to the current item."""
    path: list[str | int] = []
    levels: list[Iterator[tuple[Any, Any]]] = []
    item = value
    while True:
        kind = type(item)
        if kind is str:
            if any(search(item) for search in searches):
                problem = string_problem(item, context, shown=True)
                return InitErrorDetails(type=problem, loc=tuple(path), input=printable(item))
        elif kind is float:
            if not math.isfinite(item):
                return InitErrorDetails(type=PydanticCustomError(
                    "finite_number", "must be a finite number (JSON has no infinity or NaN)"), loc=tuple(path),
                    input=None)
        elif kind is dict and item:
            levels.append(iter(item.items()))
            path.append("")
        elif kind is list and item:
            levels.append(enumerate(item))
            path.append(0)
        while levels:  # the next item: the next child of the deepest level that has one
            step = next(levels[-1], None)
            if step is None:
                levels.pop()
                path.pop()
                continue
            key, item = step
            path[-1] = key
            if type(key) is str and any(search(key) for search in searches):
                path[-1] = printable(key)
                return InitErrorDetails(type=string_problem(key, context, shown=True), loc=tuple(path),
                                        input=printable(key))
            break
        else:
            return None


# Text the model reads: a string without lone surrogates or control tokens.
Text = Annotated[str, AfterValidator(_readable)]
# Text the model reads that must say something.
NonEmptyText = Annotated[str, BeforeValidator(_non_empty), AfterValidator(_readable),
                         Field(min_length=1, pattern=r"\S")]
# A caller's name that is echoed back (a decision id, a question id): shown to the model only by a decision GGUF's
# template, and checked for its control tokens then.
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


class RequestIdentity(BaseModel):
    """``x_request`` of every answer: which request this is and which release answered it, in the body, where
    SageMaker's data capture records it (it records bodies, not headers)."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="The request's id: its X-Request-Id header (the caller's, else its SageMaker "
                                "InferenceId, else a new one) and its log line's request_id.")
    inference_id: str | None = Field(None, description="The InferenceId the caller gave SageMaker's InvokeEndpoint "
                                                       "(the X-Amzn-SageMaker-Inference-Id header; data capture's "
                                                       "eventMetadata.inferenceId), when sent.")
    image_digest: str | None = Field(None, description="The digest of the image that answered (ADAPTER_IMAGE_DIGEST, "
                                                       "which the endpoint stacks set from the pinned image), when "
                                                       "known.")
    model_sha256: str | None = Field(description="The SHA-256 of the GGUF that answered (as in the model identity).")
    adapter_version: str = Field(description="The decision adapter's version.")


X_REQUEST_DESCRIPTION = ("This request's id (the X-Request-Id header and the log line's request_id) and the release "
                         "that answered it, in the body so that a data capture record joins its log line.")
