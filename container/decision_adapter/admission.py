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
        self._places = threading.BoundedSemaphore(self.capacity)
        self._model = threading.Lock()

    def try_enter(self) -> bool:
        return self._places.acquire(blocking=False)

    def leave(self) -> None:
        self._places.release()

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
