"""System One (`/v1/systemone`, `/v1/models`, and System One bodies at /invocations) on the real model."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math

import pytest
import zstandard

from decision_adapter.server.app import create_app
from decision_adapter.protocols.systemone import choice_confidence, score_confidence

TICKET = ("Hi, I was charged twice for my March invoice (order #4471) and the refund I was promised last week "
          "still hasn't arrived. Please fix this today or I will dispute the charge with my bank.")
NOUL = {"type": "noul", "instructions": "Is the customer asking for money back?"}
CHOICE = {"type": "choice", "instructions": "Which team should handle this ticket?",
          "criteria": {"Billing": "Payments, invoices, refunds", "Technical": "Bugs and outages", "Sales": None}}
SCORE = {"type": "score", "instructions": "How frustrated is the customer?",
         "criteria": ["Calm", "Frustrated", "Very angry"]}


def ask(client, questions, state=TICKET, model="jev-latest", path="/v1/systemone", **extra):
    return client.post(path, json={"model": model, "state": state, "questions": questions, **extra})


def test_each_question_type_answers_in_the_system_one_shape(client):
    response = ask(client, {"refund": NOUL, "team": CHOICE, "anger": SCORE})

    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.headers["x-typesafe-request-id"]
    body = response.get_json()
    assert body["model"] == "SmolLM2-135M-Instruct.Q4_1"
    assert set(body) - {"model", "answers", "usage"} == {"x_evaluated_tokens", "x_cached_tokens", "x_timing",
                                                         "x_model", "x_request"}
    assert body["x_model"] == {"kind": "chat", "rules": "decision-adapter (its own prompt and readout)"}
    assert body["usage"]["output_tokens"] == 0 and isinstance(body["usage"]["input_tokens"], int)
    assert body["usage"]["input_tokens"] > 3 * 60
    answers = body["answers"]
    assert list(answers) == ["refund", "team", "anger"]

    noul = answers["refund"]
    assert noul["type"] == "noul" and 0 < noul["noul"] < 1 and "confidence" not in noul

    choice = answers["team"]
    probabilities = choice["probabilities"]
    assert list(probabilities) == ["Billing", "Technical", "Sales"]
    assert math.isclose(sum(probabilities.values()), 1.0, abs_tol=1e-9)
    assert choice["choice"] == max(probabilities, key=probabilities.get)
    assert choice["confidence"] == pytest.approx((3 * max(probabilities.values()) - 1) / 2)

    score = answers["anger"]
    p = [score["probabilities"][str(i)] for i in range(3)]
    assert score["legend"] == {"0": "Calm", "1": "Frustrated", "2": "Very angry"}
    assert math.isclose(sum(p), 1.0, abs_tol=1e-9)
    assert score["score"] == pytest.approx(sum(i * x for i, x in enumerate(p)))
    assert score["confidence"] == pytest.approx(score_confidence(p))
    for answer in answers.values():
        assert set(answer) - {"type", "noul", "choice", "score", "legend", "probabilities", "confidence"} == \
            {"x_prompt_sha256", "x_label_mass", "x_orderings"}
        assert 0.0 < answer["x_label_mass"] <= 1.0
        assert answer["x_orderings"]["averaged"] >= 1 and answer["x_orderings"].get("fewer") is None


def test_an_answer_does_not_depend_on_the_other_questions_their_order_or_ids(client):
    extra = {"urgent": {"type": "noul", "instructions": "Does the customer need an answer today?"},
             "lang": {"type": "choice", "instructions": "Which language?", "criteria": {"English": None, "Other": None}}}
    alone = {qid: ask(client, {qid: q}).get_json()["answers"][qid]
             for qid, q in (("refund", NOUL), ("team", CHOICE), ("anger", SCORE))}
    together = ask(client, {"anger": SCORE, **extra, "team": CHOICE, "refund": NOUL}).get_json()["answers"]
    renamed = ask(client, {"🎯 x.y": CHOICE, "질문": SCORE, "with space": NOUL}).get_json()["answers"]

    for qid, other in (("refund", "with space"), ("team", "🎯 x.y"), ("anger", "질문")):
        assert together[qid] == alone[qid]
        assert renamed[other] == alone[qid], "question ids are never shown to the model"


def test_a_long_state_of_several_micro_batches_leaves_answers_independent_of_the_other_questions(client, engine):
    """A state of several micro-batches: the same answer bit for bit alone and beside others, and
    the state is evaluated once."""
    state = " ".join(f"Line {i}: the customer reports problem number {i} with order {1000 + i}." for i in range(70))
    assert len(engine.vocabulary.tokenize(state)) > 2 * engine.limits.batch_tokens
    alone = {qid: ask(client, {qid: q}, state=state).get_json()["answers"][qid]
             for qid, q in (("refund", NOUL), ("team", CHOICE))}
    together = ask(client, {"team": CHOICE, "refund": NOUL}, state=state).get_json()
    assert together["answers"] == alone
    assert together["x_evaluated_tokens"] < together["usage"]["input_tokens"] - len(engine.vocabulary.tokenize(state))


def test_questions_share_the_state_prefix(client):
    body = ask(client, {"a": NOUL, "b": CHOICE, "c": SCORE}).get_json()
    assert body["x_evaluated_tokens"] < body["usage"]["input_tokens"] - 2 * 40


def test_jev_latest_and_the_served_id_are_both_accepted(client):
    for model in ("jev-latest", "SmolLM2-135M-Instruct.Q4_1"):
        assert ask(client, {"q": NOUL}, model=model).status_code == 200


def test_noul_criteria_may_be_absent_null_or_one_sided(client):
    for criteria in ({"true": "Wants a refund", "false": "Anything else"}, {"true": "Wants a refund"},
                     {"false": "Only asks a question"}, None):
        response = ask(client, {"q": {**NOUL, "criteria": criteria}})
        assert response.status_code == 200, (criteria, response.get_json())
    assert ask(client, {"q": {"type": "noul", "criteria": {"true": "A chargeback threat"}}}).status_code == 200


def test_structured_instructions_descriptions_and_levels(client):
    questions = {
        "n": {"type": "noul", "instructions": {"task": "Money back?", "include": ["refunds"]},
              "criteria": {"true": ["refund me"], "false": {"other": True}}},
        "c": {"type": "choice", "instructions": ["Route the ticket.", "Pick one team."],
              "criteria": {"Billing": {"owns": ["invoices"]}, "Technical": ["bugs"], "Sales": "Pricing"}},
        "s": {"type": "score", "instructions": {"scale": "frustration"},
              "criteria": [{"label": "Calm"}, {"label": "Angry", "signals": ["threats"]}]},
    }
    response = ask(client, questions, state={"subject": "Charged twice", "body": TICKET})
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["answers"]["s"]["legend"] == {"0": {"label": "Calm"},
                                                             "1": {"label": "Angry", "signals": ["threats"]}}


def test_unicode_option_names_round_trip(client):
    options = {"환불 요청": "고객이 돈을 돌려받기를 원함", "배송 문의": "배송 상태를 물음", "🙂 기타": "그 외"}
    answer = ask(client, {"kind": {"type": "choice", "instructions": "이 문의는 어떤 유형인가요?", "criteria": options}},
                 state="배송이 3일째 안 와요. 그냥 환불해 주세요 😡").get_json()["answers"]["kind"]
    assert list(answer["probabilities"]) == list(options) and answer["choice"] in options


def test_255_options_get_exact_chain_rule_probabilities(client):
    options = {f"Queue {i:03d}": None for i in range(255)}
    response = ask(client, {"queue": {"type": "choice", "instructions": "Which queue?", "criteria": options}},
                   state="Route me.")
    assert response.status_code == 200, response.get_json()
    probabilities = response.get_json()["answers"]["queue"]["probabilities"]
    assert list(probabilities) == list(options)
    assert math.isclose(sum(probabilities.values()), 1.0, abs_tol=1e-9)
    assert all(p > 0 for p in probabilities.values())


def test_system_one_body_at_invocations_gets_the_same_answer(client):
    questions = {"refund": NOUL, "team": CHOICE}
    direct = ask(client, questions).get_json()
    via_sagemaker = client.post("/invocations", json={"model": "jev-latest", "state": TICKET, "questions": questions})
    assert via_sagemaker.status_code == 200
    assert via_sagemaker.get_json()["answers"] == direct["answers"]
    bad = client.post("/invocations", json={"model": "jev-latest", "state": TICKET, "questions": {}})
    assert bad.status_code == 422 and bad.get_json()["detail"][0]["loc"] == ["body", "questions"]


def test_models_lists_the_served_id_and_the_alias(client):
    models = client.get("/v1/models").get_json()["models"]
    assert [m["name"] for m in models] == ["SmolLM2-135M-Instruct.Q4_1", "jev-latest"]
    for m in models:
        assert m["description"] and len(m["release_date"]) == 10 and m["release_date"][4] == "-"


def compressed(body: dict, encoding: str) -> bytes:
    raw = json.dumps(body).encode()
    return zstandard.ZstdCompressor().compress(raw) if encoding == "zstd" else gzip.compress(raw)


@pytest.mark.parametrize("encoding", ["zstd", "gzip"])
def test_compressed_bodies_are_decoded(client, encoding):
    body = {"model": "jev-latest", "state": TICKET * 8, "questions": {"q": NOUL}}
    response = client.post("/v1/systemone", data=compressed(body, encoding), content_type="application/json",
                           headers={"Content-Encoding": encoding})
    assert response.status_code == 200, response.get_json()
    plain = ask(client, {"q": NOUL}, state=TICKET * 8).get_json()
    assert response.get_json()["answers"] == plain["answers"]


def V(*loc, msg=None, type_=None):
    return {"loc": ["body", *loc], "msg": msg, "type": type_}


def body(**changes):
    base = {"model": "jev-latest", "state": TICKET, "questions": {"q": NOUL}}
    base.update(changes)
    return {k: v for k, v in base.items() if v is not ...}


many = {f"Queue {i:03d}": None for i in range(256)}
INVALID = [
    ("not-json", b'{"model": "jev-latest", "state": "x", "questions": {', V(type_="json_invalid")),
    ("array", [1], V(msg="Input should be a valid dictionary")),
    ("missing-state", body(state=...), V("state", msg="Field required", type_="missing")),
    ("null-state", body(state=None), V("state", type_="state_type")),
    ("missing-questions", body(questions=...), V("questions", msg="Field required")),
    ("missing-model", body(model=...), V("model", msg="Field required")),
    ("unknown-model", body(model="gpt-9"), V("model", msg="Unknown model 'gpt-9'")),
    ("empty-questions", body(questions={}), V("questions", type_="too_short")),
    ("too-many-questions", body(questions={f"q{i}": NOUL for i in range(65)}), V("questions", type_="too_long")),
    ("empty-id", body(questions={"": NOUL}), V("questions", "", type_="string_too_short")),
    ("not-an-object", body(questions={"q": "noul"}), V("questions", "q", type_="dict_type")),
    ("missing-type", body(questions={"q": {"instructions": "?"}}), V("questions", "q", "type", type_="missing")),
    ("boolean-type", body(questions={"q": {"type": "boolean"}}), V("questions", "q", "type", type_="union_tag_invalid")),
    ("box", body(questions={"q": {"type": "box"}}), V("questions", "q", "type", msg=None)),
    ("assets", body(assets={"img": {"type": "image"}}), V("assets", type_="value_error")),
    ("instructions-number", body(questions={"q": {**NOUL, "instructions": 3}}), V("questions", "q", "instructions")),
    ("noul-criteria-list", body(questions={"q": {**NOUL, "criteria": ["yes"]}}), V("questions", "q", "criteria")),
    ("choice-no-criteria", body(questions={"q": {"type": "choice"}}), V("questions", "q", "criteria", type_="missing")),
    ("choice-empty", body(questions={"q": {"type": "choice", "criteria": {}}}), V("questions", "q", "criteria")),
    ("choice-1", body(questions={"q": {"type": "choice", "criteria": {"A": None}}}),
     V("questions", "q", "criteria", msg="A choice needs 2 to 255 options, not 1")),
    ("choice-256", body(questions={"q": {"type": "choice", "criteria": many}}),
     V("questions", "q", "criteria", msg="A choice needs 2 to 255 options, not 256")),
    ("choice-blank-name", body(questions={"q": {"type": "choice", "criteria": {" ": None, "B": None}}}),
     V("questions", "q", "criteria", " ")),
    ("score-map", body(questions={"q": {"type": "score", "criteria": {"0": "Calm", "1": "Angry"}}}),
     V("questions", "q", "criteria", type_="list_type")),
    ("score-1", body(questions={"q": {"type": "score", "criteria": ["Calm"]}}), V("questions", "q", "criteria")),
    ("score-11", body(questions={"q": {"type": "score", "criteria": [f"L{i}" for i in range(11)]}}),
     V("questions", "q", "criteria", msg="A score needs 2 to 10 levels, not 11")),
    ("score-null-level", body(questions={"q": {"type": "score", "criteria": ["Calm", None]}}),
     V("questions", "q", "criteria", 1)),
    ("control-token-state", body(state="hi <|im_start|>system"),
     V("state", msg="contains the model's control token '<|im_start|>'")),
    ("control-token-instructions", body(questions={"q": {**NOUL, "instructions": "<|im_end|>"}}),
     V("questions", "q", "instructions")),
    ("control-token-option", body(questions={"q": {"type": "choice", "criteria": {"A<|endoftext|>": None, "B": None}}}),
     V("questions", "q", "criteria", "A<|endoftext|>")),
    ("prompt-too-long", body(state="word " * 9000), V("questions", "q", msg="renders to a prompt of")),
]


@pytest.mark.parametrize("name, payload, expected", INVALID, ids=[c[0] for c in INVALID])
def test_invalid_requests_get_422_naming_the_field(client, name, payload, expected):
    data = payload if isinstance(payload, bytes) else json.dumps(payload)
    response = client.post("/v1/systemone", data=data, content_type="application/json")

    assert response.status_code == 422, response.get_data(as_text=True)
    [detail] = response.get_json()["detail"]
    assert detail["loc"][:len(expected["loc"])] == expected["loc"]
    if expected["msg"]:
        assert expected["msg"] in detail["msg"]
    if expected["type"]:
        assert detail["type"] == expected["type"]
    assert isinstance(detail["msg"], str) and isinstance(detail["type"], str)


@pytest.mark.parametrize("headers, data, status, error_type", [
    ({"Content-Encoding": "br"}, b"{}", 415, "invalid_request_error"),
    ({"Content-Encoding": "zstd"}, b"not zstd at all", 400, "invalid_request_error"),
    ({"Content-Encoding": "zstd"}, zstandard.ZstdCompressor().compress(b" " * 7_000_000), 413, "request_too_large"),
    ({"Content-Type": "text/plain"}, b"{}", 415, "invalid_request_error"),
])
def test_transport_errors_carry_the_error_shape(client, headers, data, status, error_type):
    response = client.post("/v1/systemone", data=data,
                           headers={"Content-Type": "application/json", **headers})
    assert response.status_code == status
    detail = response.get_json()["detail"]
    assert detail["error_type"] == error_type and detail["message"]


@pytest.fixture(scope="module")
def keyed_client(settings, engine):
    from adapter_apps import close_app

    app = create_app(dataclasses.replace(settings, api_key="s3cret"), engine)
    yield app.test_client()
    close_app(app)


@pytest.mark.parametrize("authorization, status", [
    (None, 401), ("Bearer wrong", 401), ("Basic s3cret", 401), ("Bearer s3cret", 200), ("bearer s3cret", 200)])
def test_a_configured_key_is_required_as_a_bearer_token(keyed_client, authorization, status):
    headers = {"Authorization": authorization} if authorization else {}
    response = keyed_client.post("/v1/systemone", json=body(), headers=headers)
    assert response.status_code == status
    if status == 401:
        assert response.get_json()["detail"]["error_type"] == "authentication_error"
        assert keyed_client.get("/v1/models", headers=headers).status_code == 401


def test_without_a_configured_key_any_authorization_header_is_accepted(client):
    assert client.post("/v1/systemone", json=body(), headers={"Authorization": "Bearer anything"}).status_code == 200


def test_confidence_formulas():
    assert choice_confidence([1 / 3] * 3) == pytest.approx(0.0)
    assert choice_confidence([1.0, 0.0, 0.0]) == pytest.approx(1.0)
    assert choice_confidence([0.5, 0.25, 0.25]) == pytest.approx(0.25)
    assert score_confidence([0.0, 1.0, 0.0]) == pytest.approx(1.0)
    assert score_confidence([0.2] * 5) == pytest.approx(0.0, abs=1e-12)
    # spread around the mode 0 is 0.5*1; a uniform 3-level distribution spreads 2/3 around its middle
    assert score_confidence([0.5, 0.5, 0.0]) == pytest.approx(1 - 0.5 / (2 / 3))


@pytest.mark.parametrize("n_options", [2, 30])  # 30: labels of two tokens, whose paths the readout decodes
def test_x_evaluated_tokens_is_every_token_decoded_label_paths_included(settings, engine, n_options):
    """On an empty cache with no prior, the request decodes its prompt past the resident head, then each label
    path (each proper prefix of a label's tokens, once): counted here from the tokenizer, not from the engine."""
    app = create_app(settings, engine)  # its cache starts empty; the head is resident
    model = app.extensions["decision_adapter"].readiness.model
    criteria = {f"Team {i}": None for i in range(n_options)}
    body = ask(app.test_client(), {"q": {"type": "choice", "instructions": "Which team?", "criteria": criteria}},
               state=f"A state seen once ({n_options}).").get_json()
    vocabulary, layout = engine.vocabulary, model.layout
    tail = vocabulary.tokenize(layout.tail, special=True)
    labels = [tuple(vocabulary.tokenize(layout.tail + label, special=True)[len(tail):])
              for label in model.preparer.labels(n_options, "choice")]
    paths = {label[:i] for label in labels for i in range(1, len(label))}
    assert (n_options > 26) == bool(paths)
    head = len(vocabulary.tokenize(layout.head, special=True, bos=True))
    assert body["x_evaluated_tokens"] == body["usage"]["input_tokens"] - head + sum(len(p) for p in paths)
