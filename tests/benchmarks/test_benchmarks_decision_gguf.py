"""benchmarks.decision_gguf: the same tasks on the plain embedded model and on decision GGUFs derived from it. The
plain row is checked against the accuracy harness's own scoring (an independent path: logits, not the answer's
probabilities); the derived rows are answered by their type's rules."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import decision_gguf
from benchmarks.scoring import score_one
from benchmarks.tasks import load

SAMPLE = Path(__file__).with_name("tasks-sample.jsonl")


@pytest.fixture(scope="module")
def plain():
    from decision_adapter.decisions.model_files import embedded_model_dir
    from decision_adapter.settings import Settings
    from decision_adapter.startup import load_decision_model

    model = load_decision_model(Settings(model_dir=str(embedded_model_dir()), threads=2, permutations=1,
                                         debias="off"), calibrated=False)
    yield model
    model.close()


def test_a_plain_model_s_probabilities_are_the_accuracy_harness_s(plain):
    for task in load([SAMPLE]):
        mine, theirs = decision_gguf.score_task(plain, task), score_one(plain, task)
        assert mine is not None and theirs is not None
        assert mine.distribution == pytest.approx(theirs.distribution, abs=1e-6)


def test_the_run_scores_every_kind_on_the_same_tasks_and_names_itself(tmp_path, capsys):
    code = decision_gguf.main(["--tasks", str(SAMPLE), "--per-tier", "1", "--threads", "2", "--out", str(tmp_path)])
    assert code == 0
    result = json.loads((tmp_path / "decision_gguf.json").read_text())
    assert list(result["models"]) == ["plain", "lev", "openjev"]
    n = result["tasks"]
    assert n >= 2
    for kind, entry in result["models"].items():
        overall = entry["summary"]["overall"]
        assert overall["n"] == n and entry["refused"] == 0, kind
        assert 0.0 <= overall["accuracy"] <= 1.0 and math.isfinite(overall["brier"])
    assert result["provenance"]["command"].startswith("python -m benchmarks.decision_gguf ")
    table = (tmp_path / "decision_gguf.md").read_text()
    assert all(f"| {kind} |" in table for kind in result["models"])
