"""Every answer carries ``x_request`` (issue 48): the request's id, the same as its ``X-Request-Id`` header and its
log line's ``request_id``, the caller's SageMaker InferenceId where sent, and the release that answered (the model's
sha256, the adapter's version). SageMaker's data capture records bodies, not headers: this joins a captured record to
its log line, on both protocols, in every line of a batch and in a dry run."""

from __future__ import annotations

import json
import logging
from importlib import metadata

import pytest

TICKET = "Customer asks to reset a forgotten password and says the reset email never arrived."
SYSTEM_ONE = {"model": "jev-latest", "state": TICKET,
              "questions": {"team": {"type": "choice", "instructions": "Which queue should handle this request?",
                                     "criteria": {"account_access": "Account access", "billing": "Billing"}}}}


def _request_lines(caplog) -> list[dict]:
    return [r.fields for r in caplog.records if r.name == "decision_adapter.requests"]


def _release(app) -> dict:
    model = app.extensions["decision_adapter"].readiness.model
    return {"model_sha256": model.model_info["sha256"], "adapter_version": metadata.version("decision-adapter")}


@pytest.mark.parametrize("path, body", [("/invocations", "example"), ("/invocations", "decisions"),
                                        ("/invocations", "system_one"), ("/v1/systemone", "system_one"),
                                        ("/invocations", "dry_run")])
def test_the_body_carries_the_id_of_the_header_and_the_log_line(app, client, example, caplog, path, body):
    shared = {"decisions": [{**example["decision"], "id": "one"},
                            {**example["decision"], "id": "two", "question": "Which queue is wrong for this?"}]}
    bodies = {"example": example, "decisions": shared, "system_one": SYSTEM_ONE,
              "dry_run": {**example, "x_dry_run": True}}
    with caplog.at_level(logging.INFO, logger="decision_adapter.requests"):
        response = client.post(path, json=bodies[body], headers={"X-Request-Id": f"req-{body}"})

    assert response.status_code == 200, response.get_data(as_text=True)
    [line] = _request_lines(caplog)
    answer = response.get_json()
    assert answer["x_request"] == {"id": f"req-{body}", **_release(app)}
    assert answer["x_request"]["id"] == response.headers["X-Request-Id"] == line["request_id"]
    assert "inference_id" not in line
    assert {key: line[key] for key in _release(app)} == _release(app), "the log line names the release too"
    if body == "example":
        assert answer["x_request"]["model_sha256"] == answer["result"]["model"]["sha256"]


def test_a_generated_id_is_the_same_in_the_body_the_header_and_the_log_line(app, client, example, caplog):
    with caplog.at_level(logging.INFO, logger="decision_adapter.requests"):
        response = client.post("/invocations", json=example)

    [line] = _request_lines(caplog)
    identity = response.get_json()["x_request"]
    assert len(identity["id"]) == 32 and identity["id"] == response.headers["X-Request-Id"] == line["request_id"]


def test_sagemakers_inference_id_is_the_request_id_when_no_other_is_sent(app, client, example, caplog):
    with caplog.at_level(logging.INFO, logger="decision_adapter.requests"):
        response = client.post("/invocations", json=example,
                               headers={"X-Amzn-SageMaker-Inference-Id": "audit-7f3c"})
        both = client.post("/v1/systemone", json=SYSTEM_ONE,
                           headers={"X-Amzn-SageMaker-Inference-Id": "audit-7f3d", "X-Request-Id": "req-own"})

    first, second = _request_lines(caplog)
    assert response.get_json()["x_request"] == {"id": "audit-7f3c", "inference_id": "audit-7f3c", **_release(app)}
    assert response.headers["X-Request-Id"] == first["request_id"] == "audit-7f3c"
    assert first["inference_id"] == "audit-7f3c"
    # The caller's own X-Request-Id stays the request id; the inference id joins it, in the body and the log line.
    assert both.get_json()["x_request"] == {"id": "req-own", "inference_id": "audit-7f3d", **_release(app)}
    assert both.headers["X-Request-Id"] == second["request_id"] == "req-own"
    assert second["inference_id"] == "audit-7f3d"


def test_every_line_of_a_batch_carries_the_requests_id(app, client, example, caplog):
    lines = [json.dumps(example), json.dumps(SYSTEM_ONE), json.dumps({"decision": {"id": "x"}})]
    with caplog.at_level(logging.INFO, logger="decision_adapter.requests"):
        response = client.post("/invocations", data="\n".join(lines) + "\n", content_type="application/jsonlines",
                               headers={"X-Request-Id": "batch-9"})

    assert response.status_code == 200, response.get_data(as_text=True)
    [line] = _request_lines(caplog)
    out = [json.loads(text) for text in response.get_data(as_text=True).splitlines()]
    assert line["request_id"] == response.headers["X-Request-Id"] == "batch-9"
    assert [o.get("x_request") for o in out[:2]] == [{"id": "batch-9", **_release(app)}] * 2
    assert out[2]["status"] == 400 and "x_request" not in out[2], "an error line keeps its protocol's error shape"


def test_the_image_digest_the_deployment_names_is_in_x_request(tmp_path, settings, example):
    """ADAPTER_IMAGE_DIGEST (the endpoint stacks set it from the pinned image) names the release in every answer."""
    from adapter_apps import close_app
    from adapter_fakes import FakeEngine, fake_model_dir
    from decision_adapter.server.app import create_app

    digest = "sha256:" + "ab" * 32
    app = create_app(settings.replace(image_digest=digest), FakeEngine(fake_model_dir(tmp_path) / "fake.gguf"))
    try:
        answer = app.test_client().post("/invocations", json=example, headers={"X-Request-Id": "r"}).get_json()
    finally:
        close_app(app)
    assert answer["x_request"] == {"id": "r", "image_digest": digest,
                                   "model_sha256": answer["result"]["model"]["sha256"],
                                   "adapter_version": metadata.version("decision-adapter")}
