"""Batch Transform as SageMaker runs it: discovery sized from the measured speed, mini-batches as one unit of work
with one budget, records one per line, an error record (never a refused mini-batch) for a record that cannot be
answered."""

from __future__ import annotations

import json
import threading
import time

import pytest

from adapter_fakes import FakeEngine, fake_model_dir
from decision_adapter.server import batch
from decision_adapter.server.app import create_app
from decision_adapter.settings import MIB, Settings


def test_execution_parameters_come_from_the_measured_speed(app, client):
    model = app.extensions["decision_adapter"].readiness.model
    speed, per_token = model.scheduler.tokens_per_s, model.text_bytes_per_token
    assert speed > 0 and 1.0 < per_token < 8.0, "measured by the probe: tokens/s and request bytes per token"
    answer = client.get("/execution-parameters").get_json()
    assert answer == batch.execution_parameters(app.extensions["decision_adapter"].settings, speed,
                                                per_token).as_json()
    assert answer["MaxConcurrentTransforms"] == 1, "one scheduler runs one job at a time"


@pytest.mark.parametrize("tokens_per_s, bytes_per_token, changes, expected", [
    # 1 MiB takes 1 MiB / 4 B = 262,144 tokens: at 100 tokens/s, 2,621 s, over half of 0.9 * 3,600 s.
    (100.0, 4.0, {}, (1, "SINGLE_RECORD", 6)),
    (200.0, 4.0, {}, (1, "MULTI_RECORD", 1)),  # 200 * 1,620 s * 4 B = 1.24 MiB
    (2000.0, 4.0, {}, (1, "MULTI_RECORD", 6)),  # 12.4 MiB, capped at the body limit
    (2000.0, 4.0, {"max_body_bytes": 100 * MIB}, (1, "MULTI_RECORD", 12)),
    (2000.0, 4.0, {"batch_timeout_s": 600}, (1, "MULTI_RECORD", 2)),  # 2000 * 270 s * 4 B = 2.06 MiB
    (None, 4.0, {}, (1, "SINGLE_RECORD", 6)),  # nothing measured yet
])
def test_the_payload_is_what_the_measured_speed_finishes_in_half_the_budget(tokens_per_s, bytes_per_token,
                                                                           changes, expected):
    parameters = batch.execution_parameters(Settings(**changes), tokens_per_s, bytes_per_token)
    assert (parameters.max_concurrent_transforms, parameters.batch_strategy, parameters.max_payload_mb) == expected


def padded_lines(record: dict, lines: int, total_bytes: int) -> bytes:
    """``lines`` copies of a record, each padded with JSON whitespace so the body is ``total_bytes`` long."""
    compact = json.dumps(record).encode()
    size = total_bytes // lines - 1  # each line ends with "\n"
    body = b"".join(compact[:1] + b" " * (size - len(compact)) + compact[1:] + b"\n" for _ in range(lines))
    return body + b" " * (total_bytes - len(body))


def test_a_6_mib_body_of_records_is_answered_line_by_line_without_a_413(client, example):
    body = padded_lines(example, 8, 6 * MIB)

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


def test_a_malformed_first_record_gets_its_own_error_record(client, example):
    lines = ['{"decision": {"id": "broken", ', json.dumps(example), json.dumps(example)]
    response = client.post("/invocations", data="\n".join(lines) + "\n", content_type="application/json")

    assert response.status_code == 200, response.get_data(as_text=True)
    out = [json.loads(line) for line in response.get_data(as_text=True).splitlines()]
    assert out[0]["status"] == 400 and out[0]["error"].startswith("line 1: the body is not valid JSON")
    assert ["result" in o for o in out[1:]] == [True, True]


def test_one_json_object_spread_over_lines_is_one_request(client, example):
    response = client.post("/invocations", data=json.dumps(example, indent=2), content_type="application/json")
    assert response.status_code == 200
    assert response.get_json()["result"]["id"] == "support-route"
    broken = json.dumps(example, indent=2)[:-3]
    response = client.post("/invocations", data=broken, content_type="application/json")
    assert response.status_code == 400, "one malformed object over several lines is one bad body, not records"


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


def test_a_mini_batch_is_one_unit_of_work_with_no_busy_refusal_inside(blocked, example, tmp_path, settings):
    """Its records are not refused by the token budget that single requests fill: the mini-batch was admitted as a
    whole (one place in admission), and its records wait behind what runs, within its own budget."""
    from decision_adapter.protocols import decision_schema
    from decision_adapter.protocols.fields import RequestContext

    (tmp_path / "sizing").mkdir()
    sizing = create_app(settings, FakeEngine(fake_model_dir(tmp_path / "sizing") / "fake.gguf"))
    model = sizing.extensions["decision_adapter"].readiness.model
    [parsed], _ = decision_schema.parse(example, RequestContext())
    tokens = model.prepare([parsed.question]).request_tokens  # what one such request costs the fake model
    app, engine, release = blocked(queue_tokens=tokens + 10, max_request_tokens=tokens + 10)
    single = threading.Thread(target=lambda: app.test_client().post("/invocations", json=example))
    single.start()
    results: list = []
    lines = "\n".join(json.dumps({"decision": {**example["decision"], "id": f"r{i}"}}) for i in range(3))
    caller = threading.Thread(target=lambda: results.append(
        app.test_client().post("/invocations", data=lines, content_type="application/jsonlines")))
    try:
        assert engine.scoring.wait(30), "the single request reached the model and holds its tokens"
        caller.start()
        scheduler = app.extensions["decision_adapter"].readiness.model.scheduler
        while scheduler.queued_tokens < 2 * tokens:  # the first record queued beside it, over the budget
            time.sleep(0.01)
        another = app.test_client().post("/invocations", json=example)
        assert another.status_code == 503 and another.get_json()["retryable"] is True, \
            "a single request is refused by the token budget"
    finally:
        release.set()
        single.join(30)
        caller.join(30)
    [response] = results
    assert response.status_code == 200
    out = [json.loads(line) for line in response.get_data(as_text=True).splitlines()]
    assert [o["result"]["id"] for o in out] == ["r0", "r1", "r2"]


def test_a_record_past_the_mini_batchs_budget_gets_an_error_record_not_a_refused_batch(blocked, example):
    app, engine, release = blocked(batch_timeout_s=1, retry_after_s=3)
    engine.on_score = lambda: time.sleep(0.5)  # every record takes half a second of a 0.9 s budget
    lines = "\n".join([json.dumps({"decision": {"id": "x"}})] +
                      [json.dumps({"decision": {**example["decision"], "id": f"r{i}"}}) for i in range(4)])
    response = app.test_client().post("/invocations", data=lines, content_type="application/jsonlines")

    assert response.status_code == 200, "the mini-batch is answered, never refused whole"
    out = [json.loads(line) for line in response.get_data(as_text=True).splitlines()]
    assert len(out) == 5 and out[0]["status"] == 400
    answered = [o for o in out[1:] if "result" in o]
    late = [o for o in out[1:] if "result" not in o]
    assert answered and late, "some records fit the budget, the rest did not"
    assert all(o["status"] == 503 and o["retryable"] is True and o["error"].startswith("line ") for o in late)
