"""The call an answer is computed in, and what an answer is: shared by every protocol's answer function.

A ``Call`` carries what answering one request object needs: the decision model, the request's ``Budget`` (its
deadline and what any request may take here, set by how the container is deployed), when it arrived and the
validation context. ``Call.score`` scores on the model within the budget; what the engine raises (busy, too slow,
a deadline, a failure) goes up to the server's one error classifier untouched. An ``Answer`` is the payload, the
headers and the fields of the request's log line: answer functions write no HTTP state of their own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..decisions.model import Answered, DecisionModel, Prepared
from .fields import RequestContext


@dataclass(frozen=True)
class Budget:
    """What one request may take: its deadline (``time.monotonic()``), the span of that deadline from arrival
    (what any request may take here), and whether the token budget admits it (an endpoint's requests; a Batch
    Transform mini-batch is alone and is not)."""

    deadline: float
    allowed_s: float
    by_tokens: bool

    @property
    def spent(self) -> bool:
        return time.monotonic() >= self.deadline


@dataclass(frozen=True)
class Call:
    """What answering one request object needs: the model, the request's budget, when the request arrived
    (``time.perf_counter()``), and what validation needs beyond the body."""

    model: DecisionModel
    budget: Budget
    started: float
    context: RequestContext

    def score(self, prepared: Prepared) -> Answered:
        """Score ``prepared`` through the model's scheduler within the budget; raises what the model raises."""
        budget = self.budget
        return self.model.score(prepared, budget.deadline, by_tokens=budget.by_tokens, allowed_s=budget.allowed_s)


@dataclass(frozen=True)
class Answer:
    payload: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    log: dict[str, Any] = field(default_factory=dict)
