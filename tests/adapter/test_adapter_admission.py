"""Admission under contention: a full worker answers a retryable 503 at once; nothing waits unbounded."""

from __future__ import annotations

import dataclasses
import json
import threading

from adapter_fakes import FakeEngine, fake_model_dir
from decision_adapter.app import create_app

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
        assert response.headers["Retry-After"] == str(settings.retry_after_s)
        assert client.get("/ping").status_code == 200, "/ping is never queued behind scoring"
    finally:
        for _ in held:
            admission.leave()
    assert post(client, example).status_code == 200


def test_request_behind_a_busy_model_is_turned_away_when_the_queue_is_full(tmp_path, settings, example):
    engine = FakeEngine(fake_model_dir(tmp_path) / "fake.gguf")
    app = create_app(dataclasses.replace(settings, queue_depth=0), engine)
    release = threading.Event()
    engine.on_score = lambda: release.wait(30)
    engine.scoring.clear()
    client = app.test_client()
    first: dict = {}
    worker = threading.Thread(target=lambda: first.setdefault("response", post(app.test_client(), example)))
    worker.start()
    try:
        assert engine.scoring.wait(30), "the first request reached the model"
        second = post(client, example)
        assert second.status_code == 503 and second.get_json() == BUSY
    finally:
        release.set()
        worker.join(30)
    assert first["response"].status_code == 200
    assert post(client, example).status_code == 200


def test_queued_request_gives_up_after_the_queue_timeout(tmp_path, settings, example):
    engine = FakeEngine(fake_model_dir(tmp_path) / "fake.gguf")
    app = create_app(dataclasses.replace(settings, queue_depth=1, queue_timeout_s=0.2), engine)
    release = threading.Event()
    engine.on_score = lambda: release.wait(30)
    engine.scoring.clear()
    worker = threading.Thread(target=lambda: post(app.test_client(), example))
    worker.start()
    try:
        assert engine.scoring.wait(30)
        queued = post(app.test_client(), example)  # admitted to the queue, then waits 0.2 s for the model
        assert queued.status_code == 503 and queued.get_json() == BUSY
        assert engine.calls == 2, "the queued request never reached the model"
    finally:
        release.set()
        worker.join(30)
