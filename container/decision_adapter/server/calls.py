"""Answering one request object (a body, or one record of a batch) in its protocol, within the request's budget.

The budget is set by how the container is deployed, not by the body (``request_budget``): on an endpoint
(``ADAPTER_DEPLOYMENT=realtime``) every request, a JSON-lines one too, has ``ADAPTER_REQUEST_TIMEOUT_S`` from its
arrival and the token budget; on an asynchronous endpoint (``ADAPTER_DEPLOYMENT=async``) 90% of
``ADAPTER_ASYNC_TIMEOUT_S`` and the token budget; in a Batch Transform job (``AdapterState.in_transform``: the
deployment's settings say so) every request is a mini-batch with 90% of ``ADAPTER_BATCH_TIMEOUT_S`` and no token
budget (it is alone). ``answer_object`` is the one function that answers
a request object, for the real-time routes and for each record of a batch alike: the protocol's answer, or its
error in the protocol's shape (classified once, ``errors.classify``), with the protocol's headers.

Every answer (200) carries ``x_request`` (``request_identity``): the request's id, the same as its ``X-Request-Id``
header and its log line's ``request_id``, the caller's SageMaker ``InferenceId`` where it sent one, and the release
that answered (the image's digest where the deployment says it, ``ADAPTER_IMAGE_DIGEST``; the model's sha256; the
adapter's version). SageMaker's data capture records bodies, not headers, so
this is what joins a captured record to its log line; in a batch every line carries it.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from typing import Any

from ..protocols.call import Budget, Call
from ..protocols.dispatch import Protocol
from ..protocols.fields import RequestContext
from .errors import classify
from .inflight import current_request
from .state import current


def _adapter_version() -> str:
    try:
        return metadata.version("decision-adapter")
    except metadata.PackageNotFoundError:  # run from a source tree that was not installed
        return "unknown"


ADAPTER_VERSION = _adapter_version()


def release() -> dict[str, Any]:
    """What identifies the release serving now: the image's digest (where the deployment names it), the loaded
    model's sha256 (once loaded) and the adapter's version; in every answer's ``x_request`` and every log line."""
    state = current()
    model = state.readiness.model
    return {**({"image_digest": state.settings.image_digest} if state.settings.image_digest else {}),
            **({"model_sha256": model.model_info.get("sha256")} if model is not None else {}),
            "adapter_version": ADAPTER_VERSION}


def request_identity() -> dict[str, Any]:
    """The current request's ``x_request``: its id, the caller's InferenceId if sent, and the release answering it."""
    request = current_request()
    return {"id": request.request_id, **({"inference_id": request.inference_id} if request.inference_id else {}),
            **release()}


def request_budget() -> Budget:
    """The budget of the current request, as the container is deployed (see the module's text)."""
    state = current()
    span = state.settings.request_budget_s
    return Budget(current_request().arrived + span, span, by_tokens=not state.in_transform)


def call(budget: Budget) -> Call:
    """The call context of the current request within ``budget`` (its model must be ready: the gate checked it)."""
    state = current()
    model = state.readiness.model
    request = current_request()
    return Call(model=model, budget=budget, started=request.started,
                context=RequestContext.of(model, state.settings.max_decisions), classify=classify,
                prepared_hook=request.give_back_turn)


@dataclass(frozen=True)
class Reply:
    """A request object's answer or error: its body, its status and the headers its protocol sends."""

    payload: dict[str, Any]
    status: int
    headers: dict[str, str]


def answer_object(obj: Any, protocol: Protocol, budget: Budget) -> Reply:
    """``obj`` answered in ``protocol`` within ``budget``: 200 and the answer (whose log fields join the
    request's log line), or the error the classifier makes of whatever was raised, in the protocol's shape."""
    request = current_request()
    headers = protocol.headers(request.request_id)
    try:
        answer = protocol.answer(obj, call(budget))
    except Exception as exc:  # noqa: BLE001 - classified in one place, rendered in the object's protocol
        failure = classify(exc)
        payload, status = protocol.render(failure)
        return Reply(payload, status, {**failure.headers, **headers})
    request.add_log_fields(answer.log)
    return Reply({**answer.payload, "x_request": request_identity()}, 200, {**answer.headers, **headers})
