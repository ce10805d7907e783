"""The one error classifier: any exception to the ``Failure`` every protocol renders in its own shape.

Input errors (the request's fields, pydantic's or the decision model's) are ``input``; HTTP errors that routing
raises (404, 405 with its ``Allow``), refusals (busy, not ready, limits, auth) are ``refused`` with their
status, headers and whether to retry; anything else is an ``internal`` 500 whose traceback goes to the log,
never to the client.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from flask import Response, g
from pydantic import ValidationError
from werkzeug.exceptions import HTTPException

from ..errors import ApiError, Failure, InputError
from .http import json_response

log = logging.getLogger(__name__)


def classify(exc: Exception) -> Failure:
    if isinstance(exc, (InputError, ValidationError)):
        return Failure(400, str(exc), "input", cause=exc)
    if isinstance(exc, HTTPException):
        headers = {k: v for k, v in exc.get_headers() if k.lower() != "content-type"}
        return Failure(exc.code or 500, exc.description or exc.name, "refused", headers, cause=exc)
    if isinstance(exc, ApiError):
        kind = "internal" if exc.status >= 500 and not exc.retryable else "refused"
        return Failure(exc.status, exc.message, kind, dict(exc.headers), exc.retryable, exc)
    log.error("unhandled error", exc_info=exc, extra={"fields": {"request_id": g.get("request_id")}})
    return Failure(500, "internal error", "internal", cause=exc)


def respond(render: Callable[[Failure], tuple[dict[str, Any], int]], exc: Exception,
            headers: dict[str, str] | None = None) -> Response:
    """The response to ``exc`` in the shape ``render`` (a protocol's) gives it, with the failure's headers."""
    failure = classify(exc)
    body, status = render(failure)
    return json_response(body, status, {**failure.headers, **(headers or {})})
