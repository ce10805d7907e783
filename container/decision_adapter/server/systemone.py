"""The System One blueprint: ``POST /v1/systemone`` and ``GET /v1/models``, errors in System One's shape.

Every response carries ``x-typesafe-request-id``, as TypeSafe's servers send it.
"""

from __future__ import annotations

import os
import time

from flask import Blueprint, Response, request

from ..errors import ApiError
from ..protocols import systemone
from ..protocols.dispatch import SYSTEM_ONE
from . import bodies, gate
from .calls import answer_object, request_budget
from .errors import respond
from .http import JSON_TYPES, json_response, media_type, read_body, require_accept
from .inflight import current_request
from .state import current

blueprint = Blueprint("systemone", __name__, url_prefix="/v1")


def request_id_header() -> dict[str, str]:
    request = current_request()
    return SYSTEM_ONE.headers(request.request_id if request is not None else "")


def render_error(exc: Exception) -> Response:
    """Any error on these routes, in System One's shape."""
    return respond(systemone.render, exc, request_id_header())


gate.install(blueprint, scoring_endpoint="systemone.systemone_route", guard_others=True)
blueprint.register_error_handler(Exception, render_error)


@blueprint.post("/systemone")
def systemone_route() -> Response:
    require_accept(JSON_TYPES)
    kind = media_type()
    if kind and kind not in JSON_TYPES:
        raise ApiError(415, f"Content-Type must be application/json (got {request.content_type})")
    budget = request_budget()
    reply = answer_object(bodies.parse_json(read_body()), SYSTEM_ONE, budget)
    return json_response(reply.payload, reply.status, reply.headers)


@blueprint.get("/models")
def models_route() -> Response:
    state = current()
    model = state.readiness.model
    released = (model.identity.built_at or "")[:10] or time.strftime(
        "%Y-%m-%d", time.gmtime(_mtime(state.settings.model_dir, model.identity.file)))
    kind = systemone.model_kind(model.model_info)
    how = (f"a {kind['decision_type']} decision GGUF answered by its type's rules" if kind.get("decision_type")
           else "a chat GGUF answered by this adapter's prompt and readout")
    described = f"{model.identity.file} ({model.model_info.get('architecture', 'gguf')}: {how}), served by llama.cpp"
    return json_response({"models": [
        {"name": model.served_id, "description": f"Decision model {described}.", "release_date": released,
         "x_model": kind},
        {"name": systemone.ALIAS, "description": f"Alias of {model.served_id}.", "release_date": released,
         "x_model": kind}]},
        200, request_id_header())


def _mtime(model_dir: str, name: str) -> float:
    try:
        return os.path.getmtime(os.path.join(model_dir, name))
    except OSError:
        return time.time()
