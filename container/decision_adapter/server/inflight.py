"""The request being handled, in one object: its id, its arrival, its place in admission, its large body's turn
and its log line.

``begin`` makes it in the app's first hook, before any body is read, and keeps it on flask's ``g``; every other
module reads and changes it through ``current_request()``. Nothing else about a request is kept on ``g``. Its
arrival, what its deadline counts from, is when the server saw it: under gunicorn the worker stamps the time its
main thread handed the connection to the thread pool (``worker``; the WSGI environ's ``ARRIVAL``), so that a
request queued behind busy threads has already spent its wait; elsewhere (tests, a plain WSGI server) it is now.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from flask import g

_KEY = "in_flight"
# The WSGI environ's key for the request's arrival: (``time.monotonic()``, ``time.perf_counter()``), set by the worker.
ARRIVAL = "decision_adapter.arrival"
# The header SageMaker forwards InvokeEndpoint's InferenceId in (data capture records it as eventMetadata.inferenceId).
INFERENCE_ID_HEADER = "X-Amzn-SageMaker-Inference-Id"


@dataclass
class InFlight:
    request_id: str
    inference_id: str | None = None  # the caller's InferenceId (SageMaker's X-Amzn-SageMaker-Inference-Id), if sent
    started: float = field(default_factory=time.perf_counter)  # what the log line's total_s counts from
    arrived: float = field(default_factory=time.monotonic)  # what the request's deadline counts from
    admitted: bool = False  # holds a place in admission (given back when the request ends)
    log: dict[str, Any] = field(default_factory=dict)  # fields the request's log line adds
    end_turn: Callable[[], None] | None = None  # gives back a large body's turn (``admission.LargeBodyTurns``)

    def give_back_turn(self) -> None:
        """The body's work is handed to the scheduler, or the request ends: the next large body may be read."""
        if self.end_turn is not None:
            self.end_turn()
            self.end_turn = None

    def add_log_fields(self, fields: dict[str, Any]) -> None:
        """Add an answer's fields to the request's log line; numbers add up over the records of a batch."""
        for key, value in fields.items():
            previous = self.log.get(key)
            if isinstance(value, (int, float)) and isinstance(previous, (int, float)):
                value = round(previous + value, 6) if isinstance(value, float) else previous + value
            self.log[key] = value


def begin(request_id: str, arrival: tuple[float, float] | None = None) -> InFlight:
    """The request's state, arrived at ``arrival`` (the environ's ``ARRIVAL``; None: now). The time it waited for a
    thread joins its log line (``waited_s``)."""
    if arrival is None:
        state = InFlight(request_id)
    else:
        arrived, started = arrival
        state = InFlight(request_id, started=started, arrived=arrived)
        state.log["waited_s"] = round(max(0.0, time.monotonic() - arrived), 6)
    setattr(g, _KEY, state)
    return state


def current_request() -> InFlight | None:
    """The request being handled; None outside one (or before ``begin``)."""
    return g.get(_KEY)
