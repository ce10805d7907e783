"""HTTP helpers both blueprints use: media types, what the client accepts, the body within its limits and its
deadline, JSON responses."""

from __future__ import annotations

import socket
import threading
from typing import Any

from flask import Response, request
from werkzeug.datastructures import MIMEAccept
from werkzeug.http import dump_options_header, parse_options_header

from ..errors import ApiError
from . import bodies
from .inflight import current_request
from .state import current

JSON_TYPES = frozenset({"application/json"})
JSONLINES_TYPES = frozenset({"application/jsonlines", "application/x-jsonlines", "application/jsonl",
                             "application/x-ndjson"})


def read_body() -> bytes:
    """The request's body within ``ADAPTER_MAX_BODY_BYTES``, decoded per its Content-Encoding, and within
    ``ADAPTER_BODY_TIMEOUT_S`` of starting to read it (``BodyDeadline``: a 408 after it); a large body then waits for
    its turn (``admission.LargeBodyTurns``), which it keeps until its work reaches the scheduler."""
    state = current()
    seconds = state.settings.body_timeout_s
    with BodyDeadline(_socket(request.environ), seconds) as deadline:
        try:
            data = bodies.read_body(request.stream, request.content_length, request.headers.get("Content-Encoding"),
                                    state.settings.max_body_bytes)
        except Exception:  # noqa: BLE001 - a body cut short at its deadline is a 408, whatever its reading made of it
            if not deadline.expired:
                raise
    if deadline.expired:  # the stream may also just end early (werkzeug's, given a length), which is no error
        raise ApiError(408, f"the request body did not arrive within {seconds:g} s: send the body with its headers, "
                            f"at once")
    current_request().end_turn = state.turns.take(len(data))
    return data


def _socket(environ: dict[str, Any]) -> socket.socket | None:
    """The client's socket, where the WSGI server says it (gunicorn, werkzeug's server); None elsewhere (tests)."""
    sock = environ.get("gunicorn.socket") or environ.get("werkzeug.socket")
    return sock if isinstance(sock, socket.socket) else None


class BodyDeadline:
    """Ends reading a body at its deadline, however the client sends it (all at once, trickled byte by byte, or not
    at all): at the deadline a timer shuts the socket's read side, so the read blocked on it returns what came and
    the stream reports the body cut short (``expired`` then says why). The response can still be written; the
    connection closes after it. Without a socket (a test client's body is in memory) it does nothing."""

    def __init__(self, sock: socket.socket | None, seconds: float):
        self.expired = False
        self._sock = sock
        self._lock = threading.Lock()
        self._done = False
        self._timer = threading.Timer(seconds, self._expire) if sock is not None else None

    def _expire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.expired = True
            try:
                self._sock.shutdown(socket.SHUT_RD)
            except OSError:
                pass  # the client is gone already

    def __enter__(self) -> "BodyDeadline":
        if self._timer is not None:
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        with self._lock:
            self._done = True
        if self._timer is not None:
            self._timer.cancel()


def require_accept(produces: frozenset[str]) -> None:
    """A 406 naming the ``Accept`` header when it is sent and admits none of ``produces`` (the route's answers) nor
    application/json (its errors); absent, empty, ``*/*``, ``application/*`` and q-values are werkzeug's
    ``MIMEAccept``'s to judge (``q=0`` refuses a type). Every answer is UTF-8, so ``charset=utf-8`` on a type the
    client names is dropped before matching (``MIMEAccept`` matches a type with parameters only to an offer with
    the same ones); another charset is not answered."""
    accept = request.accept_mimetypes
    types = sorted(produces | JSON_TYPES)
    if not accept or _without_utf8_charset(accept).best_match(types) is not None:
        return
    raise ApiError(406, f"the Accept header admits no type this route answers with: it answers {', '.join(types)} "
                        f"(got Accept: {request.headers.get('Accept')})")


def _without_utf8_charset(accept: MIMEAccept) -> MIMEAccept:
    values = []
    for value, quality in accept:
        kind, params = parse_options_header(value)
        if params.get("charset", "").lower() in ("utf-8", "utf8"):
            del params["charset"]
        values.append((dump_options_header(kind, params), quality))
    return MIMEAccept(values)


def media_type() -> str:
    """The Content-Type without parameters; a charset other than UTF-8 is a 415 (JSON is UTF-8)."""
    charset = (request.mimetype_params.get("charset") or "utf-8").lower()
    if charset not in ("utf-8", "utf8"):
        raise ApiError(415, f"Content-Type charset must be utf-8 (got {charset})")
    return (request.mimetype or "").lower()


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(bodies.dumps(payload), status, headers=headers, mimetype="application/json")
