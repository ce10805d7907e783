"""The dispatch of a body to its protocol.

A protocol is its answer function and its error renderer. ``answer(body, call)`` validates the body, prepares it
on ``call.model`` and scores it through ``call.score`` (the server's: the request's deadline and admission), and
returns an ``Answer``: the payload, the headers and the fields of the request's log line. ``render(failure)`` is
the protocol's own error body and status for a ``Failure`` the server classified.
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


DECISIONS = Protocol("decisions", decision_schema.answer, decision_schema.render)
SYSTEM_ONE = Protocol("systemone", systemone.answer_request, systemone.render)


def protocol_of(body: Any) -> Protocol:
    """The protocol of a parsed ``/invocations`` body, by its keys; an InputError (decision schema's) if none."""
    if not isinstance(body, dict):
        raise InputError((), "the body must be a JSON object")
    if "questions" in body:
        return SYSTEM_ONE
    if "decision" in body or "decisions" in body:
        return DECISIONS
    raise InputError((), "the body must hold 'decision', 'decisions' or 'questions' (System One)")
