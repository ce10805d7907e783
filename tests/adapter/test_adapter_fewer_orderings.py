"""Order averaging never refuses a request that one ordering could answer (issue 50): the server's default number of
orderings is a preference, shrunk to the largest that fits the request's token budget and what a request may take
here; the answer says how many were averaged and why fewer; a request's own number that cannot fit is refused,
naming the largest that would; the priors follow the number chosen; and the dry run shows the same choice."""

from __future__ import annotations

import dataclasses
import re

import pytest

from decision_adapter.server.app import create_app
from decision_adapter.server.local import EMBEDDED_PERMUTATIONS, local_environ
from decision_adapter.settings import Settings

from adapter_apps import close_app


def choice(n: int, *, state: str = "A customer writes about an order.", **top) -> dict:
    """A choice of ``n`` options as the jevcompat suite's option-count case sends them (at 64, the 16 orderings of
    `make run` need 33,847 tokens, over the budget of 32,768)."""
    criteria = {"Billing": "Payments, invoices, refunds",
                **{f"Queue {i:03d}": f"Tickets routed to queue {i}" for i in range(1, n)}}
    return {"model": "jev-latest", "state": state, **top, "questions": {"q": {
        "type": "choice", "instructions": "Which queue should this ticket go to?", "criteria": criteria}}}


@pytest.fixture(scope="module")
def local_settings(settings):
    """`make run`'s settings (server.local): every ordering averaged (up to 16), the default debias prior and
    limits; the test session's thread count."""
    made = Settings.from_env(local_environ({}))
    assert made.permutations == EMBEDDED_PERMUTATIONS
    return dataclasses.replace(made, threads=settings.threads)


@pytest.fixture(scope="module")
def local_app(local_settings, engine):
    app = create_app(local_settings, engine)
    yield app
    close_app(app)


@pytest.fixture(scope="module")
def small_app(local_settings, engine):
    """The same with a small token budget, so that shrinking is cheap to show."""
    app = create_app(dataclasses.replace(local_settings, max_request_tokens=3000, queue_tokens=3000), engine)
    yield app
    close_app(app)


@pytest.mark.parametrize("options", [64, 255])
def test_make_run_admits_64_and_255_options_with_the_largest_number_of_orderings_that_fits(local_app, options):
    """Planned, not decoded (a dry run: the same preparation and admission; the real requests run in the
    conformance suite against `make run`, test_adapter_conformance.py)."""
    response = local_app.test_client().post("/v1/systemone", json=choice(options, x_dry_run=True))
    assert response.status_code == 200, response.get_data(as_text=True)
    dry = response.get_json()["x_dry_run"]
    assert dry["admitted"] and dry["decode_tokens"] <= 32768, dry
    averaged = dry["questions"]["q"]["orderings"]
    assert 1 <= averaged["averaged"] < EMBEDDED_PERMUTATIONS
    assert re.search(rf"{averaged['averaged']} of the server's {EMBEDDED_PERMUTATIONS} orderings "
                     r"\(ADAPTER_PERMUTATIONS\): with 16, the request needs at least \d+ tokens of evaluation, over "
                     r"the request limit of 32768", averaged["fewer"]), averaged


def test_the_default_shrinks_to_the_largest_number_that_fits_and_one_more_would_not(small_app):
    client = small_app.test_client()
    body = choice(16)
    criteria = body["questions"]["q"]["criteria"]
    got = client.post("/invocations", json={"decision": {
        "id": "d", "state": body["state"], "question": body["questions"]["q"]["instructions"],
        "options": [{"id": key, "description": text} for key, text in criteria.items()]}}).get_json()
    result = got["result"]
    assert 1 <= result["orderings"]["averaged"] < 16 and result["orderings"]["fewer"] in result["readout"]
    assert result["timing"]["evaluated_tokens"] <= 3000
    # System One (its prompt shows the options otherwise): the default shrinks to k, a request of its own for k
    # fits, and k + 1 is refused naming k
    k = client.post("/v1/systemone", json=body).get_json()["answers"]["q"]["x_orderings"]["averaged"]
    assert 1 <= k < 16
    assert client.post("/v1/systemone", json={**body, "x_permutations": k}).status_code == 200
    refused = client.post("/v1/systemone", json={**body, "x_permutations": k + 1})
    assert refused.status_code == 422
    [detail] = refused.get_json()["detail"]
    assert detail["type"] == "value_error.request_too_long"
    assert f"with the {k + 1} orderings the request asks for (permutations, x_permutations); at most {k} orderings " \
           f"would fit" in detail["msg"]


def test_a_long_state_with_many_options_gets_fewer_orderings_not_a_refusal(small_app):
    state = " ".join(f"event {i} happened" for i in range(300))
    response = small_app.test_client().post("/v1/systemone", json=choice(8, state=state))
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.get_json()["answers"]["q"]["x_orderings"]["averaged"] < 8


def test_the_dry_run_shows_the_number_chosen_and_the_figures_the_real_run_reports(small_app):
    client = small_app.test_client()
    body = choice(16)
    dry = client.post("/v1/systemone", json={**body, "x_dry_run": True}).get_json()["x_dry_run"]
    real = client.post("/v1/systemone", json=body).get_json()
    question = dry["questions"]["q"]
    assert question["orderings"] == real["answers"]["q"]["x_orderings"]
    assert len(question["prompts"]) == question["orderings"]["averaged"]
    assert dry["decode_tokens"] == real["x_evaluated_tokens"]


def test_the_prior_follows_the_number_chosen_and_the_answer_is_that_number_asked_for(small_app, settings, engine):
    client = small_app.test_client()
    body = {**choice(16), "x_debias": "empty"}
    shrunk = client.post("/v1/systemone", json=body).get_json()["answers"]["q"]
    k = shrunk["x_orderings"]["averaged"]
    engine.cache.clear()  # the same question asked for k orderings, decoded again: the same bits
    asked = client.post("/v1/systemone", json={**body, "x_permutations": k}).get_json()["answers"]["q"]
    assert asked["probabilities"] == shrunk["probabilities"] and asked["x_debias"] == shrunk["x_debias"]
    assert "fewer" not in asked["x_orderings"]
