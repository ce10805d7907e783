"""The one error classifier: any exception to the ``Failure`` every protocol renders in its own shape.

Input errors (the request's fields, pydantic's or the decision model's) are ``input``; HTTP errors that routing
raises (404, 405 with its ``Allow``), refusals (busy, not ready, limits, auth) are ``refused`` with their
status, headers and whether to retry. What the engine raises while a request is scored is classified here too,
once: a full queue or a passed deadline is the retryable busy 503 (work that cannot be done before the deadline
says why), but a deadline the job ran into is counted apart on the request's log line (a fault of the release,
not load: metric_logs); a failure inside the engine is a 500 ``scoring failed`` whose cause goes to the log (one
line the ScoringFailures metric counts, and a count on the request's line), never to the client. Anything else is an ``internal`` 500 whose traceback goes to
the log.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from flask import Response
from pydantic import ValidationError
from werkzeug.exceptions import HTTPException

from ..engine.errors import Busy, DeadlineExceeded, ScoringFailed, TooSlow
from ..errors import ApiError, Failure, InputError, busy
from ..metric_logs import COMPUTE_FIELD, DEADLINE_MISSES_FIELD, EVALUATED_TOKENS_FIELD, SCORING_FAILURES_FIELD
from .http import json_response
from .inflight import current_request
from .logs import log_scoring_failed

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
    request = current_request()
    if isinstance(exc, DeadlineExceeded) and request is not None:
        # The same busy 503 to the client, but a fault of the release in the log (metric_logs): admission let
        # the job in at the measured speed and it still ran out of time. What it computed until it was stopped
        # joins the request's line, so that the release's speed is measured on it too.
        request.add_log_fields({DEADLINE_MISSES_FIELD: 1, COMPUTE_FIELD: round(exc.compute_s, 6),
                                EVALUATED_TOKENS_FIELD: exc.decoded_tokens})
    if isinstance(exc, (Busy, DeadlineExceeded)):  # a full queue, no time left: the same request may pass later
        return classify(busy(f"model is busy; retry the request: {exc}" if isinstance(exc, TooSlow) else None))
    request_id = request.request_id if request is not None else None
    if isinstance(exc, ScoringFailed):
        log_scoring_failed({"request_id": request_id, "cause": str(exc)})
        if request is not None:
            request.add_log_fields({SCORING_FAILURES_FIELD: 1})
        return Failure(500, "scoring failed", "internal", cause=exc)
    log.error("unhandled error", exc_info=exc, extra={"fields": {"request_id": request_id}})
    return Failure(500, "internal error", "internal", cause=exc)


def respond(render: Callable[[Failure], tuple[dict[str, Any], int]], exc: Exception,
            headers: dict[str, str] | None = None) -> Response:
    """The response to ``exc`` in the shape ``render`` (a protocol's) gives it, with the failure's headers."""
    failure = classify(exc)
    body, status = render(failure)
    return json_response(body, status, {**failure.headers, **(headers or {})})
