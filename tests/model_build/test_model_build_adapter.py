"""The packaged archive end to end: what model_build uploads is what the adapter loads, verifies and serves."""

from __future__ import annotations

import json
import math
from pathlib import Path

from decision_adapter.app import create_app
from decision_adapter.settings import Settings

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "support-route.json"


def test_adapter_loads_the_unpacked_archive_and_scores_a_decision(packaged_model):
    settings = Settings(model_dir=str(packaged_model.model_dir), threads=2)
    app = create_app(settings, defer_loading=True)
    state = app.extensions["decision_adapter"]
    state.start_loading()
    assert state.readiness.wait(120)
    client = app.test_client()
    assert client.get("/ping").status_code == 200, client.get("/ping").get_json()

    response = client.post("/invocations", data=EXAMPLE.read_text(), content_type="application/json")

    assert response.status_code == 200, response.get_data(as_text=True)
    result = response.get_json()["result"]
    assert math.isclose(sum(result["probabilities"]), 1.0, abs_tol=1e-9)
    manifest = packaged_model.manifest
    model = result["model"]
    assert (model["file"], model["bytes"], model["sha256"]) == (manifest["file"], manifest["bytes"], manifest["sha256"])
    assert (model["source"], model["revision"]) == (manifest["source"], manifest["revision"])
    state.readiness.model.engine.close()


def test_adapter_refuses_an_archive_whose_gguf_does_not_match_its_manifest(packaged_model, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    manifest = dict(packaged_model.manifest)
    gguf = packaged_model.model_dir / manifest["file"]
    (folder / manifest["file"]).symlink_to(gguf)
    manifest["sha256"] = "f" * 64
    (folder / "model-manifest.json").write_text(json.dumps(manifest))

    app = create_app(Settings(model_dir=str(folder), threads=2), defer_loading=True)
    state = app.extensions["decision_adapter"]
    state.start_loading()
    assert state.readiness.wait(120)
    ping = app.test_client().get("/ping")
    assert ping.status_code == 503
    assert f"model-manifest.json pins {'f' * 64}" in ping.get_json()["detail"]
