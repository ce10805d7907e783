"""The adapter on an asynchronous endpoint (ADAPTER_DEPLOYMENT=async, issue 48): every request has 90% of the
invocation's timeout and the token budget, so a long state that a real-time endpoint refuses as too slow is answered;
`python -m endpoint_client invoke --async --local-container` plays SageMaker's side (input, output and failure
files) against it over HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from werkzeug.serving import make_server

from adapter_apps import close_app
from decision_adapter.server.app import create_app
from decision_adapter.settings import Settings, SettingsError

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]


def long_decision(lines: int = 120) -> dict:
    """One decision over a state of ~1,500 tokens: about a second on two cores, never 0.1 s."""
    state = " ".join(f"Line {i}: the customer reports problem number {i} with the parcel." for i in range(lines))
    return {"decision": {"id": "long", "state": state, "question": "Where should this ticket go?",
                         "options": [{"id": "billing", "description": "Payments and refunds"},
                                     {"id": "shipping", "description": "Parcels and delivery"},
                                     {"id": "sales", "description": "New orders"}]}}


def test_each_deployment_sets_the_budget_of_every_request():
    assert Settings(request_timeout_s=40).request_budget_s == 40
    assert Settings(deployment="transform", batch_timeout_s=1000).request_budget_s == pytest.approx(900)
    assert Settings(deployment="async", async_timeout_s=3600).request_budget_s == pytest.approx(3240)
    assert Settings.from_env({"ADAPTER_DEPLOYMENT": "async"}).async_timeout_s == 900, "SageMaker's default"
    assert Settings.from_env({"ADAPTER_DEPLOYMENT": "async", "SAGEMAKER_BATCH": "true"}).deployment == "transform"
    for bad in ("0", "3601", "soon"):
        with pytest.raises(SettingsError, match="ADAPTER_ASYNC_TIMEOUT_S"):
            Settings.from_env({"ADAPTER_DEPLOYMENT": "async", "ADAPTER_ASYNC_TIMEOUT_S": bad})


@pytest.fixture
def serving(settings, engine):
    """A real-time app whose requests may take 0.1 s, and an asynchronous one (15 minutes) on loopback HTTP, over the
    session's model."""
    realtime = create_app(settings.replace(request_timeout_s=0.1), engine)
    asynchronous = create_app(settings.replace(deployment="async", async_timeout_s=900), engine)
    server = make_server("127.0.0.1", 0, asynchronous, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield realtime, f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join()
        close_app(asynchronous)
        close_app(realtime)


def invoke_async(base: str, body: dict, directory: Path, *extra: str) -> subprocess.CompletedProcess:
    request = directory / "request.json"
    request.write_text(json.dumps(body))
    return subprocess.run([sys.executable, "-m", "endpoint_client", "invoke", "--async", "--endpoint-name", "local",
                           "--local-container", base, "--local-dir", str(directory / "calls"), "--file", str(request),
                           *extra], capture_output=True, text=True, cwd=REPOSITORY_ROOT, timeout=600)


def test_a_long_state_refused_in_real_time_is_answered_asynchronously(serving, tmp_path):
    realtime, base = serving
    body = long_decision()
    refused = realtime.test_client().post("/invocations", json=body)
    assert refused.status_code == 400, refused.get_json()
    assert "a request here may take 0 s" in refused.get_json()["error"], "its usual too-slow 4xx"

    done = invoke_async(base, body, tmp_path, "--inference-id", "ticket-7")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    result = answer["result"]
    assert result["id"] == "long" and sorted(result["option_ids"]) == ["billing", "sales", "shipping"]
    assert abs(sum(result["probabilities"]) - 1) < 1e-6
    assert answer["x_request"]["inference_id"] == "ticket-7", "SageMaker's InferenceId reaches the answer"
    assert "ticket-7 answered in " in done.stderr
    calls = tmp_path / "calls"
    assert json.loads((calls / "input" / "ticket-7.json").read_text()) == body
    assert json.loads((calls / "output" / "ticket-7.out").read_text()) == answer
    assert not any((calls / "failure").iterdir())


def test_a_bad_request_lands_in_the_failure_location_with_its_4xx(serving, tmp_path):
    _, base = serving
    failed = invoke_async(base, {"decision": {"id": "x", "state": "s", "question": "q", "options": []}}, tmp_path,
                          "--inference-id", "bad-1")
    assert failed.returncode == 1, failed.stderr
    assert failed.stdout == ""
    written = json.loads((tmp_path / "calls" / "failure" / "bad-1.out").read_text())
    assert "options" in written["error"], "the error names the field"
    assert "bad-1 failed after" in failed.stderr and "options" in failed.stderr
