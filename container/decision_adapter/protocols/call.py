"""The call an answer is computed in, and what an answer is: shared by every protocol's answer function.

``Call`` holds the decision model, the function that scores a prepared request on it (the server's: the
request's deadline and the scheduler's admission), the request's arrival time and the validation context. An
``Answer`` is the payload, the headers and the fields of the request's log line: answer functions write no
HTTP state of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..decisions.model import Answered, DecisionModel, Prepared
from .fields import RequestContext


@dataclass(frozen=True)
class Call:
    """What answering one request object needs: the model, how to score on it, when the request arrived
    (``time.perf_counter()``), and what validation needs beyond the body."""

    model: DecisionModel
    score: Callable[[Prepared], Answered]
    started: float
    context: RequestContext


@dataclass(frozen=True)
class Answer:
    payload: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    log: dict[str, Any] = field(default_factory=dict)
