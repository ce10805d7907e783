"""Derived lev and openjev decision GGUFs served for real: both routes answer `==`, by the type's rules."""

from __future__ import annotations

import dataclasses
import math
import re

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


LOG = "\n".join(f"{i:04d} ticket {i * 37 % 1000} moved to queue {i % 7} by agent {i % 13}" for i in range(60))


@pytest.fixture(scope="module")
def cold_lev(settings, tmp_path_factory):
    """A lev GGUF served with no cache at all: every answer is decoded, none served from an earlier request."""
    path = derive_type(find_gguf(embedded_model_dir()), tmp_path_factory.mktemp("lev"), "lev")
    app = create_app(dataclasses.replace(settings, model_dir=str(path.parent), state_cache_mb=0))
    state = app.extensions["decision_adapter"]
    assert state.readiness.wait(300) and state.readiness.state == "ready", state.readiness.reason
    yield app
    from adapter_apps import close_app

    close_app(app)


def test_a_letter_prompt_is_laid_out_by_its_own_values_whatever_else_the_request_holds(cold_lev):
    """Q alone, Q beside another question, and Q among its own orderings: the same state span (where every
    question over the state would differ), so the same bits, on a server that caches nothing."""
    client = cold_lev.test_client()
    model = cold_lev.extensions["decision_adapter"].readiness.model
    question = {"type": "choice", "instructions": "Which team?", "criteria": OPTIONS}
    other = {"type": "noul", "instructions": "Is it urgent?"}

    def body(**questions):
        return {"model": "jev-latest", "state": LOG, "questions": questions}

    alone = client.post("/v1/systemone", json=body(route=question)).get_json()["answers"]["route"]
    beside = client.post("/v1/systemone", json=body(urgent=other, route=question)).get_json()["answers"]["route"]
    assert beside["probabilities"] == alone["probabilities"]
    from decision_adapter.protocols import systemone
    from decision_adapter.protocols.fields import RequestContext

    def state_end(questions):
        _, _, items = systemone.parse(body(**questions), RequestContext.of(model, max_decisions=64))
        return model.prepare([item.question for item in items]).spec.state_end

    alone_end = state_end({"route": question})
    assert alone_end > len(model.preparer.head_tokens) + 400  # the state's span, not the head alone
    assert state_end({"urgent": other, "route": question}) == alone_end
    # K = 3 orderings, averaged, against each ordering sent alone (one variant): nothing is cached here, so each
    # single is decoded, and its bits are those it has among the three
    keys = list(OPTIONS)
    averaged = client.post("/v1/systemone", json={**body(route=question), "x_permutations": 3}).get_json()
    singles = []
    for order in orderings(keys, 3):
        sent = {"type": "choice", "instructions": "Which team?", "criteria": {keys[j]: OPTIONS[keys[j]] for j in order}}
        singles.append(client.post("/v1/systemone", json={**body(route=sent), "x_permutations": 1}).get_json())
    expected = {key: sum(s["answers"]["route"]["probabilities"][key] / 3 for s in singles) for key in keys}
    assert averaged["answers"]["route"]["probabilities"] == pytest.approx(expected, abs=1e-12)


def test_a_body_of_many_orderings_over_a_long_state_is_refused_before_the_state_is_rendered_into_every_prompt(
        cold_lev, monkeypatch):
    """64 choice questions of 16 options, 16 orderings each, over a state of about 5,000 tokens (each prompt fits
    the context: only the request is too long): a body of about 30 KB whose prompts would hold 6 million tokens. It
    is refused (request_too_long, naming at most how many orderings would fit: the state is decoded once for all of
    them) from bounds computed on the prompts rendered without the state: a few hundred thousand tokens tokenized,
    not millions, in bounded memory, the search for that number included. (Measured:
    ``python -m benchmarks.hostile --letter``; the bound on time here is far above it.)"""
    import time
    import tracemalloc

    client = cold_lev.test_client()
    vocabulary = cold_lev.extensions["decision_adapter"].readiness.model.engine.vocabulary
    tokenized = [0]
    tokenize = vocabulary.tokenize

    def counting(text, **kw):
        found = tokenize(text, **kw)
        tokenized[0] += len(found)
        return found

    monkeypatch.setattr(vocabulary, "tokenize", counting)
    state = " ".join(f"w{i % 997}" for i in range(2000))
    assert len(tokenize(state)) > 4500
    criteria = {f"option-{j}": f"choice {j}" for j in range(16)}
    questions = {f"q{i}": {"type": "choice", "instructions": f"Question {i}?", "criteria": criteria}
                 for i in range(64)}
    body = {"model": "jev-latest", "state": state, "x_permutations": 16, "questions": questions}
    tracemalloc.start()
    started = time.perf_counter()
    try:
        response = client.post("/v1/systemone", json=body)
        seconds = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert response.status_code == 422, response.get_data(as_text=True)
    assert "request_too_long" in response.get_data(as_text=True)
    assert "with the 16 orderings the request asks for" in response.get_data(as_text=True)
    assert re.search(r"at most \d+ orderings would fit", response.get_data(as_text=True))
    assert tokenized[0] < 400_000, tokenized[0]
    print(f"refused in {seconds:.3f} s, {peak / 2**20:.1f} MiB traced, {tokenized[0]} tokens tokenized")
    assert peak < 64 << 20 and seconds < 10, (peak, seconds)
