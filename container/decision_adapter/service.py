"""What both protocols' routes share: the adapter's state, the gate before a scoring request, and scoring.

A scoring request passes ``gate()`` before its body is read: the API key (when one is set), a loaded
model, and a place in admission (503 at once when none is free, or when the server is draining after
SIGTERM). ``score()`` hands the prepared request to the model's scheduler and waits for it: a full queue or a
passed deadline is the retryable 503; a failure in the engine is a 500 with the traceback in the log only.
"""

from __future__ import annotations

import hmac
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from flask import Response, current_app, g, request
from werkzeug.exceptions import HTTPException

from . import bodies

from .admission import Admission
from .errors import ApiError, busy
from .fields import RequestContext
from .metric_logs import SCORING_FAILED
from .scheduler import Busy, DeadlineExceeded, ScoringFailed
from .settings import Settings
from .startup import Readiness, load_into

log = logging.getLogger(__name__)
EXTENSION = "decision_adapter"


@dataclass
class AdapterState:
    settings: Settings
    readiness: Readiness
    admission: Admission
    engine: Any = None
    loader: threading.Thread | None = field(default=None, repr=False)

    def start_loading(self) -> None:
        """Load in the background (once); /ping stays 503 until the model is ready."""
        if self.loader is None:
            self.loader = threading.Thread(target=load_into, args=(self.readiness, self.settings, self.engine),
                                           name="model-loader", daemon=True)
            self.loader.start()

    def context(self) -> RequestContext:
        """What request validation needs: the loaded model (its control tokens), limits, the served id."""
        model = self.readiness.model
        return RequestContext(model=model, max_decisions=self.settings.max_decisions,
                              served_id=model.served_id if model is not None else "")


def current() -> AdapterState:
    return current_app.extensions[EXTENSION]


def authenticate() -> None:
    """When ``ADAPTER_API_KEY`` is set, every scoring route needs ``Authorization: Bearer <key>``."""
    api_key = current().settings.api_key
    if not api_key:
        return
    scheme, _, token = (request.headers.get("Authorization") or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "Missing API key: send Authorization: Bearer <key>", headers={"WWW-Authenticate": "Bearer"})
    if not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise ApiError(401, "Invalid API key", headers={"WWW-Authenticate": "Bearer"})


def require_model() -> None:
    state = current()
    if state.readiness.state != "ready":
        raise ApiError(503, f"model is not ready: {state.readiness.reason}",
                       headers={"Retry-After": str(state.settings.retry_after_s)}, retryable=True)


def gate() -> None:
    """Before a scoring request's body is read: key, model, and a place in admission."""
    authenticate()
    require_model()
    state = current()
    if not state.admission.try_enter():
        raise busy(state.settings.retry_after_s)
    g.admitted = True


def leave(_exc: BaseException | None = None) -> None:
    if g.get("admitted"):
        current().admission.leave()
        g.admitted = False


def score(model, prepared, state: AdapterState):
    """(results, stats, seconds queued) for a prepared request, through the model's scheduler."""
    try:
        ticket = model.submit(prepared, state.settings.request_timeout_s)
        scored, stats = model.result(prepared, ticket)
    except (Busy, DeadlineExceeded):
        raise busy(state.settings.retry_after_s) from None
    except ScoringFailed as exc:
        # A metric filter counts this line (metric_logs); the ScoringFailures alarm rolls an update back on it.
        SCORING_FAILED.log({"request_id": g.get("request_id"), "cause": str(exc)})
        raise ApiError(500, "scoring failed") from None
    return scored, stats, ticket.queue_s


def read_body() -> bytes:
    """The request's body within ``ADAPTER_MAX_BODY_BYTES``, decoded per its Content-Encoding."""
    return bodies.read_body(request.stream, request.content_length, request.headers.get("Content-Encoding"),
                            current().settings.max_body_bytes)


def media_type() -> str:
    """The Content-Type without parameters; a charset other than UTF-8 is a 415 (JSON is UTF-8)."""
    charset = (request.mimetype_params.get("charset") or "utf-8").lower()
    if charset not in ("utf-8", "utf8"):
        raise ApiError(415, f"Content-Type charset must be utf-8 (got {charset})")
    return (request.mimetype or "").lower()


def http_error_headers(exc: HTTPException) -> dict[str, str]:
    """A werkzeug error's own headers (405's Allow, ...) without its HTML content type."""
    return {k: v for k, v in exc.get_headers() if k.lower() != "content-type"}


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(bodies.dumps(payload), status, headers=headers, mimetype="application/json")
