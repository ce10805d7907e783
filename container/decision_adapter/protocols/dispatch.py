"""The dispatch of a body to its protocol.

A protocol is its answer function, its error renderer and its response headers. ``answer(body, call)`` validates
the body, prepares it on ``call.model`` and scores it through ``call.score`` (within the request's budget), and
returns an ``Answer``: the payload, the headers and the fields of the request's log line. ``render(failure)`` is
the protocol's own error body and status for a ``Failure`` the server classified. ``headers(request_id)`` are
what every response of the protocol carries, success or error (System One's ``x-typesafe-request-id``).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from ..errors import Failure, InputError
from . import decision_schema, systemone
from .call import Answer, Call


class Protocol(NamedTuple):
    name: str
    answer: Callable[[Any, Call], Answer]
    render: Callable[[Failure], tuple[dict[str, Any], int]]
    headers: Callable[[str], dict[str, str]]


DECISIONS = Protocol("decisions", decision_schema.answer, decision_schema.render, lambda request_id: {})
SYSTEM_ONE = Protocol("systemone", systemone.answer_request, systemone.render, systemone.response_headers)


def protocol_of(body: Any) -> Protocol:
    """The protocol of a parsed ``/invocations`` body, by its keys; an InputError (decision schema's) if none."""
    if not isinstance(body, dict):
        raise InputError((), "the body must be a JSON object")
    if "questions" in body:
        return SYSTEM_ONE
    if "decision" in body or "decisions" in body:
        return DECISIONS
    raise InputError((), "the body must hold 'decision', 'decisions' or 'questions' (System One)")
