"""The request being handled, in one object: its id, its arrival, its place in admission, its large body's turn
and its log line.

``begin`` makes it as the request arrives (the app's first hook, before any body is read: a deadline counts from
here) and keeps it on flask's ``g``; every other module reads and changes it through ``current_request()``.
Nothing else about a request is kept on ``g``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from flask import g

_KEY = "in_flight"


@dataclass
class InFlight:
    request_id: str
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


def begin(request_id: str) -> InFlight:
    state = InFlight(request_id)
    setattr(g, _KEY, state)
    return state


def current_request() -> InFlight | None:
    """The request being handled; None outside one (or before ``begin``)."""
    return g.get(_KEY)
