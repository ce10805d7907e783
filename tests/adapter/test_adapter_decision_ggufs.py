"""Derived lev and openjev decision GGUFs served for real: both routes answer `==`, by the type's rules."""

from __future__ import annotations

import dataclasses
import math

import pytest

from decision_adapter.decisions.letter import choice_confidence, variant_probabilities
from decision_adapter.decisions.model_files import embedded_model_dir, find_gguf
from decision_adapter.decisions.prepare import orderings
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


def ask(client, state, options, **extensions):
    """One choice question on /v1/systemone; its answer (the test fails on any other status)."""
    response = client.post("/v1/systemone", json={"model": "jev-latest", "state": state, **extensions, "questions": {
        "route": {"type": "choice", "instructions": "Which team?", "criteria": dict(options)}}})
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()["answers"]["route"]


@pytest.mark.parametrize("kind", ["lev", "openjev"])
def test_order_averaging_and_debiasing_apply_only_when_asked_and_match_a_slow_recomputation(kind, settings, tmp_path):
    """x_permutations and x_debias on a decision GGUF, each against its answer rebuilt from plain requests: the
    orderings are the same question sent in each order (read at the file's temperature by the type's rules, one
    variant each with x_permutations 1), the prior the same question with an empty state."""
    path = derive_type(find_gguf(embedded_model_dir()), tmp_path / kind, kind)
    app = create_app(dataclasses.replace(settings, model_dir=str(path.parent)))
    state = app.extensions["decision_adapter"]
    assert state.readiness.wait(300) and state.readiness.state == "ready", state.readiness.reason
    client = app.test_client()
    keys = list(OPTIONS)

    # K orderings replace the type's variants: each is the question sent in that order, read alone.
    averaged = ask(client, STATE, OPTIONS.items(), x_permutations=3)
    singles = []
    for order in orderings(keys, 3):
        sent = [(keys[j], OPTIONS[keys[j]]) for j in order]
        singles.append(ask(client, STATE, sent, x_permutations=1)["probabilities"])
    # One ordering is one variant, lev's included: the softmax of the raw label logits at the file's temperature.
    one = client.post("/invocations", json={"decision": {"id": "route", "state": STATE, "question": "Which team?",
                                                         "permutations": 1, "options": [
                                                             {"id": k, "description": v}
                                                             for k, v in OPTIONS.items()]}}).get_json()["result"]
    assert one["probabilities"] == variant_probabilities(one["option_logits"], 0.5)
    expected = {key: sum(p[key] / 3 for p in singles) for key in keys}
    assert averaged["probabilities"] == pytest.approx(expected, abs=1e-12)
    assert averaged["probabilities"] != ask(client, STATE, OPTIONS.items())["probabilities"]

    # The prior: the same prompts with the state replaced by an empty one, divided out at the server's strength.
    plain = ask(client, STATE, OPTIONS.items())
    debiased = ask(client, STATE, OPTIONS.items(), x_debias="empty", x_show_prior=True)
    applied = debiased["x_debias"]
    assert (applied["mode"], applied["strength"], applied["floor"]) == ("empty", settings.debias_strength,
                                                                       settings.debias_floor)
    prior = ask(client, "", OPTIONS.items())["probabilities"]
    assert applied["prior"] == pytest.approx(prior, abs=1e-12)
    floor, strength = applied["floor"], applied["strength"]
    adjusted = {k: math.log(plain["probabilities"][k]) - strength * math.log((1 - floor) * prior[k] + floor / 3)
                for k in keys}
    total = sum(math.exp(v) for v in adjusted.values())
    assert debiased["probabilities"] == pytest.approx({k: math.exp(v) / total for k, v in adjusted.items()},
                                                      abs=1e-12)
    assert debiased["confidence"] == pytest.approx(choice_confidence(list(debiased["probabilities"].values())))
    # A state that carries no content has no state prior: answered as without one, and none is reported.
    empty_state = ask(client, "N/A", OPTIONS.items(), x_debias="empty")
    assert empty_state["probabilities"] == ask(client, "N/A", OPTIONS.items())["probabilities"]
    assert "x_debias" not in empty_state

    # A score's levels and lev's noul ratings keep their order: more than one ordering is refused, naming why.
    for question, why in (({"type": "score", "instructions": "How urgent?", "criteria": ["low", "mid", "high"]},
                           "a score's levels keep their order"),) + ((
            ({"type": "noul", "instructions": "Refund?"}, "rating labels"),) if kind == "lev" else ()):
        refused = client.post("/v1/systemone", json={"model": "jev-latest", "state": "x", "x_permutations": 2,
                                                     "questions": {"q": question}})
        assert refused.status_code == 422 and why in refused.get_data(as_text=True), refused.get_data(as_text=True)


def test_a_head_type_is_refused_at_start_and_ping_says_why(settings, tmp_path):
    path = derive_head(find_gguf(embedded_model_dir()), tmp_path / "kev", "kev")
    app = create_app(dataclasses.replace(settings, model_dir=str(path.parent)))
    state = app.extensions["decision_adapter"]
    assert state.readiness.wait(120)
    ping = app.test_client().get("/ping")
    assert ping.status_code == 503
    assert "'kev'" in ping.get_json()["detail"] and "b11361" in ping.get_json()["detail"]
