"""python -m endpoint_client over real HTTP on loopback: a moto server for the happy path, and a stub
SageMaker Runtime that answers 503 (or other errors) a given number of times, so that every retry goes through
botocore (signing, error parsing) and back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
import requests
from botocore.config import Config

from endpoint_client.invoke import InvokeFailed, RetryPolicy, invoke
from loopback_servers import JsonServer, Reply, replies

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPOSITORY_ROOT / "examples" / "support-route.json"
RESULT = {"result": {"id": "support-route", "option_ids": ["account_access", "billing", "sales"],
                     "probabilities": [0.9, 0.06, 0.04]}}
FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(autouse=True)
def fake_credentials(monkeypatch):
    for name in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_ENDPOINT_URL",
                 "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in FAKE_CREDENTIALS.items():
        monkeypatch.setenv(name, value)


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    environment.update(FAKE_CREDENTIALS if env is None else env)
    environment["PYTHONPATH"] = str(REPOSITORY_ROOT)
    return subprocess.run([sys.executable, "-m", "endpoint_client", *args], capture_output=True, text=True,
                          env=environment, cwd=REPOSITORY_ROOT, timeout=120)


# --- moto: the happy path ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def moto_url(moto_server):
    return moto_server


# Endpoints of this module's own (moto keeps one SageMaker Runtime state per process; the acceptance tests'
# serving fixture forgets its answers before and after each test: conftest.forget_moto_answers).
MOTO_CPU_ENDPOINT = "endpoint-client-test-cpu"
MOTO_GPU_ENDPOINT = "endpoint-client-test-gpu"


def queue_moto_result(moto_url: str, body: str, content_type: str = "application/json") -> None:
    response = requests.post(f"{moto_url}/moto-api/static/sagemaker/endpoint-results", json={
        "results": [{"Body": body, "ContentType": content_type, "InvokedProductionVariant": "AllTraffic",
                     "CustomAttributes": ""}]}, timeout=10)
    response.raise_for_status()


def test_cli_prints_the_endpoint_result_from_moto(moto_url):
    queue_moto_result(moto_url, json.dumps(RESULT))
    completed = run_cli("--endpoint-name", MOTO_CPU_ENDPOINT, "--file", str(EXAMPLE), "--region", "us-east-1",
                        "--endpoint-url", moto_url)
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout) == RESULT
    assert completed.stderr == ""


def test_invoke_returns_body_and_variant_from_moto(moto_url):
    queue_moto_result(moto_url, '{"results": []}')
    client = boto3.client("sagemaker-runtime", region_name="us-east-1", endpoint_url=moto_url)
    result = invoke(client, endpoint_name=MOTO_GPU_ENDPOINT, body=b'{"decisions": []}',
                    content_type="application/json", accept="application/json")
    assert (result.body, result.content_type, result.invoked_variant, result.attempts) == (
        b'{"results": []}', "application/json", "AllTraffic", 1)


# --- a scripted SageMaker Runtime on loopback: retries --------------------------------------------------

class ScriptedRuntime(JsonServer):
    """Answers InvokeEndpoint with the scripted (status, error type, body) answers in turn, then 200."""

    def __init__(self, answers: list[tuple[int, str, dict]], success_body: bytes = json.dumps(RESULT).encode()):
        scripted = [Reply(status, payload, {"x-amzn-ErrorType": error_type}) for status, error_type, payload in answers]
        super().__init__(replies(*scripted, then=Reply(200, body=success_body, headers={
            "x-Amzn-Invoked-Production-Variant": "AllTraffic"})))

    def client(self):
        return boto3.client("sagemaker-runtime", region_name="us-east-1", endpoint_url=self.url,
                            config=Config(retries={"total_max_attempts": 1}))


BUSY = (503, "ServiceUnavailable", {"message": "Service Unavailable"})
CONTAINER_BUSY = (424, "ModelError", {
    "Message": "Received server error (503) from primary with message ...", "OriginalStatusCode": 503,
    "OriginalMessage": '{"error": "model is busy; retry the request", "retryable": true}',
    "LogStreamArn": "arn:aws:logs:us-east-1:123456789012:log-group:/aws/sagemaker/Endpoints/x"})
BAD_FIELD = (424, "ModelError", {
    "Message": "Received client error (400)", "OriginalStatusCode": 400,
    "OriginalMessage": '{"error": "decision.options[0].id is missing"}', "LogStreamArn": "x"})
NO_SUCH_ENDPOINT = (400, "ValidationError", {"message": "Endpoint decision-dev-cpu of account 123 not found."})


class Recorder:
    def __init__(self):
        self.sleeps, self.logs = [], []


def invoke_scripted(runtime: ScriptedRuntime, recorder: Recorder, policy: RetryPolicy):
    # uniform returns its upper bound: the waits are then exactly the capped exponential ceilings.
    return invoke(runtime.client(), endpoint_name="decision-dev-cpu", body=EXAMPLE.read_bytes(),
                  content_type="application/json", accept="application/json", policy=policy,
                  sleep=recorder.sleeps.append, uniform=lambda low, high: high, log=recorder.logs.append)


def test_503_is_retried_with_exponential_backoff_until_it_succeeds():
    recorder = Recorder()
    with ScriptedRuntime([BUSY, BUSY, BUSY]) as runtime:
        result = invoke_scripted(runtime, recorder, RetryPolicy(max_attempts=6, base_delay_s=0.5, max_delay_s=20))
    assert result.attempts == 4 and json.loads(result.body) == RESULT
    assert recorder.sleeps == [0.5, 1.0, 2.0]
    assert len(runtime.requests) == 4
    for request in runtime.requests:  # every attempt is a real, signed InvokeEndpoint request
        assert request.path == "/endpoints/decision-dev-cpu/invocations"
        assert request.body == EXAMPLE.read_bytes()
        assert request.headers["Content-Type"] == "application/json"
        assert request.headers["Authorization"].startswith("AWS4-HMAC-SHA256 ")
    assert "attempt 1/6: SageMaker answered 503 ServiceUnavailable" in recorder.logs[0]


def test_waits_are_capped_and_jittered_below_the_cap():
    recorder = Recorder()
    with ScriptedRuntime([BUSY] * 5) as runtime:
        invoke_scripted(runtime, recorder, RetryPolicy(max_attempts=6, base_delay_s=1.0, max_delay_s=3.0))
    assert recorder.sleeps == [1.0, 2.0, 3.0, 3.0, 3.0]
    policy, seen = RetryPolicy(base_delay_s=1.0, max_delay_s=3.0), []
    delay = policy.delay_before_retry(4, lambda low, high: seen.append((low, high)) or 1.25)
    assert delay == 1.25 and seen == [(0.0, 3.0)]  # full jitter: anywhere from 0 to the capped ceiling


def test_a_busy_container_behind_model_error_is_retried():
    recorder = Recorder()
    with ScriptedRuntime([CONTAINER_BUSY]) as runtime:
        result = invoke_scripted(runtime, recorder, RetryPolicy(max_attempts=3, base_delay_s=0.1))
    assert result.attempts == 2
    assert "the model container answered 503" in recorder.logs[0]


def test_gives_up_after_the_last_attempt():
    recorder = Recorder()
    with ScriptedRuntime([BUSY] * 10) as runtime:
        with pytest.raises(InvokeFailed) as failure:
            invoke_scripted(runtime, recorder, RetryPolicy(max_attempts=3, base_delay_s=0.1))
    assert failure.value.retryable and failure.value.attempts == 3
    assert "gave up after 3 attempts" in str(failure.value)
    assert len(runtime.requests) == 3 and len(recorder.sleeps) == 2


@pytest.mark.parametrize("answer, expected", [
    (BAD_FIELD, "the model container answered 400: {\"error\": \"decision.options[0].id is missing\"}"),
    (NO_SUCH_ENDPOINT, "SageMaker answered 400 ValidationError: Endpoint decision-dev-cpu"),
])
def test_client_errors_are_not_retried(answer, expected):
    recorder = Recorder()
    with ScriptedRuntime([answer]) as runtime:
        with pytest.raises(InvokeFailed) as failure:
            invoke_scripted(runtime, recorder, RetryPolicy(max_attempts=5))
    assert not failure.value.retryable and len(runtime.requests) == 1 and recorder.sleeps == []
    assert expected in str(failure.value)


def test_cli_exit_code_and_message_when_retries_run_out():
    with ScriptedRuntime([BUSY] * 10) as runtime:
        completed = run_cli("--endpoint-name", "decision-dev-cpu", "--file", str(EXAMPLE), "--region",
                            "us-east-1", "--endpoint-url", runtime.url, "--max-attempts", "3", "--base-delay", "0")
    assert completed.returncode == 3
    assert completed.stdout == ""
    assert "endpoint_client: decision-dev-cpu: SageMaker answered 503 ServiceUnavailable" in completed.stderr
    assert "gave up after 3 attempts" in completed.stderr
    assert len(runtime.requests) == 3


def test_cli_exit_code_when_the_request_is_rejected():
    with ScriptedRuntime([BAD_FIELD]) as runtime:
        completed = run_cli("--endpoint-name", "decision-dev-cpu", "--file", str(EXAMPLE), "--region",
                            "us-east-1", "--endpoint-url", runtime.url)
    assert completed.returncode == 1
    assert "decision.options[0].id is missing" in completed.stderr


def test_cli_refuses_a_file_that_is_not_json(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('{"decision": ')
    completed = run_cli("--endpoint-name", "x", "--file", str(broken), "--region", "us-east-1")
    assert completed.returncode == 2
    assert f"{broken} is not valid application/json" in completed.stderr


def test_cli_reports_a_missing_file(tmp_path):
    completed = run_cli("--endpoint-name", "x", "--file", str(tmp_path / "missing.json"), "--region", "us-east-1")
    assert completed.returncode == 2 and "cannot read" in completed.stderr


def test_cli_without_region_says_how_to_set_one(tmp_path):
    env = {k: v for k, v in FAKE_CREDENTIALS.items() if k != "AWS_DEFAULT_REGION"}
    env["AWS_CONFIG_FILE"] = str(tmp_path / "none")
    completed = run_cli("--endpoint-name", "x", "--file", str(EXAMPLE), env=env)
    assert completed.returncode == 4 and "no AWS region" in completed.stderr
