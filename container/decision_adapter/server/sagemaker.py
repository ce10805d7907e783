"""The SageMaker blueprint: ``/ping``, ``/invocations``, ``/execution-parameters`` and ``/openapi.json``.

``/invocations`` reads one JSON body, or records one per line (``application/jsonlines``, or
``application/json`` holding several objects one per line, as Batch Transform sends with SplitType=Line
and BatchStrategy=MultiRecord), and dispatches each on its keys (``protocols.dispatch``): ``decision``/
``decisions`` to the decision schema, ``questions`` to System One, answered and refused in System One's shape
(``calls.answer_object``). Errors on these routes are ``{"error": "<message naming the field>"}``, plus
``"retryable": true`` on transient ones; an ``Accept`` that admits neither JSON nor JSON lines is a 406. A body of
records is answered record by record by ``batch``; its budget, like every request's, is the deployment's
(``calls.request_budget``), whatever the body.
"""

from __future__ import annotations

from flask import Blueprint, Response, request

from ..errors import ApiError
from ..protocols import decision_schema, openapi
from ..protocols.dispatch import protocol_of
from . import batch, bodies, gate
from .calls import answer_object, request_budget
from .errors import respond
from .http import JSON_TYPES, JSONLINES_TYPES, json_response, media_type, read_body, require_accept
from .state import current

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
    if readiness.model is not None:  # the CPU kernels the model runs on (engine/backends.py), its kind and rules, and
        info = readiness.model.model_info  # what its memory is made of and the reuse that applies (engine/memory_kind.py)
        body.update({key: info[key] for key in (*KERNEL_KEYS, "kind", "rules", "decision_type", "memory", "reuse")
                     if key in info})
    return json_response(body, 200 if readiness.state == "ready" else 503)


@blueprint.get("/execution-parameters")
def execution_parameters() -> Response:
    """Batch Transform asks this once per container, once it is healthy: what one instance can finish. It only
    reads: whether the container serves a transform is the deployment's (ADAPTER_DEPLOYMENT, or SAGEMAKER_BATCH,
    which SageMaker sets in every transform container), never a request's, and the API key, where one is set, is
    needed here as on the scoring routes (SageMaker's transform sends none: a transform sets no key)."""
    gate.authenticate()
    gate.require_model()
    state = current()
    model = state.readiness.model
    return json_response(batch.execution_parameters(state.settings, model.scheduler.tokens_per_s,
                                                    model.text_bytes_per_token).as_json())


@blueprint.get("/openapi.json")
def openapi_document() -> Response:
    return json_response(openapi.document())


@blueprint.post("/invocations")
def invocations() -> Response:
    require_accept(JSON_TYPES | JSONLINES_TYPES)
    kind = media_type()
    if kind not in JSON_TYPES | JSONLINES_TYPES:
        raise ApiError(415, "Content-Type must be application/json or application/jsonlines "
                            f"(got {request.content_type or 'none'})")
    budget = request_budget()
    parsed = bodies.parse_invocation(read_body(), lines=kind in JSONLINES_TYPES, max_lines=current().settings.max_lines)
    if parsed.records is not None:
        results = batch.answer_lines(parsed.records, budget, mini_batch=current().in_transform)
        return Response("\n".join(bodies.dumps(r) for r in results) + "\n", 200, mimetype="application/jsonlines")
    reply = answer_object(parsed.value, protocol_of(parsed.value), budget)
    return json_response(reply.payload, reply.status, reply.headers)
