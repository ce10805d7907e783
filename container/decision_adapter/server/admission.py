"""Admission before a body is read: a bounded number of requests may be in the server at once.

A request first takes a place (``try_enter``); if none is free it is answered 503 at once, before its body is
read, so a flood costs no parsing. Work is admitted a second time by the scheduler, by the tokens it decodes.
"""

from __future__ import annotations

import threading


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
