"""Servers on loopback that tests talk to over real HTTP: moto's AWS server, and a JSON server a test scripts.

- ``moto_server()``: moto's threaded server on a free port of 127.0.0.1; yields its URL.
- ``JsonServer(respond)``: a threaded HTTP server on a free port; ``respond(request)`` gives each request's
  ``Reply`` (status, headers, a JSON payload or raw bytes), and ``requests`` records what came in. ``replies(...)``
  makes a ``respond`` that answers with the scripted replies in turn, then with a last one for good.

Importable from every test folder (pytest.ini puts ``tests`` on the path).
"""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

from moto.server import ThreadedMotoServer


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class Reply:
    status: int = 200
    payload: Any = None  # sent as JSON unless ``body`` is given
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None

    def encoded(self) -> bytes:
        return self.body if self.body is not None else json.dumps(self.payload).encode()


def replies(*scripted: Reply, then: Reply = Reply(200, {})) -> Callable[[Request], Reply]:
    """Answer with ``scripted`` in turn, then with ``then`` for every later request."""
    queue = list(scripted)
    return lambda request: queue.pop(0) if queue else then


class JsonServer:
    def __init__(self, respond: Callable[[Request], Reply]):
        self.respond = respond
        self.requests: list[Request] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                request = Request(self.command, self.path, dict(self.headers), self.rfile.read(length))
                server.requests.append(request)
                reply = server.respond(request)
                body = reply.encoded()
                self.send_response(reply.status)
                headers = {"Content-Type": "application/json", **reply.headers}
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = _answer  # noqa: N815 - the stdlib's names

            def log_message(self, *args) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    def __enter__(self) -> "JsonServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._http.shutdown()
        self._http.server_close()
