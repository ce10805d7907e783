"""Admission before a body is read: a bounded number of requests may be in the server at once; and turns for
the large bodies among them.

A request first takes a place (``try_enter``); if none is free it is answered 503 at once, before its body is
read, so a flood costs no parsing. Work is admitted a second time by the scheduler, by the tokens it decodes.

``LargeBodyTurns``: parsing, checking and rendering a body of megabytes is seconds of Python and C that holds the
GIL in long stretches (``json``'s scanner alone holds it about 0.3 s for 6 MiB here). Sixteen of them at once
queue every other thread of the process behind them, ``/ping`` and the scheduler's included: 16 concurrent 6 MiB
bodies made ``/ping`` wait 2.2 s. So a body over the threshold is read, then waits for its turn, and keeps it
until its work is handed to the scheduler (or the request ends): one large body at a time competes for the GIL,
and the rest wait on a lock, which holds no GIL. Small bodies never wait for a turn.
"""

from __future__ import annotations

import threading
from typing import Callable


class Admission:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self._lock = threading.Lock()
        self._admitted = 0
        self.draining = False  # set on SIGTERM: new requests are turned away, those admitted finish

    def try_enter(self) -> bool:
        with self._lock:
            if self.draining or self._admitted >= self.capacity:
                return False
            self._admitted += 1
            return True

    def leave(self) -> None:
        with self._lock:
            if self._admitted == 0:
                raise RuntimeError("leave() without a matching try_enter()")
            self._admitted -= 1

    @property
    def admitted(self) -> int:
        return self._admitted


# Bodies larger than this take turns: the largest valid request that is not a batch (64 decisions over a 4 KB state)
# is about this size, and a body this size is parsed and checked in a few milliseconds.
LARGE_BODY_BYTES = 256 * 1024


class LargeBodyTurns:
    """One body over ``threshold`` bytes at a time is parsed, checked and rendered (see the module's text)."""

    def __init__(self, threshold: int = LARGE_BODY_BYTES):
        self.threshold = threshold
        self._turn = threading.Lock()

    def take(self, size: int) -> Callable[[], None] | None:
        """Wait for the turn if a body of ``size`` bytes needs one; the function that gives it back (once), or None
        where the body is small."""
        if size <= self.threshold:
            return None
        self._turn.acquire()
        given_back = threading.Event()

        def give_back() -> None:
            if not given_back.is_set():
                given_back.set()
                self._turn.release()

        return give_back
