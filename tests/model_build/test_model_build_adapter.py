"""The packaged archive end to end: what model_build uploads is what the adapter loads, verifies and serves,
with or without the calibration.json a pin names."""

from __future__ import annotations

import functools
import json
import math
import tarfile
from pathlib import Path

import pytest

from decision_adapter.decisions import calibration as adapter_calibration
from decision_adapter.decisions import model_files
from decision_adapter.server.app import create_app
from decision_adapter.decisions.calibration import Calibration
from decision_adapter.settings import Settings
from model_build import calibration as build_calibration
from model_build import manifest as build_manifest
from model_build.cli import main
from model_build.errors import ExitCode
from packaging_testkit import Origin, url_pin

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "support-route.json"
# The example decision has no question type, so the adapter applies the `choice` temperature.
CHOICE_TEMPERATURE = 2.5
CHOICE_STRENGTH = 0.6


def _started(model_dir: Path):
    """An adapter app on `model_dir` whose background load has finished, one way or the other."""
    app = create_app(Settings(model_dir=str(model_dir), threads=2), defer_loading=True)
    state = app.extensions["decision_adapter"]
    state.start_loading()
    assert state.readiness.wait(120)
    return app, state


@functools.lru_cache(maxsize=1)
def served_prompt_version() -> str:
    """The prompt version the adapter serves the embedded model with: its template's head and tail, the default
    style, the payload layout (what `python -m decision_adapter.calibrate` writes into calibration.json)."""
    from decision_adapter.decisions.model import prompt_layout
    from decision_adapter.decisions.prompt import DEFAULT_STYLE, STYLES
    from decision_adapter.engine.core import Engine
    from decision_adapter.startup import engine_options

    gguf = model_files.find_gguf(model_files.embedded_model_dir())
    options = engine_options(Settings(threads=1, ctx_tokens=1024, max_prompt_tokens=512, state_cache_mb=0))
    with Engine(str(gguf), options) as engine:
        return prompt_layout(engine, STYLES[DEFAULT_STYLE]).version


def _fitted_calibration(gguf_sha256: str) -> str:
    """calibration.json as `python -m decision_adapter.calibrate` writes it, for this adapter's prompt and its
    default orderings, debias mode and floor, with a strength per type."""
    defaults = Settings()
    return Calibration(gguf_sha256=gguf_sha256, prompt_version=served_prompt_version(),
                       temperatures={"choice": CHOICE_TEMPERATURE, "noul": 0.7}, permutations=defaults.permutations,
                       debias=defaults.debias, strengths={"choice": CHOICE_STRENGTH, "noul": 0.4},
                       floor=defaults.debias_floor, fitted={"rows": 40, "folds": 5}).to_json()


@pytest.fixture(scope="module")
def calibrated_model_dir(tmp_path_factory, embedded_gguf, origin_server) -> Path:
    """The embedded GGUF packaged by `python -m model_build package` from a pin naming a calibration fitted
    for it, unpacked like /opt/ml/model."""
    root = tmp_path_factory.mktemp("calibrated-model")
    route = Origin(origin_server).serve("model.gguf", embedded_gguf.data)
    (root / "calibrations").mkdir()
    (root / "calibrations" / "smollm2.json").write_text(_fitted_calibration(embedded_gguf.sha256))
    pins = root / "pins.json"
    pins.write_text(json.dumps({"default": "calibrated", "pins": {
        "calibrated": url_pin(route.url, embedded_gguf, calibration="calibrations/smollm2.json")}}))

    exit_code = main(["package", "--pins", str(pins), "--work-dir", str(root / "work"), "--no-upload",
                      "--output", str(root / "out")])

    assert exit_code == ExitCode.OK
    model_dir = root / "model"
    with tarfile.open(root / "out" / "calibrated" / embedded_gguf.sha256 / "model.tar.gz", "r:gz") as archive:
        archive.extractall(model_dir, filter="data")
    return model_dir


def test_adapter_loads_the_unpacked_archive_and_scores_a_decision(packaged_model):
    app, state = _started(packaged_model.model_dir)
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
    # An archive without calibration.json is served uncalibrated.
    assert "calibration" not in result
    state.readiness.model.close()


def test_adapter_serves_an_archive_with_a_matching_calibration_calibrated(calibrated_model_dir, embedded_gguf):
    app, state = _started(calibrated_model_dir)
    try:
        client = app.test_client()
        assert client.get("/ping").status_code == 200, client.get("/ping").get_json()

        body = json.loads(EXAMPLE.read_text())
        body["decision"]["show_prior"] = True
        response = client.post("/invocations", json=body)

        assert response.status_code == 200, response.get_data(as_text=True)
        result = response.get_json()["result"]
        assert result["calibration"] == {"temperature": CHOICE_TEMPERATURE, "type": "choice",
                                         "gguf_sha256": embedded_gguf.sha256, "prompt_version": served_prompt_version()}
        logits = result["option_logits"]
        if "debias" in result:  # the server's default: the prior divided out before the temperature
            strength, floor, prior = (result["debias"][key] for key in ("strength", "floor", "prior"))
            assert strength == CHOICE_STRENGTH, "the file's strength for the type"
            logits = [x - strength * math.log((1 - floor) * p + floor / len(prior)) for x, p in zip(logits, prior)]
        assert result["probabilities"] == pytest.approx(_softmax([x / CHOICE_TEMPERATURE for x in logits]))
        # Guards the check above: at this temperature the calibrated and raw probabilities differ.
        assert result["probabilities"] != pytest.approx(_softmax(logits))
    finally:
        if state.readiness.model is not None:
            state.readiness.model.close()


def test_adapter_refuses_an_archive_whose_calibration_was_fitted_for_another_gguf(calibrated_model_dir,
                                                                                 embedded_gguf, tmp_path):
    # model_build refuses such a pin, so the archive's folder is altered after unpacking instead.
    other_sha256 = "e" * 64
    folder = tmp_path / "model"
    folder.mkdir()
    manifest_path = calibrated_model_dir / model_files.MANIFEST_NAME
    gguf_name = json.loads(manifest_path.read_text())["file"]
    (folder / gguf_name).symlink_to(calibrated_model_dir / gguf_name)
    (folder / model_files.MANIFEST_NAME).write_bytes(manifest_path.read_bytes())
    (folder / adapter_calibration.FILE_NAME).write_text(_fitted_calibration(other_sha256))

    app, _ = _started(folder)

    ping = app.test_client().get("/ping")
    assert ping.status_code == 503
    assert (f"calibration.json was fitted for the GGUF with sha256 {other_sha256}, "
            f"not this one ({embedded_gguf.sha256})") in ping.get_json()["detail"]


def test_adapter_refuses_an_archive_whose_gguf_does_not_match_its_manifest(packaged_model, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    manifest = dict(packaged_model.manifest)
    gguf = packaged_model.model_dir / manifest["file"]
    (folder / manifest["file"]).symlink_to(gguf)
    manifest["sha256"] = "f" * 64
    (folder / "model-manifest.json").write_text(json.dumps(manifest))

    app, _ = _started(folder)

    ping = app.test_client().get("/ping")
    assert ping.status_code == 503
    assert f"model-manifest.json pins {'f' * 64}" in ping.get_json()["detail"]


def test_model_build_uses_the_adapters_file_names_and_question_types():
    # model_build cannot import the adapter (it runs without it), so it keeps copies; this keeps them equal.
    assert build_calibration.ARCHIVE_NAME == adapter_calibration.FILE_NAME
    assert build_calibration.QUESTION_TYPES == adapter_calibration.QUESTION_TYPES
    assert build_manifest.MANIFEST_NAME == model_files.MANIFEST_NAME


def test_a_calibration_the_adapter_writes_passes_the_pin_check(embedded_gguf, tmp_path):
    path = tmp_path / "calibration.json"
    path.write_text(_fitted_calibration(embedded_gguf.sha256))
    problems: list[str] = []

    pinned = build_calibration.read_calibration("pins.p.calibration", path.name, tmp_path, embedded_gguf.sha256,
                                                problems)

    assert problems == []
    assert (pinned.data, pinned.prompt_version) == (path.read_bytes(), served_prompt_version())


def _softmax(values: list[float]) -> list[float]:
    top = max(values)
    exponentials = [math.exp(value - top) for value in values]
    return [value / math.fsum(exponentials) for value in exponentials]
