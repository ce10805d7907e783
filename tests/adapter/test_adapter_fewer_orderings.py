"""Order averaging never refuses a request that one ordering could answer (issue 50): the server's default number of
orderings is a preference, shrunk to the largest that fits the request's token budget and what a request may take
here; the answer says how many were averaged and why fewer; a request's own number that cannot fit is refused,
naming the largest that would; the priors follow the number chosen; and the dry run shows the same choice."""

from __future__ import annotations

import dataclasses
import re

import pytest

from decision_adapter.server.app import create_app
from decision_adapter.server.local import EMBEDDED_PERMUTATIONS

from adapter_apps import close_app


def choice(n: int, *, state: str = "A customer writes about an order.", **top) -> dict:
    return {"model": "jev-latest", "state": state, **top, "questions": {"q": {
        "type": "choice", "instructions": "Which option fits?",
        "criteria": {f"option-{i:03d}": f"the {i}th way to handle it" for i in range(n)}}}}


@pytest.fixture(scope="module")
def local_app(settings, engine):
    """The embedded model at `make run`'s settings: every ordering averaged (up to 16), the default limits."""
    app = create_app(dataclasses.replace(settings, permutations=EMBEDDED_PERMUTATIONS), engine)
    yield app
    close_app(app)


@pytest.fixture(scope="module")
def small_app(settings, engine):
    """The same with a small token budget, so that shrinking is cheap to show."""
    app = create_app(dataclasses.replace(settings, permutations=EMBEDDED_PERMUTATIONS, max_request_tokens=3000,
                                         queue_tokens=3000), engine)
    yield app
    close_app(app)


@pytest.mark.parametrize("options", [64, 255])
def test_make_run_admits_64_and_255_options_with_the_largest_number_of_orderings_that_fits(local_app, options):
    """Planned, not decoded (a dry run: the same preparation and admission; the real requests run in the
    conformance suite against `make run`, test_adapter_conformance.py)."""
    response = local_app.test_client().post("/v1/systemone", json=choice(options, x_dry_run=True))
    assert response.status_code == 200, response.get_data(as_text=True)
    dry = response.get_json()["x_dry_run"]
    assert dry["admitted"] and dry["decode_tokens"] <= 32768
    averaged = dry["questions"]["q"]["orderings"]
    assert 1 <= averaged["averaged"] < EMBEDDED_PERMUTATIONS
    assert re.search(rf"{averaged['averaged']} of the server's {EMBEDDED_PERMUTATIONS} orderings "
                     r"\(ADAPTER_PERMUTATIONS\): with 16, the request needs at least \d+ tokens of evaluation, over "
                     r"the request limit of 32768", averaged["fewer"]), averaged


def test_the_default_shrinks_to_the_largest_number_that_fits_and_one_more_would_not(small_app):
    client = small_app.test_client()
    got = client.post("/invocations", json={"decision": {
        "id": "d", "state": "A customer writes about an order.", "question": "Which option fits?",
        "options": [{"id": f"option-{i:02d}", "description": f"the {i}th way"} for i in range(12)]}}).get_json()
    result = got["result"]
    k = result["orderings"]["averaged"]
    assert 1 <= k < 12 and "fewer" in result["orderings"] and result["orderings"]["fewer"] in result["readout"]
    assert got["result"]["timing"]["evaluated_tokens"] <= 3000
    body = choice(12)  # the same options on System One: its own request of k fits, k + 1 is refused naming k
    body["questions"]["q"]["criteria"] = {f"option-{i:02d}": f"the {i}th way" for i in range(12)}
    body["state"] = "A customer writes about an order."
    assert client.post("/v1/systemone", json={**body, "x_permutations": k}).status_code == 200
    refused = client.post("/v1/systemone", json={**body, "x_permutations": k + 1})
    assert refused.status_code == 422
    [detail] = refused.get_json()["detail"]
    assert detail["type"] == "value_error.request_too_long"
    assert f"with the {k + 1} orderings the request asks for (permutations, x_permutations); at most {k} orderings " \
           f"would fit" in detail["msg"]


def test_a_long_state_with_many_options_gets_fewer_orderings_not_a_refusal(small_app):
    state = " ".join(f"event {i} happened" for i in range(300))
    response = small_app.test_client().post("/v1/systemone", json=choice(10, state=state))
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.get_json()["answers"]["q"]["x_orderings"]["averaged"] < 10


def test_the_dry_run_shows_the_number_chosen_and_the_figures_the_real_run_reports(small_app):
    client = small_app.test_client()
    body = choice(12)
    dry = client.post("/v1/systemone", json={**body, "x_dry_run": True}).get_json()["x_dry_run"]
    real = client.post("/v1/systemone", json=body).get_json()
    question = dry["questions"]["q"]
    assert question["orderings"] == real["answers"]["q"]["x_orderings"]
    assert len(question["prompts"]) == question["orderings"]["averaged"]
    assert dry["decode_tokens"] == real["x_evaluated_tokens"]


def test_the_prior_follows_the_number_chosen_and_the_answer_is_that_number_asked_for(small_app, settings, engine):
    client = small_app.test_client()
    body = {**choice(12), "x_debias": "empty"}
    shrunk = client.post("/v1/systemone", json=body).get_json()["answers"]["q"]
    k = shrunk["x_orderings"]["averaged"]
    engine.cache.clear()  # the same question asked for k orderings, decoded again: the same bits
    asked = client.post("/v1/systemone", json={**body, "x_permutations": k}).get_json()["answers"]["q"]
    assert asked["probabilities"] == shrunk["probabilities"] and asked["x_debias"] == shrunk["x_debias"]
    assert "fewer" not in asked["x_orderings"]
