"""The SageMaker blueprint: ``/ping``, ``/invocations``, ``/execution-parameters`` and ``/openapi.json``.

``/invocations`` reads one JSON body, or records one per line (``application/jsonlines``, or
``application/json`` holding several objects one per line, as Batch Transform sends with SplitType=Line
and BatchStrategy=MultiRecord), and dispatches each on its keys: ``decision``/``decisions`` to the
decision schema, ``questions`` to System One's handler, which answers in its own shape. Errors on these
routes are ``{"error": "<message naming the field>"}``, plus ``"retryable": true`` on transient ones.

In a batch, a record with bad input gets its own error object (its status inside) and the others are
answered; a record refused for a transient reason (busy, deadline) refuses the whole batch with a
retryable 503, which SageMaker retries, rather than writing a permanent error record.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, NamedTuple

from flask import Blueprint, Response, g, request
from pydantic import ValidationError
from werkzeug.exceptions import HTTPException

from . import bodies, decision_schema, openapi, service, systemone_routes
from .errors import ApiError, InputError

log = logging.getLogger(__name__)
blueprint = Blueprint("sagemaker", __name__)

JSON_TYPES = {"application/json"}
JSONLINES_TYPES = {"application/jsonlines", "application/x-jsonlines", "application/jsonl", "application/x-ndjson"}


class Protocol(NamedTuple):
    answer: Callable[[Any], tuple[dict[str, Any], dict[str, str]]]
    render_error: Callable[[Exception], tuple[dict[str, Any], int, dict[str, str]]]


def answer_decisions(obj: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Answer a ``decision`` or ``decisions`` body: (payload, headers). Raises InputError or ApiError."""
    state = service.current()
    model = state.readiness.model
    decisions, single = decision_schema.parse(obj, state.context())
    prepared = model.prepare([d.question for d in decisions])
    scored, stats, queue_s = service.score(model, prepared, state)
    results = [decision_schema.result(d, s, model.model_info) for d, s in zip(decisions, scored)]
    timing = {"queue": queue_s, "prefill": stats.prefill_s, "readout": stats.readout_s,
              "total": time.perf_counter() - g.started, "cached_tokens": stats.cached_tokens}
    g.log.update({"decisions": g.log.get("decisions", 0) + len(decisions),
                  "input_tokens": g.log.get("input_tokens", 0) + sum(s.input_tokens for s in scored),
                  "queue_s": round(queue_s, 6), "prefill_s": round(stats.prefill_s, 6),
                  "readout_s": round(stats.readout_s, 6)})
    if single:
        return {"result": {**results[0], "timing": timing}}, {}
    timing.update({"prefix_tokens": stats.resident_tokens + stats.shared_tokens,
                   "resident_tokens": stats.resident_tokens, "shared_tokens": stats.shared_tokens,
                   "question_tokens": list(stats.own_tokens)})
    return {"results": results, "timing": timing}, {}


def render_error(exc: Exception) -> tuple[dict[str, Any], int, dict[str, str]]:
    """(body, status, headers) of any error in this blueprint's shape."""
    if isinstance(exc, InputError):
        return {"error": str(exc)}, 400, {}
    if isinstance(exc, HTTPException):
        return {"error": exc.description or exc.name}, exc.code or 500, service.http_error_headers(exc)
    if isinstance(exc, ApiError):
        body: dict[str, Any] = {"error": exc.message}
        if exc.retryable:
            body["retryable"] = True
        return body, exc.status, exc.headers
    log.error("unhandled error", exc_info=exc, extra={"fields": {"request_id": g.get("request_id")}})
    return {"error": "internal error"}, 500, {}


DECISIONS = Protocol(answer_decisions, render_error)
SYSTEM_ONE = Protocol(systemone_routes.answer, systemone_routes.render_error)


def protocol_of(obj: Any) -> Protocol:
    if not isinstance(obj, dict):
        raise InputError((), "the body must be a JSON object")
    if "questions" in obj:
        return SYSTEM_ONE
    if "decision" in obj or "decisions" in obj:
        return DECISIONS
    raise InputError((), "the body must hold 'decision', 'decisions' or 'questions' (System One)")


def answer_record(obj: Any) -> tuple[dict[str, Any], int, dict[str, str]]:
    """One request object, answered in its protocol's shape, errors included, except a transient refusal
    (``ApiError.retryable``), which propagates."""
    protocol = protocol_of(obj)
    try:
        payload, headers = protocol.answer(obj)
    except ApiError as exc:
        if exc.retryable:
            raise
        return protocol.render_error(exc)
    except (InputError, ValidationError) as exc:
        return protocol.render_error(exc)
    return payload, 200, headers


@blueprint.before_request
def _gate() -> None:
    if request.endpoint == "sagemaker.invocations":
        service.gate()


blueprint.teardown_request(service.leave)


@blueprint.errorhandler(Exception)
def _error(exc: Exception) -> Response:
    return service.json_response(*render_error(exc))


@blueprint.get("/ping")
def ping() -> Response:
    state = service.current()
    readiness = state.readiness
    if state.admission.draining:
        return service.json_response({"status": "draining", "detail": "the server is shutting down"}, 503)
    return service.json_response({"status": readiness.state, "detail": readiness.reason,
                                  "admitted": state.admission.admitted, "capacity": state.admission.capacity},
                                 200 if readiness.state == "ready" else 503)


@blueprint.get("/execution-parameters")
def execution_parameters() -> Response:
    """Batch Transform asks this once per container: what one instance honours."""
    settings = service.current().settings
    return service.json_response({"MaxConcurrentTransforms": settings.max_concurrent_transforms,
                                  "BatchStrategy": "MULTI_RECORD", "MaxPayloadInMB": settings.max_payload_mb})


@blueprint.get("/openapi.json")
def openapi_document() -> Response:
    return service.json_response(openapi.document())


@blueprint.post("/invocations")
def invocations() -> Response:
    media_type = service.media_type()
    if media_type not in JSON_TYPES | JSONLINES_TYPES:
        raise ApiError(415, "Content-Type must be application/json or application/jsonlines "
                            f"(got {request.content_type or 'none'})")
    body = service.read_body()
    if media_type in JSONLINES_TYPES or bodies.holds_lines(body):
        return _answer_lines(bodies.split_records(body, service.current().settings.max_lines))
    obj = bodies.parse_json(body)
    protocol = protocol_of(obj)
    try:
        payload, status, headers = answer_record(obj)
    except ApiError as exc:
        payload, status, headers = protocol.render_error(exc)
    return service.json_response(payload, status, headers)


def _answer_lines(records: list[tuple[int, bytes]]) -> Response:
    """One result line per record, in order."""
    out = []
    for number, raw in records:
        try:
            if not raw.strip():
                raise InputError((), "is empty")
            payload, status, _ = answer_record(bodies.parse_json(raw))
        except InputError as exc:
            payload, status = {"error": str(exc)}, 400
        except ApiError as exc:  # transient: the whole mini-batch is refused, and SageMaker retries it
            raise ApiError(exc.status, f"line {number}: {exc.message}; the whole batch is refused so that it is "
                           "retried", headers=exc.headers, retryable=True) from None
        if status != 200:
            if "error" in payload:
                payload = {**payload, "error": f"line {number}: {payload['error']}"}
            payload = {**payload, "status": status}
        out.append(bodies.dumps(payload))
    return Response("\n".join(out) + "\n", 200, mimetype="application/jsonlines")
