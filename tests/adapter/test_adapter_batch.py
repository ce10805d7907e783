"""Batch Transform as SageMaker runs it: discovery, 6 MB mini-batches, records one per line, retries."""

from __future__ import annotations

import json
import threading

import pytest

from adapter_fakes import FakeEngine, fake_model_dir
from decision_adapter.server.app import create_app
from decision_adapter.settings import MIB, Settings


def test_execution_parameters_by_default(client):
    response = client.get("/execution-parameters")
    assert response.status_code == 200
    assert response.get_json() == {"MaxConcurrentTransforms": 16, "BatchStrategy": "MULTI_RECORD", "MaxPayloadInMB": 6}


@pytest.mark.parametrize("changes, expected", [
    ({"queue_depth": 1, "max_body_bytes": 16 * MIB}, (1, 16)),
    ({"queue_depth": 7, "max_body_bytes": 6 * MIB + 1}, (7, 6)),
    ({"max_body_bytes": 65536}, (16, 1)),
])
def test_execution_parameters_follow_the_settings(changes, expected):
    settings = Settings(**changes)
    assert (settings.max_concurrent_transforms, settings.max_payload_mb) == expected


def padded_lines(record: dict, lines: int, total_bytes: int) -> bytes:
    """``lines`` copies of a record, each padded with JSON whitespace so the body is ``total_bytes`` long."""
    compact = json.dumps(record).encode()
    size = total_bytes // lines - 1  # each line ends with "\n"
    body = b"".join(compact[:1] + b" " * (size - len(compact)) + compact[1:] + b"\n" for _ in range(lines))
    return body + b" " * (total_bytes - len(body))


def test_a_default_6_mb_mini_batch_is_answered_line_by_line_without_a_413(client, example):
    parameters = client.get("/execution-parameters").get_json()
    body = padded_lines(example, 8, parameters["MaxPayloadInMB"] * MIB)
    assert len(body) == 6 * MIB

    response = client.post("/invocations", data=body, content_type="application/jsonlines")

    assert response.status_code == 200, response.get_data(as_text=True)[:300]
    out = [json.loads(line) for line in response.get_data(as_text=True).splitlines()]
    assert len(out) == 8
    assert all(o["result"]["probabilities"] == out[0]["result"]["probabilities"] for o in out)


def test_application_json_with_one_object_per_line_is_read_as_records(client, example):
    lines = [json.dumps(example), json.dumps({"decision": {"id": "x"}}), json.dumps(example)]
    response = client.post("/invocations", data="\n".join(lines) + "\n", content_type="application/json")

    assert response.status_code == 200
    assert response.mimetype == "application/jsonlines"
    out = [json.loads(line) for line in response.get_data(as_text=True).splitlines()]
    assert [("result" in o, o.get("status")) for o in out] == [(True, None), (False, 400), (True, None)]
    assert out[1]["error"] == "line 2: decision.state is required"


def test_one_json_object_spread_over_lines_is_one_request(client, example):
    response = client.post("/invocations", data=json.dumps(example, indent=2), content_type="application/json")
    assert response.status_code == 200
    assert response.get_json()["result"]["id"] == "support-route"


def test_two_objects_on_one_line_are_not_json(client, example):
    response = client.post("/invocations", data=json.dumps(example) * 2, content_type="application/json")
    assert response.status_code == 400
    assert "the body is not valid JSON: Extra data" in response.get_json()["error"]


@pytest.fixture
def blocked(tmp_path, settings):
    """An app over a fake engine whose scoring waits for ``release``."""
    def build(**changes):
        engine = FakeEngine(fake_model_dir(tmp_path) / "fake.gguf")
        app = create_app(settings.replace(**changes), engine)
        release = threading.Event()
        engine.on_score = lambda: release.wait(30)
        engine.scoring.clear()
        return app, engine, release
    return build


def test_max_concurrent_transforms_requests_are_all_admitted_and_one_more_is_not(blocked, example):
    app, engine, release = blocked(queue_depth=3)
    concurrent = app.test_client().get("/execution-parameters").get_json()["MaxConcurrentTransforms"]
    assert concurrent == 3
    statuses: list[int] = []
    callers = [threading.Thread(target=lambda: statuses.append(
        app.test_client().post("/invocations", json=example).status_code)) for _ in range(concurrent)]
    for caller in callers:
        caller.start()
    try:
        assert engine.scoring.wait(30)
        admission = app.extensions["decision_adapter"].admission
        while admission.admitted < concurrent:
            threading.Event().wait(0.01)
        extra = app.test_client().post("/invocations", json=example)
        assert extra.status_code == 503 and extra.get_json()["retryable"] is True
    finally:
        release.set()
        for caller in callers:
            caller.join(30)
    assert statuses == [200] * concurrent


def test_a_record_refused_as_busy_refuses_the_batch_with_a_retryable_503(blocked, example):
    app, engine, release = blocked(queue_depth=2, request_timeout_s=0.2, retry_after_s=3)
    holder = threading.Thread(target=lambda: app.test_client().post("/invocations", json=example))
    holder.start()
    try:
        assert engine.scoring.wait(30)
        lines = "\n".join([json.dumps({"decision": {"id": "x"}}), json.dumps(example)])
        response = app.test_client().post("/invocations", data=lines, content_type="application/jsonlines")
    finally:
        release.set()
        holder.join(30)

    assert response.status_code == 503
    assert response.headers["Retry-After"] == "3"
    body = response.get_json()
    assert body["retryable"] is True
    assert body["error"].startswith("line 2: model is busy; retry the request")
    retried = app.test_client().post("/invocations", data=lines, content_type="application/jsonlines")
    assert retried.status_code == 200
    assert [json.loads(line).get("status") for line in retried.get_data(as_text=True).splitlines()] == [400, None]
