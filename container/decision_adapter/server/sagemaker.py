"""The SageMaker blueprint: ``/ping``, ``/invocations``, ``/execution-parameters`` and ``/openapi.json``.

``/invocations`` reads one JSON body, or records one per line (``application/jsonlines``, or
``application/json`` holding several objects one per line, as Batch Transform sends with SplitType=Line
and BatchStrategy=MultiRecord), and dispatches each on its keys (``protocols.dispatch``): ``decision``/
``decisions`` to the decision schema, ``questions`` to System One, answered and refused in System One's shape.
Errors on these routes are ``{"error": "<message naming the field>"}``, plus ``"retryable": true`` on
transient ones.

In a batch, a record with bad input gets its own error object (its status inside) and the others are
answered; a record refused for a transient reason (busy, deadline) refuses the whole batch with a
retryable 503, which SageMaker retries, rather than writing a permanent error record.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, request

from ..errors import ApiError, InputError
from ..protocols import decision_schema, openapi
from ..protocols.dispatch import SYSTEM_ONE, Protocol, protocol_of
from . import bodies, gate
from .calls import call
from .errors import classify, respond
from .http import JSON_TYPES, JSONLINES_TYPES, json_response, media_type, read_body
from .logs import add_log_fields
from .state import current
from .systemone import request_id_header

blueprint = Blueprint("sagemaker", __name__)
KERNEL_KEYS = ("cpu_variant", "cpu_features")


def render_error(exc: Exception) -> Response:
    """Any error on these routes, in the decision schema's shape."""
    return respond(decision_schema.render, exc)


gate.install(blueprint, scoring_endpoint="sagemaker.invocations", guard_others=False)
blueprint.register_error_handler(Exception, render_error)


@blueprint.get("/ping")
def ping() -> Response:
    state = current()
    readiness = state.readiness
    if state.admission.draining:
        return json_response({"status": "draining", "detail": "the server is shutting down"}, 503)
    body = {"status": readiness.state, "detail": readiness.reason,
            "admitted": state.admission.admitted, "capacity": state.admission.capacity}
    if readiness.model is not None:  # the CPU kernels the model runs on (engine/backends.py)
        body.update({key: readiness.model.model_info[key] for key in KERNEL_KEYS if key in readiness.model.model_info})
    return json_response(body, 200 if readiness.state == "ready" else 503)


@blueprint.get("/execution-parameters")
def execution_parameters() -> Response:
    """Batch Transform asks this once per container: what one instance honours."""
    settings = current().settings
    return json_response({"MaxConcurrentTransforms": settings.max_concurrent_transforms,
                          "BatchStrategy": "MULTI_RECORD", "MaxPayloadInMB": settings.max_payload_mb})


@blueprint.get("/openapi.json")
def openapi_document() -> Response:
    return json_response(openapi.document())


@blueprint.post("/invocations")
def invocations() -> Response:
    kind = media_type()
    if kind not in JSON_TYPES | JSONLINES_TYPES:
        raise ApiError(415, "Content-Type must be application/json or application/jsonlines "
                            f"(got {request.content_type or 'none'})")
    body = read_body()
    if kind in JSONLINES_TYPES or bodies.holds_lines(body):
        return _answer_lines(bodies.split_records(body, current().settings.max_lines))
    obj = bodies.parse_json(body)
    protocol = protocol_of(obj)
    headers = request_id_header() if protocol is SYSTEM_ONE else {}
    try:
        answer = protocol.answer(obj, call())
    except Exception as exc:  # noqa: BLE001 - rendered in the body's own protocol, classified in one place
        return respond(protocol.render, exc, headers)
    add_log_fields(answer.log)
    return json_response(answer.payload, 200, {**answer.headers, **headers})


def _answer_record(protocol: Protocol, obj: Any) -> tuple[dict[str, Any], int]:
    """One record, answered in its protocol's shape, errors included, except a transient refusal (retryable),
    which propagates."""
    try:
        answer = protocol.answer(obj, call())
    except Exception as exc:  # noqa: BLE001 - classified in one place; transient refusals go up
        failure = classify(exc)
        if failure.retryable:
            raise
        return protocol.render(failure)
    add_log_fields(answer.log)
    return answer.payload, 200


def _answer_lines(records: list[tuple[int, bytes]]) -> Response:
    """One result line per record, in order."""
    out = []
    for number, raw in records:
        try:
            if not raw.strip():
                raise InputError((), "is empty")
            obj = bodies.parse_json(raw)
            payload, status = _answer_record(protocol_of(obj), obj)
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
