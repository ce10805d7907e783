"""Derived lev and openjev decision GGUFs served for real: both routes answer `==`, by the type's rules."""

from __future__ import annotations

import dataclasses

import pytest

from decision_adapter.decisions.letter import choice_confidence, variant_probabilities
from decision_adapter.decisions.model_files import embedded_model_dir, find_gguf
from decision_adapter.server.app import create_app

from decision_ggufs import derive_head, derive_type

STATE = {"ticket": "I was charged twice for my order", "plan": "pro"}
OPTIONS = {"billing": "payments and refunds", "shipping": "parcels", "tech": "bugs"}


@pytest.mark.parametrize("kind", ["lev", "openjev"])
def test_both_routes_answer_a_decision_gguf_the_same_by_its_rules(kind, settings, tmp_path):
    path = derive_type(find_gguf(embedded_model_dir()), tmp_path / kind, kind)
    app = create_app(dataclasses.replace(settings, model_dir=str(path.parent)))
    state = app.extensions["decision_adapter"]
    assert state.readiness.wait(300) and state.readiness.state == "ready", state.readiness.reason
    client = app.test_client()
    ping = client.get("/ping").get_json()
    assert (ping["kind"], ping["decision_type"]) == ("decision-gguf", kind)
    s1 = client.post("/v1/systemone", json={"model": "jev-latest", "state": STATE, "questions": {
        "route": {"type": "choice", "instructions": "Which team?", "criteria": OPTIONS}}}).get_json()
    ds = client.post("/invocations", json={"decision": {"id": "route", "state": STATE, "question": "Which team?",
                                                        "options": [{"id": k, "description": v}
                                                                    for k, v in OPTIONS.items()]}}).get_json()
    result, answer = ds["result"], s1["answers"]["route"]
    assert list(answer["probabilities"].values()) == result["probabilities"]
    assert answer["x_prompt_sha256"] == result["prompt_sha256"]
    assert result["model"]["kind"] == "decision-gguf" and result["model"]["decision_type"] == kind
    assert result["temperature"] == 0.5  # choice with 3 options: lev's choice.small, openjev's choice.3_5
    assert answer["confidence"] == choice_confidence(result["probabilities"])
    if kind == "openjev":  # one variant: the softmax of the raw label logits at the file's temperature
        assert result["probabilities"] == variant_probabilities(result["option_logits"], 0.5)
    else:  # forward and reversed averaged: the options sent reversed are the same two prompts
        reversed_ = client.post("/v1/systemone", json={"model": "jev-latest", "state": STATE, "questions": {
            "route": {"type": "choice", "instructions": "Which team?",
                      "criteria": dict(reversed(OPTIONS.items()))}}}).get_json()["answers"]["route"]
        assert reversed_["probabilities"] == answer["probabilities"]
    refused = client.post("/v1/systemone", json={"model": "jev-latest", "state": "x", "x_debias": "empty",
                                                 "questions": {"q": {"type": "noul"}}})
    assert refused.status_code == 422 and "not available for a decision GGUF" in refused.get_data(as_text=True)


def test_a_head_type_is_refused_at_start_and_ping_says_why(settings, tmp_path):
    path = derive_head(find_gguf(embedded_model_dir()), tmp_path / "kev", "kev")
    app = create_app(dataclasses.replace(settings, model_dir=str(path.parent)))
    state = app.extensions["decision_adapter"]
    assert state.readiness.wait(120)
    ping = app.test_client().get("/ping")
    assert ping.status_code == 503
    assert "'kev'" in ping.get_json()["detail"] and "b11361" in ping.get_json()["detail"]
