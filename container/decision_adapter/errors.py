"""Errors that reach clients: one HTTP error type, the input error, and a failure as every protocol renders it.

The server classifies any exception into a ``Failure`` (``server.errors.classify``); each protocol turns a
``Failure`` into its own body (``protocols.dispatch.Protocol.render``).

may import from the package: nothing
never imports: flask, werkzeug, gunicorn, llama_cpp, pydantic
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Sequence

Loc = tuple[str | int, ...]


class ApiError(Exception):
    """An HTTP answer other than success: its status, message and headers. ``retryable`` marks a transient
    refusal (busy, not ready, past a deadline) that the same request may pass later (in a batch, the record's
    error line says so: protocols.openapi.BATCH_LINES)."""

    def __init__(self, status: int, message: str, *, headers: dict[str, str] | None = None,
                 retryable: bool = False):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}
        self.retryable = retryable


class InputError(ValueError):
    """A request field is invalid. ``loc`` is the path to it, e.g. ("decision", "options", 1, "id")."""

    def __init__(self, loc: Sequence[str | int], msg: str, kind: str = "value_error"):
        super().__init__(f"{dotted(loc)} {msg}" if loc else msg)
        self.loc: Loc = tuple(loc)
        self.msg = msg
        self.kind = kind


def dotted(loc: Sequence[str | int]) -> str:
    """("decisions", 2, "options", 0, "id") -> "decisions[2].options[0].id"."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# What a retryable 503 asks a client to wait: the queue turns over within about a second, and a refusal costs the
# server nothing (it comes before the body is read, or at once from admission).
RETRY_AFTER_S = 1


def busy(message: str | None = None) -> ApiError:
    """The retryable 503: busy (admission full, work that cannot be done before the deadline) or not ready yet."""
    return ApiError(503, message or "model is busy; retry the request", headers={"Retry-After": str(RETRY_AFTER_S)},
                    retryable=True)


@dataclass(frozen=True)
class Failure:
    """An error as a client gets it: status, message and headers; ``kind`` says whether the request's input was
    wrong (``input``: the protocol may detail ``cause``), the server refused it (``refused``: busy, limits,
    routing, auth) or failed (``internal``); ``retryable`` marks a transient refusal."""

    status: int
    message: str
    kind: Literal["input", "refused", "internal"]
    headers: dict[str, str] = field(default_factory=dict)
    retryable: bool = False
    cause: Exception | None = None
