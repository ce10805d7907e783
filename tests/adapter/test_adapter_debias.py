"""Content-free calibration (``debias`` / ``x_debias``) on the real embedded model, and its pure parts on fakes.

What is held: the prior is the answer's own computation over content-free states (same layout, orderings and
readout); it is subtracted after order averaging and before the temperature; a cached prior is reused without a
job; and an answer is bit for bit the same with its prior cold or warm, alone or beside other questions.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from adapter_fakes import FakeEngine, fake_decision_model, fake_model_dir
from decision_adapter.decisions.debias import MODES, aligned_mean, normalised
from decision_adapter.decisions.model import Question
from decision_adapter.engine.errors import Busy
from decision_adapter.engine.readout import softmax
from decision_adapter.engine.scheduler import Scheduler
from decision_adapter.errors import InputError
from decision_adapter.server.app import create_app

STATE = "The customer says the invoice for March charged the annual plan twice and asks for the money back."
OPTIONS = [{"id": "billing", "description": "Payments, invoices and refunds."},
           {"id": "tech", "description": "Bugs, outages and integrations."},
           {"id": "sales", "description": "Questions before a purchase."}]
NOUL = {"type": "noul", "instructions": "Does the customer want a refund?",
        "criteria": {"true": "They ask for money back", "false": "Anything else"}}


def decision(**extra) -> dict:
    return {"id": "route", "state": STATE, "question": "Which team should handle this?", "options": OPTIONS, **extra}


@pytest.fixture
def model(app):
    return app.extensions["decision_adapter"].readiness.model


@pytest.fixture
def jobs(model, monkeypatch):
    """The batches of jobs requests queue in the scheduler, as (number of jobs,) per call."""
    queued: list[int] = []
    submit_all = model.scheduler.submit_all

    def counting(jobs_, **kwargs):
        queued.append(len(jobs_))
        return submit_all(jobs_, **kwargs)

    monkeypatch.setattr(model.scheduler, "submit_all", counting)
    return queued


def forget_answer_and_state(model, body_decision: dict) -> None:
    """Drop the request's own answer and state from the cache, and nothing else: its prior stays."""
    from decision_adapter.protocols import decision_schema
    from decision_adapter.protocols.fields import RequestContext

    [parsed], _ = decision_schema.parse({"decision": body_decision}, RequestContext.of(model, max_decisions=4))
    model.engine.forget(model.prepare([parsed.question]).spec)


# ---- the decision schema ---------------------------------------------------------------------------------------

def test_a_cached_prior_is_reused_without_a_job_and_the_answer_is_the_same_bit_for_bit(client, model, jobs):
    body = decision(debias="content-free", permutations=2, show_prior=True)
    model.engine.cache.clear()
    cold = client.post("/invocations", json={"decision": body}).get_json()["result"]
    assert jobs == [4], "the answer's job and one per content-free state, queued together"
    assert cold["timing"]["prior_tokens"] > 0
    assert cold["debias"]["mode"] == "content-free" and cold["debias"]["states"] == list(MODES["content-free"].states)
    assert "debiased (content-free)" in cold["readout"]

    forget_answer_and_state(model, body)
    warm = client.post("/invocations", json={"decision": body}).get_json()["result"]
    assert jobs == [4, 1], "the prior came from the cache: only the answer's own job ran"
    assert warm["timing"]["prior_tokens"] == 0 and warm["timing"]["cached_tokens"] == 0
    for key in ("probabilities", "option_logits", "debias", "readout", "prompt_sha256"):
        assert warm[key] == cold[key], key

    # A new state asking the same question needs no prior job either, and another question beside it changes
    # nothing: the prior is the question's, cold or warm, alone or not.
    other = {**body, "state": "Our dashboard shows a 500 error since this morning."}
    beside = {"id": "urgent", "state": other["state"], "question": "How urgent is it?",
              "options": [{"id": "low"}, {"id": "high"}], "debias": "content-free"}
    together = client.post("/invocations", json={"decisions": [beside, other]}).get_json()
    assert jobs[2:] == [4], "the answer's job and the new question's priors (the cached ones are not decoded)"
    assert together["timing"]["prior_tokens"] < cold["timing"]["prior_tokens"]
    model.engine.cache.clear()
    alone = client.post("/invocations", json={"decision": other}).get_json()["result"]
    assert alone["timing"]["prior_tokens"] > 0, "cold again"
    for key in ("probabilities", "option_logits", "debias"):
        assert together["results"][1][key] == alone[key], key


def test_the_prior_is_the_answer_scored_on_content_free_states_then_subtracted_before_the_softmax(client, model):
    """prior = the geometric mean, over the content-free states, of the K-averaged distribution each gives;
    probabilities = softmax(option_logits - log prior)."""
    body = decision(debias="content-free", permutations=2, show_prior=True)
    result = client.post("/invocations", json={"decision": body}).get_json()["result"]
    prior = result["debias"]["prior"]
    assert result["probabilities"] == pytest.approx(
        softmax([a - math.log(p) for a, p in zip(result["option_logits"], prior)]), abs=1e-12)

    question = Question(("decision",), STATE, body["question"], tuple(o["description"] for o in OPTIONS),
                        tuple(("decision", "options", i) for i in range(3)), ("decision", "state"),
                        ("decision", "question"), option_keys=tuple(o["id"] for o in OPTIONS), permutations=2,
                        debias="off")
    per_state = []
    for text in MODES["content-free"].states:  # the empty state is the model's to score, not a request's
        [scored] = model.score(model.prepare([dataclasses.replace(question, state=text)])).results
        per_state.append(normalised(scored.option_logits))
    geometric = softmax([math.fsum(column) / len(per_state) for column in zip(*per_state)])
    assert prior == pytest.approx(geometric, abs=1e-12)
    assert result["probabilities"] != pytest.approx(softmax(result["option_logits"]), abs=1e-6), "it moved"


def test_the_server_default_applies_unless_the_request_says(settings, engine):
    app = create_app(dataclasses.replace(settings, debias="content-free"), engine)
    client = app.test_client()
    defaulted = client.post("/invocations", json={"decision": decision()}).get_json()["result"]
    assert defaulted["debias"]["mode"] == "content-free" and "prior" not in defaulted["debias"]
    off = client.post("/invocations", json={"decision": decision(debias="off")}).get_json()["result"]
    assert "debias" not in off and "prior" not in off["timing"]
    assert off["probabilities"] == pytest.approx(softmax(off["option_logits"]), abs=1e-12)
    assert off["option_logits"] == defaulted["option_logits"], "the model's own values either way"


@pytest.mark.parametrize("extra, message", [
    ({"debias": "on"}, "decision.debias Input should be 'off', 'empty' or 'content-free'"),
    ({"debias": 1}, "decision.debias Input should be 'off', 'empty' or 'content-free'"),
    ({"show_prior": "yes"}, "decision.show_prior"),
])
def test_a_bad_debias_option_is_a_400_naming_the_field(client, extra, message):
    response = client.post("/invocations", json={"decision": decision(**extra)})
    assert response.status_code == 400
    assert response.get_json()["error"].startswith(message)


# ---- System One ----------------------------------------------------------------------------------------------

def test_system_one_debiases_with_x_debias_and_reuses_the_prior(client, model, jobs):
    body = {"model": "jev-latest", "state": STATE, "questions": {"refund": NOUL}, "x_debias": "content-free",
            "x_show_prior": True}
    model.engine.cache.clear()
    first = client.post("/v1/systemone", json=body).get_json()
    answer = first["answers"]["refund"]
    assert answer["x_debias"]["mode"] == "content-free"
    assert set(answer["x_debias"]["prior"]) == {"true", "false"}
    assert math.isclose(sum(answer["x_debias"]["prior"].values()), 1.0)
    assert first["x_prior_tokens"] > 0 and first["x_evaluated_tokens"] > first["x_prior_tokens"]
    assert jobs == [4]

    # Another state, and another question beside: the refund question's prior comes from the cache.
    other = {**body, "state": "The parcel arrived broken; the customer wants a new one sent.",
             "questions": {"team": {"type": "choice", "criteria": {"Billing": None, "Shipping": None}},
                           "refund": NOUL}}
    second = client.post("/v1/systemone", json=other).get_json()
    assert jobs[1:] == [4], "the answer's job and the new question's priors only"
    model.engine.cache.clear()
    cold = client.post("/v1/systemone", json={**other, "questions": {"refund": NOUL}}).get_json()
    assert cold["x_prior_tokens"] > 0
    assert second["answers"]["refund"] == cold["answers"]["refund"], "bit for bit, cold or warm, alone or not"

    without = client.post("/v1/systemone", json={**body, "x_debias": "off"}).get_json()
    assert "x_debias" not in without["answers"]["refund"] and "x_prior_tokens" not in without
    assert without["answers"]["refund"]["noul"] != answer["noul"]


@pytest.mark.parametrize("extra, loc", [
    ({"x_debias": "yes"}, ["body", "x_debias"]),
    ({"x_debias": None, "x_show_prior": "true"}, ["body", "x_show_prior"]),
])
def test_a_bad_x_debias_is_a_422_naming_the_field(client, extra, loc):
    body = {"model": "jev-latest", "state": STATE, "questions": {"refund": NOUL}, **extra}
    response = client.post("/v1/systemone", json=body)
    assert response.status_code == 422
    assert [issue["loc"] for issue in response.get_json()["detail"]] == [loc]


# ---- pure logic, on a fake engine ------------------------------------------------------------------------------

@pytest.fixture
def fake_model(tmp_path):
    model = fake_decision_model(FakeEngine(fake_model_dir(tmp_path) / "fake.gguf"), 600, 2000)
    yield model
    model.close()


def fake_question(options=("Refunds.", "Bugs.", "Sales."), **changes) -> Question:
    question = Question(("decision",), "the state", "Which team?", tuple(options),
                        tuple(("decision", "options", i) for i in range(len(options))), ("decision", "state"),
                        ("decision", "question"))
    return dataclasses.replace(question, **changes)


def test_a_bias_the_state_does_not_change_is_removed_whole(fake_model):
    """The fake prefers the first label by 3 nats whatever the state says: with K = 1 the prior holds the same
    preference, and dividing it out leaves the uniform distribution."""
    fake_model.engine.logits = lambda n: [-3.0 * i for i in range(n)]
    [biased] = fake_model.score(fake_model.prepare([fake_question()])).results
    assert biased.probabilities[0] > 0.9 and biased.debias is None
    answered = fake_model.score(fake_model.prepare([fake_question(debias="content-free", show_prior=True)]))
    [debiased] = answered.results
    assert debiased.probabilities == pytest.approx((1 / 3,) * 3, abs=1e-12)
    assert debiased.prior == pytest.approx(biased.probabilities, abs=1e-12)
    assert debiased.option_logits == biased.option_logits, "the model's own values stay"
    assert answered.jobs == 1 + len(MODES["content-free"].states)


def test_the_prior_counts_in_the_request_budget_whether_or_not_it_is_cached(fake_model):
    plain = fake_model.prepare([fake_question()])
    debiased = fake_model.prepare([fake_question(debias="content-free", permutations=3)])
    assert debiased.request_tokens == debiased.plan.tokens + sum(p.plan.tokens for p in debiased.priors)
    assert len(debiased.priors) == 3 and all(len(p.prompts) == 3 for p in debiased.priors)
    assert debiased.request_tokens > 3 * plain.request_tokens
    eight = tuple(f"Option {i}, described at some length." for i in range(8))
    fake_model.prepare([fake_question(options=eight, permutations=4)])
    with pytest.raises(InputError, match="over the request limit of 2000"):
        fake_model.prepare([fake_question(options=eight, debias="content-free", permutations=4)])


def test_aligned_mean_averages_normalised_rows_in_option_order():
    rows = [((0.0, math.log(3.0)), (1, 0)), ((math.log(3.0), 0.0), (0, 1))]
    assert aligned_mean(rows, 2) == pytest.approx((math.log(0.75), math.log(0.25)), abs=1e-15)
    assert aligned_mean(rows, 2) == aligned_mean(list(rows), 2), "the same rows, the same floats"


def test_a_request_is_queued_whole_or_not_at_all(tmp_path):
    from decision_adapter.engine.plan import JobSpec, Limits as PlanLimits, plan_job
    from decision_adapter.engine.readout import LabelTrie

    import threading

    engine = FakeEngine(fake_model_dir(tmp_path) / "fake.gguf")
    release = threading.Event()
    engine.on_score = lambda: release.wait(30)
    scheduler = Scheduler(engine, queue_tokens=300)
    trie = LabelTrie.build([(1,), (2,)])
    spec = JobSpec((tuple(range(100)),), (trie,), 0, 50)
    plan = plan_job(spec, PlanLimits(batch_tokens=512, cells=10_000, sequences=32))
    try:
        running = scheduler.submit(spec, plan)
        assert engine.scoring.wait(30)
        with pytest.raises(Busy, match="over the budget of 300"):
            scheduler.submit_all([(spec, plan)] * 3)
        assert scheduler.queued_tokens == plan.tokens, "none of the three was queued"
        tickets = scheduler.submit_all([(spec, plan)] * 2)
        release.set()
        for ticket in [running, *tickets]:
            scheduler.result(ticket)
    finally:
        release.set()
        scheduler.stop()
