"""Admission: one request scores at a time per worker, a bounded number wait, the rest are turned away.

A request first takes a place (``try_enter``); if none is free it is answered 503 at once, before its
body is read. A request with a place may parse and validate its body, then waits for the model
(``model_turn``) at most ``timeout_s``; a request that waits longer is answered 503 too.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator


class Admission:
    def __init__(self, queue_depth: int, timeout_s: float):
        self.capacity = queue_depth + 1
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._admitted = 0
        self._model = threading.Lock()

    def try_enter(self) -> bool:
        with self._lock:
            if self._admitted >= self.capacity:
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
        """Requests holding a place: the one scoring and those waiting behind it."""
        return self._admitted

    @contextmanager
    def model_turn(self) -> Iterator[float | None]:
        """Yields the seconds waited for the model, or None if the wait timed out."""
        started = time.perf_counter()
        if not self._model.acquire(timeout=self.timeout_s):
            yield None
            return
        try:
            yield time.perf_counter() - started
        finally:
            self._model.release()
