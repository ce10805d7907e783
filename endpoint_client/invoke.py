"""One InvokeEndpoint call with retries: which answers are worth another attempt, and how long to wait.

botocore's own retries are switched off by the caller (``total_max_attempts=1``) so that this policy is the
only one: at most ``max_attempts`` requests, waiting ``uniform(0, min(max_delay, base_delay * 2**n))`` before
retry ``n`` (full jitter, so clients that were refused together do not come back together).

Retried: HTTP 503 ServiceUnavailable, 429 (ModelNotReady, throttling), other transient 5xx from SageMaker,
connection failures, and a ModelError whose container answered 429 or 5xx (the adapter answers a busy 503 with
``"retryable": true``). Anything else (a 400 naming the bad field, a missing endpoint) is final.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any, Callable

from botocore.exceptions import ClientError, ConnectionError as BotocoreConnectionError
from botocore.exceptions import ReadTimeoutError

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504, 530})
THROTTLING_CODES = frozenset({"ThrottlingException", "Throttling", "TooManyRequestsException",
                              "ModelNotReadyException"})


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 6
    base_delay_s: float = 0.5
    max_delay_s: float = 20.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.base_delay_s < 0 or self.max_delay_s < 0:
            raise ValueError("delays must not be negative")

    def delay_before_retry(self, retry: int, uniform: Callable[[float, float], float]) -> float:
        """Seconds to wait before retry number ``retry`` (0 for the first retry)."""
        return uniform(0.0, min(self.max_delay_s, self.base_delay_s * (2 ** retry)))


@dataclass(frozen=True)
class InvokeResult:
    body: bytes
    content_type: str
    invoked_variant: str | None
    attempts: int


class InvokeFailed(Exception):
    """The endpoint did not give a result; ``retryable`` says whether the last answer was a transient one."""

    def __init__(self, message: str, *, retryable: bool, attempts: int):
        super().__init__(message)
        self.retryable, self.attempts = retryable, attempts


def invoke(client: Any, *, endpoint_name: str, body: bytes, content_type: str, accept: str,
           policy: RetryPolicy = RetryPolicy(), sleep: Callable[[float], None] = time.sleep,
           uniform: Callable[[float, float], float] = random.uniform,
           log: Callable[[str], None] = lambda message: None) -> InvokeResult:
    """Call ``client.invoke_endpoint`` until it succeeds, fails for good, or the attempts run out."""
    for attempt in range(1, policy.max_attempts + 1):
        try:
            response = client.invoke_endpoint(EndpointName=endpoint_name, Body=body, ContentType=content_type,
                                              Accept=accept)
        except ClientError as error:
            retryable, reason = _classify(error)
        except (BotocoreConnectionError, ReadTimeoutError) as error:
            retryable, reason = True, f"connection failed: {error}"
        else:
            return InvokeResult(body=response["Body"].read(), content_type=response.get("ContentType", ""),
                                invoked_variant=response.get("InvokedProductionVariant"), attempts=attempt)
        if not retryable:
            raise InvokeFailed(reason, retryable=False, attempts=attempt)
        if attempt == policy.max_attempts:
            raise InvokeFailed(f"{reason}; gave up after {attempt} attempt{'s' if attempt > 1 else ''}",
                               retryable=True, attempts=attempt)
        delay = policy.delay_before_retry(attempt - 1, uniform)
        log(f"attempt {attempt}/{policy.max_attempts}: {reason}; retrying in {delay:.2f} s")
        sleep(delay)
    raise AssertionError("unreachable")


def _classify(error: ClientError) -> tuple[bool, str]:
    response = error.response
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    code = response.get("Error", {}).get("Code", "")
    message = response.get("Error", {}).get("Message", "")
    if code == "ModelError":
        # The container answered something other than 200; SageMaker reports it as 424.
        original = response.get("OriginalStatusCode")
        original_message = response.get("OriginalMessage") or message
        retryable = isinstance(original, int) and (original == 429 or original >= 500)
        return retryable, f"the model container answered {original}: {original_message}"
    retryable = status in RETRYABLE_STATUS or code in THROTTLING_CODES
    return retryable, f"SageMaker answered {status} {code}: {message}".rstrip(": ")
