"""The call a protocol's answer is computed in, for the request being handled.

Scoring goes through the model's scheduler under a budget set by how the container is deployed, not by the body
(``request_budget``): on an endpoint (``ADAPTER_DEPLOYMENT=realtime``) every request, a JSON-lines one too, has
``ADAPTER_REQUEST_TIMEOUT_S`` from its arrival and the token budget; in a Batch Transform job every request is a
mini-batch with 90% of ``ADAPTER_BATCH_TIMEOUT_S`` and no token budget (it is alone). A full queue, work that
cannot be done before the deadline, or a passed deadline becomes the retryable busy 503; work that can never be
done within the budget, a 400 from the decision model; a failure inside the engine a 500 ``scoring failed``
whose cause goes to the log (one line the ScoringFailures metric counts), never to the client.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Budget:
    """What one request may take: its deadline (``time.monotonic()``), the span of that deadline from arrival
    (what any request may take here), and whether the token budget admits it."""

    deadline: float
    allowed_s: float
    by_tokens: bool

    @property
    def spent(self) -> bool:
        return time.monotonic() >= self.deadline


def request_budget() -> Budget:
    """The budget of the current request, as the container is deployed (see the module's text)."""
    settings = current().settings
    span = settings.request_budget_s
    return Budget(g.arrived + span, span, by_tokens=settings.deployment == "realtime")


def call(budget: Budget) -> Call:
    """The call context of the current request within ``budget`` (its model must be ready: the gate checked it)."""
    state = current()
    model = state.readiness.model
    settings = state.settings

    def score(prepared: Prepared) -> Answered:
        try:
            return model.score(prepared, budget.deadline, by_tokens=budget.by_tokens, allowed_s=budget.allowed_s)
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
