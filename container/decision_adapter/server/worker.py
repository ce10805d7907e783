"""The gunicorn worker: gthread's, with each request's arrival stamped where the server first sees it.

gthread's main thread waits on every connection; once a request's first bytes can be read it hands the connection
to its thread pool, where the request may wait behind busy threads before anything reads it. A request's deadline
must count from when it reached the server, not from when a thread got to it (SageMaker's 60 s started earlier
still): ``Worker`` notes the time as its main thread hands the connection over (a new connection's first request,
or the next request on a kept-alive connection: not the connection's accept, which may be long before), and the
thread that handles it puts that time in the request's WSGI environ (``inflight.ARRIVAL``), where
``inflight.begin`` reads it.

gthread parses a request's headers from a blocking socket with no deadline, so a client that sends half its
headers would hold a pool thread for ever (enough of them hold every thread). The thread that takes a connection
gives its headers ``header_timeout_s`` (serve sets it from ``ADAPTER_BODY_TIMEOUT_S``), counted from the hand-over:
past it the socket's read side is shut (``http.BodyDeadline``), the parse ends, and gunicorn closes the connection
without an answer (there is no request to answer yet). Once the headers are in, the app takes over and the body has
its own deadline (``http.read_body``).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterable

from gunicorn.workers.gthread import ThreadWorker

from .http import BodyDeadline
from .inflight import ARRIVAL


class Worker(ThreadWorker):
    header_timeout_s: float | None = None  # None: headers read without a deadline (gthread's own behaviour)

    @classmethod
    def reading_headers_within(cls, seconds: float) -> type["Worker"]:
        """This worker with a deadline on each request's headers (gunicorn takes a class, not an instance)."""
        return type(cls.__name__, (cls,), {"header_timeout_s": seconds})

    def init_process(self) -> None:
        self._arrival = threading.local()  # the arrival of the request this pool thread handles
        self._headers = threading.local()  # the deadline on its headers, ended once the app has the request
        super().init_process()

    def enqueue_req(self, conn) -> None:
        """In the main thread, as a readable connection goes to the pool: its request has arrived."""
        conn.arrival = (time.monotonic(), time.perf_counter())
        super().enqueue_req(conn)

    def handle(self, conn):
        """In a pool thread: the request of ``conn`` arrived when it was handed over."""
        self._arrival.value = getattr(conn, "arrival", None)
        headers = BodyDeadline(conn.sock, self.header_timeout_s) if self.header_timeout_s else None
        self._headers.value = headers
        if headers is not None:
            headers.__enter__()
        try:
            return super().handle(conn)
        finally:
            if headers is not None:
                headers.__exit__()
            self._arrival.value = self._headers.value = None

    def load_wsgi(self) -> None:
        super().load_wsgi()
        # Flask's middleware: the app stays itself
        self.wsgi.wsgi_app = _Stamped(self.wsgi.wsgi_app, self._arrival, self._headers)


class _Stamped:
    """WSGI middleware: the environ gets the arrival its pool thread holds, and the deadline on the request's
    headers ends (they are in: the app reads the body within its own)."""

    def __init__(self, app: Callable[..., Iterable[bytes]], arrival: threading.local, headers: threading.local):
        self.app = app
        self.arrival = arrival
        self.headers = headers

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        headers = getattr(self.headers, "value", None)
        if headers is not None:
            headers.__exit__()
        arrival = getattr(self.arrival, "value", None)
        if arrival is not None:
            environ[ARRIVAL] = arrival
        return self.app(environ, start_response)
