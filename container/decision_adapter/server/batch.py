"""Batch Transform: what one container can finish (``/execution-parameters``), and a body of records answered
record by record within one budget.

SageMaker sends a mini-batch (``SplitType`` Line, ``BatchStrategy`` MultiRecord) as one request and waits
``InvocationsTimeoutInSeconds`` for it (600 s unless the job says; at most 3,600), retrying it whole on a
timeout; it fails the job on a record larger than ``MaxPayloadInMB``. So the sizing must never be below a valid
record, and a mini-batch must be one unit of work:

- ``MaxConcurrentTransforms`` is 1: one scheduler runs one job at a time, so a second mini-batch in flight would
  only wait, its clock running.
- ``MaxPayloadInMB`` is the body limit in whole MiB: a record up to the body limit is valid (a ``decisions``
  record repeats its state in every decision: 64 decisions over a 20 KB state are 1.3 MB), so any smaller
  payload could fail the job on one record. ``BatchStrategy`` is ``MULTI_RECORD`` where a mini-batch of that size
  is evaluated in half the mini-batch's budget (90% of ``ADAPTER_BATCH_TIMEOUT_S``) at the decode speed measured
  since start-up (the probe first) and the bytes of request text per evaluated token (the probe's, with the
  first prior of a question counted: a record of a new question pays it); elsewhere ``SINGLE_RECORD``, one record
  a request with the whole budget, the only shape that can finish.
- The records of a body run one after another under the request's one budget (``calls.request_budget``: the
  mini-batch's in a transform; an endpoint's real-time deadline and token budget elsewhere). A record is not
  even parsed once the budget is spent. On an endpoint it gets an error line (503, retryable), as does one that
  cannot be done in what is left at the measured speed. In a transform such a record fails the whole mini-batch
  with a retryable 503 (``out_of_time``): SageMaker stores a 200's lines as results and reports the job
  Completed, so an error line there would be a record lost without a word; a failed invocation is retried, then
  fails the job. A record with bad input, or whose work can never fit the budget, gets its 4xx line either way
  (the contract of the answer: ``protocols.openapi.BATCH_LINES``). Records over one state share its
  evaluation through the state cache (a record finds the state the one before saved).
- A line's error is in its record's protocol. A record that does not say its protocol (blank, not JSON, not a
  request object) gets its error in the protocol every other record read says, where they all say one (a body
  of System One records: System One's 422), else in ``/invocations``' own, the decision schema's
  (``unknown_lines``). The blank lines that end a body are no records (``bodies.Records``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from ..errors import ApiError, InputError
from ..protocols.call import Budget
from ..protocols.dispatch import DECISIONS, Protocol, protocol_of
from ..settings import MIB, Settings
from . import bodies
from .bodies import Records
from .calls import answer_object
from .errors import classify

# MULTI_RECORD is chosen where a full mini-batch fills at most this share of its budget at the measured speed:
# records longer than the probe's, and a slower machine than at start-up, have the rest.
FILL = 0.5
SAGEMAKER_MIN_PAYLOAD_MB = 1


@dataclass(frozen=True)
class ExecutionParameters:
    max_concurrent_transforms: int
    batch_strategy: str
    max_payload_mb: int

    def as_json(self) -> dict[str, Any]:
        return {"MaxConcurrentTransforms": self.max_concurrent_transforms, "BatchStrategy": self.batch_strategy,
                "MaxPayloadInMB": self.max_payload_mb}


def execution_parameters(settings: Settings, tokens_per_s: float | None,
                         bytes_per_token: float | None) -> ExecutionParameters:
    """What one container finishes within a mini-batch's budget at the measured speed (see the module's text)."""
    body_mb = max(SAGEMAKER_MIN_PAYLOAD_MB, settings.max_body_bytes // MIB)
    if not tokens_per_s or not bytes_per_token:
        return ExecutionParameters(1, "SINGLE_RECORD", body_mb)
    filled_mb = tokens_per_s * settings.batch_budget_s * FILL * bytes_per_token / MIB
    return ExecutionParameters(1, "MULTI_RECORD" if filled_mb >= body_mb else "SINGLE_RECORD", body_mb)


def answer_lines(records: Records, budget: Budget, *, mini_batch: bool = False) -> list[dict[str, Any]]:
    """One result object per record, in order: the answer in the record's protocol, or an error object naming
    the line, with its status (and ``retryable`` where trying the record again later may pass). A record whose
    protocol it does not say itself (blank, not JSON, not a request object) gets its error in the body's
    protocol (``unknown_lines``). In a transform (``mini_batch``) a record that the budget leaves unanswered fails
    the whole mini-batch (``out_of_time``): SageMaker stores a 200's lines as results."""
    out: list[dict[str, Any]] = []
    unknown: list[tuple[int, int, InputError]] = []  # (where in out, line number, error) of such records
    protocols: dict[str, Protocol] = {}
    for number, raw in records:
        if budget.spent:
            if mini_batch:
                raise out_of_time(number, len(records), budget)
            out.append({"error": f"line {number}: the request's time ran out before this record; retry it",
                        "status": 503, "retryable": True})
            continue
        try:
            if not raw.strip():
                raise InputError((), "is empty")
            obj = bodies.parse_json(raw)
            protocol = protocol_of(obj)
        except InputError as exc:
            unknown.append((len(out), number, InputError(exc.loc, exc.msg, exc.kind)))  # no traceback, no line
            out.append({})
            continue
        protocols[protocol.name] = protocol
        reply = answer_object(obj, protocol, budget)  # as a real-time body is answered
        if mini_batch and reply.status == 503:  # busy: it cannot be done in what the mini-batch has left
            raise out_of_time(number, len(records), budget)
        out.append(reply.payload if reply.status == 200 else _error_line(number, reply.payload, reply.status))
    shape = unknown_lines(protocols.values())
    for at, number, exc in unknown:
        out[at] = _error_line(number, *shape.render(classify(exc)))
    return out


def out_of_time(number: int, count: int, budget: Budget) -> ApiError:
    """A transform's mini-batch whose budget ran out at record ``number``: a retryable 503 for the whole of it.
    SageMaker writes a 200's body to the output as results, error lines and all, and reports the job Completed; a
    failed invocation it retries (``InvocationsMaxRetries``), then fails the job, which names the input. A retry
    starts where this one stopped: the records answered are in the answer cache."""
    return ApiError(503, f"line {number}: the mini-batch's time ({budget.allowed_s:.0f} s, 90% of "
                         f"ADAPTER_BATCH_TIMEOUT_S) ran out before this record, {number - 1} of its {count} records "
                         f"answered (kept in the answer cache for a retry); give the job a longer "
                         f"InvocationsTimeoutInSeconds with ADAPTER_BATCH_TIMEOUT_S to match, or a smaller "
                         f"MaxPayloadInMB", retryable=True)


def unknown_lines(protocols: Iterable[Protocol]) -> Protocol:
    """The protocol whose shape the error of a record that does not say its own protocol takes: the protocol of
    every other record read, where they share one (a body of System One records gets System One's 422); else
    (records of both protocols, or none that says) the route's, ``/invocations``': the decision schema."""
    seen = list(protocols)
    return seen[0] if len(seen) == 1 else DECISIONS


def _error_line(number: int, payload: dict[str, Any], status: int) -> dict[str, Any]:
    if "error" in payload:
        payload = {**payload, "error": f"line {number}: {payload['error']}"}
    return {**payload, "status": status}
