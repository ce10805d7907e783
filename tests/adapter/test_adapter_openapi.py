"""The OpenAPI document: current in docs/openapi.json, served at /openapi.json, true of real responses.

Every route's real answers, success and error, are validated against the published document itself (its JSON
Schema, draft 2020-12, as OpenAPI 3.1 defines it) for the status and media type they came with: a status the
document does not list fails, and so does a field it does not list (every response schema is closed).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import jsonschema
import pytest
import schemathesis

from decision_adapter.protocols import decision_schema as ds
from decision_adapter.protocols import openapi
from decision_adapter.protocols import systemone as s1
from decision_adapter.server.app import create_app

DOCUMENT = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
DOC = json.loads(DOCUMENT.read_text())
SYSTEM_ONE = {"model": "jev-latest", "state": "Charged twice.", "questions": {
    "n": {"type": "noul"}, "c": {"type": "choice", "criteria": {"A": None, "B": "b"}},
    "s": {"type": "score", "criteria": ["low", {"level": "high"}]}}}


def schema_errors(schema: dict, instance) -> list[str]:
    validator = jsonschema.Draft202012Validator({**schema, "components": DOC["components"]})
    return [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
            for e in sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.absolute_path)))]


def documented(path: str, method: str, response) -> None:
    """Fail unless ``response`` is what the document says ``method path`` answers with its status and media type."""
    responses = DOC["paths"][path][method]["responses"]
    status = str(response.status_code)
    assert status in responses, f"{method.upper()} {path} answered {status}, which the document does not list"
    content = responses[status]["content"]
    assert response.mimetype in content, (f"{method.upper()} {path} {status} came as {response.mimetype}; "
                                          f"the document lists {list(content)}")
    entry = content[response.mimetype]
    if response.mimetype == "application/jsonlines":
        lines = response.get_data(as_text=True).splitlines()
        assert lines
        problems = [f"line {n}: {e}" for n, line in enumerate(lines, 1)
                    for e in schema_errors(entry["x-line-schema"], json.loads(line))]
    else:
        problems = schema_errors(entry["schema"], response.get_json())
    assert not problems, f"{method.upper()} {path} {status} is not as documented:\n" + "\n".join(problems[:8])


def test_docs_openapi_json_is_current():
    assert DOCUMENT.read_text() == openapi.text(), "docs/openapi.json is stale: run `make openapi` and commit it"


def test_the_server_serves_the_same_document_and_it_loads_as_openapi_3_1(client):
    response = client.get("/openapi.json")
    assert response.status_code == 200
    document = response.get_json()
    assert document == DOC
    assert document["openapi"] == "3.1.0"
    schema = schemathesis.openapi.from_dict(document)
    operations = {(op.ok().method.upper(), op.ok().path) for op in schema.get_all_operations()}
    assert operations == {("GET", "/ping"), ("POST", "/invocations"), ("GET", "/execution-parameters"),
                          ("GET", "/openapi.json"), ("POST", "/v1/systemone"), ("GET", "/v1/models")}
    jsonschema.Draft202012Validator.check_schema({"$defs": DOC["components"]["schemas"]})


def response_schema_names() -> set[str]:
    """Every component schema an answer of some route can contain (followed through $ref)."""
    seen: set[str] = set()
    pending = [entry for path in DOC["paths"].values() for operation in path.values()
               for response in operation["responses"].values() for entry in response.get("content", {}).values()]

    def refs(node):
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                yield node["$ref"].rsplit("/", 1)[1]
            for value in node.values():
                yield from refs(value)
        elif isinstance(node, list):
            for value in node:
                yield from refs(value)

    while pending:
        for name in refs(pending.pop()):
            if name not in seen:
                seen.add(name)
                pending.append(DOC["components"]["schemas"][name])
    return seen


def test_every_response_schema_is_closed():
    names = response_schema_names()
    assert {"DecisionResponse", "ModelInfo", "SystemOneResponse", "NoulAnswer", "Ping", "BatchLine"} <= names
    for name in names:
        schema = DOC["components"]["schemas"][name]
        if "properties" in schema:
            assert schema.get("additionalProperties") is False, f"{name} admits fields it does not list"


def test_the_response_fields_the_engine_will_add_are_described():
    schemas = DOC["components"]["schemas"]
    assert {"label_mass", "top_token_is_label"} <= set(schemas["DecisionResult"]["properties"])
    assert "cached_tokens" in schemas["Timing"]["properties"]
    for answer in ("NoulAnswer", "ChoiceAnswer", "ScoreAnswer"):
        assert {"x_prompt_sha256", "x_label_mass", "x_calibration"} <= set(schemas[answer]["properties"]), answer
    assert "x_cached_tokens" in schemas["SystemOneResponse"]["properties"]


def test_a_field_added_to_an_answer_without_the_schema_is_refused(client, example):
    """The check above can fail: the same real answer with one undocumented field in its model is refused."""
    answer = client.post("/invocations", json=example)
    documented("/invocations", "post", answer)
    body = copy.deepcopy(answer.get_json())
    body["result"]["model"]["new_field"] = 1
    schema = DOC["paths"]["/invocations"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema_errors(schema, body), "an undocumented field passed"
    with pytest.raises(Exception, match="new_field"):
        ds.DecisionResponse.model_validate(body, strict=True)


def test_successful_answers_of_every_route_are_as_documented(client, example):
    decision = example["decision"]
    debiased = {**decision, "id": "debiased", "debias": "empty", "show_prior": True}
    for body in ({"decision": decision}, {"decision": debiased},
                 {"decisions": [decision, {**decision, "id": "second"}]}, SYSTEM_ONE,
                 {**SYSTEM_ONE, "x_debias": "empty", "x_show_prior": True}):
        documented("/invocations", "post", client.post("/invocations", json=body))
    documented("/v1/systemone", "post", client.post("/v1/systemone", json=SYSTEM_ONE))
    documented("/v1/models", "get", client.get("/v1/models"))
    documented("/ping", "get", client.get("/ping"))
    documented("/execution-parameters", "get", client.get("/execution-parameters"))
    documented("/openapi.json", "get", client.get("/openapi.json"))
    # the models describe the same answers, strictly
    ds.DecisionResponse.model_validate(client.post("/invocations", json=example).get_json(), strict=True)
    s1.SystemOneResponse.model_validate(client.post("/v1/systemone", json=SYSTEM_ONE).get_json(), strict=True)


def test_dry_runs_are_as_documented(client, example):
    """x_dry_run on both protocols and both routes: admitted, and (System One) with labels of several tokens."""
    decision = {**example["decision"], "permutations": 2, "debias": "empty"}
    many = {"type": "choice", "criteria": {f"o{i}": None for i in range(30)}}
    for body in ({"decision": decision, "x_dry_run": True},
                 {"decisions": [decision, {**decision, "id": "second"}], "x_dry_run": True},
                 {**SYSTEM_ONE, "x_dry_run": True},
                 {**SYSTEM_ONE, "questions": {**SYSTEM_ONE["questions"], "m": many}, "x_debias": "empty",
                  "x_dry_run": True}):
        response = client.post("/invocations", json=body)
        documented("/invocations", "post", response)
        model = ds.DryRunResponse if "x_dry_run" not in response.get_json() else s1.SystemOneDryRunResponse
        model.model_validate(response.get_json(), strict=True)
    response = client.post("/v1/systemone", json={**SYSTEM_ONE, "x_dry_run": True})
    documented("/v1/systemone", "post", response)
    s1.SystemOneDryRunResponse.model_validate(response.get_json(), strict=True)
    lines = [json.dumps({**example, "x_dry_run": True}), json.dumps({**SYSTEM_ONE, "x_dry_run": True})]
    batch = client.post("/invocations", data="\n".join(lines) + "\n", content_type="application/jsonlines")
    documented("/invocations", "post", batch)


def test_dry_runs_that_admission_would_refuse_are_as_documented(tmp_path, settings, example):
    """The refusal inside a dry run is the error body the route documents for its status: here, work too large for
    the time a request may take (400; System One 422)."""
    from adapter_fakes import FakeEngine, fake_model_dir

    class Slow(FakeEngine):
        def step(self, job) -> bool:
            import time

            time.sleep(job.tokens / 2000)
            return super().step(job)

    client = create_app(settings.replace(request_timeout_s=0.1), Slow(fake_model_dir(tmp_path) / "fake.gguf")
                        ).test_client()
    system_one = {**SYSTEM_ONE, "state": "Charged twice. " * 40, "x_dry_run": True}
    for route, body in (("/invocations", {"decision": {**example["decision"], "state": "Charged twice. " * 40},
                                          "x_dry_run": True}),
                        ("/invocations", system_one), ("/v1/systemone", system_one)):
        response = client.post(route, json=body)
        documented(route, "post", response)
        report = response.get_json().get("dry_run") or response.get_json()["x_dry_run"]
        assert report["admitted"] is False and report["status"] in (400, 422), report
        refusal = DOC["paths"][route]["post"]["responses"][str(report["status"])]["content"]["application/json"]
        assert not schema_errors(refusal["schema"], report["refusal"])


def test_a_batch_answer_is_documented_line_by_line(client, example):
    """Good records, a bad line and an invalid System One record: each line as the line schema says."""
    lines = [json.dumps(example), "{not json", json.dumps(SYSTEM_ONE), json.dumps({"model": "jev-latest", "questions": {}}),
             json.dumps({"decision": {**example["decision"], "options": []}})]
    response = client.post("/invocations", data="\n".join(lines) + "\n", content_type="application/jsonlines")
    assert response.status_code == 200
    documented("/invocations", "post", response)
    statuses = [json.loads(line).get("status") for line in response.get_data(as_text=True).splitlines()]
    assert statuses == [None, 400, None, 422, 400], statuses


@pytest.mark.parametrize("route, body, content_type, status", [
    ("/invocations", {}, "application/json", 400),
    ("/invocations", {"decision": {"id": "x"}}, "application/json", 400),
    ("/invocations", "{}", "text/plain", 415),
    ("/invocations", {"model": "jev-latest", "questions": {}}, "application/json", 422),
    ("/invocations", "x" * 70000, "application/json", 413),
    ("/v1/systemone", {}, "application/json", 422),
    ("/v1/systemone", "{}", "text/plain", 415),
    ("/v1/systemone", "x" * 70000, "application/json", 413),
])
def test_errors_are_as_documented(tight_client, route, body, content_type, status):
    data = body if isinstance(body, str) else json.dumps(body)
    response = tight_client.post(route, data=data, content_type=content_type)
    assert response.status_code == status, response.get_data(as_text=True)[:300]
    documented(route, "post", response)


@pytest.mark.parametrize("route, body", [("/invocations", SYSTEM_ONE), ("/v1/systemone", SYSTEM_ONE)])
def test_a_406_for_an_accept_the_route_cannot_answer_is_as_documented(client, route, body):
    response = client.post(route, json=body, headers={"Accept": "text/html"})
    assert response.status_code == 406
    documented(route, "post", response)


def test_refusals_of_a_full_or_draining_server_are_as_documented(app, client, example):
    admission = app.extensions["decision_adapter"].admission
    held = [admission.try_enter() for _ in range(admission.capacity)]
    try:
        documented("/invocations", "post", client.post("/invocations", json=example))
        documented("/v1/systemone", "post", client.post("/v1/systemone", json=SYSTEM_ONE))
        assert client.post("/v1/systemone", json=SYSTEM_ONE).status_code == 503
    finally:
        for _ in held:
            admission.leave()
    admission.draining = True
    try:
        ping = client.get("/ping")
        assert ping.status_code == 503
        documented("/ping", "get", ping)
    finally:
        admission.draining = False


def test_an_unauthorised_request_is_answered_as_documented(settings, engine, example):
    client = create_app(dataclasses.replace(settings, api_key="s3cret"), engine).test_client()
    for route, method in (("/invocations", "post"), ("/v1/systemone", "post"), ("/v1/models", "get")):
        response = client.open(route, method=method.upper(), json=SYSTEM_ONE if method == "post" else None)
        assert response.status_code == 401, (route, response.status_code)
        documented(route, method, response)
