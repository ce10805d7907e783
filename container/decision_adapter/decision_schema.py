"""The AWS walkthrough's decision schema: ``{"decision": {...}}`` and ``{"decisions": [...]}``.

Parses and validates request objects into ``Question``s for the decision model, and shapes results.
Every problem is an ``InputError`` whose path names the field, e.g. ``decisions[1].options[0].id``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import InputError, Loc
from .labels import MAX_OPTIONS
from .prompt import state_text
from .scoring import Question, Scored

DECISION_FIELDS = ("id", "state", "question", "options")
OPTION_FIELDS = ("id", "description")


@dataclass(frozen=True)
class Decision:
    id: str
    state: str  # as the model reads it
    option_ids: tuple[str, ...]
    question: Question


def parse_one(body: dict[str, Any], max_options: int = MAX_OPTIONS) -> Decision:
    _only(body, ("decision",), ())
    return parse_decision(body["decision"], ("decision",), max_options)


def parse_many(body: dict[str, Any], max_decisions: int, max_options: int = MAX_OPTIONS) -> list[Decision]:
    _only(body, ("decisions",), ())
    items = body["decisions"]
    if not isinstance(items, list) or not items:
        raise InputError(("decisions",), "must be a non-empty array of decisions")
    if len(items) > max_decisions:
        raise InputError(("decisions",), f"has {len(items)} decisions, over the limit of {max_decisions}")
    decisions = [parse_decision(item, ("decisions", i), max_options) for i, item in enumerate(items)]
    seen: set[str] = set()
    for i, d in enumerate(decisions):
        if d.state != decisions[0].state:
            raise InputError(("decisions", i, "state"), "must equal decisions[0].state: a decisions request "
                             "shares one state (send separate requests for different states)")
        if d.id in seen:
            raise InputError(("decisions", i, "id"), f"repeats the id {d.id!r}; ids must be unique")
        seen.add(d.id)
    return decisions


def parse_decision(value: Any, loc: Loc, max_options: int = MAX_OPTIONS) -> Decision:
    if not isinstance(value, dict):
        raise InputError(loc, "must be an object with id, state, question and options", "type_error")
    _only(value, DECISION_FIELDS, loc, required=DECISION_FIELDS)
    decision_id = _text(value["id"], loc + ("id",))
    state = _state(value["state"], loc + ("state",))
    question = _text(value["question"], loc + ("question",))
    options = value["options"]
    if not isinstance(options, list):
        raise InputError(loc + ("options",), "must be an array of options", "type_error")
    if not 2 <= len(options) <= max_options:
        raise InputError(loc + ("options",), f"has {len(options)} options; 2 to {max_options} are allowed")
    ids: list[str] = []
    texts: list[str] = []
    for i, option in enumerate(options):
        oloc = loc + ("options", i)
        if not isinstance(option, dict):
            raise InputError(oloc, "must be an object with id and description", "type_error")
        _only(option, OPTION_FIELDS, oloc, required=("id",))
        option_id = _text(option["id"], oloc + ("id",))
        if option_id in ids:
            raise InputError(oloc + ("id",), f"repeats the option id {option_id!r}; option ids must be unique")
        description = option.get("description", "")
        if not isinstance(description, str):
            raise InputError(oloc + ("description",), "must be a string", "type_error")
        ids.append(option_id)
        texts.append(description.strip() or option_id)
    option_locs = tuple(loc + ("options", i, "description" if options[i].get("description", "").strip() else "id")
                        for i in range(len(options)))
    return Decision(decision_id, state, tuple(ids), Question(
        loc=loc, state=state, question=question, options=tuple(texts), option_locs=option_locs,
        state_loc=loc + ("state",), question_loc=loc + ("question",), option_keys=tuple(ids)))


def result(decision: Decision, scored: Scored, model_info: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": decision.id,
        "option_ids": list(decision.option_ids),
        "probabilities": list(scored.probabilities),
        "option_logits": list(scored.option_logits),
        "prompt_sha256": scored.prompt_sha256,
        "input_tokens": scored.input_tokens,
        "readout": scored.readout,
        "label_mass": scored.label_mass,
        "top_token_is_label": scored.top_token_is_label,
        **({"calibration": scored.calibration} if scored.calibration is not None else {}),
        "model": model_info,
    }


def _only(value: dict[str, Any], allowed: tuple[str, ...], loc: Loc, required: tuple[str, ...] | None = None) -> None:
    for key in value:
        if key not in allowed:
            raise InputError(loc + (key,), f"is not a known field (expected: {', '.join(allowed)})",
                             "value_error.extra")
    for key in required if required is not None else allowed:
        if key not in value:
            raise InputError(loc + (key,), "is required", "missing")


def _text(value: Any, loc: Loc) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InputError(loc, "must be a non-empty string", "type_error" if not isinstance(value, str) else "value_error")
    return value


def _state(value: Any, loc: Loc) -> str:
    if isinstance(value, str):
        return _text(value, loc)
    if isinstance(value, (dict, list)):
        if not value:
            raise InputError(loc, "must not be empty")
        return state_text(value)
    raise InputError(loc, "must be a non-empty string or a JSON object or array", "type_error")
