"""Batch Transform as SageMaker runs it: discovery sized from the measured speed, mini-batches as one unit of work
with one budget, records one per line, an error record (never a refused mini-batch) for a record that cannot be
answered."""

from __future__ import annotations

import json
import re
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
    # A mini-batch of 6 MiB is 6 MiB / 4 B = 1.57M tokens: MULTI_RECORD once half of 0.9 * 3,600 s decodes it.
    (100.0, 4.0, {}, (1, "SINGLE_RECORD", 6)),
    (200.0, 4.0, {}, (1, "SINGLE_RECORD", 6)),  # 1.24 MiB in half the budget: a 1.3 MB record would fail the job
    (1000.0, 4.0, {}, (1, "MULTI_RECORD", 6)),  # 6.18 MiB
    (2000.0, 4.0, {}, (1, "MULTI_RECORD", 6)),  # 12.4 MiB, and never past the body limit
    (2000.0, 4.0, {"max_body_bytes": 100 * MIB}, (1, "SINGLE_RECORD", 100)),
    (2000.0, 4.0, {"batch_timeout_s": 600}, (1, "SINGLE_RECORD", 6)),  # 2000 * 270 s * 4 B = 2.06 MiB
    (200.0, 4.0, {"max_body_bytes": MIB}, (1, "MULTI_RECORD", 1)),
    (None, 4.0, {}, (1, "SINGLE_RECORD", 6)),  # nothing measured yet
])
def test_the_strategy_comes_from_the_measured_speed_and_the_payload_from_the_body_limit(tokens_per_s, bytes_per_token,
                                                                                      changes, expected):
    parameters = batch.execution_parameters(Settings(**changes), tokens_per_s, bytes_per_token)
    assert (parameters.max_concurrent_transforms, parameters.batch_strategy, parameters.max_payload_mb) == expected


@pytest.mark.parametrize("max_body_mib", [1, 6, 100])
def test_max_payload_is_never_below_a_record_the_server_takes(max_body_mib):
    """SageMaker fails the job on a record over MaxPayloadInMB: whatever the speed, every body the server reads
    (the largest valid record) is within it."""
    settings = Settings(max_body_bytes=max_body_mib * MIB, deployment="transform")
    for speed in (None, 1.0, 50.0, 200.0, 1000.0, 1e5):
        assert batch.execution_parameters(settings, speed, 4.0).max_payload_mb * MIB >= settings.max_body_bytes


def test_a_transform_needs_a_body_limit_of_whole_mib():
    from decision_adapter.settings import SettingsError

    with pytest.raises(SettingsError, match="whole number of MiB"):
        Settings.from_env({"ADAPTER_DEPLOYMENT": "transform", "ADAPTER_MAX_BODY_BYTES": str(6 * MIB + 1)})


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


DECISION_BAD = json.dumps({"decision": {"id": "x"}})  # a decision-schema record that fails its validation
S1_BAD = json.dumps({"model": "jev-latest", "state": "s", "questions": {"q": {"type": "nope"}}})  # System One's 422
S1_BROKEN = '{"model": "jev-latest", "state": "s", "questions": {"q": {"type": "noul"}'  # cut short


def line_shape(line: dict) -> tuple:
    """An error line as (status, the decision schema's message) or (status, System One's first detail type)."""
    if "error" in line:
        return line["status"], line["error"]
    return line["status"], line["detail"][0]["type"], line["detail"][0]["loc"]


@pytest.mark.parametrize("body, content_type, expected", [
    # the blank lines that end a body are no records; one between records is an empty record
    ("\n".join([DECISION_BAD, DECISION_BAD]) + "\n\n", "application/jsonlines",
     [(400, "line 1: decision.state is required"), (400, "line 2: decision.state is required")]),
    ("\n".join([DECISION_BAD, DECISION_BAD]) + "\n\n \r\n\n", "application/json",
     [(400, "line 1: decision.state is required"), (400, "line 2: decision.state is required")]),
    (DECISION_BAD + "\n\n" + DECISION_BAD + "\n\n", "application/jsonlines",
     [(400, "line 1: decision.state is required"), (400, "line 2: is empty"),
      (400, "line 3: decision.state is required")]),
    # a record that does not say its protocol gets its error in the protocol of the body's other records
    ("\n".join([S1_BROKEN, S1_BAD]), "application/jsonlines",
     [(422, "json_invalid", ["body"]), (422, "union_tag_invalid", ["body", "questions", "q", "type"])]),
    ("\n".join([S1_BROKEN, S1_BAD, S1_BAD]) + "\n", "application/json",  # a malformed first record
     [(422, "json_invalid", ["body"])] + [(422, "union_tag_invalid", ["body", "questions", "q", "type"])] * 2),
    ("\n".join([S1_BAD, "", "[1, 2]", '{"state": "s"}', S1_BAD]), "application/jsonlines",
     [(422, "union_tag_invalid", ["body", "questions", "q", "type"]), (422, "value_error", ["body"]),
      (422, "value_error", ["body"]), (422, "value_error", ["body"]),
      (422, "union_tag_invalid", ["body", "questions", "q", "type"])]),
    ("\n".join([DECISION_BAD, S1_BROKEN]), "application/jsonlines",
     [(400, "line 1: decision.state is required"),
      (400, "line 2: the body is not valid JSON: Expecting ',' delimiter: line 1 column 74 (char 73)")]),
    # records of both protocols, or none that says: the route's shape, the decision schema's
    ("\n".join([S1_BAD, DECISION_BAD, ""]) + "\n" + S1_BAD, "application/jsonlines",
     [(422, "union_tag_invalid", ["body", "questions", "q", "type"]), (400, "line 2: decision.state is required"),
      (400, "line 3: is empty"), (422, "union_tag_invalid", ["body", "questions", "q", "type"])]),
    ("\n".join([S1_BROKEN, "[]"]), "application/jsonlines",
     [(400, "line 1: the body is not valid JSON: Expecting ',' delimiter: line 1 column 74 (char 73)"),
      (400, "line 2: the body must be a JSON object")]),
], ids=["blank-end", "blank-end-json", "blank-between", "system-one-broken", "system-one-malformed-first",
        "system-one-blank-and-no-request", "decisions-broken", "both-protocols", "none-says"])
def test_error_lines_one_per_record_in_the_protocol_the_body_says(client, body, content_type, expected):
    """A line's error is in its record's protocol; where the record does not say (it does not parse, or is no
    request object, or is blank), in the protocol every other record of the body says, else /invocations' own
    (the decision schema). Blank lines at the end of a body are white space, not records."""
    response = client.post("/invocations", data=body, content_type=content_type)

    assert response.status_code == 200, response.get_data(as_text=True)
    out = [json.loads(line) for line in response.get_data(as_text=True).splitlines()]
    assert [line_shape(line) for line in out] == expected


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
    """In a transform, its records are not refused by the token budget, which an endpoint's requests share: the
    mini-batch is alone (MaxConcurrentTransforms 1), and its records wait behind what runs, within its budget."""
    from decision_adapter.protocols import decision_schema
    from decision_adapter.protocols.fields import RequestContext

    (tmp_path / "sizing").mkdir()
    sizing = create_app(settings, FakeEngine(fake_model_dir(tmp_path / "sizing") / "fake.gguf"))
    model = sizing.extensions["decision_adapter"].readiness.model
    [parsed], _ = decision_schema.parse(example, RequestContext())
    tokens = model.prepare([parsed.question]).request_tokens  # what one such request costs the fake model
    app, engine, release = blocked(queue_tokens=tokens + 10, max_request_tokens=tokens + 10, deployment="transform")
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
        deadline = time.monotonic() + 30
        while scheduler.queued_tokens < 2 * tokens:  # the first record queued beside it, over the budget
            assert time.monotonic() < deadline and caller.is_alive(), results and results[0].get_data(as_text=True)
            time.sleep(0.01)
    finally:
        release.set()
        single.join(30)
        caller.join(30)
    [response] = results
    assert response.status_code == 200
    out = [json.loads(line) for line in response.get_data(as_text=True).splitlines()]
    assert [o["result"]["id"] for o in out] == ["r0", "r1", "r2"]


def test_on_an_endpoint_a_json_lines_body_is_held_to_the_real_time_deadline(blocked, example):
    """Whatever the body, an endpoint's request has ADAPTER_REQUEST_TIMEOUT_S (not the transform's budget of
    0.9 x 3,600 s): the records that do not fit it get retryable error lines, the request ends within it."""
    app, engine, _ = blocked(request_timeout_s=1.0)
    engine.on_score = lambda: time.sleep(0.3)
    lines = "\n".join(json.dumps({"decision": {**example["decision"], "id": f"r{i}"}}) for i in range(12))
    response = app.test_client().post("/invocations", data=lines, content_type="application/jsonlines")

    assert response.status_code == 200
    out = [json.loads(line) for line in response.get_data(as_text=True).splitlines()]
    answered = [o for o in out if "result" in o]
    late = [o for o in out if "result" not in o]
    assert len(out) == 12 and answered and late, "a transform's budget would have answered all twelve"
    assert all(o["status"] == 503 and o["retryable"] is True for o in late)
    assert [o["result"]["id"] for o in answered] == [f"r{i}" for i in range(len(answered))], "in order"


@pytest.mark.parametrize("deployment, status", [("realtime", 503), ("transform", 200)])
def test_a_one_record_mini_batch_gets_the_transforms_budget(blocked, example, deployment, status):
    """A one-record application/json mini-batch in a transform has the mini-batch's budget, not the endpoint's
    (here 0.5 s, less than the record takes)."""
    app, engine, _ = blocked(request_timeout_s=0.5, batch_timeout_s=30, deployment=deployment)
    engine.on_score = lambda: time.sleep(1.5)
    response = app.test_client().post("/invocations", json=example)
    assert response.status_code == status, response.get_json()


def test_a_record_past_the_mini_batchs_budget_fails_the_mini_batch_so_that_the_job_reports_it(blocked, example):
    """SageMaker writes a 200's body to the job's output as results, error lines and all, and reports the job
    Completed: a record the budget left unanswered would be lost without a word. So in a transform it fails the
    whole invocation with a retryable 503 naming the line (SageMaker retries it, then fails the job); a record with
    bad input before it stays what it was, its own 4xx, in the retry's answer."""
    app, engine, release = blocked(batch_timeout_s=1, deployment="transform")
    engine.on_score = lambda: time.sleep(0.5)  # every record takes half a second of a 0.9 s budget
    lines = "\n".join([json.dumps({"decision": {"id": "x"}})] +
                      [json.dumps({"decision": {**example["decision"], "id": f"r{i}"}}) for i in range(4)])
    response = app.test_client().post("/invocations", data=lines, content_type="application/jsonlines")

    assert response.status_code == 503, response.get_data(as_text=True)
    answer = response.get_json()
    assert answer["retryable"] is True
    assert re.match(r"line [3-5]: the mini-batch's time \(1 s, 90% of ADAPTER_BATCH_TIMEOUT_S\) ran out before "
                    r"this record, [2-4] of its 5 records answered", answer["error"]), answer
    assert "result" not in response.get_data(as_text=True)


def test_on_an_endpoint_a_record_past_the_deadline_is_an_error_line_in_a_200(blocked, example):
    app, engine, release = blocked(request_timeout_s=0.9)
    engine.on_score = lambda: time.sleep(0.5)
    lines = "\n".join(json.dumps({"decision": {**example["decision"], "id": f"r{i}"}}) for i in range(4))
    response = app.test_client().post("/invocations", data=lines, content_type="application/jsonlines")

    assert response.status_code == 200
    out = [json.loads(line) for line in response.get_data(as_text=True).splitlines()]
    assert "result" in out[0] and out[-1]["status"] == 503 and out[-1]["retryable"] is True


@pytest.mark.parametrize("environ", [{"SAGEMAKER_BATCH": "true"},
                                     {"SAGEMAKER_BATCH": "TRUE", "ADAPTER_DEPLOYMENT": "realtime"}])
def test_sagemakers_own_batch_variable_makes_a_transform_whatever_the_model_says(environ):
    assert Settings.from_env(environ).deployment == "transform"


def test_without_sagemakers_batch_variable_the_setting_decides():
    assert Settings.from_env({"SAGEMAKER_BATCH": "false"}).deployment == "realtime"
    assert Settings.from_env({"ADAPTER_DEPLOYMENT": "transform"}).deployment == "transform"


def test_execution_parameters_change_nothing_outside_a_transform(blocked, example):
    """Only the deployment makes a container a transform (ADAPTER_DEPLOYMENT, or SageMaker's SAGEMAKER_BATCH): after
    any number of GET /execution-parameters an endpoint's request still has the endpoint's deadline (0.5 s here,
    which refuses it), not a transform's budget, and the route needs the API key where one is set."""
    app, engine, release = blocked(request_timeout_s=0.5, batch_timeout_s=30, api_key="sesame")
    engine.on_score = lambda: time.sleep(1.0)
    client = app.test_client()
    key = {"Authorization": "Bearer sesame"}
    assert client.get("/execution-parameters").status_code == 401
    assert client.get("/execution-parameters", headers=key).status_code == 200
    assert client.post("/invocations", json=example, headers=key).status_code == 503, "still the endpoint's deadline"
    assert not app.extensions["decision_adapter"].in_transform
