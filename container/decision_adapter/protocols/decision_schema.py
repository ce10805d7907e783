"""The AWS walkthrough's decision schema: ``{"decision": {...}}`` and ``{"decisions": [...]}``.

Owns the request models (pydantic, strict), their translation into ``Question``s for the decision
model, the answer and its result shape, the error body (``{"error": ..., "retryable"?}``, also every
SageMaker route's) and the response models (for the OpenAPI document). Every problem becomes an
``InputError`` whose message names the field, e.g. ``decisions[1].options[0].id repeats the option id 'a'``.
A body with ``"x_dry_run": true`` is answered with what it would do instead (``dry_run``): ``{"dry_run": {...}}``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo
from pydantic import WithJsonSchema, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from ..decisions.labels import MAX_OPTIONS, MAX_PERMUTATIONS
from ..decisions.model import DryRun, Question, QuestionSource, Scored
from ..decisions.prompt import state_text
from ..errors import Failure, InputError, Loc
from . import dry_run
from .orderings import Orderings, answered_orderings
from .call import Answer, Call
from .fields import DEBIAS_DESCRIPTION, X_REQUEST_DESCRIPTION, DebiasName, NonEmptyName, NonEmptyText, RequestContext, \
    RequestIdentity, StrictModel, Text, check_json, printable


def _state_type(value: Any) -> Any:
    if isinstance(value, str):
        if not value.strip():
            raise PydanticCustomError("string_too_short", "must be a non-empty string")
    elif isinstance(value, (dict, list)):
        if not value:
            raise PydanticCustomError("too_short", "must not be empty")
    else:
        raise PydanticCustomError("state_type", "must be a non-empty string or a JSON object or array")
    return value


def _option_count(value: Any) -> Any:
    if isinstance(value, list) and not 2 <= len(value) <= MAX_OPTIONS:
        raise PydanticCustomError("too_short" if len(value) < 2 else "too_long",
                                  "has {count} options; 2 to {most} are allowed", {"count": len(value), "most": MAX_OPTIONS})
    return value


def _decision_count(value: Any, info: ValidationInfo) -> Any:
    most = getattr(info.context, "max_decisions", None)
    if isinstance(value, list):
        if not value:
            raise PydanticCustomError("too_short", "must be a non-empty array of decisions")
        if most is not None and len(value) > most:
            raise PydanticCustomError("too_long", "has {count} decisions, over the limit of {most}",
                                      {"count": len(value), "most": most})
    return value


STATE_SCHEMA = {"anyOf": [{"type": "string", "minLength": 1, "pattern": r"\S"},
                          {"type": "object", "minProperties": 1}, {"type": "array", "minItems": 1}],
                "description": "The context: a string, or a JSON object or array rendered as JSON in its key order."}
State = Annotated[Any, BeforeValidator(_state_type), AfterValidator(check_json), WithJsonSchema(STATE_SCHEMA)]


def _located(loc: Loc, kind: str, message: str, value: Any) -> ValidationError:
    return ValidationError.from_exception_data("decision", [InitErrorDetails(
        type=PydanticCustomError(kind, message), loc=loc, input=value)])


class Option(StrictModel):
    id: NonEmptyText = Field(description="Unique within the decision; shown to the model when the description is empty.")
    description: Text = Field("", description="What the option means; when empty, the id stands in.")


class Decision(StrictModel):
    id: NonEmptyName = Field(description="Caller-defined, echoed back; shown to the model only by a decision GGUF's "
                                         "template (then checked for its control tokens).")
    state: State
    question: NonEmptyText
    options: Annotated[list[Option], BeforeValidator(_option_count), Field(min_length=2, max_length=MAX_OPTIONS)]
    permutations: int | None = Field(None, ge=1, le=MAX_PERMUTATIONS, description=(
        "Orderings of the options to score and average (default ADAPTER_PERMUTATIONS): 1 is the order sent; 2 or "
        "more derive the orderings from the option ids alone, so the answer does not depend on the order sent."))
    debias: DebiasName | None = Field(None, description=DEBIAS_DESCRIPTION)
    show_prior: bool = Field(False, description="Report the prior's own distribution over the options "
                                                "(debias.prior) when the decision is debiased.")

    @model_validator(mode="after")
    def _unique_option_ids(self) -> "Decision":
        seen: set[str] = set()
        for i, option in enumerate(self.options):
            if option.id in seen:
                raise _located(("options", i, "id"), "value_error",
                               f"repeats the option id {option.id!r}; option ids must be unique", option.id)
            seen.add(option.id)
        return self


class DecisionRequest(StrictModel):
    """One decision."""

    decision: Decision
    x_dry_run: bool = Field(False, description=dry_run.DESCRIPTION)


class DecisionsRequest(StrictModel):
    """Several decisions over one shared state, evaluated once (at most ADAPTER_MAX_DECISIONS)."""

    decisions: Annotated[list[Decision], BeforeValidator(_decision_count), Field(min_length=1)]
    x_dry_run: bool = Field(False, description=dry_run.DESCRIPTION)

    @model_validator(mode="after")
    def _one_state_unique_ids(self) -> "DecisionsRequest":
        first = state_text(self.decisions[0].state)
        seen: set[str] = set()
        for i, d in enumerate(self.decisions):
            if state_text(d.state) != first:
                raise _located(("decisions", i, "state"), "value_error", "must equal decisions[0].state: a decisions "
                               "request shares one state (send separate requests for different states)", None)
            if d.id in seen:
                raise _located(("decisions", i, "id"), "value_error", f"repeats the id {d.id!r}; ids must be unique", d.id)
            seen.add(d.id)
        return self


@dataclass(frozen=True)
class Parsed:
    """A decision ready to score, with the ids to echo."""

    id: str
    option_ids: tuple[str, ...]
    question: Question


def parse(body: dict[str, Any], context: RequestContext) -> tuple[list[Parsed], bool]:
    """(decisions, single) from a body holding ``decision`` or ``decisions``; an InputError otherwise."""
    decisions, single, _ = parse_request(body, context)
    return decisions, single


def parse_request(body: dict[str, Any], context: RequestContext) -> tuple[list[Parsed], bool, bool]:
    """(decisions, single, dry run) from a body holding ``decision`` or ``decisions``; an InputError otherwise."""
    single = "decision" in body
    root: type[DecisionRequest | DecisionsRequest] = DecisionRequest if single else DecisionsRequest
    try:
        request = root.model_validate(body, context=context)
    except ValidationError as exc:
        raise first_error(exc, root) from None
    if isinstance(request, DecisionRequest):
        return [_parsed(request.decision, ("decision",))], True, request.x_dry_run
    return [_parsed(d, ("decisions", i)) for i, d in enumerate(request.decisions)], False, request.x_dry_run


def _parsed(d: Decision, loc: Loc) -> Parsed:
    texts = tuple(o.description.strip() or o.id for o in d.options)
    option_locs = tuple(loc + ("options", i, "description" if o.description.strip() else "id")
                        for i, o in enumerate(d.options))
    return Parsed(d.id, tuple(o.id for o in d.options), Question(
        loc=loc, state=state_text(d.state), question=d.question, options=texts, option_locs=option_locs,
        state_loc=loc + ("state",), question_loc=loc + ("question",), option_keys=tuple(o.id for o in d.options),
        permutations=d.permutations, debias=d.debias, show_prior=d.show_prior,
        # A decision is a choice among its options, as a decision GGUF's template is given it: the id as the
        # question id, the option ids as keys, an empty description as none.
        source=QuestionSource(d.id, "choice", d.question, d.state,
                              tuple((o.id, o.description if o.description.strip() else None) for o in d.options))))


def first_error(exc: ValidationError, root: type[BaseModel]) -> InputError:
    """The schema's one error message: the shallowest problem first, in the schema's own words."""
    error = min(exc.errors(include_url=False), key=lambda e: len(e["loc"]))
    loc = tuple(printable(p) if isinstance(p, str) else p for p in error["loc"])
    kind = error["type"]
    if kind == "missing":
        msg = "is required"
    elif kind == "extra_forbidden":
        msg = f"is not a known field (expected: {', '.join(_fields_at(root, loc[:-1]))})"
    elif kind in ("model_type", "model_attributes_type", "dict_type"):
        fields = _fields_at(root, loc)
        msg = f"must be an object with {', '.join(fields[:-1])} and {fields[-1]}" if len(fields) > 1 else "must be an object"
    elif kind == "list_type":
        msg = "must be an array" + (" of options" if loc[-1:] == ("options",) else "")
    elif kind == "string_type":
        msg = "must be a string"
    else:
        msg = error["msg"]
    return InputError(loc, msg, kind)


def _fields_at(root: type[BaseModel], loc: Loc) -> list[str]:
    """The fields of the model that ``loc`` points into (``decisions[0].options[1]`` -> Option's)."""
    model: Any = root
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            return []
        model = next((t for t in (field.annotation, *get_args(field.annotation))
                      if isinstance(t, type) and issubclass(t, BaseModel)), None)
    return list(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else []


def answer(body: dict[str, Any], call: Call) -> Answer:
    """Answer a ``decision`` or ``decisions`` body (with ``x_dry_run``: what it would do). Raises InputError, or
    what ``call.score`` raises."""
    decisions, single, dry = parse_request(body, call.context)
    prepared = call.prepare([d.question for d in decisions])
    if dry:
        return dry_answer(decisions, call.dry_run(prepared), call)
    answered = call.score(prepared)
    stats = answered.stats
    results = [result(d, s, call.model.model_info) for d, s in zip(decisions, answered.results)]
    timing = {"queue": answered.queue_s, "prefill": stats.prefill_s, "readout": stats.readout_s,
              "memory": stats.memory_s, "total": time.perf_counter() - call.started,
              "cached_tokens": stats.cached_tokens, "evaluated_tokens": stats.evaluated_tokens + answered.prior_tokens}
    log = {"decisions": len(decisions), "input_tokens": sum(s.input_tokens for s in answered.results),
           "queue_s": round(answered.queue_s, 6), "prefill_s": round(stats.prefill_s, 6),
           "readout_s": round(stats.readout_s, 6), "memory_s": round(stats.memory_s, 6),
           "compute_s": round(stats.compute_s, 6), "evaluated_tokens": stats.evaluated_tokens}
    if answered.prior_stats:
        timing.update({"prior": answered.prior_s, "prior_tokens": answered.prior_tokens})
        log.update({"prior_s": round(answered.prior_s, 6), "prior_tokens": answered.prior_tokens})
    if single:
        return Answer({"result": {**results[0], "timing": timing}}, log=log)
    timing.update({"prefix_tokens": stats.resident_tokens + stats.shared_tokens,
                   "resident_tokens": stats.resident_tokens, "shared_tokens": stats.shared_tokens,
                   "question_tokens": list(stats.own_tokens)})
    return Answer({"results": results, "timing": timing}, log=log)


def dry_answer(decisions: list[Parsed], dry: DryRun, call: Call) -> Answer:
    """A dry run's answer: each decision's prompts, the request's figures and admission's verdict."""
    detail = dry_run.PromptDetail()
    payload = {"decisions": [{"id": d.id, **dry_run.prompts(dry, i, d.option_ids, detail)}
                             for i, d in enumerate(decisions)], **dry_run.figures(dry, call, render, detail)}
    return Answer({"dry_run": payload}, log={"decisions": len(decisions), **dry_run.log_fields(dry)})


def render(failure: Failure) -> tuple[dict[str, Any], int]:
    """The error body of this schema and of every SageMaker route: the message, and whether to retry."""
    body: dict[str, Any] = {"error": failure.message}
    if failure.retryable:
        body["retryable"] = True
    return body, failure.status


def result(decision: Parsed, scored: Scored, model_info: dict[str, Any]) -> dict[str, Any]:
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
        **({"temperature": scored.temperature} if scored.temperature is not None else {}),
        **({"debias": {**scored.debias, **({"prior": list(scored.prior)} if decision.question.show_prior else {})}}
           if scored.debias is not None else {}),
        "orderings": answered_orderings(scored),
        "model": model_info,
    }



# ---- Responses (the OpenAPI document describes them; tests check real responses against them) ----------------

class Response(BaseModel):
    """A response model is closed: the published schema refuses a field it does not list (additionalProperties
    false), so a field added to an answer without its description fails the OpenAPI test."""

    model_config = ConfigDict(extra="forbid")


class ModelInfo(Response):
    """The pinned identity of the model that answered."""

    file: str
    bytes: int
    sha256: str
    source: str | None = None
    revision: str | None = None
    llama_cpp: str | None = None
    llama_cpp_python: str | None = None
    threads: int | None = None
    gpu_layers: int | None = None
    cpu_variant: str | None = Field(None, description="llama.cpp's CPU kernels that answered: the variant loaded for "
                                    "this CPU (x64, haswell, skylakex, icelake, zen4, sapphirerapids, ...) or "
                                    "built-in.")
    cpu_features: list[str] | None = Field(None, description="Instruction sets those kernels were compiled for, in "
                                           "ggml's names (AVX2, AVX512, AVX512_VNNI, AVX512_BF16, AMX_INT8, ...).")
    architecture: str | None = Field(None, description="The GGUF's general.architecture (llama, qwen2, ...).")
    flash_attention: Literal["off", "on"] | None = Field(None, description="ADAPTER_FLASH_ATTENTION.")
    kv_cache_type: str | None = Field(None, description="ADAPTER_KV_CACHE_TYPE: the type of the keys and values.")
    layout: str | None = Field(None, description="How prompts are decoded into micro-batches (exact: the state and "
                                                 "each question from their own first tokens).")
    prompt_version: str | None = Field(None, description="A digest of the prompt's style, template and label sets: "
                                                         "the version calibration.json is bound to (a decision GGUF: "
                                                         "its type and a digest of its template and temperatures).")
    kind: Literal["chat", "decision-gguf"] | None = Field(None, description="Which kind of model answered: a plain "
                                                          "chat GGUF read by this adapter's own prompt and readout, or "
                                                          "a decision GGUF read by its type's rules.")
    rules: str | None = Field(None, description="Whose rules answered: this adapter's, or llama-server's for the "
                                                "decision GGUF's type.")
    decision_type: str | None = Field(None, description="A decision GGUF's <arch>.decision.type (lev, openjev).")
    decision_temperatures: dict[str, float] | None = Field(None, description="A decision GGUF's temperatures by "
                                                           "<question type>[.<bucket>], as used.")
    labels: int | None = Field(None, description="A decision GGUF's single-token labels on this vocabulary: the "
                                                 "most options it answers.")
    memory: str | None = Field(None, description="What the model's memory is made of, which decides how a state is "
                                                 "reused exactly: plain (attention over every position), "
                                                 "sliding-window, hybrid (recurrent layers beside attention) or "
                                                 "recurrent.")
    window: int | None = Field(None, description="The sliding window's width in positions (0: none).")
    reuse: dict[str, str] | None = Field(None, description="What each reuse does on this memory: a cached state "
                                         "(states), a cached state's prefix (prefixes) and the orderings' shared "
                                         "stem (stems).")


class Calibration(Response):
    """A temperature fitted for this GGUF and prompt version, per question type."""

    temperature: float
    type: str
    gguf_sha256: str
    prompt_version: str


class Debias(Response):
    """The content-free calibration applied: its mode, its content-free states and, on request, the prior."""

    mode: str
    states: list[str]
    question: str | None = Field(None, description="What replaced the question in the prior's prompt (a label "
                                                   "prior); absent: the question was kept (a state prior).")
    strength: float = Field(description="The power (alpha, 0 to 1) the prior was raised to before it was divided "
                                        "out: calibration.json's for the question's type, else ADAPTER_DEBIAS_STRENGTH.")
    floor: float = Field(description="The uniform's share mixed into the prior before it was divided out.")
    prior: list[float] | None = Field(None, description="The prior's own distribution over the options, in option "
                                                        "order (with show_prior).")


class Timing(Response):
    """Seconds spent waiting for the model, prefilling, reading the labels out, and in all."""

    queue: float
    prefill: float
    readout: float
    memory: float | None = Field(None, description="Seconds moving saved memory (restoring cached states and "
                                                   "checkpoints, saving, cutting back): no tokens computed.")
    total: float
    cached_tokens: int | None = Field(None, description="Tokens of the prompt taken from the state cache.")
    evaluated_tokens: int | None = Field(None, description="Tokens decoded for the request: the state, each "
                                                           "prompt's own tokens and label paths, and the priors' "
                                                           "(prior_tokens); not those the cache served.")
    prior: float | None = Field(None, description="Seconds spent scoring debiased decisions' priors (0 when "
                                                  "they came from the cache).")
    prior_tokens: int | None = Field(None, description="Tokens decoded for the priors: 0 when they came from the "
                                                       "cache.")


class SharedTiming(Timing):
    prefix_tokens: int
    resident_tokens: int
    shared_tokens: int
    question_tokens: list[int]


class DecisionResult(Response):
    id: str
    option_ids: list[str]
    probabilities: list[float] = Field(description="In option order; they sum to 1.")
    option_logits: list[float] = Field(description="Raw last-position logits of the answer labels "
                                                   "(log-probabilities when labels take several tokens).")
    prompt_sha256: str
    input_tokens: int
    readout: str
    model: ModelInfo
    label_mass: float | None = Field(None, description="Share of the full-vocabulary probability on the labels "
                                                       "at the answer position.")
    top_token_is_label: bool | None = Field(None, description="Whether the most likely token there is a label.")
    calibration: Calibration | None = Field(None, description="The calibration applied to the probabilities, when "
                                                              "the model folder holds one; option_logits stay raw.")
    debias: Debias | None = Field(None, description="The content-free calibration applied, when the decision is "
                                                    "debiased; option_logits stay the model's own.")
    temperature: float | None = Field(None, description="A decision GGUF's temperature for this question (the file's "
                                                        "<type>[.<bucket>]), applied in its type's softmax.")
    orderings: Orderings | None = None


class TimedResult(DecisionResult):
    timing: Timing


class DecisionResponse(Response):
    result: TimedResult
    x_request: RequestIdentity | None = Field(None, description=X_REQUEST_DESCRIPTION)


class DecisionsResponse(Response):
    results: list[DecisionResult]
    timing: SharedTiming
    x_request: RequestIdentity | None = Field(None, description=X_REQUEST_DESCRIPTION)


class Error(Response):
    """A SageMaker-route error: the message names the field; ``retryable`` marks a transient refusal."""

    error: str
    retryable: bool | None = None
    status: int | None = Field(None, description="In a line of a batch answer: the HTTP status of this record.")


class DryDecision(dry_run.DryQuestion):
    id: str


class DryRunReport(dry_run.DryRunFigures):
    decisions: list[DryDecision] = Field(description="Each decision, in the request's order.")
    refusal: Error | None = Field(None, description="The error body the request would get now (status), when not "
                                                    "admitted.")


class DryRunResponse(Response):
    """x_dry_run: what the request would do now; nothing was decoded."""

    dry_run: DryRunReport
    x_request: RequestIdentity | None = Field(None, description=X_REQUEST_DESCRIPTION)
