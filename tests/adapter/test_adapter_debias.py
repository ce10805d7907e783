"""Content-free calibration (``debias`` / ``x_debias``) on the real embedded model, and its pure parts on fakes.

What is held: the prior is the answer's own computation over content-free prompts (same layout, orderings and
readout; a label prior also replaces the question); it is floored, raised to its strength and subtracted after
order averaging and before the temperature (``debias.compose``, pure); a question whose prior prompt is its own is
answered as with debias off, bit for bit; a cached prior is reused without a job; and an answer is bit for bit the
same with its prior cold or warm, alone or beside other questions.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from adapter_fakes import FakeEngine, fake_decision_model, fake_model_dir
from decision_adapter.decisions.debias import MODES, aligned_mean, compose, floored, normalised
from decision_adapter.decisions.combine import Defaults
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
    probabilities = softmax(option_logits - alpha * log((1 - floor) * prior + floor / n)), at the server's default
    strength and floor (ADAPTER_DEBIAS_STRENGTH, ADAPTER_DEBIAS_FLOOR)."""
    body = decision(debias="content-free", permutations=2, show_prior=True)
    result = client.post("/invocations", json={"decision": body}).get_json()["result"]
    prior, alpha, floor = result["debias"]["prior"], result["debias"]["strength"], result["debias"]["floor"]
    assert (alpha, floor) == (model.defaults.strength, model.defaults.floor)
    assert result["probabilities"] == pytest.approx(softmax(
        [a - alpha * math.log((1 - floor) * p + floor / 3) for a, p in zip(result["option_logits"], prior)]), abs=1e-12)

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
    ({"debias": "on"}, "decision.debias Input should be 'off', 'empty', 'content-free' or 'label'"),
    ({"debias": 1}, "decision.debias Input should be 'off', 'empty', 'content-free' or 'label'"),
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


# ---- a state that carries no content: answered as off, on both protocols ---------------------------------------

QUESTION_BORNE = {
    "refund": {"type": "noul", "instructions": "Does the message 'I want my money back for order 118' ask for a "
               "refund?"},
    "team": {"type": "choice", "instructions": "Which team should handle 'my card was charged twice'?",
             "criteria": {"Billing": "Payments and invoices", "Tech": "Bugs and outages", "Sales": None}}}


@pytest.mark.parametrize("mode", ["empty", "content-free"])
def test_a_content_free_state_is_answered_as_off_bit_for_bit_on_both_protocols(settings, engine, mode):
    """The issue's first case: with the state empty the content sits in the question, and a state prior would be
    the answer's own prompt (the answer divided by itself: uniform). With a state prior, as the server's default
    (the shipped default is one) or asked for, such a request is answered as debias off is, bit for bit."""
    client = create_app(dataclasses.replace(settings, debias=mode), engine).test_client()
    body = {"model": "jev-latest", "state": "", "questions": QUESTION_BORNE}
    for asked in ({}, {"x_debias": mode}):
        debiased = client.post("/v1/systemone", json={**body, **asked}).get_json()
        off = client.post("/v1/systemone", json={**body, "x_debias": "off"}).get_json()
        assert debiased["answers"] == off["answers"]
        assert "x_prior_tokens" not in debiased
        assert len(set(debiased["answers"]["team"]["probabilities"].values())) == 3, "not the uniform answer"
    # The decision schema refuses an empty state; N/A is the content-free state a client sends instead.
    for state in ("N/A", " [MASK] "):
        one = decision(state=state, question="Which team should handle 'I was charged twice for March'?")
        debiased = client.post("/invocations", json={"decision": one}).get_json()["result"]
        off = client.post("/invocations", json={"decision": {**one, "debias": "off"}}).get_json()["result"]
        assert debiased["probabilities"] == off["probabilities"] and debiased["option_logits"] == off["option_logits"]
        assert "debias" not in debiased and "prior" not in debiased["timing"]
        assert f"not debiased ({mode}): the state carries no content" in debiased["readout"]


@pytest.mark.parametrize("state", ["{}", [], {"events": []}, {"note": "n/a", "owner": None}, "none", "N/A.", "-",
                                   "  \n\t ", "(none)", "NULL"])
def test_a_state_without_content_is_recognised_by_content_not_spelling(settings, engine, state):
    """Empty JSON, white space and the common placeholders skip the state prior as the empty state does: a prior
    almost equal to the answer would pull it towards the uniform. Answered == debias off, bit for bit."""
    client = create_app(dataclasses.replace(settings, debias="empty"), engine).test_client()
    body = {"model": "jev-latest", "state": state, "questions": QUESTION_BORNE}
    debiased = client.post("/v1/systemone", json=body)
    off = client.post("/v1/systemone", json={**body, "x_debias": "off"})
    assert debiased.status_code == off.status_code == 200, debiased.get_data(as_text=True)
    assert debiased.get_json()["answers"] == off.get_json()["answers"]
    assert "x_prior_tokens" not in debiased.get_json()


@pytest.mark.parametrize("state", ["no", "0", "A ticket arrived.", {"events": [0]}, {"status": "open"}])
def test_a_state_with_content_keeps_its_prior(state):
    from decision_adapter.decisions.debias import content_free
    from decision_adapter.decisions.prompt import state_text

    assert not content_free(state_text(state))
    assert not content_free("n/a " * 100)  # past PLACEHOLDER_CHARS: content, whatever it spells


def test_a_label_prior_keeps_what_the_question_carries(settings, engine):
    """With a generic state, a state prior holds the question's content and divides it out; a label prior holds
    the options alone, so two questions with the same options share it, whatever they ask."""
    client = create_app(dataclasses.replace(settings, debias="label"), engine).test_client()
    ask = {"model": "jev-latest", "state": "A new support ticket has arrived.", "x_show_prior": True}
    one = client.post("/v1/systemone", json={**ask, "questions": {"q": QUESTION_BORNE["team"]}}).get_json()
    other = {**QUESTION_BORNE["team"], "instructions": "Which team should handle 'the app crashes at login'?"}
    two = client.post("/v1/systemone", json={**ask, "questions": {"q": other}}).get_json()
    a, b = one["answers"]["q"]["x_debias"], two["answers"]["q"]["x_debias"]
    assert a["mode"] == "label" and a["question"] == "N/A" and a["states"] == [""]
    assert a["prior"] == b["prior"], "the same options, the same label prior"
    assert two["x_prior_tokens"] == 0, "answered from the cache"
    empty = client.post("/v1/systemone", json={**ask, "x_debias": "empty",
                                              "questions": {"q": QUESTION_BORNE["team"]}}).get_json()
    assert empty["answers"]["q"]["x_debias"]["prior"] != a["prior"], "a state prior holds the question too"
    # With an empty state the label prior still holds the options alone: it is divided out (not answered as off).
    body = {"model": "jev-latest", "state": "", "questions": {"q": QUESTION_BORNE["team"]}}
    labelled = client.post("/v1/systemone", json=body).get_json()["answers"]["q"]
    off = client.post("/v1/systemone", json={**body, "x_debias": "off"}).get_json()["answers"]["q"]
    assert labelled["x_debias"]["mode"] == "label" and labelled["probabilities"] != off["probabilities"]


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
    preference, and dividing it out at full strength without a floor leaves the uniform distribution."""
    fake_model.defaults = Defaults(strength=1.0, floor=0.0)
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
    scheduler = Scheduler(engine.runner, queue_tokens=300)
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


# ---- the composition: strength, floor, and what is never divided out --------------------------------------------

ROWS = [((0.4, -1.3, 0.2), (0, 1, 2)), ((0.1, 0.9, -2.0), (2, 0, 1))]
PRIOR = [((2.0, -1.0, 0.0), (0, 1, 2)), ((1.5, 0.3, -0.7), (2, 0, 1))]


def test_no_prior_or_strength_zero_is_the_model_own_answer_bit_for_bit():
    off = compose(ROWS, 3)
    assert off.probabilities == tuple(softmax(list(off.logits))) and off.adjusted == off.logits
    for kwargs in ({"strength": 0.0}, {"strength": 0.0, "floor": 0.3}):
        zero = compose(ROWS, 3, PRIOR, **kwargs)
        assert zero.probabilities == off.probabilities and zero.adjusted == off.logits
        assert zero.prior == tuple(softmax(list(aligned_mean(PRIOR, 3)))), "the prior is still reported"
    full = compose(ROWS, 3, PRIOR)
    assert full.adjusted == tuple(a - b for a, b in zip(off.logits, aligned_mean(PRIOR, 3))), "issue 18's arithmetic"


def test_the_strength_scales_the_prior_in_log_space_and_the_floor_mixes_it_with_the_uniform():
    log_prior = aligned_mean(PRIOR, 3)
    half = compose(ROWS, 3, PRIOR, strength=0.5)
    assert half.adjusted == pytest.approx([a - 0.5 * b for a, b in zip(half.logits, log_prior)], abs=1e-15)
    p = softmax(list(log_prior))
    assert floored(log_prior, 0.25) == pytest.approx([math.log(0.75 * x + 0.25 / 3) for x in p], abs=1e-15)
    assert floored(log_prior, 0.0) == log_prior
    flat = compose(ROWS, 3, PRIOR, floor=1.0)
    assert flat.probabilities == pytest.approx(compose(ROWS, 3).probabilities, abs=1e-12), "all uniform: no prior"
    with pytest.raises(ValueError):
        compose(ROWS, 3, PRIOR, strength=1.5)


def test_a_floor_bounds_what_one_confident_prior_can_move():
    """Issue 27's case: the answer says A 0.69, one content-free prompt says A 0.95. Dividing it out whole flips
    the answer to B at 0.89; floored by mixing with the uniform, the prior moves the log-odds by at most
    alpha * log((1 - f + f/n) / (f/n)), and here the answer stays A."""
    answer = [((math.log(0.69), math.log(0.31)), (0, 1))]
    prior = [((math.log(0.95), math.log(0.05)), (0, 1))]
    whole = compose(answer, 2, prior)
    assert whole.probabilities[1] > 0.85
    for floor, strength in ((0.75, 1.0), (0.5, 0.75)):
        kept = compose(answer, 2, prior, strength=strength, floor=floor)
        moved = (math.log(0.69 / 0.31) - math.log(kept.probabilities[0] / kept.probabilities[1]))
        assert 0 < moved <= strength * math.log((1 - floor + floor / 2) / (floor / 2)) + 1e-12
        assert kept.probabilities[0] > 0.5, (floor, strength)


def test_a_question_whose_state_carries_no_content_gets_no_prior_and_is_answered_as_off(fake_model):
    fake_model.engine.logits = lambda n: [-3.0 * i for i in range(n)]
    off = fake_model.score(fake_model.prepare([fake_question(state="")])).results[0]
    for mode in ("empty", "content-free"):
        prepared = fake_model.prepare([fake_question(state="", debias=mode)])
        assert prepared.priors == () and prepared.no_prior == {0}
        assert prepared.request_tokens == fake_model.prepare([fake_question(state="")]).request_tokens
        answered = fake_model.score(prepared)
        [result] = answered.results
        assert answered.jobs == 1 and answered.prior_stats == ()
        assert result.probabilities == off.probabilities and result.option_logits == off.option_logits
        assert result.debias is None and result.prior is None
        assert f"not debiased ({mode}): the state carries no content" in result.readout
    # Every content-free state (give or take white space), for every state prior; a state with content has its
    # prior; a label prior (which never holds the question) is divided out whatever the state.
    for state in ("N/A", " [MASK]\n"):
        assert fake_model.prepare([fake_question(state=state, debias="empty")]).no_prior == {0}
    assert fake_model.prepare([fake_question(state="N/A please", debias="empty")]).no_prior == frozenset()
    labelled = fake_model.prepare([fake_question(state="", debias="label")])
    assert labelled.no_prior == frozenset() and len(labelled.priors) == 1


def test_a_label_prior_replaces_the_state_and_the_question_and_keeps_the_options(fake_model):
    prepared = fake_model.prepare([fake_question(debias="label", permutations=2)])
    [job] = prepared.priors
    assert job.key == ("", "N/A") and len(job.prompts) == 2
    for k, prompt in zip(job.prompts, job.spec.prompts):
        options = [fake_question().options[j] for j in prepared.orders[k]]
        text = fake_model.layout.question_segment("N/A", fake_model.labels(3), options)
        assert tuple(prompt) == (fake_model.preparer.head_tokens + fake_model.preparer.content_free_tokens[""]
                                 + tuple(fake_model.engine.vocabulary.tokenize(text)) + fake_model.preparer.tail_tokens)
    # Two questions with the same options share one label prior whatever they ask.
    other = fake_question(question="Who should answer?", debias="label", permutations=2)
    both = fake_model.prepare([fake_question(debias="label", permutations=2), other])
    [shared] = both.priors
    assert shared.spec.prompts[:2] == shared.spec.prompts[2:]
