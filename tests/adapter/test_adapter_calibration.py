"""Calibration: fitting (a temperature and a strength per type), group-disjoint folds, the file's binding to one
GGUF and prompt, files from before strengths (or debiasing) existed, and its use."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from decision_adapter.server.app import create_app
import json

from decision_adapter.decisions.calibration import (FILE_NAME, Calibration, CalibrationError, Row, fit, fit_both,
                                                    fit_strength, fit_temperature, group_folds, load, nll, out_of_fold)
from decision_adapter.decisions.model_files import find_gguf, sha256_of
from decision_adapter.engine.readout import softmax


def synthetic(temperature: float, n: int, seed: int, kind: str = "choice") -> list[Row]:
    """Rows whose answers are drawn from softmax(logits / temperature): that temperature fits them best."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        logits = tuple(rng.gauss(0, 3) for _ in range(4))
        p = softmax([x / temperature for x in logits])
        answer = rng.choices(range(4), weights=p)[0]
        rows.append(Row(kind, logits, answer, f"g{i // 3}"))
    return rows


def test_the_fitted_temperature_is_the_one_the_answers_were_drawn_with():
    rows = synthetic(2.5, 3000, seed=1)
    t = fit_temperature(rows)
    assert t == pytest.approx(2.5, rel=0.1)
    assert nll(rows, t) <= min(nll(rows, 1.0), nll(rows, 2.5))


def test_each_question_type_gets_its_own_temperature():
    rows = synthetic(0.5, 1500, seed=2, kind="noul") + synthetic(3.0, 1500, seed=3, kind="score")
    temperatures = fit(rows)
    assert set(temperatures) == {"noul", "score"}
    assert temperatures["noul"] == pytest.approx(0.5, rel=0.15) and temperatures["score"] == pytest.approx(3.0, rel=0.15)


def test_folds_keep_every_group_whole_and_out_of_fold_never_sees_its_own_rows():
    rows = synthetic(2.0, 90, seed=4)
    folds = group_folds(rows, 5)
    assert sorted(i for f in folds for i in f) == list(range(90))
    for fold in folds:
        others = {rows[i].group for f in folds if f is not fold for i in f}
        assert not {rows[i].group for i in fold} & others
    held = folds[0]
    tampered = list(rows)
    for i in held:  # wild logits in the held-out fold must not change the temperature used on it
        tampered[i] = dataclasses.replace(rows[i], logits=tuple(100 * x for x in rows[i].logits))
    t = fit([r for i, r in enumerate(rows) if i not in set(held)])["choice"]
    assert out_of_fold(tampered, 5)[held[0]] == pytest.approx(softmax([x / t for x in tampered[held[0]].logits]))


PROMPT_VERSION = "plain-0123456789ab"


@pytest.fixture(scope="module")
def served_version(app) -> str:
    """The prompt version the embedded model's server renders (its template, style, layout and wording)."""
    return app.extensions["decision_adapter"].readiness.model.prompt_version


def write(folder, **changes) -> None:
    calibration = Calibration(gguf_sha256="a" * 64, prompt_version=PROMPT_VERSION,
                              temperatures={"choice": 2.0, "noul": 0.5})
    (folder / FILE_NAME).write_text(dataclasses.replace(calibration, **changes).to_json())


def test_a_file_for_another_number_of_orderings_is_refused(tmp_path):
    write(tmp_path, permutations=4)
    assert load(tmp_path, gguf_sha256="a" * 64, prompt_version=PROMPT_VERSION, permutations=4).permutations == 4
    with pytest.raises(CalibrationError, match="fitted on answers averaged over 4 orderings; ADAPTER_PERMUTATIONS is 1"):
        load(tmp_path, gguf_sha256="a" * 64, prompt_version=PROMPT_VERSION, permutations=1)


def test_a_file_for_another_model_or_prompt_is_refused(tmp_path):
    write(tmp_path)
    assert load(tmp_path, gguf_sha256="a" * 64, prompt_version=PROMPT_VERSION).temperature("noul") == 0.5
    with pytest.raises(CalibrationError, match="fitted for the GGUF with sha256 a{64}, not this one"):
        load(tmp_path, gguf_sha256="b" * 64, prompt_version=PROMPT_VERSION)
    with pytest.raises(CalibrationError, match="fitted for prompt version 'old'"):
        write(tmp_path, prompt_version="old")
        load(tmp_path, gguf_sha256="a" * 64, prompt_version=PROMPT_VERSION)
    (tmp_path / FILE_NAME).write_text("{not json")
    with pytest.raises(CalibrationError, match="is not a calibration file"):
        load(tmp_path, gguf_sha256="a" * 64, prompt_version=PROMPT_VERSION)
    assert load(tmp_path / "absent", gguf_sha256="a" * 64, prompt_version=PROMPT_VERSION) is None


@pytest.fixture
def model_copy(tmp_path, settings):
    """The embedded GGUF in a folder of its own, where a calibration file can be put beside it."""
    folder = tmp_path / "model"
    folder.mkdir()
    gguf = find_gguf(settings.model_dir)
    (folder / gguf.name).symlink_to(gguf)
    return folder, sha256_of(gguf)


def test_the_server_refuses_to_turn_ready_with_a_calibration_for_another_model(model_copy, settings):
    folder, _ = model_copy
    write(folder, gguf_sha256="f" * 64)
    app = create_app(dataclasses.replace(settings, model_dir=str(folder)))
    state = app.extensions["decision_adapter"]
    assert state.readiness.wait(120)
    ping = app.test_client().get("/ping")
    assert ping.status_code == 503
    assert "fitted for the GGUF with sha256 ffff" in ping.get_json()["detail"]


def test_calibrated_answers_scale_the_logits_and_name_the_calibration(model_copy, settings, example, served_version):
    folder, digest = model_copy
    raw_app = create_app(dataclasses.replace(settings, model_dir=str(folder)))
    assert raw_app.extensions["decision_adapter"].readiness.wait(120)
    raw = raw_app.test_client().post("/invocations", json=example).get_json()["result"]
    write(folder, gguf_sha256=digest, prompt_version=served_version)
    app = create_app(dataclasses.replace(settings, model_dir=str(folder)))
    assert app.extensions["decision_adapter"].readiness.wait(120)
    result = app.test_client().post("/invocations", json=example).get_json()["result"]

    assert result["option_logits"] == raw["option_logits"], "the raw values stay"
    assert result["probabilities"] == pytest.approx(softmax([x / 2.0 for x in raw["option_logits"]]), abs=1e-12)
    assert result["calibration"] == {"temperature": 2.0, "type": "choice", "gguf_sha256": digest,
                                     "prompt_version": served_version}
    answer = app.test_client().post("/v1/systemone", json={
        "model": "jev-latest", "state": example["decision"]["state"],
        "questions": {"q": {"type": "noul", "instructions": "Is it about a password?"}}}).get_json()["answers"]["q"]
    assert answer["x_calibration"]["temperature"] == 0.5 and answer["x_calibration"]["type"] == "noul"
    assert 0.0 < answer["noul"] < 1.0 and math.isfinite(answer["noul"])
    assert "calibration" not in raw, "the uncalibrated server names none"
    # A temperature fitted with one ordering does not apply to an answer averaged over four: the answer says so.
    averaged = app.test_client().post("/invocations", json={"decision": {**example["decision"], "permutations": 4}})
    averaged = averaged.get_json()["result"]
    assert "calibration" not in averaged
    assert "not calibrated: calibration.json was fitted with 1 orderings, this question asked for 4" in averaged["readout"]
    assert averaged["probabilities"] == pytest.approx(softmax(averaged["option_logits"]), abs=1e-12)


def test_the_server_refuses_a_calibration_fitted_for_other_orderings(model_copy, settings, served_version):
    folder, digest = model_copy
    write(folder, gguf_sha256=digest, prompt_version=served_version, permutations=2)
    app = create_app(dataclasses.replace(settings, model_dir=str(folder)))
    assert app.extensions["decision_adapter"].readiness.wait(120)
    ping = app.test_client().get("/ping")
    assert ping.status_code == 503 and "ADAPTER_PERMUTATIONS is 1" in ping.get_json()["detail"]


def test_a_file_for_another_debias_mode_is_refused(tmp_path):
    write(tmp_path, debias="empty", strengths={"choice": 0.5})
    assert load(tmp_path, gguf_sha256="a" * 64, prompt_version=PROMPT_VERSION, permutations=1,
                debias="empty").debias == "empty"
    with pytest.raises(CalibrationError, match="debiased with 'empty'; ADAPTER_DEBIAS is 'off'"):
        load(tmp_path, gguf_sha256="a" * 64, prompt_version=PROMPT_VERSION, permutations=1, debias="off")


def legacy_file(folder, **fields) -> None:
    """calibration.json as an earlier adapter wrote it: without strengths, floor and (before debiasing) debias."""
    (folder / FILE_NAME).write_text(json.dumps({"gguf_sha256": "a" * 64, "prompt_version": PROMPT_VERSION,
                                                "temperatures": {"choice": 2.0}, "permutations": 1,
                                                "fitted": {"rows": 40}, **fields}))


@pytest.mark.parametrize("fields, mode", [({}, "off"), ({"debias": "empty"}, "empty")])
def test_a_file_from_before_strengths_loads_whatever_the_server_mode_at_full_strength(tmp_path, fields, mode):
    legacy_file(tmp_path, **fields)
    for server in ("off", "empty", "label"):
        calibration = load(tmp_path, gguf_sha256="a" * 64, prompt_version=PROMPT_VERSION, permutations=1,
                           debias=server)
        assert calibration.debias == mode and calibration.strengths is None and calibration.floor == 0.0
        assert calibration.strength("choice", 0.3) == 1.0, "fitted on answers with the whole prior divided out"


def test_a_file_with_an_invalid_strength_is_refused(tmp_path):
    write(tmp_path, debias="empty", strengths={"choice": 1.5})
    with pytest.raises(CalibrationError, match="invalid strengths"):
        load(tmp_path, gguf_sha256="a" * 64, prompt_version=PROMPT_VERSION)


def with_prior(strength: float, n: int, seed: int, kind: str = "noul") -> list[Row]:
    """Rows whose answers are drawn from softmax(logits - strength * log prior): the model's own logits hold a
    bias towards option 0 that the prior holds too."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        log_prior = tuple(math.log(p) for p in softmax([rng.gauss(1.5, 0.5), 0.0]))
        logits = tuple(rng.gauss(0, 2) + lp for lp in log_prior)
        truth = softmax([a - strength * b for a, b in zip(logits, log_prior)])
        rows.append(Row(kind, logits, rng.choices(range(2), weights=truth)[0], f"g{i}", log_prior))
    return rows


def test_the_fitted_strength_is_the_one_the_answers_were_drawn_with():
    for drawn in (0.0, 0.5, 1.0):
        strength, temperature = fit_strength(with_prior(drawn, 1500, seed=int(10 * drawn)))
        assert strength == pytest.approx(drawn, abs=0.2) and temperature == pytest.approx(1.0, rel=0.2)
    # Rows without a prior cannot choose one: strength 0, the temperature as fit() finds it.
    plain = synthetic(2.0, 500, seed=5)
    assert fit_strength(plain) == (0.0, fit_temperature(plain))
    both = fit_both(with_prior(0.5, 500, seed=6) + synthetic(2.0, 300, seed=7))
    assert set(both) == {"noul", "choice"} and both["choice"][0] == 0.0


def test_out_of_fold_strengths_never_see_their_own_rows():
    rows = with_prior(0.5, 300, seed=8)
    folds = group_folds(rows, 5)
    held = folds[0]
    train = [r for i, r in enumerate(rows) if i not in set(held)]
    strength, t = fit_both(train)["noul"]
    expected = softmax([x / t for x in rows[held[0]].adjusted(strength)])
    assert out_of_fold(rows, 5, strengths=True)[held[0]] == pytest.approx(expected, abs=1e-12)


def test_the_temperature_applies_after_order_averaging_and_the_prior(model_copy, settings, example, served_version):
    """Composition: average the orderings, divide the prior out, then the temperature fitted on answers debiased
    the same way. Checked from the answer's own fields: the model's averaged logits, the prior it reports."""
    folder, digest = model_copy
    write(folder, gguf_sha256=digest, prompt_version=served_version, permutations=2, debias="empty")
    app = create_app(dataclasses.replace(settings, model_dir=str(folder), permutations=2, debias="empty"))
    assert app.extensions["decision_adapter"].readiness.wait(120)
    body = {"decision": {**example["decision"], "show_prior": True}}
    result = app.test_client().post("/invocations", json=body).get_json()["result"]
    assert result["calibration"]["temperature"] == 2.0 and result["debias"]["mode"] == "empty"
    adjusted = [x - math.log(p) for x, p in zip(result["option_logits"], result["debias"]["prior"])]
    assert result["probabilities"] == pytest.approx(softmax([x / 2.0 for x in adjusted]), abs=1e-9)
    # A question asking for another mode gets no temperature fitted on other logits, and says so.
    off = app.test_client().post("/invocations", json={"decision": {**example["decision"], "debias": "off"}})
    off = off.get_json()["result"]
    assert "calibration" not in off and "debias" not in off
    assert ("fitted with debias 'empty' (a file from before strengths were fitted), this question is answered with "
            "'off'") in off["readout"]
    assert off["probabilities"] == pytest.approx(softmax(off["option_logits"]), abs=1e-12)


def test_a_calibration_from_before_debiasing_keeps_ping_at_200_and_says_where_it_does_not_apply(
        model_copy, settings, example, served_version):
    """calibration.json written before debiasing existed (no debias, no strengths) beside a server that debiases
    by default: the server turns ready; answers in its mode are uncalibrated and say why; answers without a prior
    (debias off, the mode the file was fitted in) get its temperature."""
    folder, digest = model_copy
    (folder / FILE_NAME).write_text(json.dumps({"gguf_sha256": digest, "prompt_version": served_version,
                                                "temperatures": {"choice": 2.0}, "permutations": 1}))
    app = create_app(dataclasses.replace(settings, model_dir=str(folder), debias="label"))
    assert app.extensions["decision_adapter"].readiness.wait(120)
    client = app.test_client()
    assert client.get("/ping").status_code == 200, client.get("/ping").get_json()
    default = client.post("/invocations", json=example).get_json()["result"]
    assert "calibration" not in default and default["debias"]["mode"] == "label"
    assert ("not calibrated: calibration.json was fitted with debias 'off' (a file from before strengths were "
            "fitted), this question is answered with 'label'") in default["readout"]
    off = client.post("/invocations", json={"decision": {**example["decision"], "debias": "off"}}).get_json()
    assert off["result"]["calibration"]["temperature"] == 2.0
    assert off["result"]["probabilities"] == pytest.approx(softmax([x / 2.0 for x in off["result"]["option_logits"]]))


def test_the_server_applies_the_fitted_strength_and_floor_per_question_type(model_copy, settings, example,
                                                                            served_version):
    folder, digest = model_copy
    write(folder, gguf_sha256=digest, prompt_version=served_version, debias="empty", strengths={"choice": 0.5},
          floor=0.25)
    app = create_app(dataclasses.replace(settings, model_dir=str(folder), debias="empty", debias_strength=0.8))
    assert app.extensions["decision_adapter"].readiness.wait(120)
    client = app.test_client()
    result = client.post("/invocations", json={"decision": {**example["decision"], "show_prior": True}})
    result = result.get_json()["result"]
    assert result["debias"]["strength"] == 0.5 and result["debias"]["floor"] == 0.25
    n = len(result["option_logits"])
    adjusted = [x - 0.5 * math.log(0.75 * p + 0.25 / n) for x, p in
                zip(result["option_logits"], result["debias"]["prior"])]
    assert result["probabilities"] == pytest.approx(softmax([x / 2.0 for x in adjusted]), abs=1e-9)
    # A type the file fitted no strength for gets the server's default strength, with the file's floor.
    answer = client.post("/v1/systemone", json={
        "model": "jev-latest", "state": example["decision"]["state"],
        "questions": {"q": {"type": "noul", "instructions": "Is it about a password?"}}}).get_json()["answers"]["q"]
    assert answer["x_debias"]["strength"] == 0.8 and answer["x_debias"]["floor"] == 0.25
    assert answer["x_calibration"]["temperature"] == 0.5


def test_calibrate_fits_and_writes_a_strength_per_type_that_the_server_applies(model_copy, settings, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from benchmarks.tasks import BIAS_TASKS

    folder, digest = model_copy
    rows = tmp_path / "rows.jsonl"
    lines = BIAS_TASKS.read_text().splitlines()
    rows.write_text("\n".join(lines[24:36] + lines[54:62]) + "\n")  # noul (skewed) and choice rows
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "decision_adapter.calibrate", str(rows), "--model-dir", str(folder),
                           "--folds", "2", "--debias", "label", "--floor", "0.25"],
                          cwd=repo, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "ADAPTER_THREADS": "2", "ADAPTER_DEBIAS": "off"})
    assert done.returncode == 0, done.stderr[-3000:]
    written = json.loads((folder / FILE_NAME).read_text())
    assert written["debias"] == "label" and written["floor"] == 0.25 and written["gguf_sha256"] == digest
    assert set(written["strengths"]) == set(written["temperatures"]) == {"noul", "choice"}
    assert all(0.0 <= a <= 1.0 for a in written["strengths"].values())
    assert "alpha = " in done.stdout and "out of fold" in done.stdout
    app = create_app(dataclasses.replace(settings, model_dir=str(folder), debias="label"))
    assert app.extensions["decision_adapter"].readiness.wait(120)
    task = json.loads(lines[54])
    answer = app.test_client().post("/v1/systemone", json={
        "model": "jev-latest", "state": task["state"], "questions": {"q": task["question"]}}).get_json()["answers"]["q"]
    assert answer["x_debias"]["strength"] == written["strengths"]["choice"]
    assert answer["x_calibration"]["temperature"] == written["temperatures"]["choice"]
