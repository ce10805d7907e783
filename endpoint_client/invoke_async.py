"""One asynchronous invocation (SageMaker Asynchronous Inference): put the body where the endpoint reads it, invoke,
and wait for its output or its failure.

An asynchronous endpoint takes no body in the call: the caller uploads it to S3 and names it
(``InvokeEndpointAsync``'s ``InputLocation``); SageMaker queues the request, hands it to the container's
``/invocations`` when an instance is free (starting one first where the endpoint has scaled to zero), and writes
the container's answer to the endpoint's output path, or its error to the failure path, under the request's
``InferenceId``. ``invoke_async`` does the caller's side: upload, invoke, poll both locations until one holds an
object or ``wait_s`` is spent.

``invoke_local`` plays SageMaker's side against a container on this machine (the adapter with
``ADAPTER_DEPLOYMENT=async``): the body is read from a directory's ``input/``, sent to the container as SageMaker
sends it (``X-Amzn-SageMaker-Inference-Id``, no client-side deadline shorter than the invocation's), and the
answer written to ``output/`` (a 2xx) or ``failure/`` (anything else). It stands in for the queue and the S3 paths,
not for what only an account shows: the queue's retries, the scale from zero and the notifications.

Both return an ``AsyncAnswer``; a request that was not accepted, or whose answer did not come in time, raises
``AsyncFailed``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlparse

import requests
from botocore.exceptions import ClientError

# What SageMaker's queue gives an invocation unless the endpoint or the call says otherwise (InvocationTimeoutSeconds:
# 1 to 3600).
DEFAULT_INVOCATION_TIMEOUT_S = 900
EXTENSIONS = {"application/json": ".json", "application/jsonlines": ".jsonl", "application/x-jsonlines": ".jsonl"}


@dataclass(frozen=True)
class AsyncAnswer:
    inference_id: str
    input_location: str
    location: str          # where the answer was read: the output, or the failure
    failed: bool           # the answer is the failure SageMaker wrote (the container's error, or its own)
    body: bytes
    waited_s: float        # from the upload to the answer


class AsyncFailed(Exception):
    """No answer: the upload or the invocation was refused, or neither location held one after the wait."""


def s3_location(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` as (bucket, key); ValueError for anything else."""
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"{uri!r} is not an s3://bucket/key location")
    return parsed.netloc, parsed.path.lstrip("/")


def input_key(prefix: str, inference_id: str, content_type: str) -> str:
    """Where a request's body goes under an input prefix: one object per InferenceId."""
    extension = EXTENSIONS.get(content_type.split(";")[0].strip().lower(), "")
    return f"{prefix}{inference_id}{extension}"


def invoke_async(runtime: Any, s3: Any, *, endpoint_name: str, input_prefix: str, body: bytes, content_type: str,
                 accept: str, inference_id: str | None = None, invocation_timeout_s: int | None = None,
                 wait_s: float = 3600.0, poll_s: float = 5.0, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic,
                 log: Callable[[str], None] | None = None) -> AsyncAnswer:
    """Upload ``body`` under ``input_prefix`` (``s3://bucket/prefix/``), invoke ``endpoint_name`` asynchronously
    and wait up to ``wait_s`` for its output or failure, reading both every ``poll_s``."""
    inference_id = inference_id or uuid.uuid4().hex
    bucket, prefix = s3_location(input_prefix)
    if prefix and not prefix.endswith("/"):
        raise ValueError(f"{input_prefix!r} is not a prefix ending with '/'")
    key = input_key(prefix, inference_id, content_type)
    started = clock()
    try:
        s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType=content_type)
    except ClientError as error:
        raise AsyncFailed(f"cannot upload the body to s3://{bucket}/{key}: {_explained(error)}") from None
    call = {"EndpointName": endpoint_name, "InputLocation": f"s3://{bucket}/{key}", "ContentType": content_type,
            "Accept": accept, "InferenceId": inference_id}
    if invocation_timeout_s is not None:
        call["InvocationTimeoutSeconds"] = invocation_timeout_s
    try:
        queued = runtime.invoke_endpoint_async(**call)
    except ClientError as error:
        raise AsyncFailed(f"SageMaker refused the invocation: {_explained(error)}") from None
    output, failure = queued["OutputLocation"], queued.get("FailureLocation")
    if log is not None:
        log(f"queued {queued.get('InferenceId', inference_id)}: waiting for {output}"
            + (f" or {failure}" if failure else ""))
    watched = [(output, False)] + ([(failure, True)] if failure else [])
    while True:
        for location, failed in watched:
            found = _read(s3, location)
            if found is not None:
                return AsyncAnswer(inference_id, call["InputLocation"], location, failed, found, clock() - started)
        if clock() - started >= wait_s:
            raise AsyncFailed(f"no answer at {output}" + (f" nor {failure}" if failure else "") +
                              f" after {wait_s:.0f} s; it may still come (read it there later)")
        sleep(poll_s)


def _read(s3: Any, location: str) -> bytes | None:
    """The object at ``location``, or None while there is none."""
    bucket, key = s3_location(location)
    try:
        return s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
            return None
        raise AsyncFailed(f"cannot read {location}: {_explained(error)}") from None


def _explained(error: ClientError) -> str:
    detail = error.response.get("Error", {})
    return f"{detail.get('Code', 'error')}: {detail.get('Message', '')}".rstrip(": ")


def invoke_local(base_url: str, directory: Path, *, body: bytes, content_type: str, accept: str,
                 inference_id: str | None = None,
                 invocation_timeout_s: int = DEFAULT_INVOCATION_TIMEOUT_S) -> AsyncAnswer:
    """SageMaker's side of one asynchronous invocation, played against the container at ``base_url``: the body
    from ``directory``/input, the container's answer to ``directory``/output or, if not a 2xx, /failure."""
    inference_id = inference_id or uuid.uuid4().hex
    inputs, outputs, failures = (directory / part for part in ("input", "output", "failure"))
    for folder in (inputs, outputs, failures):
        folder.mkdir(parents=True, exist_ok=True)
    source = inputs / input_key("", inference_id, content_type)
    source.write_bytes(body)
    started = time.monotonic()
    try:
        response = requests.post(f"{base_url.rstrip('/')}/invocations", data=body, headers={
            "Content-Type": content_type, "Accept": accept, "X-Amzn-SageMaker-Inference-Id": inference_id},
            timeout=(10, invocation_timeout_s))
    except requests.Timeout:
        answer, failed = f"the container did not answer within {invocation_timeout_s} s".encode(), True
    except requests.ConnectionError as error:
        raise AsyncFailed(f"cannot reach the container at {base_url}: {error}") from None
    else:
        answer, failed = response.content, not response.ok
    target = (failures if failed else outputs) / f"{inference_id}.out"
    target.write_bytes(answer)
    return AsyncAnswer(inference_id, source.as_uri(), target.as_uri(), failed, answer, time.monotonic() - started)
