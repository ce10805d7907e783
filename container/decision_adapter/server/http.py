"""HTTP helpers both blueprints use: media types, the body within its limits, JSON responses."""

from __future__ import annotations

from typing import Any

from flask import Response, request

from ..errors import ApiError
from . import bodies
from .inflight import current_request
from .state import current

JSON_TYPES = frozenset({"application/json"})
JSONLINES_TYPES = frozenset({"application/jsonlines", "application/x-jsonlines", "application/jsonl",
                             "application/x-ndjson"})


def read_body() -> bytes:
    """The request's body within ``ADAPTER_MAX_BODY_BYTES``, decoded per its Content-Encoding; a large body then
    waits for its turn (``admission.LargeBodyTurns``), which it keeps until its work reaches the scheduler."""
    state = current()
    data = bodies.read_body(request.stream, request.content_length, request.headers.get("Content-Encoding"),
                            state.settings.max_body_bytes)
    current_request().end_turn = state.turns.take(len(data))
    return data


def media_type() -> str:
    """The Content-Type without parameters; a charset other than UTF-8 is a 415 (JSON is UTF-8)."""
    charset = (request.mimetype_params.get("charset") or "utf-8").lower()
    if charset not in ("utf-8", "utf8"):
        raise ApiError(415, f"Content-Type charset must be utf-8 (got {charset})")
    return (request.mimetype or "").lower()


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(bodies.dumps(payload), status, headers=headers, mimetype="application/json")
