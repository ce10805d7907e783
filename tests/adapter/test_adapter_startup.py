"""Start-up and readiness: /ping tells loading, ready and failed apart; errors never leak internals."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import subprocess
import sys

import pytest

from adapter_fakes import FakeEngine, fake_model_dir
from decision_adapter.server.app import create_app
from decision_adapter.engine.core import Engine
from decision_adapter.engine.errors import GpuUnavailable
from decision_adapter.engine.llama_model import gpu_backend_available
from decision_adapter.decisions.model_files import find_gguf
from decision_adapter.startup import engine_options

NOT_READY = "model is not ready"


def post(client, body):
    return client.post("/invocations", data=json.dumps(body), content_type="application/json")


def test_ping_is_503_while_loading_and_200_once_loaded_verified_and_probed(settings, example):
    app = create_app(settings, defer_loading=True)
    client = app.test_client()
    state = app.extensions["decision_adapter"]

    before = client.get("/ping")
    assert before.status_code == 503 and before.get_json()["status"] == "loading"
    refused = post(client, example)
    assert refused.status_code == 503 and refused.get_json()["retryable"] is True
    assert NOT_READY in refused.get_json()["error"]

    state.start_loading()
    assert state.readiness.wait(120)
    after = client.get("/ping")
    assert after.status_code == 200, after.get_json()
    assert after.get_json()["status"] == "ready"
    assert post(client, example).status_code == 200


def test_failing_probe_keeps_ping_at_503(tmp_path, settings, example):
    engine = FakeEngine(fake_model_dir(tmp_path) / "fake.gguf", logits=lambda n: [math.nan] * n)
    client = create_app(settings, engine).test_client()

    ping = client.get("/ping")
    assert ping.status_code == 503
    assert ping.get_json()["status"] == "failed"
    assert "probe decision gave no proper distribution" in ping.get_json()["detail"]
    assert post(client, example).status_code == 503


def test_engine_error_during_probe_keeps_ping_at_503_and_is_logged(tmp_path, settings, caplog):
    def explode():
        raise RuntimeError("decode failed")

    engine = FakeEngine(fake_model_dir(tmp_path) / "fake.gguf", on_score=explode)
    with caplog.at_level(logging.ERROR, logger="decision_adapter"):
        client = create_app(settings, engine).test_client()
    assert client.get("/ping").status_code == 503
    assert "RuntimeError: decode failed" in client.get("/ping").get_json()["detail"]
    assert any(r.exc_info for r in caplog.records), "the traceback goes to the log"


@pytest.mark.parametrize("manifest, detail", [
    ({"sha256": "0" * 64}, "has sha256 {sha}; model-manifest.json pins " + "0" * 64),
    ({"sha256": "{sha}", "bytes": 1}, "has 25 bytes; model-manifest.json pins 1"),
    ({"sha256": "{sha}", "file": "other.gguf"}, "model-manifest.json names 'other.gguf'"),
])
def test_model_that_does_not_match_its_manifest_never_becomes_ready(tmp_path, settings, manifest, detail):
    folder = fake_model_dir(tmp_path)
    sha = hashlib.sha256((folder / "fake.gguf").read_bytes()).hexdigest()
    (folder / "model-manifest.json").write_text(json.dumps({k: v.format(sha=sha) if isinstance(v, str) else v
                                                            for k, v in manifest.items()}))
    client = create_app(settings, FakeEngine(folder / "fake.gguf")).test_client()

    ping = client.get("/ping")
    assert ping.status_code == 503
    assert detail.format(sha=sha) in ping.get_json()["detail"]


def test_manifest_identity_is_reported_with_results(tmp_path, settings, example):
    folder = fake_model_dir(tmp_path)
    data = (folder / "fake.gguf").read_bytes()
    (folder / "model-manifest.json").write_text(json.dumps({
        "source": "org/repo", "revision": "a" * 40, "file": "fake.gguf", "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest()}))
    client = create_app(settings, FakeEngine(folder / "fake.gguf")).test_client()

    model = post(client, example).get_json()["result"]["model"]
    assert (model["source"], model["revision"], model["bytes"]) == ("org/repo", "a" * 40, len(data))


@pytest.mark.parametrize("change, detail", [
    ({"chat_template": None}, "the model has no chat template"),
    ({"chat_template": "{{ raise_exception('no') }}"}, "chat template failed"),
    ({"chat_template": "{% for m in messages %}{{ m.content | upper }}{% endfor %}"},
     "does not keep the user message verbatim"),
])
def test_incompatible_model_fails_start_up_with_a_clear_reason(tmp_path, settings, change, detail):
    engine = FakeEngine(fake_model_dir(tmp_path) / "fake.gguf")
    for key, value in change.items():
        setattr(engine, key, value)
    ping = create_app(settings, engine).test_client().get("/ping")
    assert ping.status_code == 503 and detail in ping.get_json()["detail"]


def test_label_that_is_not_one_token_fails_start_up(tmp_path, settings):
    engine = FakeEngine(fake_model_dir(tmp_path) / "fake.gguf")
    tokenize, piece = engine.tokenize, engine.piece
    # "C" becomes itself plus a zero-width token: it still spells "C", in two tokens.
    engine.tokenize = lambda text, **kw: [t for c in tokenize(text, **kw) for t in ((c, 0) if c == ord("C") else (c,))]
    engine.piece = lambda token: b"" if token == 0 else piece(token)
    ping = create_app(settings, engine).test_client().get("/ping")
    assert ping.status_code == 503
    assert "the answer label 'C' is 2 tokens, not one" in ping.get_json()["detail"]


def test_exception_inside_scoring_is_500_without_internals(tmp_path, settings, example, caplog):
    engine = FakeEngine(fake_model_dir(tmp_path) / "fake.gguf")
    client = create_app(settings, engine).test_client()

    def explode():
        raise RuntimeError("secret internal detail")

    engine.on_score = explode
    with caplog.at_level(logging.ERROR, logger="decision_adapter"):
        response = post(client, example)
    assert response.status_code == 500
    assert response.get_json() == {"error": "scoring failed"}
    assert "secret" not in response.get_data(as_text=True)
    assert any(r.exc_info and "secret internal detail" in str(r.exc_info[1]) for r in caplog.records)


def test_each_request_logs_one_structured_line(client, example, caplog):
    with caplog.at_level(logging.INFO, logger="decision_adapter.requests"):
        response = client.post("/invocations", data=json.dumps(example), content_type="application/json",
                               headers={"X-Request-Id": "req-42"})
    assert response.headers["X-Request-Id"] == "req-42"
    [record] = [r for r in caplog.records if r.name == "decision_adapter.requests"]
    fields = record.fields
    assert fields["request_id"] == "req-42" and fields["status"] == 200 and fields["decisions"] == 1
    assert fields["input_tokens"] == response.get_json()["result"]["input_tokens"]
    for key in ("queue_s", "prefill_s", "readout_s", "total_s"):
        assert fields[key] >= 0


def test_the_real_engine_is_what_the_decision_model_and_the_scheduler_need(engine):
    from decision_adapter.decisions.model import ScoringEngine
    from decision_adapter.engine.scheduler import JobRunner

    assert isinstance(engine, ScoringEngine) and isinstance(engine.runner, JobRunner)


def test_control_tokens_are_read_from_the_gguf(engine):
    assert {"<|im_start|>", "<|im_end|>", "<|endoftext|>"} <= set(engine.vocabulary.control_texts)
    assert "A" not in engine.vocabulary.control_texts


@pytest.mark.skipif(gpu_backend_available(), reason="this llama.cpp build has a GPU backend")
def test_gpu_layers_without_a_gpu_backend_refuse_to_start(settings):
    with pytest.raises(GpuUnavailable, match="ADAPTER_GPU_LAYERS=-1 asks for GPU offload"):
        Engine(str(find_gguf(settings.model_dir)), engine_options(dataclasses.replace(settings, threads=1, gpu_layers=-1)))

    env = {**os.environ, "ADAPTER_MODEL_DIR": settings.model_dir, "ADAPTER_GPU_LAYERS": "-1",
           "SAGEMAKER_BIND_TO_PORT": "1"}
    done = subprocess.run([sys.executable, "-m", "decision_adapter.server.serve"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert "serve: refusing to start: ADAPTER_GPU_LAYERS=-1 asks for GPU offload" in done.stderr


def test_serve_refuses_bad_settings_and_missing_models(tmp_path):
    base = {**os.environ, "ADAPTER_MODEL_DIR": str(tmp_path)}
    for env, message in [({"ADAPTER_THREADS": "many"}, "ADAPTER_THREADS='many' is not an integer"),
                         ({}, "must hold exactly one .gguf file (found: none)")]:
        done = subprocess.run([sys.executable, "-m", "decision_adapter.server.serve"], env={**base, **env},
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and message in done.stderr


def test_closing_the_engine_under_a_running_decode_waits_for_its_step_and_later_jobs_fail_cleanly(settings):
    """Freeing llama.cpp's context under a running llama_decode would crash the process: close aborts the decode,
    waits for its step under the engine's lock, and a job begun afterwards fails with a clear error."""
    import dataclasses
    import threading
    import time

    from decision_adapter.engine.errors import EngineError, ScoringFailed
    from decision_adapter.protocols import decision_schema
    from decision_adapter.protocols.fields import RequestContext
    from decision_adapter.startup import load_decision_model

    quiet = dataclasses.replace(settings, state_cache_mb=0)
    engine = Engine(str(find_gguf(settings.model_dir)), engine_options(quiet))
    model = load_decision_model(quiet, engine)
    try:
        def question(state: str):
            decision = {"id": "d", "state": state, "question": "Which team?",
                        "options": [{"id": "a", "description": "Billing"}, {"id": "b", "description": "Sales"}]}
            [parsed], _ = decision_schema.parse({"decision": decision}, RequestContext.of(model, max_decisions=1))
            return parsed.question

        outcome: dict = {}

        def long_job():
            try:
                outcome["result"] = model.score(model.prepare([question("The parcel is late again. " * 250)]))
            except Exception as exc:  # noqa: BLE001 - what the job ends with is the assertion
                outcome["error"] = exc

        worker = threading.Thread(target=long_job)
        worker.start()
        waited = time.monotonic() + 60
        while model.scheduler.in_flight == 0 and worker.is_alive():
            assert time.monotonic() < waited
            time.sleep(0.005)
        engine.close()  # the process survives this
        worker.join(120)
        assert not worker.is_alive() and ("error" in outcome or "result" in outcome)
        with pytest.raises((ScoringFailed, EngineError)):
            model.score(model.prepare([question("Another state.")]))
    finally:
        model.close()
        engine.close()
