"""Endpoints the harness calls: the decision adapter (local URL or SageMaker endpoint) and, for the
generation baseline, an OpenAI-style chat completion server (llama-server, or the llama.cpp DLC on
SageMaker). Each call returns the parsed JSON and the wall-clock seconds it took."""

from __future__ import annotations

import json
import time
from typing import Any, Protocol

import requests

BUSY_STATUSES = (429, 503)


class EndpointError(RuntimeError):
    """The endpoint refused or failed a request; the message carries its status and body."""


class JsonEndpoint(Protocol):
    name: str

    def call(self, body: dict[str, Any]) -> tuple[dict[str, Any], float]: ...


class HttpEndpoint:
    """POST JSON to a URL, retrying busy answers (503/429) after their Retry-After."""

    def __init__(self, url: str, *, timeout_s: float = 600.0, attempts: int = 5, api_key: str | None = None):
        self.name = url
        self.url = url
        self.timeout_s = timeout_s
        self.attempts = attempts
        self.session = requests.Session()
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"

    def call(self, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
        for attempt in range(self.attempts):
            started = time.perf_counter()
            response = self.session.post(self.url, json=body, timeout=self.timeout_s)
            elapsed = time.perf_counter() - started
            if response.status_code in BUSY_STATUSES and attempt + 1 < self.attempts:
                time.sleep(min(10.0, float(response.headers.get("Retry-After", 1))))
                continue
            if response.status_code != 200:
                raise EndpointError(f"HTTP {response.status_code}: {response.text[:300]}")
            return response.json(), elapsed
        raise AssertionError("unreachable")


class SageMakerEndpoint:
    """invoke_endpoint on a SageMaker endpoint, with endpoint_client's retry policy; the container answers
    the body posted to /invocations. The latency is that of the attempt that answered."""

    def __init__(self, endpoint_name: str, *, region: str | None = None, endpoint_url: str | None = None):
        import boto3
        from botocore.config import Config

        self.name = f"sagemaker:{endpoint_name}"
        self.endpoint_name = endpoint_name
        self.client = boto3.client("sagemaker-runtime", region_name=region, endpoint_url=endpoint_url,
                                   config=Config(retries={"total_max_attempts": 1}, read_timeout=600))

    def call(self, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
        from endpoint_client.invoke import InvokeFailed, invoke

        started = [0.0]

        def sleep(seconds: float) -> None:
            time.sleep(seconds)
            started[0] = time.perf_counter()

        started[0] = time.perf_counter()
        try:
            result = invoke(self.client, endpoint_name=self.endpoint_name, body=json.dumps(body).encode(),
                            content_type="application/json", accept="application/json", sleep=sleep)
        except InvokeFailed as exc:
            raise EndpointError(f"{self.name}: {exc}") from None
        return json.loads(result.body), time.perf_counter() - started[0]


def endpoint(spec: str, **kwargs: Any) -> JsonEndpoint:
    """`sagemaker:NAME` or an http(s) URL."""
    if spec.startswith("sagemaker:"):
        return SageMakerEndpoint(spec.partition(":")[2], region=kwargs.get("region"),
                                 endpoint_url=kwargs.get("sagemaker_endpoint_url"))
    if spec.startswith(("http://", "https://")):
        return HttpEndpoint(spec, api_key=kwargs.get("api_key"))
    raise ValueError(f"endpoint must be an http(s) URL or sagemaker:NAME, not {spec!r}")
