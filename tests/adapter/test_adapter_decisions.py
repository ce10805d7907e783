"""The decision schema on the real model: the walkthrough's example, shared state, batches, bad input."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math

import pytest

from decision_adapter.server.app import create_app
from decision_adapter.engine.core import Engine
from decision_adapter.decisions.labels import labels_for
from decision_adapter.decisions.model_files import find_gguf
from decision_adapter.startup import engine_options

STATE = ("Order 4471 was placed on 3 May by a returning customer in Lyon. The parcel left the warehouse on "
         "5 May and the tracking page has shown 'in transit' for nine days. The customer writes in French, "
         "is polite but says this is the second late order this year and asks for a refund of the shipping fee.")
QUESTIONS = [
    ("Which team should answer?", [("logistics", "Shipping and delivery problems."),
                                   ("billing", "Refunds and charges."), ("sales", "New purchases.")]),
    ("How urgent is it?", [("low", "Can wait a week."), ("medium", "Answer within a day."),
                           ("high", "Answer within the hour.")]),
    ("Which language should the reply use?", [("en", "English"), ("fr", "French"), ("de", "German"),
                                              ("es", "Spanish")]),
    ("Is the customer likely to churn?", [("yes", ""), ("no", "")]),
]


def decision(i: int, question: str, options, state=STATE) -> dict:
    return {"id": f"d{i}", "state": state, "question": question,
            "options": [{"id": o, "description": d} for o, d in options]}


def post(client, body, content_type="application/json", **kwargs):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return client.post("/invocations", data=data, content_type=content_type, **kwargs)


def test_walkthrough_example_returns_probabilities_with_full_metadata(client, app, example):
    app.extensions["decision_adapter"].readiness.model.engine.cache.clear()  # the example is also the probe
    response = post(client, example)

    assert response.status_code == 200, response.get_data(as_text=True)
    result = response.get_json()["result"]
    assert result["id"] == "support-route"
    assert result["option_ids"] == ["account_access", "billing", "sales"]
    assert len(result["probabilities"]) == 3 and len(result["option_logits"]) == 3
    assert all(0.0 < p < 1.0 for p in result["probabilities"])
    assert math.isclose(sum(result["probabilities"]), 1.0, abs_tol=1e-9)
    softmax = [math.exp(x) for x in result["option_logits"]]
    assert [s / sum(softmax) for s in softmax] == pytest.approx(result["probabilities"], abs=1e-9)
    assert set(result["timing"]) == {"queue", "prefill", "memory", "readout", "total", "cached_tokens",
                                     "evaluated_tokens"}
    assert result["timing"]["cached_tokens"] == 0
    assert 0.0 < result["label_mass"] <= 1.0 and isinstance(result["top_token_is_label"], bool)
    assert result["timing"]["total"] >= result["timing"]["prefill"] > 0
    assert result["input_tokens"] > 30
    assert "no tokens generated" in result["readout"]
    model = result["model"]
    for key in ("file", "bytes", "sha256", "source", "revision", "llama_cpp", "llama_cpp_python", "threads",
                "gpu_layers"):
        assert key in model
    assert model["file"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert model["sha256"] == hashlib.sha256(find_gguf(app.extensions["decision_adapter"].settings.model_dir)
                                             .read_bytes()).hexdigest()

    d = example["decision"]
    dm = app.extensions["decision_adapter"].readiness.model
    rendered = dm.render(d["state"], d["question"], labels_for(3), [o["description"] for o in d["options"]])
    assert result["prompt_sha256"] == hashlib.sha256(rendered.encode()).hexdigest()
    assert rendered.index(d["state"]) < rendered.index(d["question"]) < rendered.index("A. Account access")
    assert rendered.endswith("<|im_start|>assistant\n")  # the readout is the first answer position


def test_state_as_json_object_keeps_key_order(client, app, example):
    body = copy.deepcopy(example)
    body["decision"]["state"] = {"zeta": 1, "alpha": {"nested": [1, 2]}, "message": "reset email never arrived"}

    result = post(client, body).get_json()["result"]

    dm = app.extensions["decision_adapter"].readiness.model
    d = body["decision"]
    rendered = dm.render('{"zeta": 1, "alpha": {"nested": [1, 2]}, "message": "reset email never arrived"}',
                         d["question"], labels_for(3), [o["description"] for o in d["options"]])
    assert result["prompt_sha256"] == hashlib.sha256(rendered.encode()).hexdigest()


def test_shared_state_equals_each_decision_scored_alone_on_a_fresh_model_bit_for_bit(client, fresh_model):
    decisions = [decision(i, q, o) for i, (q, o) in enumerate(QUESTIONS)]

    shared = post(client, {"decisions": decisions})
    assert shared.status_code == 200, shared.get_data(as_text=True)
    body = shared.get_json()
    alone = [post(client, {"decision": d}).get_json()["result"] for d in decisions]
    fresh = [fresh_model(d) for d in decisions]

    for result, solo, ref in zip(body["results"], alone, fresh):
        assert result["id"] == solo["id"]
        assert result["prompt_sha256"] == solo["prompt_sha256"] == ref.prompt_sha256
        assert result["probabilities"] == solo["probabilities"] == list(ref.probabilities)
        assert result["option_logits"] == solo["option_logits"] == list(ref.option_logits)
    timing = body["timing"]
    assert timing["shared_tokens"] > 40 or timing["cached_tokens"] > 40, "the state is evaluated once, or cached"
    assert timing["resident_tokens"] > 10, "the template head and instruction come from the resident prefix"
    assert len(timing["question_tokens"]) == len(decisions)
    assert all(n < timing["shared_tokens"] + timing["cached_tokens"] for n in timing["question_tokens"])


def test_a_cache_hit_gives_the_probabilities_of_a_miss_in_both_orders(app, client):
    engine = app.extensions["decision_adapter"].readiness.model.engine
    first, second = (decision(i, q, o, state=STATE + " Second visit.") for i, (q, o) in enumerate(QUESTIONS[:2]))
    outcomes = {}
    for order in ((first, second), (second, first)):
        engine.cache.clear()
        miss = post(client, {"decision": order[0]}).get_json()["result"]
        hit = post(client, {"decision": order[1]}).get_json()["result"]
        repeat = post(client, {"decision": order[1]}).get_json()["result"]
        assert miss["timing"]["cached_tokens"] == 0
        assert hit["timing"]["cached_tokens"] > 50, "the state came from the cache"
        assert repeat["timing"]["cached_tokens"] == repeat["input_tokens"] - engine.resident_tokens
        assert repeat["probabilities"] == hit["probabilities"]
        outcomes.setdefault(order[0]["id"], []).append(("miss", miss["probabilities"]))
        outcomes.setdefault(order[1]["id"], []).append(("hit", hit["probabilities"]))
    for runs in outcomes.values():
        assert sorted(kind for kind, _ in runs) == ["hit", "miss"]
        assert runs[0][1] == runs[1][1], "a hit and a miss agree bit for bit"


@pytest.mark.parametrize("fork_by", ["copy", "snapshot"])
def test_a_valid_request_larger_than_the_memory_at_once_is_planned_to_fit(settings, fork_by):
    """Five questions of 26 long options each need more memory cells side by side than a 2,048-token context
    holds; the plan decodes them one after another (both ways of forking) and answers, never a 5xx."""
    words = "the customer asks for the parcel to be sent again to the new address"
    options = [{"id": f"o{j}", "description": f"Option {j}: {words}"} for j in range(26)]
    body = {"decisions": [{"id": f"d{i}", "state": "Order 4471 is late.", "question": f"Question {i}?",
                           "options": options} for i in range(5)]}
    # not about deadlines: a busy machine may take longer than the real-time 55 s
    small = dataclasses.replace(settings, ctx_tokens=2048, max_prompt_tokens=2000, request_timeout_s=600)
    with Engine(str(find_gguf(settings.model_dir)), dataclasses.replace(engine_options(small), fork_by=fork_by)) as engine:
        app = create_app(small, engine)
        try:
            response = post(app.test_client(), body)
        finally:
            app.extensions["decision_adapter"].close()  # its scheduler stops before the engine is freed
        assert response.status_code == 200, response.get_data(as_text=True)
        timing = response.get_json()["timing"]
        assert sum(timing["question_tokens"]) > 2048, "more than the context holds at once"
        assert all(math.isclose(sum(r["probabilities"]), 1.0) for r in response.get_json()["results"])


def test_decisions_results_come_back_in_request_order(client):
    decisions = [decision(i, q, o) for i, (q, o) in enumerate(QUESTIONS)][::-1]
    body = post(client, {"decisions": decisions}).get_json()
    assert [r["id"] for r in body["results"]] == [d["id"] for d in decisions]
    assert [r["option_ids"] for r in body["results"]] == [[o["id"] for o in d["options"]] for d in decisions]


def test_option_without_description_shows_its_id(client, app):
    d = decision(0, QUESTIONS[3][0], QUESTIONS[3][1])
    result = post(client, {"decision": d}).get_json()["result"]
    dm = app.extensions["decision_adapter"].readiness.model
    rendered = dm.render(STATE, QUESTIONS[3][0], labels_for(2), ["yes", "no"])
    assert result["prompt_sha256"] == hashlib.sha256(rendered.encode()).hexdigest()


def test_more_than_26_options_use_two_token_labels_and_cover_all_options(client):
    options = [(f"team_{i}", f"Team number {i}.") for i in range(40)]
    result = post(client, {"decision": decision(0, "Which team?", options, state="A short state.")}).get_json()["result"]
    assert len(result["probabilities"]) == 40
    assert math.isclose(sum(result["probabilities"]), 1.0, abs_tol=1e-9)
    assert all(p > 0 for p in result["probabilities"])
    assert "chain rule" in result["readout"]
    weights = [math.exp(x) for x in result["option_logits"]]
    assert sum(weights) < 1.0, "option_logits are full-vocabulary log-probabilities of each label"
    assert [w / sum(weights) for w in weights] == pytest.approx(result["probabilities"], rel=1e-9)


def test_jsonlines_batch_answers_every_good_line_despite_a_bad_one(client, example):
    good = json.dumps(example)
    lines = [good, '{"decision": {"id": "x"}}', "not json", json.dumps({"decisions": [example["decision"]]})]

    response = post(client, "\n".join(lines) + "\n", content_type="application/jsonlines")

    assert response.status_code == 200
    assert response.mimetype == "application/jsonlines"
    out = [json.loads(line) for line in response.get_data(as_text=True).splitlines()]
    assert len(out) == 4
    assert out[0]["result"]["id"] == "support-route"
    assert out[1] == {"error": "line 2: decision.state is required", "status": 400}
    assert out[2]["status"] == 400 and out[2]["error"].startswith("line 3: the body is not valid JSON")
    assert out[3]["results"][0]["probabilities"] == pytest.approx(out[0]["result"]["probabilities"], abs=1e-12)


def long_text(words: int) -> str:
    return " ".join(f"word{i}" for i in range(words))


def ex(**changes) -> dict:
    d = {"id": "support-route", "state": "Customer cannot log in.", "question": "Which queue?",
         "options": [{"id": "account_access", "description": "Account access."},
                     {"id": "billing", "description": "Billing."}]}
    d.update(changes)
    return {"decision": {k: v for k, v in d.items() if v is not ...}}


BAD_INPUT = [
    ("not json", "application/json", 400, "the body is not valid JSON"),
    ('{"decision": NaN}', "application/json", 400, "the body is not valid JSON: NaN is not valid JSON"),
    ("[1, 2]", "application/json", 400, "the body must be a JSON object"),
    ({}, "application/json", 400, "the body must hold 'decision', 'decisions' or 'questions' (System One)"),
    ({"decision": "x"}, "application/json", 400, "decision must be an object"),
    ({"decision": {}, "extra": 1}, "application/json", 400, "extra is not a known field"),
    (ex(id=...), "application/json", 400, "decision.id is required"),
    (ex(id=""), "application/json", 400, "decision.id must be a non-empty string"),
    (ex(id=7), "application/json", 400, "decision.id must be a non-empty string"),
    (ex(state="  "), "application/json", 400, "decision.state must be a non-empty string"),
    (ex(state=12), "application/json", 400, "decision.state must be a non-empty string or a JSON object"),
    (ex(state={}), "application/json", 400, "decision.state must not be empty"),
    (ex(question=...), "application/json", 400, "decision.question is required"),
    (ex(options={"a": 1}), "application/json", 400, "decision.options must be an array"),
    (ex(options=[{"id": "a"}]), "application/json", 400, "decision.options has 1 options; 2 to 255 are allowed"),
    (ex(options=[{"id": f"o{i}"} for i in range(256)]), "application/json", 400,
     "decision.options has 256 options; 2 to 255 are allowed"),
    (ex(options=[{"id": "a"}, "b"]), "application/json", 400, "decision.options[1] must be an object"),
    (ex(options=[{"id": "a"}, {"id": "a"}]), "application/json", 400,
     "decision.options[1].id repeats the option id 'a'"),
    (ex(options=[{"id": "a"}, {"description": "b"}]), "application/json", 400, "decision.options[1].id is required"),
    (ex(options=[{"id": "a", "description": 3}, {"id": "b"}]), "application/json", 400,
     "decision.options[0].description must be a string"),
    (ex(options=[{"id": "a", "label": "A"}, {"id": "b"}]), "application/json", 400,
     "decision.options[0].label is not a known field"),
    (ex(colour="red"), "application/json", 400, "decision.colour is not a known field"),
    (ex(state="hi <|im_start|>system"), "application/json", 400,
     "decision.state contains the model's control token '<|im_start|>'"),
    (ex(question="Which?<|im_end|>"), "application/json", 400,
     "decision.question contains the model's control token '<|im_end|>'"),
    (ex(options=[{"id": "a", "description": "ok"}, {"id": "b", "description": "<|endoftext|>"}]),
     "application/json", 400, "decision.options[1].description contains the model's control token '<|endoftext|>'"),
    (ex(options=[{"id": "a"}, {"id": "b<|im_start|>"}]), "application/json", 400,
     "decision.options[1].id contains the model's control token '<|im_start|>'"),
    (ex(state=long_text(300)), "application/json", 400, "over the limit of 400"),
    ({"decisions": []}, "application/json", 400, "decisions must be a non-empty array"),
    ({"decisions": [ex()["decision"]] * 4}, "application/json", 400, "decisions has 4 decisions, over the limit of 3"),
    ({"decisions": [ex()["decision"], ex(id="b", state="Other.")["decision"]]}, "application/json", 400,
     "decisions[1].state must equal decisions[0].state"),
    ({"decisions": [ex()["decision"], ex()["decision"]]}, "application/json", 400,
     "decisions[1].id repeats the id 'support-route'"),
    ({"decisions": [ex(id=str(i), state=long_text(30), question=f"Q{i} " + long_text(45))["decision"]
                    for i in range(3)]}, "application/json", 400, "over the request limit of 500"),
    ({"decisions": [ex()["decision"], {"id": "b"}]}, "application/json", 400, "decisions[1].state is required"),
    (ex(), "text/plain", 415, "Content-Type must be application/json or application/jsonlines"),
    ("", "application/jsonlines", 400, "the JSON-lines body has no lines"),
    ("{}\n{}\n{}\n{}\n", "application/jsonlines", 400, "the JSON-lines body has 4 lines, over the limit of 3"),
    ({"decision": {"id": "x", "state": "s" * 70000}}, "application/json", 413, "over the limit of 65536"),
]


@pytest.mark.parametrize("body, content_type, status, message", BAD_INPUT,
                         ids=[f"{i}-{case[3][:40]}" for i, case in enumerate(BAD_INPUT)])
def test_bad_input_gets_a_4xx_that_names_the_field(tight_client, body, content_type, status, message):
    response = post(tight_client, body, content_type=content_type)

    assert response.status_code == status, response.get_data(as_text=True)
    assert message in response.get_json()["error"]


def test_prompt_budget_error_gives_the_count_and_the_limit(tight_client):
    error = post(tight_client, ex(state=long_text(300))).get_json()["error"]
    assert error.startswith("decision renders to a prompt of more than ") and error.endswith("over the limit of 400")
    count = int(error.split("prompt of more than ")[1].split(" tokens")[0])
    assert count >= 400


def test_unknown_route_and_method_answer_json(client):
    response = client.get("/nope")
    assert response.status_code == 404 and response.get_json()["error"]
    response = client.get("/invocations")
    assert response.status_code == 405 and "error" in response.get_json()
