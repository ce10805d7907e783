"""The gate before a scoring request's body is read: the API key, a loaded model, and a place in admission.

A request that finds no free place (or a server draining after SIGTERM) gets the retryable 503 at once, so a
flood costs no parsing; ``leave`` gives the place back when the request ends (and a large body's turn, if it still holds it).
"""

from __future__ import annotations

import hmac

from flask import Blueprint, request

from ..errors import ApiError, busy
from .inflight import current_request
from .state import current


def authenticate() -> None:
    """When ``ADAPTER_API_KEY`` is set, every scoring route needs ``Authorization: Bearer <key>``."""
    api_key = current().settings.api_key
    if not api_key:
        return
    scheme, _, token = (request.headers.get("Authorization") or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "Missing API key: send Authorization: Bearer <key>", headers={"WWW-Authenticate": "Bearer"})
    if not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise ApiError(401, "Invalid API key", headers={"WWW-Authenticate": "Bearer"})


def require_model() -> None:
    state = current()
    if state.readiness.state != "ready":
        raise busy(f"model is not ready: {state.readiness.reason}")


def enter() -> None:
    """Before a scoring request's body is read: key, model, and a place in admission."""
    authenticate()
    require_model()
    state = current()
    if not state.admission.try_enter():
        raise busy()
    current_request().admitted = True


def leave(_exc: BaseException | None = None) -> None:
    request_state = current_request()
    if request_state is None:
        return
    request_state.give_back_turn()
    if request_state.admitted:
        current().admission.leave()
        request_state.admitted = False


def install(blueprint: Blueprint, *, scoring_endpoint: str, guard_others: bool) -> None:
    """Gate ``blueprint``: its scoring route enters admission; its other routes need the key and a loaded model
    when ``guard_others``; the place is given back when each request ends."""

    def check() -> None:
        if request.endpoint == scoring_endpoint:
            enter()
        elif guard_others:
            authenticate()
            require_model()

    blueprint.before_request(check)
    blueprint.teardown_request(leave)
