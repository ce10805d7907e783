"""The OpenAPI document: current in docs/openapi.json, served at /openapi.json, true of real responses."""

from __future__ import annotations

import json
from pathlib import Path

import schemathesis

from decision_adapter.protocols import decision_schema as ds
from decision_adapter.protocols import openapi
from decision_adapter.protocols import systemone as s1

DOCUMENT = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def test_docs_openapi_json_is_current():
    assert DOCUMENT.read_text() == openapi.text(), "docs/openapi.json is stale: run `make openapi` and commit it"


def test_the_server_serves_the_same_document_and_it_loads_as_openapi_3_1(client):
    response = client.get("/openapi.json")
    assert response.status_code == 200
    document = response.get_json()
    assert document == json.loads(DOCUMENT.read_text())
    assert document["openapi"] == "3.1.0"
    schema = schemathesis.openapi.from_dict(document)
    operations = {(op.ok().method.upper(), op.ok().path) for op in schema.get_all_operations()}
    assert operations == {("GET", "/ping"), ("POST", "/invocations"), ("GET", "/execution-parameters"),
                          ("GET", "/openapi.json"), ("POST", "/v1/systemone"), ("GET", "/v1/models")}


def test_the_response_fields_the_engine_will_add_are_described():
    schemas = openapi.document()["components"]["schemas"]
    assert {"label_mass", "top_token_is_label"} <= set(schemas["DecisionResult"]["properties"])
    assert "cached_tokens" in schemas["Timing"]["properties"]
    for answer in ("NoulAnswer", "ChoiceAnswer", "ScoreAnswer"):
        assert {"x_prompt_sha256", "x_label_mass", "x_calibration"} <= set(schemas[answer]["properties"]), answer
    assert "x_cached_tokens" in schemas["SystemOneResponse"]["properties"]


def test_real_responses_match_their_models(client, example):
    decision = client.post("/invocations", json=example)
    ds.DecisionResponse.model_validate(decision.get_json(), strict=True)
    decisions = client.post("/invocations", json={"decisions": [example["decision"],
                                                                 {**example["decision"], "id": "second"}]})
    ds.DecisionsResponse.model_validate(decisions.get_json(), strict=True)
    body = {"model": "jev-latest", "state": "Charged twice.", "questions": {
        "n": {"type": "noul"}, "c": {"type": "choice", "criteria": {"A": None, "B": "b"}},
        "s": {"type": "score", "criteria": ["low", {"level": "high"}]}}}
    s1.SystemOneResponse.model_validate(client.post("/v1/systemone", json=body).get_json(), strict=True)
    s1.ModelsResponse.model_validate(client.get("/v1/models").get_json(), strict=True)
    openapi.Ping.model_validate(client.get("/ping").get_json(), strict=True)
    openapi.ExecutionParameters.model_validate(client.get("/execution-parameters").get_json(), strict=True)
    ds.Error.model_validate(client.post("/invocations", json={}).get_json(), strict=True)
    s1.ValidationFailure.model_validate(client.post("/v1/systemone", json={}).get_json(), strict=True)
    s1.SystemOneError.model_validate(client.post("/v1/systemone", data="{}", content_type="text/plain").get_json(),
                                     strict=True)
