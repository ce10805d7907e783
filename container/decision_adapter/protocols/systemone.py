"""TypeSafe's System One wire format (``POST /v1/systemone``): request models, questions as decisions, answers,
error bodies.

Each question becomes one decision over the request's state, so all questions share the state's prompt
prefix; question ids are never shown to the model. ``noul`` is a two-option decision (yes first),
``choice`` one option per criterion, ``score`` one option per level in order. The request models are
pydantic's (strict types); an invalid request gets FastAPI's ``422 {"detail": [{"loc", "msg", "type"}]}``
with pydantic's own errors, located from ``"body"`` (``["body", "questions", "team", "criteria"]``). A body with
``"x_dry_run": true`` is answered with what it would do instead: ``{"model", "x_dry_run": {...}}`` (``dry_run``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from ..decisions.labels import MAX_OPTIONS, MAX_PERMUTATIONS, QUESTION_TYPES
from ..decisions.model import DryRun, Question, QuestionSource, Scored
from ..decisions.prompt import DEFAULT_INSTRUCTIONS, NOUL_OPTIONS, json_text, state_text
from ..errors import Failure, InputError, Loc
from . import dry_run
from .orderings import Orderings, answered_orderings
from .call import Answer, Call
from .fields import (DEBIAS_DESCRIPTION, X_REQUEST_DESCRIPTION, DebiasName, RequestContext, RequestIdentity, Structured,
                     check_json, names_shown, printable, string_problem)

ALIAS = "jev-latest"
MAX_SCORE_LEVELS = 10
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
               415: "invalid_request_error", 429: "rate_limit_error", 500: "api_error", 503: "overloaded_error"}


class SystemOneModel(BaseModel):
    """Strict JSON types; unknown fields are ignored, as TypeSafe's servers do."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


def _count(least: int, most: int, noun: str):
    def check(value: Any) -> Any:
        if isinstance(value, (dict, list)) and not least <= len(value) <= most:
            raise PydanticCustomError("too_short" if len(value) < least else "too_long",
                                      "A {kind} needs {least} to {most} {noun}, not {count}",
                                      {"kind": "choice" if noun == "options" else "score", "least": least,
                                       "most": most, "noun": noun, "count": len(value)})
        return value
    return BeforeValidator(check)


def _option_name(value: Any, info: ValidationInfo) -> Any:
    if isinstance(value, str):
        if not value.strip():
            raise PydanticCustomError("string_too_short", "Option names must be non-empty")
        if problem := string_problem(value, info.context, shown=True):
            raise problem
    return value


def _question_id(value: Any, info: ValidationInfo) -> Any:
    if isinstance(value, str):
        if not value:
            raise PydanticCustomError("string_too_short", "Question ids must be non-empty strings")
        if problem := string_problem(value, info.context, shown=names_shown(info.context)):
            raise problem
    return value


def _level(value: Any) -> Any:
    if value is None:
        raise PydanticCustomError("string_type", "Input should be a string, an object or an array, not null")
    return value


OptionName = Annotated[str, BeforeValidator(_option_name), Field(min_length=1)]
QuestionId = Annotated[str, BeforeValidator(_question_id), Field(min_length=1)]
Level = Annotated[Structured, BeforeValidator(_level)]


class NoulCriteria(SystemOneModel):
    true: Structured | None = Field(None, description="What makes the answer true.")
    false: Structured | None = Field(None, description="What makes it false.")


class NoulQuestion(SystemOneModel):
    """Yes or no: the answer is P(true)."""

    type: Literal["noul"]
    instructions: Structured | None = None
    criteria: NoulCriteria | None = None


class ChoiceQuestion(SystemOneModel):
    """One of 2 to 255 named options (a description may be null)."""

    type: Literal["choice"]
    instructions: Structured | None = None
    criteria: Annotated[dict[OptionName, Structured | None], _count(2, MAX_OPTIONS, "options"),
                        Field(min_length=2, max_length=MAX_OPTIONS)]


class ScoreQuestion(SystemOneModel):
    """2 to 10 ordered levels, level 0 first: the answer is the expected level."""

    type: Literal["score"]
    instructions: Structured | None = None
    criteria: Annotated[list[Level], _count(2, MAX_SCORE_LEVELS, "levels"),
                        Field(min_length=2, max_length=MAX_SCORE_LEVELS)]


def _question_object(value: Any) -> Any:
    if not isinstance(value, dict):
        raise PydanticCustomError("dict_type", "Input should be a valid dictionary")
    return value


SystemOneQuestion = Annotated[Union[NoulQuestion, ChoiceQuestion, ScoreQuestion], Field(discriminator="type"),
                              BeforeValidator(_question_object)]


def _question_count(value: Any, info: ValidationInfo) -> Any:
    most = getattr(info.context, "max_decisions", None)
    if isinstance(value, dict):
        if not value:
            raise PydanticCustomError("too_short", "Dictionary should have at least 1 item after validation")
        if most is not None and len(value) > most:
            raise PydanticCustomError("too_long", "Dictionary should have at most {most} items "
                                      "(ADAPTER_MAX_DECISIONS), not {count}", {"most": most, "count": len(value)})
    return value


def _state(value: Any) -> Any:
    if not isinstance(value, (str, dict, list)):
        raise PydanticCustomError("state_type", "Input should be a string, an object or an array")
    return value


class SystemOneRequest(SystemOneModel):
    model: str = Field(description=f"The served model id, or its alias {ALIAS!r}.")
    state: Annotated[Any, BeforeValidator(_state), Field(json_schema_extra={
        "anyOf": [{"type": "string"}, {"type": "object"}, {"type": "array"}]})]
    questions: Annotated[dict[QuestionId, SystemOneQuestion], BeforeValidator(_question_count),
                         Field(min_length=1, description="Question id -> question; at most ADAPTER_MAX_DECISIONS.")]
    assets: Any = Field(None, description="Image assets; refused: this server serves a text-only model.")
    x_permutations: int | None = Field(None, ge=1, le=MAX_PERMUTATIONS, description=(
        "Orderings of each question's options to score and average (default ADAPTER_PERMUTATIONS): 1 is the order "
        "sent; 2 or more derive them from the option names (score levels: their text) alone."))
    x_debias: DebiasName | None = Field(None, description=DEBIAS_DESCRIPTION)
    x_show_prior: bool | None = Field(None, description="Report each debiased answer's prior over its options "
                                                        "(x_debias.prior, keyed as the answer's probabilities).")
    x_dry_run: bool | None = Field(None, description=dry_run.DESCRIPTION)

    @field_validator("model")
    @classmethod
    def _served(cls, model: str, info: ValidationInfo) -> str:
        served = getattr(info.context, "served_id", None)
        if served is not None and model not in (ALIAS, served):
            raise PydanticCustomError("value_error", "Unknown model {model}; this server serves {served} (also as "
                                      "{alias})", {"model": repr(printable(model)), "served": repr(served),
                                                   "alias": repr(ALIAS)})
        return model

    @field_validator("state", mode="after")
    @classmethod
    def _readable_state(cls, state: Any, info: ValidationInfo) -> Any:
        return check_json(state, info)

    @field_validator("assets")
    @classmethod
    def _no_assets(cls, assets: Any) -> Any:
        if assets is not None:
            raise PydanticCustomError("value_error",
                                      "Image assets are not supported: this server serves a text-only model")
        return assets


@dataclass(frozen=True)
class Item:
    """One question of the request, ready to score."""

    qid: str
    type: str
    names: tuple[str, ...]  # option names (choice), level keys (score), ("true", "false") for noul
    legend: tuple[Any, ...]  # score levels as sent
    question: Question


def parse_items(body: Any, context: RequestContext) -> list[Item]:
    """The items of a System One body; a ValidationError (pydantic's) if it is invalid."""
    return parse_request(body, context)[0]


def parse_request(body: Any, context: RequestContext) -> tuple[list[Item], bool]:
    """(items, dry run) of a System One body; a ValidationError (pydantic's) if it is invalid."""
    request = SystemOneRequest.model_validate(body, context=context)
    text = state_text(request.state)
    return [_item(qid, q, text, request.x_permutations, request.x_debias, bool(request.x_show_prior), request.state)
            for qid, q in request.questions.items()], bool(request.x_dry_run)


def parse(body: Any, context: RequestContext) -> tuple[str, str, list[Item]]:
    """(model name as sent, state text, items), the first problem an InputError: for callers outside the
    routes (the benchmark harness, the calibrate command)."""
    try:
        items = parse_items(body, context)
    except ValidationError as exc:
        first = validation_detail(exc)["detail"][0]
        raise InputError(first["loc"], first["msg"], first["type"]) from None
    return body["model"], items[0].question.state, items


def _structured(value: Any) -> str | None:
    return None if value is None else value if isinstance(value, str) else json_text(value)


def _item(qid: str, q: NoulQuestion | ChoiceQuestion | ScoreQuestion, state: str,
          permutations: int | None = None, debias: str | None = None, show_prior: bool = False,
          raw_state: Any = None) -> Item:
    loc: Loc = ("body", "questions", qid)
    cloc = loc + ("criteria",)
    instructions = _structured(q.instructions)
    legend: tuple[Any, ...] = ()
    if isinstance(q, NoulQuestion):
        criteria = q.criteria or NoulCriteria()
        names: tuple[str, ...] = ("true", "false")
        sides = list(zip((_structured(criteria.true), _structured(criteria.false)), NOUL_OPTIONS))
        texts = tuple(f"{word}: {description}" if description else word for description, word in sides)
        option_locs = (cloc + ("true",), cloc + ("false",))
        sent: tuple[tuple[str, Any], ...] = (("true", criteria.true), ("false", criteria.false))
    elif isinstance(q, ChoiceQuestion):
        names = tuple(q.criteria)
        texts = tuple(f"{name}: {text}" if (text := _structured(d)) else name for name, d in q.criteria.items())
        option_locs = tuple(cloc + (name,) for name in names)
        sent = tuple(q.criteria.items())
    else:
        names = tuple(str(i) for i in range(len(q.criteria)))
        texts = tuple(_structured(level) or "" for level in q.criteria)
        option_locs = tuple(cloc + (i,) for i in range(len(q.criteria)))
        legend = tuple(q.criteria)
        sent = tuple(zip(names, q.criteria))
    # Order averaging orders choices by name and score levels by their text: the options as the client
    # means them, whatever order it sent them in.
    keys = texts if q.type == "score" else names
    return Item(qid, q.type, names, legend, Question(
        loc=loc, state=state, question=instructions if instructions is not None else DEFAULT_INSTRUCTIONS[q.type],
        options=texts, option_locs=option_locs, state_loc=("body", "state"), question_loc=loc + ("instructions",),
        option_keys=keys, permutations=permutations, kind=q.type, debias=debias, show_prior=show_prior,
        source=QuestionSource(qid, q.type, q.instructions if q.instructions is not None
                              else DEFAULT_INSTRUCTIONS[q.type], state if raw_state is None else raw_state, sent)))


def answer_request(body: Any, call: Call) -> Answer:
    """Answer one System One body (with ``x_dry_run``: what it would do). Raises ValidationError or InputError
    (invalid, 422), or what ``call.score`` raises."""
    items, dry = parse_request(body, call.context)
    prepared = call.prepare([item.question for item in items])
    if dry:
        return dry_answer(items, call.dry_run(prepared), call)
    answered = call.score(prepared)
    stats = answered.stats
    input_tokens = sum(s.input_tokens for s in answered.results)
    payload = {
        "model": call.model.served_id,
        "answers": {item.qid: answer(item, s) for item, s in zip(items, answered.results)},
        "usage": {"input_tokens": input_tokens, "output_tokens": 0},
        "x_model": model_kind(call.model.model_info),
        "x_evaluated_tokens": stats.evaluated_tokens + answered.prior_tokens,  # label paths included
        "x_cached_tokens": stats.cached_tokens,
        "x_timing": {"queue": answered.queue_s, "prefill": stats.prefill_s, "readout": stats.readout_s,
                     "memory": stats.memory_s, "total": time.perf_counter() - call.started},
    }
    log = {"questions": len(items), "input_tokens": input_tokens, "queue_s": round(answered.queue_s, 6),
           "prefill_s": round(stats.prefill_s, 6), "readout_s": round(stats.readout_s, 6),
           "memory_s": round(stats.memory_s, 6), "compute_s": round(stats.compute_s, 6),
           "evaluated_tokens": stats.evaluated_tokens}
    if answered.prior_stats:
        payload["x_timing"]["prior"] = answered.prior_s
        payload["x_prior_tokens"] = answered.prior_tokens
        log.update({"prior_s": round(answered.prior_s, 6), "prior_tokens": answered.prior_tokens})
    return Answer(payload, log=log)


def model_kind(info: dict[str, Any]) -> dict[str, Any]:
    """Which kind of model answered and whose rules: ``x_model`` of every answer, and ``/v1/models``."""
    return {key: info[key] for key in ("kind", "rules", "decision_type") if info.get(key) is not None}


def dry_answer(items: list[Item], dry: DryRun, call: Call) -> Answer:
    """A dry run's answer: each question's prompts by its id, the request's figures and admission's verdict."""
    detail = dry_run.PromptDetail()
    payload = {"questions": {item.qid: dry_run.prompts(dry, i, item.names, detail) for i, item in enumerate(items)},
               **dry_run.figures(dry, call, render, detail)}
    return Answer({"model": call.model.served_id, "x_dry_run": payload},
                  log={"questions": len(items), **dry_run.log_fields(dry)})


def response_headers(request_id: str) -> dict[str, str]:
    """What every System One response carries, success or error, as TypeSafe's servers send it."""
    return {"x-typesafe-request-id": request_id}


def render(failure: Failure) -> tuple[dict[str, Any], int]:
    """System One's error body: FastAPI's 422 for invalid input, ``{"detail": {error_type, message}}`` else."""
    cause = failure.cause
    if failure.kind == "input" and isinstance(cause, (ValidationError, InputError)):
        if isinstance(cause, InputError) and cause.kind.startswith("json_"):
            return json_error(cause), 422
        return validation_detail(cause), 422
    body = error_body(failure.status, failure.message)
    if failure.retryable:
        body["retryable"] = True
    return body, failure.status


def answer(item: Item, scored: Scored) -> dict[str, Any]:
    """One question's answer. A decision GGUF's rules give their own figures (``Scored.answer``: lev's noul from
    its ratings, the confidences as llama-server computes them); otherwise they come from the probabilities."""
    p = scored.probabilities
    own = scored.answer or {}
    if item.type == "noul":
        out: dict[str, Any] = {"type": "noul", "noul": own.get("noul", p[0])}
    elif item.type == "choice":
        top = max(range(len(p)), key=p.__getitem__)
        out = {"type": "choice", "choice": item.names[top],
               "probabilities": dict(zip(item.names, p)), "confidence": own.get("confidence", choice_confidence(p))}
    else:
        out = {"type": "score", "score": own.get("score", math.fsum(i * x for i, x in enumerate(p))),
               "legend": dict(zip(item.names, item.legend)), "probabilities": dict(zip(item.names, p)),
               "confidence": own.get("confidence", score_confidence(p))}
    out["x_prompt_sha256"] = scored.prompt_sha256
    if scored.temperature is not None:
        out["x_temperature"] = scored.temperature
    out["x_label_mass"] = scored.label_mass
    out["x_orderings"] = answered_orderings(scored)
    if scored.calibration is not None:
        out["x_calibration"] = scored.calibration
    if scored.debias is not None:
        out["x_debias"] = {**scored.debias, **({"prior": dict(zip(item.names, scored.prior))}
                                               if item.question.show_prior and scored.prior else {})}
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


def validation_detail(exc: ValidationError | InputError) -> dict[str, Any]:
    """FastAPI's 422 body: pydantic's errors (or the scoring layer's one), each located from "body"."""
    if isinstance(exc, InputError):
        loc = list(exc.loc) if exc.loc and exc.loc[0] == "body" else ["body", *exc.loc]
        return {"detail": [{"loc": _safe_loc(loc), "msg": exc.msg, "type": exc.kind}]}
    return {"detail": [_fastapi_error(error) for error in exc.errors(include_url=False, include_input=False)]}


def _fastapi_error(error: dict[str, Any]) -> dict[str, Any]:
    loc = list(error["loc"])
    # A tagged union puts the tag in the location (questions.q.choice.criteria); the question's own
    # fields sit right under its id, so the tag is dropped. An absent tag is the missing field it is.
    if len(loc) > 2 and loc[0] == "questions" and loc[2] in QUESTION_TYPES:
        del loc[2]
    out = {"loc": _safe_loc(["body", *loc]), "msg": error["msg"], "type": error["type"]}
    if error["type"] == "union_tag_not_found":
        return {"loc": out["loc"] + ["type"], "msg": "Field required", "type": "missing"}
    if error["type"] == "union_tag_invalid":
        out["loc"].append("type")
    if error.get("ctx"):
        out["ctx"] = {k: v if isinstance(v, (str, int, float, bool)) or v is None else str(v)
                      for k, v in error["ctx"].items()}
    if error["type"] == "union_tag_invalid" and error.get("ctx", {}).get("tag") == "box":
        out["msg"] += " (box questions need a vision model)"
    return out


def json_error(exc: InputError) -> dict[str, Any]:
    """FastAPI's 422 for a body that is not JSON at all."""
    return {"detail": [{"loc": ["body"], "msg": exc.msg, "type": exc.kind}]}


def _safe_loc(loc: list[Any]) -> list[Any]:
    return [printable(p) if isinstance(p, str) else p for p in loc]


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"detail": {"error_type": ERROR_TYPES.get(status, "invalid_request_error"), "message": message}}


# ---- Responses (the OpenAPI document describes them; tests check real responses against them) ----------------

class Response(BaseModel):
    """Closed, as the decision schema's responses are: the published schema refuses fields it does not list."""

    model_config = ConfigDict(extra="forbid")


class DebiasApplied(Response):
    """The content-free calibration applied to an answer: its mode, its content-free states and, with x_show_prior,
    the prior's own distribution (keyed like the answer's probabilities; noul: true and false)."""

    mode: str
    states: list[str]
    question: str | None = Field(None, description="What replaced the question in the prior's prompt (a label "
                                                   "prior); absent: the question was kept (a state prior).")
    strength: float = Field(description="The power (alpha, 0 to 1) the prior was raised to before it was divided "
                                        "out: calibration.json's for the question's type, else ADAPTER_DEBIAS_STRENGTH.")
    floor: float = Field(description="The uniform's share mixed into the prior before it was divided out.")
    prior: dict[str, float] | None = None


class Extensions(Response):
    """What every answer adds to TypeSafe's shape."""

    x_prompt_sha256: str
    x_label_mass: float | None = Field(None, description="Share of the full-vocabulary probability on the labels "
                                                         "at the answer position; low means the prompt is not understood.")
    x_calibration: dict[str, Any] | None = Field(None, description="The temperature applied (calibration.json "
                                                                   "fitted for this GGUF and prompt), if any.")
    x_debias: DebiasApplied | None = Field(None, description="The content-free calibration applied, if any.")
    x_temperature: float | None = Field(None, description="A decision GGUF's temperature for this question (the "
                                                          "file's <type>[.<bucket>]).")
    x_orderings: Orderings | None = None


class NoulAnswer(Extensions):
    type: Literal["noul"]
    noul: float = Field(description="P(true).")


class ChoiceAnswer(Extensions):
    type: Literal["choice"]
    choice: str
    probabilities: dict[str, float]
    confidence: float = Field(description="(n*max - 1) / (n - 1).")


class ScoreAnswer(Extensions):
    type: Literal["score"]
    score: float = Field(description="The expected level, sum of i * p_i.")
    legend: dict[str, Any]
    probabilities: dict[str, float]
    confidence: float


class Usage(Response):
    input_tokens: int
    output_tokens: int


class SystemOneTiming(Response):
    queue: float
    prefill: float
    readout: float
    memory: float | None = Field(None, description="Seconds moving saved memory (restoring cached states and "
                                                   "checkpoints, saving, cutting back): no tokens computed.")
    total: float
    prior: float | None = Field(None, description="Seconds spent scoring the priors of debiased answers (0 when "
                                                  "they came from the cache).")


class ModelKind(Response):
    """Which kind of model answered, and whose rules."""

    kind: Literal["chat", "decision-gguf"]
    rules: str
    decision_type: str | None = None


class SystemOneResponse(Response):
    model: str
    answers: dict[str, Annotated[Union[NoulAnswer, ChoiceAnswer, ScoreAnswer], Field(discriminator="type")]]
    usage: Usage
    x_model: ModelKind | None = Field(None, description="Which kind of model answered (a plain chat GGUF by this "
                                                        "adapter's readout, or a decision GGUF by its type's rules).")
    x_evaluated_tokens: int = Field(description="Tokens decoded for the request: the state, each prompt's own "
                                                "tokens and label paths, and the priors' (x_prior_tokens); not those "
                                                "the cache served.")
    x_timing: SystemOneTiming
    x_request: RequestIdentity | None = Field(None, description=X_REQUEST_DESCRIPTION)
    x_cached_tokens: int | None = Field(None, description="Prompt tokens an earlier request evaluated, taken "
                                                         "from the state cache.")
    x_prior_tokens: int | None = Field(None, description="Tokens decoded for the priors of debiased answers "
                                                        "(included in x_evaluated_tokens); 0 when cached.")


class ValidationIssue(Response):
    loc: list[str | int]
    msg: str
    type: str
    ctx: dict[str, Any] | None = None


class ValidationFailure(Response):
    """422: the request does not match the schema; each issue is located from "body"."""

    detail: list[ValidationIssue]
    status: int | None = Field(None, description="In a line of a batch answer: the HTTP status of this record.")


class ErrorDetail(Response):
    error_type: str
    message: str


class SystemOneError(Response):
    """Any other refusal (401, 413, 415, 503, ...)."""

    detail: ErrorDetail
    retryable: bool | None = None
    status: int | None = Field(None, description="In a line of a batch answer: the HTTP status of this record.")


class ServedModel(Response):
    name: str
    description: str
    release_date: str
    x_model: ModelKind | None = None


class ModelsResponse(Response):
    models: list[ServedModel]


class SystemOneDryRun(dry_run.DryRunFigures):
    questions: dict[str, dry_run.DryQuestion] = Field(description="Each question by its id.")
    refusal: SystemOneError | ValidationFailure | None = Field(None, description="The error body the request would "
                                                                                 "get now (status), when not admitted.")


class SystemOneDryRunResponse(Response):
    """x_dry_run: what the request would do now; nothing was decoded."""

    model: str
    x_dry_run: SystemOneDryRun
    x_request: RequestIdentity | None = Field(None, description=X_REQUEST_DESCRIPTION)
