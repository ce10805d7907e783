"""Errors that reach clients: one HTTP error type, and the input error each protocol renders its way."""

from __future__ import annotations

from typing import Any, Sequence

Loc = tuple[str | int, ...]


class ApiError(Exception):
    """An HTTP answer other than success, with the JSON body and headers it carries."""

    def __init__(self, status: int, message: str, *, headers: dict[str, str] | None = None,
                 body: dict[str, Any] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}
        self.body = body if body is not None else {"error": message}


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


def busy(retry_after_s: int, reason: str | None = None) -> ApiError:
    message = "model is busy; retry the request"
    body = {"error": message, "retryable": True, **({"reason": reason} if reason else {})}
    return ApiError(503, message, headers={"Retry-After": str(retry_after_s)}, body=body)
