"""The OpenAPI 3.1 document of every route, generated from the request and response models.

``document()`` is what ``GET /openapi.json`` serves; ``docs/openapi.json`` keeps a copy, which a test
holds current (``make openapi`` rewrites it: ``python -m decision_adapter.protocols.openapi > docs/openapi.json``).
Limits that are settings (``ADAPTER_MAX_DECISIONS``, the byte and token budgets) are in descriptions,
so that the document is the same for every deployment. Every response model is closed (``additionalProperties``
false): tests/adapter/test_adapter_openapi.py validates real answers of every route against this document.

A JSON-lines answer (Batch Transform) is described line by line: OpenAPI 3.1 has no item schema for a sequential
media type (3.2's ``itemSchema``), so each such media type carries ``x-line-schema``, the schema of one line.
"""

from __future__ import annotations

import json
import sys
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, Field
from pydantic.json_schema import models_json_schema

from . import decision_schema as ds
from . import systemone as s1

REF = "#/components/schemas/{model}"
VERSION = "1"


# The contract of a batch, in one place: what a multi-record request is answered with.
BATCH_LINES = ("One request object (any of the application/json bodies) per line. The answer has one line per input "
               "line, in order, each the record's answer or its error (with the record's status, and retryable where "
               "sending that record again may pass). A batch is refused whole only in a Batch Transform, and only "
               "when its time runs out before a record: a retryable 503 naming the line, so that SageMaker retries "
               "it and the job reports the failure (a 200's lines are stored as results).")


class ExecutionParameters(ds.Response):
    """Batch Transform's discovery answer: what one container honours."""

    MaxConcurrentTransforms: int
    BatchStrategy: str
    MaxPayloadInMB: int


class Ping(ds.Response):
    status: str
    detail: str
    admitted: int | None = Field(None, description="Requests admitted now (absent while draining).")
    capacity: int | None = Field(None, description="Requests admitted at most (absent while draining).")
    cpu_variant: str | None = Field(None, description="Once loaded: llama.cpp's CPU kernels, as in a result's model.")
    cpu_features: list[str] | None = Field(None, description="Once loaded: their instruction sets.")
    kind: Literal["chat", "decision-gguf"] | None = Field(None, description="Once loaded: which kind of model it is "
                                                          "(a plain chat GGUF, or a decision GGUF).")
    rules: str | None = Field(None, description="Once loaded: whose rules answer it (this adapter's, or llama-server's "
                                                "for the decision GGUF's type).")
    decision_type: str | None = Field(None, description="Once loaded: a decision GGUF's type (lev, openjev).")
    memory: str | None = Field(None, description="Once loaded: what the model's memory is made of (plain, "
                                                 "sliding-window, hybrid, recurrent), as in a result's model.")
    reuse: dict[str, str] | None = Field(None, description="Once loaded: what each reuse (states, prefixes, stems) does "
                                         "on that memory, as in a result's model.")


def _batch_line() -> dict[str, Any]:
    """The schema of one line of a JSON-lines answer (``BatchLine`` in the document)."""
    return {"description": BATCH_LINES,
            "oneOf": [_ref(m) for m in (ds.DecisionResponse, ds.DecisionsResponse, s1.SystemOneResponse,
                                        ds.DryRunResponse, s1.SystemOneDryRunResponse, ds.Error,
                                        s1.ValidationFailure, s1.SystemOneError)]}


REQUESTS: list[type[BaseModel]] = [ds.DecisionRequest, ds.DecisionsRequest, s1.SystemOneRequest]
RESPONSES: list[type[BaseModel]] = [ds.DecisionResponse, ds.DecisionsResponse, ds.DryRunResponse, ds.Error,
                                    s1.SystemOneResponse, s1.SystemOneDryRunResponse, s1.ValidationFailure,
                                    s1.SystemOneError, s1.ModelsResponse, ExecutionParameters, Ping]


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": REF.format(model=model.__name__)}


def _json(model_or_schema: Any, description: str) -> dict[str, Any]:
    schema = _ref(model_or_schema) if isinstance(model_or_schema, type) else model_or_schema
    return {"description": description, "content": {"application/json": {"schema": schema}}}


@lru_cache(maxsize=1)
def document() -> dict[str, Any]:
    _, schemas = models_json_schema([(m, "validation") for m in REQUESTS] + [(m, "serialization") for m in RESPONSES],
                                    ref_template=REF)
    any_body = {"oneOf": [_ref(m) for m in REQUESTS]}
    lines = {"type": "string", "description": BATCH_LINES}
    schemas = {**schemas["$defs"], "BatchLine": _batch_line()}
    sagemaker_errors = {
        "400": _json(ds.Error, "Bad input: the message names the field."),
        "401": _json(ds.Error, "ADAPTER_API_KEY is set and the bearer key is missing or wrong."),
        "406": _json(ds.Error, "The Accept header admits neither application/json nor JSON lines."),
        "408": _json(ds.Error, "The body did not arrive within ADAPTER_BODY_TIMEOUT_S of starting to read it."),
        "413": _json(ds.Error, "The body, sent or decoded, is over ADAPTER_MAX_BODY_BYTES."),
        "415": _json(ds.Error, "Another Content-Type or Content-Encoding."),
        "422": _json(s1.ValidationFailure, "An invalid System One body (System One's shape)."),
        "503": _json(ds.Error, "Busy or not ready: retry (Retry-After)."),
    }
    systemone_errors = {
        "401": _json(s1.SystemOneError, "ADAPTER_API_KEY is set and the bearer key is missing or wrong."),
        "406": _json(s1.SystemOneError, "The Accept header does not admit application/json."),
        "408": _json(s1.SystemOneError, "The body did not arrive within ADAPTER_BODY_TIMEOUT_S of starting to read it."),
        "413": _json(s1.SystemOneError, "The body, sent or decoded, is over ADAPTER_MAX_BODY_BYTES."),
        "415": _json(s1.SystemOneError, "Another Content-Type or Content-Encoding."),
        "422": _json(s1.ValidationFailure, "Invalid request: pydantic's errors, located from body."),
        "503": _json(s1.SystemOneError, "Busy or not ready: retry (Retry-After)."),
    }
    answers = {"oneOf": [_ref(m) for m in (ds.DecisionResponse, ds.DecisionsResponse, s1.SystemOneResponse,
                                           ds.DryRunResponse, s1.SystemOneDryRunResponse)]}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Decision adapter", "version": VERSION,
                 "description": "A GGUF model served as a decision model on SageMaker AI: the AWS walkthrough's "
                                "decision schema and TypeSafe's System One API over one llama.cpp engine."},
        "paths": {
            "/ping": {"get": {"operationId": "ping", "summary": "SageMaker health check",
                              "responses": {"200": _json(Ping, "Loaded, verified and probed."),
                                            "503": _json(Ping, "Loading, or failed (detail says why).")}}},
            "/invocations": {"post": {
                "operationId": "invocations", "summary": "SageMaker entry: decision, decisions, System One, "
                                                         "or one per line (Batch Transform)",
                "requestBody": {"required": True, "content": {
                    "application/json": {"schema": any_body},
                    "application/jsonlines": {"schema": lines, "x-line-schema": any_body}}},
                "responses": {"200": {"description": "The answer (one line per record for a batch); with x_dry_run, "
                                                     "what the request would do.", "content": {
                    "application/json": {"schema": answers},
                    "application/jsonlines": {"schema": lines, "x-line-schema": {"$ref": REF.format(model="BatchLine")}}}},
                    **sagemaker_errors}}},
            "/execution-parameters": {"get": {
                "operationId": "executionParameters", "summary": "Batch Transform's discovery call",
                "description": "Read only: whether the container serves a transform is its deployment's setting.",
                "responses": {"200": _json(ExecutionParameters, "What this container honours."),
                              "401": sagemaker_errors["401"], "503": sagemaker_errors["503"]}}},
            "/openapi.json": {"get": {"operationId": "openapi", "summary": "This document",
                                      "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1.")}}},
            "/v1/systemone": {"post": {
                "operationId": "systemone", "summary": "System One (TypeSafe-compatible)",
                "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(s1.SystemOneRequest)}}},
                "responses": {"200": _json({"oneOf": [_ref(s1.SystemOneResponse), _ref(s1.SystemOneDryRunResponse)]},
                                           "Answers by question id; with x_dry_run, what the request would do."),
                              **systemone_errors},
                "security": [{}, {"bearer": []}]}},
            "/v1/models": {"get": {
                "operationId": "models", "summary": "The served model id and its alias",
                "responses": {"200": _json(s1.ModelsResponse, "Models."), "401": systemone_errors["401"],
                              "503": systemone_errors["503"]},
                "security": [{}, {"bearer": []}]}},
        },
        "components": {"schemas": schemas,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                                      "description": "Required when ADAPTER_API_KEY is set."}}},
    }


def text() -> str:
    """The document as committed in docs/openapi.json."""
    return json.dumps(document(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    sys.stdout.write(text())
