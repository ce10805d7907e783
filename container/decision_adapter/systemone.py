"""TypeSafe's System One wire format (``POST /v1/systemone``): parse, render as decisions, shape answers.

Each question becomes one decision over the request's state, so all questions share the state's prompt
prefix; question ids are never shown to the model. ``noul`` is a two-option decision (yes first),
``choice`` one option per criterion, ``score`` one option per level in order. Invalid requests raise
``InputError`` with a FastAPI-style location (``["body", "questions", "team", "criteria"]``), rendered
as ``422 {"detail": [...]}``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from .errors import InputError, Loc
from .labels import MAX_OPTIONS
from .prompt import state_text
from .scoring import Question, Scored

ALIAS = "jev-latest"
MAX_SCORE_LEVELS = 10
TYPES = ("noul", "choice", "score")
DEFAULT_INSTRUCTIONS = {
    "noul": "Is the following true for the state?",
    "choice": "Which option fits the state best?",
    "score": "Which level fits the state best?",
}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 415: "invalid_request_error",
               429: "rate_limit_error", 500: "api_error", 503: "overloaded_error"}


@dataclass(frozen=True)
class Item:
    """One question of the request, ready to score."""

    qid: str
    type: str
    names: tuple[str, ...]  # option names (choice), level keys (score), ("true", "false") for noul
    legend: tuple[Any, ...]  # score levels as sent
    question: Question


def parse(body: Any, served: str, max_questions: int) -> tuple[str, str, list[Item]]:
    """(model name as sent, state text, items) from a System One body."""
    if not isinstance(body, dict):
        raise InputError(("body",), "Input should be a valid dictionary", "dict_type")
    for key in ("model", "state", "questions"):
        if key not in body:
            raise InputError(("body", key), "Field required", "missing")
    model = body["model"]
    if not isinstance(model, str):
        raise InputError(("body", "model"), "Input should be a valid string", "string_type")
    if model not in (ALIAS, served):
        raise InputError(("body", "model"), f"Unknown model {model!r}; this server serves {served!r} "
                         f"(also as {ALIAS!r})", "value_error")
    state = body["state"]
    if not isinstance(state, (str, dict, list)):
        raise InputError(("body", "state"), "Input should be a string, an object or an array", "state_type")
    if body.get("assets") is not None:
        raise InputError(("body", "assets"), "Image assets are not supported: this server serves a text-only model",
                         "value_error")
    questions = body["questions"]
    if not isinstance(questions, dict):
        raise InputError(("body", "questions"), "Input should be a valid dictionary", "dict_type")
    if not questions:
        raise InputError(("body", "questions"), "Dictionary should have at least 1 item after validation",
                         "too_short")
    if len(questions) > max_questions:
        raise InputError(("body", "questions"), f"Dictionary should have at most {max_questions} items "
                         f"(ADAPTER_MAX_DECISIONS), not {len(questions)}", "too_long")
    text = state_text(state)
    items = [_item(qid, q, text) for qid, q in questions.items()]
    return model, text, items


def _item(qid: str, q: Any, state: str) -> Item:
    loc: Loc = ("body", "questions", qid)
    if not qid:
        raise InputError(loc, "Question ids must be non-empty strings", "string_too_short")
    if not isinstance(q, dict):
        raise InputError(loc, "Input should be a valid dictionary", "dict_type")
    qtype = q.get("type")
    if qtype not in TYPES:
        if "type" not in q:
            raise InputError(loc + ("type",), "Field required", "missing")
        hint = " (box questions need a vision model)" if qtype == "box" else ""
        raise InputError(loc + ("type",), f"Input tag {qtype!r} found using 'type' does not match any of the expected "
                         f"tags: 'noul', 'choice', 'score'{hint}", "union_tag_invalid")
    instructions = _structured(q.get("instructions"), loc + ("instructions",), optional=True)
    question_text = instructions if instructions is not None else DEFAULT_INSTRUCTIONS[qtype]
    criteria = q.get("criteria")
    if qtype == "noul":
        names, texts, option_locs, legend = _noul(criteria, loc)
    elif qtype == "choice":
        names, texts, option_locs = _choice(criteria, loc)
        legend = ()
    else:
        names, texts, option_locs, legend = _score(criteria, loc)
    # Order averaging orders choices by name and score levels by their text: the options as the client
    # means them, whatever order it sent them in.
    keys = texts if qtype == "score" else names
    return Item(qid, qtype, names, legend, Question(
        loc=loc, state=state, question=question_text, options=texts, option_locs=option_locs,
        state_loc=("body", "state"), question_loc=loc + ("instructions",), option_keys=keys, kind=qtype))


def _noul(criteria: Any, loc: Loc):
    cloc = loc + ("criteria",)
    if criteria is None:
        criteria = {}
    if not isinstance(criteria, dict):
        raise InputError(cloc, "Input should be a valid dictionary or null", "model_type")
    sides = []
    for side, word in (("true", "Yes"), ("false", "No")):
        description = _structured(criteria.get(side), cloc + (side,), optional=True)
        sides.append(f"{word}: {description}" if description else word)
    return ("true", "false"), tuple(sides), (cloc + ("true",), cloc + ("false",)), ()


def _choice(criteria: Any, loc: Loc):
    cloc = loc + ("criteria",)
    if criteria is None or not isinstance(criteria, dict):
        raise InputError(cloc, "Field required" if criteria is None else "Input should be a valid dictionary",
                         "missing" if criteria is None else "dict_type")
    if not 2 <= len(criteria) <= MAX_OPTIONS:
        raise InputError(cloc, f"A choice needs 2 to {MAX_OPTIONS} options, not {len(criteria)}",
                         "too_short" if len(criteria) < 2 else "too_long")
    names, texts, locs = [], [], []
    for name, description in criteria.items():
        if not name.strip():
            raise InputError(cloc + (name,), "Option names must be non-empty", "string_too_short")
        text = _structured(description, cloc + (name,), optional=True)
        names.append(name)
        texts.append(f"{name}: {text}" if text else name)
        locs.append(cloc + (name,))
    return tuple(names), tuple(texts), tuple(locs)


def _score(criteria: Any, loc: Loc):
    cloc = loc + ("criteria",)
    if criteria is None:
        raise InputError(cloc, "Field required", "missing")
    if not isinstance(criteria, list):
        raise InputError(cloc, "Input should be a valid list: score levels are an ordered array, level 0 first",
                         "list_type")
    if not 2 <= len(criteria) <= MAX_SCORE_LEVELS:
        raise InputError(cloc, f"A score needs 2 to {MAX_SCORE_LEVELS} levels, not {len(criteria)}",
                         "too_short" if len(criteria) < 2 else "too_long")
    texts = tuple(_structured(level, cloc + (i,), optional=False) for i, level in enumerate(criteria))
    names = tuple(str(i) for i in range(len(criteria)))
    return names, texts, tuple(cloc + (i,) for i in range(len(criteria))), tuple(criteria)


def _structured(value: Any, loc: Loc, *, optional: bool) -> str | None:
    """Instructions and descriptions: a string, or an object or array rendered as JSON."""
    if value is None:
        if optional:
            return None
        raise InputError(loc, "Input should be a string, an object or an array, not null", "string_type")
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    raise InputError(loc, "Input should be a string, an object or an array", "string_type")


def answer(item: Item, scored: Scored) -> dict[str, Any]:
    p = scored.probabilities
    if item.type == "noul":
        out: dict[str, Any] = {"type": "noul", "noul": p[0]}
    elif item.type == "choice":
        top = max(range(len(p)), key=p.__getitem__)
        out = {"type": "choice", "choice": item.names[top],
               "probabilities": dict(zip(item.names, p)), "confidence": choice_confidence(p)}
    else:
        out = {"type": "score", "score": math.fsum(i * x for i, x in enumerate(p)),
               "legend": dict(zip(item.names, item.legend)), "probabilities": dict(zip(item.names, p)),
               "confidence": score_confidence(p)}
    out["x_prompt_sha256"] = scored.prompt_sha256
    out["x_label_mass"] = scored.label_mass
    if scored.calibration is not None:
        out["x_calibration"] = scored.calibration
    return out


def choice_confidence(p: tuple[float, ...] | list[float]) -> float:
    """(n * max - 1) / (n - 1): 0 for a uniform distribution, 1 for a certain one."""
    n = len(p)
    return min(1.0, max(0.0, (n * max(p) - 1) / (n - 1)))


def score_confidence(p: tuple[float, ...] | list[float]) -> float:
    """1 - spread around the modal level / the same spread of a uniform distribution, floored at 0."""
    n = len(p)
    mode = max(range(n), key=p.__getitem__)
    spread = math.fsum(x * abs(i - mode) for i, x in enumerate(p))
    uniform = sum(abs(i - (n - 1) / 2) for i in range(n)) / n
    return min(1.0, max(0.0, 1 - spread / uniform))


def validation_error(exc: InputError) -> dict[str, Any]:
    loc = list(exc.loc) if exc.loc and exc.loc[0] == "body" else ["body", *exc.loc]
    return {"detail": [{"loc": loc, "msg": exc.msg, "type": exc.kind}]}


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"detail": {"error_type": ERROR_TYPES.get(status, "invalid_request_error"), "message": message}}
