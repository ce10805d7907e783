"""python -m endpoint_client invoke --async against moto on loopback (issue 48): the body is uploaded under the input
prefix as <inference id>.json, InvokeEndpointAsync names it, and the command prints the output SageMaker wrote, or
reports its failure; an answer that never comes is given up after --wait. (moto writes a queued answer at once; a
real queue's wait, its retries and the scale from zero are what only an account shows: docs/deploy.md.)"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
import requests

from endpoint_client.invoke_async import AsyncFailed, input_key, invoke_async, s3_location
from registry_testkit import FAKE_CREDENTIALS, REGION

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPOSITORY_ROOT / "examples" / "support-route.json"
# moto keeps one state per process and answers an asynchronous invocation of the same input location with its first
# result: this module's endpoint and bucket are its own.
ENDPOINT = "invoke-async-test"
BUCKET = "invoke-async-test-artifacts"
PREFIX = f"s3://{BUCKET}/async-inference/dev/input/"


@pytest.fixture
def moto(moto_server, aws_environment):
    s3 = boto3.client("s3", region_name=REGION, endpoint_url=moto_server)
    s3.create_bucket(Bucket=BUCKET)
    yield moto_server, s3
    for item in s3.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        s3.delete_object(Bucket=BUCKET, Key=item["Key"])
    s3.delete_bucket(Bucket=BUCKET)


def queue(url: str, data: str, *, failure: bool = False) -> None:
    requests.post(f"{url}/moto-api/static/sagemaker/async-endpoint-results", json={"results": [
        {"data": data, **({"is_failure": True} if failure else {})}]}, timeout=10).raise_for_status()


def run_cli(url: str, *args: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    environment.update(FAKE_CREDENTIALS, PYTHONPATH=str(REPOSITORY_ROOT))
    return subprocess.run([sys.executable, "-m", "endpoint_client", "invoke", "--async", "--endpoint-name", ENDPOINT,
                           "--region", REGION, "--endpoint-url", url, "--poll", "0.1", *args],
                          capture_output=True, text=True, env=environment, cwd=REPOSITORY_ROOT, timeout=120)


def test_the_body_is_uploaded_invoked_and_the_output_printed(moto):
    url, s3 = moto
    answer = {"result": {"id": "support-route", "option_ids": ["billing", "sales"], "probabilities": [0.8, 0.2]}}
    queue(url, json.dumps(answer))
    done = run_cli(url, "--file", str(EXAMPLE), "--input-location", PREFIX, "--inference-id", "route-1")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == answer
    uploaded = s3.get_object(Bucket=BUCKET, Key="async-inference/dev/input/route-1.json")
    assert uploaded["Body"].read() == EXAMPLE.read_bytes() and uploaded["ContentType"] == "application/json"
    assert "queued route-1: waiting for s3://" in done.stderr and "route-1 answered in " in done.stderr


def test_a_failure_is_reported_with_what_sagemaker_wrote(moto):
    url, _ = moto
    queue(url, '{"error": "decision.options: at least 2 options"}', failure=True)
    done = run_cli(url, "--file", str(EXAMPLE), "--input-location", PREFIX, "--inference-id", "route-2")
    assert done.returncode == 1 and done.stdout == ""
    assert "route-2 failed after" in done.stderr and "at least 2 options" in done.stderr


def test_the_arguments_say_what_async_needs(moto):
    url, _ = moto
    missing = run_cli(url, "--file", str(EXAMPLE))
    assert missing.returncode == 2 and "--async needs -c env=NAME, --input-location" in missing.stderr
    not_a_prefix = run_cli(url, "--file", str(EXAMPLE), "--input-location", f"s3://{BUCKET}/async-inference/in")
    assert not_a_prefix.returncode == 2 and "is not a prefix ending with '/'" in not_a_prefix.stderr
    nowhere = run_cli(url, "--file", str(EXAMPLE), "--input-location", "https://example.com/in/")
    assert nowhere.returncode == 2 and "is not an s3://bucket/key location" in nowhere.stderr


class NeverAnswers:
    """SageMaker Runtime that accepts the invocation and whose answer never arrives (a queue that is still
    scaling from zero, or a request that outlives the wait)."""

    def __init__(self):
        self.calls = []

    def invoke_endpoint_async(self, **call):
        self.calls.append(call)
        return {"InferenceId": call["InferenceId"], "OutputLocation": f"s3://{BUCKET}/async-inference/dev/out/x.out",
                "FailureLocation": f"s3://{BUCKET}/async-inference/dev/failure/x.out"}


def test_an_answer_that_never_comes_is_given_up_after_the_wait(moto):
    url, s3 = moto
    runtime, clock, slept = NeverAnswers(), iter(range(0, 1000, 10)), []
    with pytest.raises(AsyncFailed, match=r"no answer at s3://.*/out/x\.out nor s3://.*/failure/x\.out after 30 s"):
        invoke_async(runtime, s3, endpoint_name=ENDPOINT, input_prefix=PREFIX, body=b"{}",
                     content_type="application/json", accept="application/json", inference_id="late",
                     invocation_timeout_s=3600, wait_s=30, poll_s=10, sleep=slept.append, clock=lambda: next(clock))
    assert runtime.calls == [{"EndpointName": ENDPOINT, "InputLocation": f"{PREFIX}late.json",
                              "ContentType": "application/json", "Accept": "application/json",
                              "InferenceId": "late", "InvocationTimeoutSeconds": 3600}]
    assert slept == [10, 10], "read every poll_s until the wait is spent"


def test_locations_and_keys():
    assert s3_location("s3://b/a/b.json") == ("b", "a/b.json")
    assert input_key("in/", "id", "application/jsonlines; charset=utf-8") == "in/id.jsonl"
    assert input_key("in/", "id", "text/csv") == "in/id"


def test_an_environment_names_its_async_endpoint_input_prefix_and_timeout(deployment, capsys, monkeypatch):
    """-c env=dev: the endpoint, the input prefix in the artifact bucket (the artifacts stack's output) and the
    invocation timeout come from cdk.json, as the stacks read them."""
    from endpoint_client import cli
    from endpoint_client.deployment import load_config

    calls = []
    real = cli.invoke_async
    monkeypatch.setattr(cli, "invoke_async", lambda *a, **k: (calls.append(k), real(*a, **k))[1])
    queue(deployment.url, '{"result": {"id": "support-route"}}')
    code = cli.main(["invoke", "--async", *deployment.args("--file", str(EXAMPLE), "--inference-id", "env-1",
                                                         "--poll", "0")])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert json.loads(out.out) == {"result": {"id": "support-route"}}
    settings = load_config(argparse.Namespace(context=["env=dev"], cdk_json=deployment.cdk_json)
                           ).endpoint_settings("async")
    [call] = calls
    assert call["endpoint_name"] == "decision-dev-async"
    assert call["input_prefix"] == f"s3://{deployment.bucket}/{settings.input_prefix}"
    assert call["invocation_timeout_s"] == settings.invocation_timeout_s
    key = f"{settings.input_prefix}env-1.json"
    assert deployment.client("s3").get_object(Bucket=deployment.bucket, Key=key)["Body"].read() == EXAMPLE.read_bytes()


def test_an_environment_without_an_async_endpoint_says_so(deployment, capsys):
    from endpoint_client import cli

    deployment.write_cdk_json(lambda environment: environment.update(
        endpoints=[kind for kind in environment["endpoints"] if kind != "async"]))
    code = cli.main(["invoke", "--async", *deployment.args("--file", str(EXAMPLE))])
    assert code == 2 and "environment dev has no async endpoint (its endpoints: cpu, gpu, text_generation)" in \
        capsys.readouterr().err
