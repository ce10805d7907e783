"""Admission under contention: a full worker answers a retryable 503 at once; nothing waits unbounded."""

from __future__ import annotations

import dataclasses
import json
import threading

from adapter_fakes import FakeEngine, fake_model_dir
from decision_adapter.errors import RETRY_AFTER_S
from decision_adapter.server.app import create_app

BUSY = {"error": "model is busy; retry the request", "retryable": True}


def post(client, body):
    return client.post("/invocations", data=json.dumps(body), content_type="application/json")


def test_full_worker_answers_503_before_reading_the_body(app, client, example, settings):
    admission = app.extensions["decision_adapter"].admission
    held = [admission.try_enter() for _ in range(admission.capacity)]
    assert all(held)
    try:
        # Over the byte limit: a request that read its body would get 413, not 503.
        oversized = b"x" * (settings.max_body_bytes + 1)
        response = client.post("/invocations", data=oversized, content_type="application/json")
        assert response.status_code == 503
        assert response.get_json() == BUSY
        assert response.headers["Retry-After"] == str(RETRY_AFTER_S)
        assert client.get("/ping").status_code == 200, "/ping is never queued behind scoring"
    finally:
        for _ in held:
            admission.leave()
    assert post(client, example).status_code == 200


def held_model(tmp_path, settings, **changes):
    """An app on the fake engine whose first scoring job blocks until released."""
    engine = FakeEngine(fake_model_dir(tmp_path) / "fake.gguf")
    app = create_app(dataclasses.replace(settings, **changes), engine)
    release = threading.Event()
    engine.on_score = lambda: release.wait(30)
    engine.scoring.clear()
    return engine, app, release


def in_background(app, body) -> tuple[threading.Thread, dict]:
    out: dict = {}
    worker = threading.Thread(target=lambda: out.setdefault("response", post(app.test_client(), body)))
    worker.start()
    return worker, out


def test_work_is_admitted_by_tokens_queued_first_come_first_served(tmp_path, settings, example):
    """While a job runs, a request whose tokens would pass ADAPTER_QUEUE_TOKENS gets 503 at once; a smaller one
    waits its turn and is answered."""
    engine, app, release = held_model(tmp_path, settings, queue_tokens=1000, max_request_tokens=1000)
    first, first_out = in_background(app, example)
    small = None
    try:
        assert engine.scoring.wait(30), "the first request reached the model"
        queued_tokens = app.extensions["decision_adapter"].readiness.model.scheduler.queued_tokens
        assert 200 < queued_tokens < 500
        big = {"decision": {**example["decision"], "state": example["decision"]["state"] + " More." * 100}}
        response = post(app.test_client(), big)
        assert response.status_code == 503 and response.get_json() == BUSY
        assert response.headers["Retry-After"] == str(RETRY_AFTER_S)
        small, small_out = in_background(app, {"decision": {**example["decision"], "id": "small"}})
        small.join(0.3)
        assert small.is_alive(), f"the small request waits behind the running one: {small_out}"
    finally:
        release.set()
        first.join(30)
        if small is not None:
            small.join(30)
    assert first_out["response"].status_code == 200
    assert small_out["response"].status_code == 200
    assert small_out["response"].get_json()["result"]["id"] == "small"


def test_a_request_past_its_deadline_in_the_queue_gets_503_and_never_reaches_the_model(tmp_path, settings, example):
    engine, app, release = held_model(tmp_path, settings, request_timeout_s=0.3)
    first, _ = in_background(app, example)
    try:
        assert engine.scoring.wait(30)
        queued = post(app.test_client(), example)
        assert queued.status_code == 503 and queued.get_json() == BUSY
    finally:
        release.set()
        first.join(30)
    assert engine.calls == 3, "the two probes and the first request; the late request was dropped, not scored"


def test_a_draining_server_turns_new_requests_away_and_ping_says_so(app, client, example):
    admission = app.extensions["decision_adapter"].admission
    admission.draining = True
    try:
        response = post(client, example)
        assert response.status_code == 503 and response.get_json() == BUSY
        assert client.get("/ping").status_code == 503
        assert client.get("/ping").get_json()["status"] == "draining"
    finally:
        admission.draining = False
    assert post(client, example).status_code == 200
