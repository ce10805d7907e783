"""benchmarks.priors: raw readouts scored once, configurations composed from them, and the rule that picks the
default. The fast path (arithmetic on stored readouts) is checked against the slow one (the adapter serving that
configuration), with ``==``."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks import priors
from benchmarks.tasks import BIAS_TASKS, load

SAMPLE = Path(__file__).with_name("tasks-sample.jsonl")


@pytest.fixture(scope="module")
def tasks():
    bias = load([BIAS_TASKS])
    # An empty-state question-borne task (its state prior is its own prompt), a generic-state one, a skewed noul.
    picked = [t for t in bias if t.id in ("bias-qb-01", "bias-qb-14", "bias-skew-yes-01", "bias-fav-team-1")]
    return load([SAMPLE])[:3] + picked


@pytest.fixture(scope="module")
def settings():
    from decision_adapter.decisions.model_files import embedded_model_dir
    from decision_adapter.settings import Settings

    return Settings(model_dir=str(embedded_model_dir()), threads=2, permutations=1, debias="off")


@pytest.fixture(scope="module")
def raw(settings, tasks):
    from decision_adapter.startup import load_decision_model

    model = load_decision_model(settings, calibrated=False)
    try:
        return priors.measure(model, tasks, [1, 2], ["off", "empty", "label"])
    finally:
        model.close()


def served(settings, tasks, config: priors.Config) -> dict[str, tuple[float, ...]]:
    """Each task's probabilities in label order as a server started with this configuration answers them."""
    from benchmarks.scoring import prepared_task
    from decision_adapter.startup import load_decision_model

    model = load_decision_model(replace(settings, debias=config.mode, permutations=config.k,
                                        debias_strength=config.strength or 1.0, debias_floor=config.floor),
                                calibrated=False)
    try:
        out = {}
        for task in tasks:
            item, _ = prepared_task(model, task, config.k, config.mode)
            prepared = model.prepare([replace(item.question, permutations=None, debias=None)])
            [result] = model.score(prepared).results
            out[task.id] = priors.in_label_order(task, item.names, result.probabilities)
        return out
    finally:
        model.close()


@pytest.mark.parametrize("config", [priors.Config("off", 0.0, 0.0, 1), priors.Config("label", 0.5, 0.25, 1),
                                    priors.Config("empty", 1.0, 0.0, 2), priors.Config("label", 0.75, 0.0, 2)],
                         ids=lambda c: c.name)
def test_a_configuration_composed_from_raw_readouts_is_what_the_adapter_serves(settings, tasks, raw, config):
    stored = json.loads(gzip.decompress(gzip.compress(json.dumps(raw).encode())))  # as --raw reads it back
    evaluated = {s.task.id: s.distribution for s in priors.evaluate(stored, tasks, config).given}
    assert set(evaluated) == {t.id for t in tasks}
    assert evaluated == served(settings, tasks, config), "bit for bit"


def test_an_empty_state_has_no_state_prior_recorded_and_composes_as_off(tasks, raw):
    rec = raw["tasks"]["bias-qb-01"]["given"]["1"]
    assert rec["priors"]["empty"] is None, "its state prior would be its own prompt"
    assert rec["priors"]["label"] == [priors.prompt_key("", "N/A")], "a label prior never holds the question"
    answers = {mode: [s.distribution for s in priors.evaluate(raw, tasks, priors.Config(mode, 1.0, 0.0, 1)).given
                      if s.task.id == "bias-qb-01"] for mode in ("off", "empty")}
    assert answers["off"] == answers["empty"]


def block(right_by_family: dict[str, int], n: int = 10, mode: str = "label", k: int = 1) -> dict:
    families = {f: {"n": n, "accuracy": r / n} for f, r in right_by_family.items()}
    total = sum(right_by_family.values())
    return {"mode": mode, "strength": 1.0, "floor": 0.0, "k": k, "families": families,
            "overall": {"n": n * len(families), "accuracy": total / (n * len(families))},
            "noul_true_rate": 0.5, "noul_true_expected": 0.5}


TOKENS = {"off K=1": {"ratio_p50_cold": 1.0}, "off K=2": {"ratio_p50_cold": 1.5},
          "label K=1": {"ratio_p50_cold": 1.6}, "empty K=1": {"ratio_p50_cold": 1.8},
          "empty K=2": {"ratio_p50_cold": 2.4}, "label K=4": {"ratio_p50_cold": 3.5}}
# Seconds on a new state with a new question; the served defaults (empty K=1) take 1.0 s, so the bound is 1.3 s.
SECONDS = {"off K=1": {"seconds_p50_cold": 0.5}, "off K=2": {"seconds_p50_cold": 0.8},
           "label K=1": {"seconds_p50_cold": 0.9}, "empty K=1": {"seconds_p50_cold": 1.0},
           "empty K=2": {"seconds_p50_cold": 1.3}, "label K=4": {"seconds_p50_cold": 1.9}}
QB = priors.QUESTION_BORNE


def test_the_latency_bound_is_weighed_against_the_served_defaults():
    from decision_adapter.decisions.debias import DEFAULT_MODE
    from decision_adapter.settings import Settings

    assert priors.reference() == f"{DEFAULT_MODE} K={Settings().permutations}"
    assert priors.latency_bound(SECONDS) == pytest.approx(priors.LATENCY_LIMIT * 1.0)
    with pytest.raises(ValueError, match="served defaults"):
        priors.latency_bound({k: v for k, v in SECONDS.items() if k != priors.reference()})


@pytest.mark.parametrize("candidate, qualifies", [
    ({"a/x": 7, "a/y": 5, QB: 5}, True),   # +3 overall, one family loses one task
    ({"a/x": 9, "a/y": 4, QB: 5}, False),  # a family loses two tasks
    ({"a/x": 9, "a/y": 6, QB: 4}, False),  # the question-borne family loses one
    ({"a/x": 5, "a/y": 6, QB: 5}, False),  # nothing better overall
])
def test_the_rule_takes_a_mode_only_when_it_is_never_worse_than_off(candidate, qualifies):
    results = {"off K=1": block({"a/x": 5, "a/y": 6, QB: 5}, mode="off"), "label a=1 f=0 K=1": block(candidate)}
    chosen = priors.choose(results, TOKENS, SECONDS)
    assert chosen["pair"] == ("label a=1 f=0 K=1" if qualifies else "off K=1")


@pytest.mark.parametrize("seconds_k2, chosen", [
    (1.3, "empty a=0.75 f=0.25 K=2"),   # at the bound: the more accurate K = 2
    (1.31, "empty a=0.75 f=0.25 K=1"),  # over it by a hair
    (None, "empty a=0.75 f=0.25 K=1"),  # never timed: cannot be chosen
])
def test_the_rule_takes_the_most_accurate_within_the_latency_bound(seconds_k2, chosen):
    results = {"off K=1": block({"a/x": 5, "a/y": 6, QB: 5}, mode="off"),
               "empty a=0.75 f=0.25 K=1": block({"a/x": 7, "a/y": 6, QB: 5}, mode="empty"),
               "empty a=0.75 f=0.25 K=2": block({"a/x": 9, "a/y": 8, QB: 6}, mode="empty", k=2)}
    for name in ("empty a=0.75 f=0.25 K=1", "empty a=0.75 f=0.25 K=2"):
        results[name].update(strength=0.75, floor=0.25)
    seconds = {**SECONDS, "empty K=2": {"seconds_p50_cold": seconds_k2}}
    got = priors.choose(results, TOKENS, seconds)
    assert got["pair"] == chosen
    assert got["latency"]["limit_seconds"] == pytest.approx(1.3)
    assert got["latency"]["chosen_seconds"] == seconds[f"empty K={got['k']}"]["seconds_p50_cold"]


def test_the_rule_keeps_to_served_modes_and_prefers_fewer_tokens_within_one_task():
    base = {"a/x": 5, "a/y": 6, QB: 5}
    results = {"off K=1": block(base, mode="off"),
               "label a=1 f=0 K=4": block({"a/x": 10, "a/y": 10, QB: 10}, k=4),  # over the latency bound
               "na a=1 f=0 K=1": block({"a/x": 10, "a/y": 10, QB: 10}, mode="na"),  # explored, never served
               "empty a=1 f=0 K=1": block({"a/x": 8, "a/y": 6, QB: 5}, mode="empty"),
               "label a=1 f=0 K=1": block({"a/x": 7, "a/y": 6, QB: 5})}
    tokens = {**TOKENS, "na K=1": TOKENS["label K=1"]}
    seconds = {**SECONDS, "na K=1": SECONDS["label K=1"]}
    got = priors.choose(results, tokens, seconds)
    assert got["pair"] == "label a=1 f=0 K=1", "one task behind empty, fewer tokens"
    assert got["allowed"] == 3, "off, empty and label at K = 1: not the explored mode, nor K = 4 over the bound"


def test_readouts_measured_again_with_the_same_code_are_the_same_and_the_run_is_named(raw, tmp_path, capsys):
    from decision_adapter.decisions.model_files import embedded_model_dir

    earlier = tmp_path / "raw.json.gz"
    earlier.write_bytes(gzip.compress(json.dumps(raw).encode(), mtime=0))
    code = priors.main(["--same-as", str(earlier), "--tasks", str(SAMPLE), str(BIAS_TASKS),
                        "--model-dir", str(embedded_model_dir()), "--orders", "1", "2",
                        "--modes", "off", "empty", "label", "--threads", "2"])
    found = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0
    assert found["tasks"] == len(raw["task_ids"])
    assert found["records_equal"] == 2 * len(raw["task_ids"]) and found["records_different"] == 0
    assert found["provenance"]["command"].startswith("python -m benchmarks.priors --same-as ")
