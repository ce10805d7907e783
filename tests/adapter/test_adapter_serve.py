"""The `serve` entry point for real: gunicorn on loopback, chunked bodies, graceful SIGTERM."""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest
import requests

from adapter_server import live_server


@pytest.fixture(scope="module")
def server(settings):
    # The deadline is not what these tests are about: on a busy machine 55 s could refuse the six-question request.
    with live_server(settings.model_dir, ADAPTER_MAX_BODY_BYTES="65536", ADAPTER_GRACEFUL_TIMEOUT_S="60",
                     ADAPTER_REQUEST_TIMEOUT_S="300") as running:
        yield running


def test_serve_answers_the_example_over_http(server, example):
    base, _ = server
    response = requests.post(f"{base}/invocations", json=example, timeout=60)
    assert response.status_code == 200
    assert response.json()["result"]["option_ids"] == ["account_access", "billing", "sales"]


def test_chunked_body_over_the_limit_is_rejected_without_reading_it_all(server):
    base, _ = server

    def chunks():
        yield b'{"decision": "'
        for _ in range(100):
            yield b"x" * 1024
        yield b'"}'

    response = requests.post(f"{base}/invocations", data=chunks(), timeout=60,
                             headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    assert "over the limit of 65536 bytes" in response.json()["error"]


def test_sigterm_lets_the_request_in_flight_finish(server, example):
    base, process = server
    state = "A returning customer in Lyon, polite, second late order this year. " * 30
    decisions = [{**example["decision"], "id": f"d{i}", "state": state, "question": f"Question {i}: which queue?"}
                 for i in range(6)]
    outcome: dict = {}

    def call():
        outcome["response"] = requests.post(f"{base}/invocations", json={"decisions": decisions}, timeout=120)

    caller = threading.Thread(target=call)
    caller.start()
    deadline = time.monotonic() + 30
    while requests.get(f"{base}/ping", timeout=5).json()["admitted"] == 0:
        assert time.monotonic() < deadline, "the request never arrived"
        time.sleep(0.01)
    process.send_signal(signal.SIGTERM)
    caller.join(120)

    assert outcome["response"].status_code == 200
    assert len(outcome["response"].json()["results"]) == 6
    assert process.wait(60) == 0
    log = process.read_log()
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert any(line.get("path") == "/invocations" and line.get("status") == 200 and line.get("decisions") == 6
               for line in lines), "one structured log line per request"
