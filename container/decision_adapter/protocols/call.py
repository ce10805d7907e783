"""The call an answer is computed in, and what an answer is: shared by every protocol's answer function.

A ``Call`` carries what answering one request object needs: the decision model, the request's ``Budget`` (its
deadline and what any request may take here, set by how the container is deployed), when it arrived, the
validation context and the server's one error classifier. ``Call.score`` scores on the model within the budget;
what the engine raises (busy, too slow, a deadline, a failure) goes up to that classifier untouched.
``Call.dry_run`` says what scoring would do now, decoding nothing; the refusal it foresees goes through the same
classifier (``Call.classify``), so that a dry run reports the very status and error body the request would get.
An ``Answer`` is the payload, the
headers and the fields of the request's log line: answer functions write no HTTP state of their own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..decisions.model import Answered, DecisionModel, DryRun, Prepared, Question
from ..errors import Failure
from .fields import RequestContext


# The server's default number of orderings is sized to what is left of a request's time, less this share: the
# search for it and the request's own preparation run before admission weighs the deadline again, so a default
# sized to the last second would be refused as too slow by the time it is queued (issue 50: a request that fewer
# orderings could answer is never refused).
SIZING_HEADROOM = 0.2


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

    def sizing_s(self) -> float:
        """The seconds the server's default orderings are sized to now: what is left before the deadline, less
        ``SIZING_HEADROOM``, and never more than what any request may take here."""
        return min(self.allowed_s, max(0.0, self.deadline - time.monotonic())) * (1.0 - SIZING_HEADROOM)


@dataclass(frozen=True)
class Call:
    """What answering one request object needs: the model, the request's budget, when the request arrived
    (``time.perf_counter()``), what validation needs beyond the body, and how the server classifies an error
    (``server.errors.classify``)."""

    model: DecisionModel
    budget: Budget
    started: float
    context: RequestContext
    classify: Callable[[Exception], Failure]
    # Called as the prepared work is handed to the model: the request's parsing and checking are over (the server
    # gives back a large body's turn here).
    prepared_hook: Callable[[], None] = lambda: None

    def prepare(self, questions: Sequence[Question]) -> Prepared:
        """The questions prepared on the model, held to what a request may take here: the server's default orderings
        shrink to what fits the time left, with headroom (``Budget.sizing_s``, ``DecisionModel.prepare``)."""
        return self.model.prepare(questions, allowed_s=self.budget.sizing_s())

    def score(self, prepared: Prepared) -> Answered:
        """Score ``prepared`` through the model's scheduler within the budget; raises what the model raises."""
        self.prepared_hook()
        budget = self.budget
        return self.model.score(prepared, budget.deadline, by_tokens=budget.by_tokens, allowed_s=budget.allowed_s)

    def dry_run(self, prepared: Prepared) -> DryRun:
        """What ``score`` would do now within the same budget, decoding nothing (``DecisionModel.dry_run``)."""
        self.prepared_hook()
        budget = self.budget
        return self.model.dry_run(prepared, budget.deadline, by_tokens=budget.by_tokens, allowed_s=budget.allowed_s)


@dataclass(frozen=True)
class Answer:
    payload: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    log: dict[str, Any] = field(default_factory=dict)
