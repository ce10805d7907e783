"""The gunicorn worker: gthread's, with each request's arrival stamped where the server first sees it.

gthread's main thread waits on every connection; once a request's first bytes can be read it hands the connection
to its thread pool, where the request may wait behind busy threads before anything reads it. A request's deadline
must count from when it reached the server, not from when a thread got to it (SageMaker's 60 s started earlier
still): ``Worker`` notes the time as its main thread hands the connection over (a new connection's first request,
or the next request on a kept-alive connection: not the connection's accept, which may be long before), and the
thread that handles it puts that time in the request's WSGI environ (``inflight.ARRIVAL``), where
``inflight.begin`` reads it.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterable

from gunicorn.workers.gthread import ThreadWorker

from .inflight import ARRIVAL


class Worker(ThreadWorker):
    def init_process(self) -> None:
        self._arrival = threading.local()  # the arrival of the request this pool thread handles
        super().init_process()

    def enqueue_req(self, conn) -> None:
        """In the main thread, as a readable connection goes to the pool: its request has arrived."""
        conn.arrival = (time.monotonic(), time.perf_counter())
        super().enqueue_req(conn)

    def handle(self, conn):
        """In a pool thread: the request of ``conn`` arrived when it was handed over."""
        self._arrival.value = getattr(conn, "arrival", None)
        try:
            return super().handle(conn)
        finally:
            self._arrival.value = None

    def load_wsgi(self) -> None:
        super().load_wsgi()
        self.wsgi.wsgi_app = _Stamped(self.wsgi.wsgi_app, self._arrival)  # Flask's middleware: the app stays itself


class _Stamped:
    """WSGI middleware: the environ gets the arrival its pool thread holds."""

    def __init__(self, app: Callable[..., Iterable[bytes]], arrival: threading.local):
        self.app = app
        self.arrival = arrival

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        arrival = getattr(self.arrival, "value", None)
        if arrival is not None:
            environ[ARRIVAL] = arrival
        return self.app(environ, start_response)
