"""Batch Transform: what one container can finish (``/execution-parameters``), and a mini-batch answered record
by record within one budget.

SageMaker sends a mini-batch (``SplitType`` Line, ``BatchStrategy`` MultiRecord) as one request and waits
``InvocationsTimeoutInSeconds`` for it (600 s unless the job says; at most 3,600), retrying it whole on a
timeout. So a mini-batch must be sized to what the model finishes in that time, and be one unit of work:

- ``MaxConcurrentTransforms`` is 1: one scheduler runs one job at a time, so a second mini-batch in flight would
  only wait, its clock running.
- ``MaxPayloadInMB`` is derived from the decode speed measured since start-up (the probe first) and the bytes
  of request text per evaluated token (the probe's): the payload the model evaluates in half the mini-batch's
  budget (90% of ``ADAPTER_BATCH_TIMEOUT_S``), within the body limit. Where not even 1 MB (SageMaker's smallest)
  fits, the answer is ``SINGLE_RECORD``: one record per request, the only shape that can finish.
- The records of a mini-batch run one after another under the mini-batch's deadline, without the token budget
  (the mini-batch was admitted as a whole); a record that cannot be done in what is left of the budget, at the
  measured speed, gets an error record at once, and so does a record with bad input (the contract of the answer:
  ``protocols.openapi.BATCH_LINES``). Records over one state share its evaluation through the state cache (a
  record finds the state the one before saved).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from ..protocols.dispatch import protocol_of
from ..settings import MIB, Settings
from . import bodies
from .calls import call
from .errors import classify
from .logs import add_log_fields

# MaxPayloadInMB is sized to fill this share of a mini-batch's budget at the measured speed: records longer than
# the probe's, and a slower machine than at start-up, have the rest.
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
    body_mb = max(1, settings.max_body_bytes // MIB)
    if not tokens_per_s or not bytes_per_token:
        return ExecutionParameters(1, "SINGLE_RECORD", body_mb)
    payload_mb = int(tokens_per_s * settings.batch_budget_s * FILL * bytes_per_token // MIB)
    if payload_mb < SAGEMAKER_MIN_PAYLOAD_MB:
        return ExecutionParameters(1, "SINGLE_RECORD", body_mb)
    return ExecutionParameters(1, "MULTI_RECORD", min(body_mb, payload_mb))


def answer_lines(records: list[tuple[int, bytes]], deadline: float) -> list[dict[str, Any]]:
    """One result object per record, in order: the answer in the record's protocol, or an error object naming
    the line, with its status (and ``retryable`` where trying the record again later may pass)."""
    out = []
    for number, raw in records:
        try:
            if not raw.strip():
                raise InputError((), "is empty")
            obj = bodies.parse_json(raw)
            protocol = protocol_of(obj)
        except InputError as exc:
            out.append({"error": f"line {number}: {exc}", "status": 400})
            continue
        try:
            answer = protocol.answer(obj, call(deadline, by_tokens=False))
        except Exception as exc:  # noqa: BLE001 - classified in one place, written as this record's error
            failure = classify(exc)
            payload, status = protocol.render(failure)
            if "error" in payload:
                payload = {**payload, "error": f"line {number}: {payload['error']}"}
            out.append({**payload, "status": status})
            continue
        add_log_fields(answer.log)
        out.append(answer.payload)
    return out
