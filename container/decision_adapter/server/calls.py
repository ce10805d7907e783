"""The call a protocol's answer is computed in, for the request being handled.

Scoring goes through the model's scheduler under the request's deadline: a full queue or a passed deadline
becomes the retryable busy 503, a failure inside the engine a 500 ``scoring failed`` whose cause goes to the
log (one line the ScoringFailures metric counts), never to the client.
"""

from __future__ import annotations

from flask import g

from ..decisions.model import Answered, Prepared
from ..engine.errors import Busy, DeadlineExceeded, ScoringFailed
from ..errors import ApiError, busy
from ..protocols.call import Call
from ..protocols.fields import RequestContext
from .logs import log_scoring_failed
from .state import current


def call() -> Call:
    """The call context of the current request (its model must be ready: the gate checked it)."""
    state = current()
    model = state.readiness.model
    settings = state.settings

    def score(prepared: Prepared) -> Answered:
        try:
            return model.score(prepared, settings.request_timeout_s)
        except (Busy, DeadlineExceeded):
            raise busy(settings.retry_after_s) from None
        except ScoringFailed as exc:
            log_scoring_failed({"request_id": g.get("request_id"), "cause": str(exc)})
            raise ApiError(500, "scoring failed") from None

    return Call(model=model, score=score, started=g.started,
                context=RequestContext.of(model, settings.max_decisions))
