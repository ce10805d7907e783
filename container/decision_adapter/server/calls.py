"""The call a protocol's answer is computed in, for the request being handled.

Scoring goes through the model's scheduler under a deadline that counts from the request's arrival (a single
request's ``ADAPTER_REQUEST_TIMEOUT_S``, or the budget of the Batch Transform mini-batch it is a record of): a
full queue, work that cannot be done before the deadline, or a passed deadline becomes the retryable busy 503; a
failure inside the engine a 500 ``scoring failed`` whose cause goes to the log (one line the ScoringFailures
metric counts), never to the client.
"""

from __future__ import annotations

import time

from flask import g

from ..decisions.model import Answered, Prepared
from ..engine.errors import Busy, DeadlineExceeded, ScoringFailed, TooSlow
from ..errors import ApiError, busy
from ..protocols.call import Call
from ..protocols.fields import RequestContext
from .logs import log_scoring_failed
from .state import current


def arrived() -> None:
    """Mark the request's arrival (before its body is read): its deadline counts from here."""
    g.started = time.perf_counter()
    g.arrived = time.monotonic()


def request_deadline() -> float:
    return g.arrived + current().settings.request_timeout_s


def call(deadline: float, *, by_tokens: bool = True) -> Call:
    """The call context of the current request (its model must be ready: the gate checked it). ``by_tokens``:
    admission by the token budget (not for the records of a batch, admitted as a whole)."""
    state = current()
    model = state.readiness.model
    settings = state.settings

    def score(prepared: Prepared) -> Answered:
        try:
            return model.score(prepared, deadline, by_tokens=by_tokens)
        except TooSlow as exc:
            raise ApiError(503, f"model is busy; retry the request: {exc}",
                           headers={"Retry-After": str(settings.retry_after_s)}, retryable=True) from None
        except (Busy, DeadlineExceeded):
            raise busy(settings.retry_after_s) from None
        except ScoringFailed as exc:
            log_scoring_failed({"request_id": g.get("request_id"), "cause": str(exc)})
            raise ApiError(500, "scoring failed") from None

    return Call(model=model, score=score, started=g.started,
                context=RequestContext.of(model, settings.max_decisions))
