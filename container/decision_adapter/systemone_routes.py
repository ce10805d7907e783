"""The System One blueprint: ``POST /v1/systemone`` and ``GET /v1/models``, in TypeSafe's error shape.

``answer(obj)`` is the one handler of a System One body; ``/invocations`` calls it too. Every error on
these routes is System One's: ``422 {"detail": [{"loc", "msg", "type"}]}`` for invalid requests,
``{"detail": {"error_type", "message"}}`` for the rest; each response carries ``x-typesafe-request-id``.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from flask import Blueprint, Response, g, request
from pydantic import ValidationError
from werkzeug.exceptions import HTTPException

from . import bodies, service, systemone
from .errors import ApiError, InputError

log = logging.getLogger(__name__)
blueprint = Blueprint("systemone", __name__, url_prefix="/v1")
JSON_TYPES = {"application/json"}


def answer(obj: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """Answer one System One body: (payload, headers). Raises ValidationError or InputError (invalid, 422)
    and ApiError (busy, scoring failed)."""
    state = service.current()
    model = state.readiness.model
    items = systemone.parse_items(obj, state.context())
    prepared = model.prepare([item.question for item in items])
    scored, stats, queue_s = service.score(model, prepared, state)
    input_tokens = sum(s.input_tokens for s in scored)
    g.log.update({"questions": len(items), "input_tokens": input_tokens, "queue_s": round(queue_s, 6),
                  "prefill_s": round(stats.prefill_s, 6), "readout_s": round(stats.readout_s, 6)})
    return {
        "model": model.served_id,
        "answers": {item.qid: systemone.answer(item, s) for item, s in zip(items, scored)},
        "usage": {"input_tokens": input_tokens, "output_tokens": 0},
        "x_evaluated_tokens": stats.shared_tokens + sum(stats.own_tokens),
        "x_cached_tokens": stats.cached_tokens,
        "x_timing": {"queue": queue_s, "prefill": stats.prefill_s, "readout": stats.readout_s,
                     "total": time.perf_counter() - g.started},
    }, request_id_header()


def render_error(exc: Exception) -> tuple[dict[str, Any], int, dict[str, str]]:
    """(body, status, headers) of any error in System One's shape."""
    headers = request_id_header()
    if isinstance(exc, ValidationError):
        return systemone.validation_detail(exc), 422, headers
    if isinstance(exc, InputError):
        if exc.kind.startswith("json_"):
            return systemone.json_error(exc), 422, headers
        return systemone.validation_detail(exc), 422, headers
    if isinstance(exc, HTTPException):
        return (systemone.error_body(exc.code or 500, exc.description or exc.name), exc.code or 500,
                {**service.http_error_headers(exc), **headers})
    if isinstance(exc, ApiError):
        body = systemone.error_body(exc.status, exc.message)
        if exc.retryable:
            body["retryable"] = True
        return body, exc.status, {**exc.headers, **headers}
    log.error("unhandled error", exc_info=exc, extra={"fields": {"request_id": g.get("request_id")}})
    return systemone.error_body(500, "internal error"), 500, headers


def request_id_header() -> dict[str, str]:
    return {"x-typesafe-request-id": g.get("request_id", "")}


@blueprint.before_request
def _gate() -> None:
    if request.endpoint == "systemone.systemone_route":
        service.gate()
    else:
        service.authenticate()
        service.require_model()


blueprint.teardown_request(service.leave)


@blueprint.errorhandler(Exception)
def _error(exc: Exception) -> Response:
    return service.json_response(*render_error(exc))


@blueprint.post("/systemone")
def systemone_route() -> Response:
    media_type = service.media_type()
    if media_type and media_type not in JSON_TYPES:
        raise ApiError(415, f"Content-Type must be application/json (got {request.content_type})")
    payload, headers = answer(bodies.parse_json(service.read_body()))
    return service.json_response(payload, 200, headers)


@blueprint.get("/models")
def models_route() -> Response:
    state = service.current()
    model = state.readiness.model
    released = (model.identity.built_at or "")[:10] or time.strftime(
        "%Y-%m-%d", time.gmtime(_mtime(state.settings.model_dir, model.identity.file)))
    described = f"{model.identity.file} ({model.model_info.get('architecture', 'gguf')}), served by llama.cpp"
    return service.json_response({"models": [
        {"name": model.served_id, "description": f"Decision model {described}.", "release_date": released},
        {"name": systemone.ALIAS, "description": f"Alias of {model.served_id}.", "release_date": released}]},
        200, request_id_header())


def _mtime(model_dir: str, name: str) -> float:
    try:
        return os.path.getmtime(os.path.join(model_dir, name))
    except OSError:
        return time.time()
