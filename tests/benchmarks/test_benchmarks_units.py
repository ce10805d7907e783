"""Pure parts of the benchmark harness: task loading, scores, reply parsing, the report and busy retries."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks import generation
from benchmarks.clients import EndpointError, HttpEndpoint, endpoint
from benchmarks.metrics import Outcome, accuracy, brier, ece, latency_summary, percentile, reliability
from benchmarks.report import markdown
from benchmarks.tasks import first_per_tier, load, state_chars, with_short_states
from loopback_servers import JsonServer, Reply, moto_server

SAMPLE = Path(__file__).with_name("tasks-sample.jsonl")


def outcome(expected: str, distribution, labels=("a", "b"), latency=0.1, tier="easy") -> Outcome:
    return Outcome("t", tier, labels, expected, None if distribution is None else tuple(distribution), latency)


# ---- tasks -------------------------------------------------------------------------------------


def test_sample_tasks_load_with_tiers_labels_and_integer_score_levels():
    tasks = load([SAMPLE])
    assert [t.tier for t in tasks] == ["easy", "easy", "original", "original", "hard", "hard"]
    score = next(t for t in tasks if t.kind == "score")
    assert score.expected == "2" and score.labels == ("0", "1", "2")
    assert score.system_one() == {"model": "jev-latest", "state": score.state, "questions": {"q": score.question}}
    assert [t.id for t in first_per_tier(tasks, 1)] == ["t-easy-choice", "t-original-score", "t-hard-noul"]


def test_short_states_keep_the_tasks_whose_state_fits_counted_as_json_when_structured():
    tasks = load([SAMPLE])
    lengths = sorted(state_chars(t) for t in tasks)
    kept = with_short_states(tasks, lengths[2])
    assert [t.id for t in kept] == [t.id for t in tasks if state_chars(t) <= lengths[2]] and len(kept) >= 3
    structured = replace(tasks[0], state={"order": 7, "note": "é"})
    assert state_chars(structured) == len('{"order": 7, "note": "é"}')


def test_a_folder_is_read_tier_by_tier_and_the_file_names_the_tier(tmp_path):
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    for tier in ("easy", "original", "hard"):
        (tmp_path / f"{tier}.jsonl").write_text(
            "".join(json.dumps({k: v for k, v in r.items() if k != "tier"}) + "\n" for r in rows[:2]) + "\n")
    tasks = load([tmp_path])
    assert [t.tier for t in tasks] == ["easy", "easy", "original", "original", "hard", "hard"]


@pytest.mark.parametrize("row, message", [
    ({"id": "x", "state": "s", "question": {"type": "rank"}, "labels": ["a"], "expected": "a"}, "unknown question type 'rank'"),
    ({"id": "x", "state": "s", "question": {"type": "noul"}, "labels": ["no", "yes"], "expected": "maybe"},
     "expected 'maybe' is not one of the labels"),
    ({"id": "x", "question": {"type": "noul"}, "labels": ["no", "yes"], "expected": "no"}, "'state'"),
])
def test_a_bad_row_names_its_file_and_line(tmp_path, row, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(SAMPLE.read_text().splitlines()[0] + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=rf"bad.jsonl:2: not a decision task: .*{message}"):
        load([path])


def test_answers_become_distributions_in_label_order():
    tasks = {t.id: t for t in load([SAMPLE])}
    assert tasks["t-easy-noul"].distribution({"noul": 0.8}) == pytest.approx([0.2, 0.8])
    choice = tasks["t-easy-choice"]
    answer = {"probabilities": {"billing_question": 0.1, "track_order": 0.7, "cancel_order": 0.2}}
    assert choice.distribution(answer) == [0.7, 0.2, 0.1]


# ---- scores ------------------------------------------------------------------------------------


def test_failures_count_as_wrong_in_accuracy_but_are_left_out_of_brier_and_ece():
    outcomes = [outcome("a", [0.9, 0.1]), outcome("b", [0.6, 0.4]), outcome("a", None)]
    assert accuracy(outcomes) == pytest.approx(1 / 3)
    # (0.1² + 0.1²) and (0.6² + 0.6²), averaged over the two answered tasks
    assert brier(outcomes) == pytest.approx((0.02 + 0.72) / 2)
    # bin 0.9: confidence 0.9, hit rate 1; bin 0.6: confidence 0.6, hit rate 0
    assert ece(outcomes) == pytest.approx(0.5 * 0.1 + 0.5 * 0.6)


def test_a_certain_answer_falls_in_the_last_reliability_bin():
    bins = reliability([outcome("a", [1.0, 0.0]), outcome("a", [0.55, 0.45])], bins=10)
    assert [len(members) for _, _, members in bins] == [0, 0, 0, 0, 0, 1, 0, 0, 0, 1]
    assert ece([outcome("a", [1.0, 0.0])]) == 0.0


def test_empty_inputs_give_nan_not_errors():
    assert math.isnan(accuracy([])) and math.isnan(brier([outcome("a", None)])) and math.isnan(ece([]))
    assert math.isnan(latency_summary([])["p50_s"])


def test_percentiles_interpolate():
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 50) == 2.5 and percentile(values, 0) == 1.0 and percentile(values, 100) == 4.0
    assert latency_summary(values) == {"p50_s": 2.5, "p95_s": pytest.approx(3.85), "max_s": 4.0, "n": 4}


# ---- the generation baseline's reply parser -------------------------------------------------------


@pytest.mark.parametrize("task_id, reply, label", [
    ("t-easy-choice", "track_order", "track_order"),
    ("t-easy-choice", "**Track order**.", "track_order"),
    ("t-easy-choice", "Answer: cancel_order", "cancel_order"),
    ("t-easy-choice", "The user wants track_order, not cancel_order", None),  # names two options
    ("t-easy-choice", "I cannot tell.", None),
    ("t-easy-noul", "Yes, it was paid.", "yes"),
    ("t-easy-noul", "false", "no"),
    ("t-easy-noul", "Maybe", None),
    ("t-original-score", "2", "2"),
    ("t-original-score", "Level: 1 (somewhat)", "1"),
    ("t-original-score", "7", None),
    ("t-hard-choice", "calculator", "calculator"),
])
def test_replies_are_parsed_to_one_option_or_none(task_id, reply, label):
    task = next(t for t in load([SAMPLE]) if t.id == task_id)
    assert generation.parse(task, reply) == label


def test_the_chat_request_lists_every_option_and_asks_for_one():
    task = next(t for t in load([SAMPLE]) if t.id == "t-hard-choice")
    body = generation.request(task)
    assert body["max_tokens"] == generation.MAX_TOKENS and body["temperature"] == 0.0
    user = body["messages"][1]["content"]
    assert task.state in user and all(f"- {label}:" in user for label in task.labels)


# ---- report --------------------------------------------------------------------------------------


def test_markdown_report_has_a_row_per_tier_and_the_reproducing_command():
    block = {"n": 2, "answered": 2, "failures": 0, "accuracy": 0.5, "brier": 0.3, "ece_10": 0.1}
    latency = {"p50_s": 0.05, "p95_s": 0.08, "max_s": 0.09, "n": 2}
    data = {"config": {"endpoint": "http://x", "tasks": 2, "threads": 2,
                       "machine": {"cpus": 2, "cpu": "test CPU", "date": "2026-12-01"}},
            "decision": {"overall": block, "tiers": {"easy": block}, "latency": latency, "decisions_per_s": 20.0},
            "command": "python -m benchmarks --per-tier 1"}
    text = markdown(data)
    assert "Reproduce: `python -m benchmarks --per-tier 1`" in text
    assert "| easy | 2 | 50.0% | 0.300 | 0.100 | - | - |" in text
    assert "| decision endpoint (logit readout) | 50 ms | 80 ms | 90 ms | 20.00 |" in text


# ---- clients -------------------------------------------------------------------------------------


@pytest.fixture
def stub():
    """A loopback endpoint answering the statuses the test scripts, each with Retry-After: 0."""
    statuses: list[int] = []
    respond = lambda request: Reply(statuses.pop(0), {"ok": statuses == []}, {"Retry-After": "0"})  # noqa: E731
    with JsonServer(respond) as server:
        yield f"{server.url}/v1/systemone", statuses


def test_busy_answers_are_retried_after_retry_after(stub):
    url, statuses = stub
    statuses += [503, 429, 200]
    body, elapsed = HttpEndpoint(url, attempts=3).call({"q": 1})
    assert body == {"ok": True} and elapsed >= 0 and statuses == []


def test_a_client_error_or_exhausted_retries_raise_with_the_status(stub):
    url, statuses = stub
    statuses += [422]
    with pytest.raises(EndpointError, match="HTTP 422"):
        HttpEndpoint(url).call({})
    statuses += [503, 503]
    with pytest.raises(EndpointError, match="HTTP 503"):
        HttpEndpoint(url, attempts=2).call({})


def test_endpoint_specs():
    assert endpoint("sagemaker:my-endpoint", region="us-east-1").name == "sagemaker:my-endpoint"
    with pytest.raises(ValueError, match="http\\(s\\) URL or sagemaker:NAME"):
        endpoint("my-endpoint")


def test_a_sagemaker_endpoint_is_called_through_sagemaker_runtime(monkeypatch):
    """Against a moto server on loopback: the harness's SageMaker path signs, sends and parses for real."""
    import requests

    from benchmarks.clients import SageMakerEndpoint

    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_SESSION_TOKEN": "testing"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with moto_server() as url:
        answer = {"model": "jev-latest", "answers": {"q": {"type": "noul", "noul": 0.7}}}
        requests.post(f"{url}/moto-api/static/sagemaker/endpoint-results", json={"results": [
            {"Body": json.dumps(answer), "ContentType": "application/json", "InvokedProductionVariant": "AllTraffic",
             "CustomAttributes": ""}]}, timeout=10).raise_for_status()
        client = SageMakerEndpoint("benchmarks-test-cpu", region="us-east-1", endpoint_url=url)
        body, elapsed = client.call({"model": "jev-latest", "state": "s", "questions": {"q": {"type": "noul"}}})
        assert body == answer and elapsed > 0


def test_accuracy_tool_compares_styles_debias_orders_and_calibration_on_the_real_model(tmp_path):
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    tasks = Path(__file__).with_name("tasks-sample.jsonl")
    command = [sys.executable, "-m", "benchmarks.accuracy", "--tasks", str(tasks), "--styles", "plain",
               "exact-examples-digits", "--orders", "1", "2", "--debias", "off", "empty", "label", "--strengths",
               "0.5", "1", "--floors", "0", "0.25", "--cost-per-tier", "1", "--threads", "2"]
    done = subprocess.run([*command, "--out", str(tmp_path)], cwd=repo, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "accuracy.json").read_text())
    assert list(result["styles"]) == ["plain", "exact-examples-digits"]
    assert result["styles"]["plain"]["version"] != result["styles"]["exact-examples-digits"]["version"]
    assert all(style["overall"]["n"] == 6 for style in result["styles"].values())
    grid = result["debias"]
    assert [n for n in grid if n.startswith("off")] == ["off K=1", "off K=2"]
    assert {n for n in grid if n.startswith("empty")} == {f"empty a={a} f={f} K={k}" for a in ("0.5", "1")
                                                          for f in ("0", "0.25") for k in (1, 2)}
    assert len(grid) == 2 + 2 * 8
    assert grid["off K=1"]["flip_rate"] is not None and grid["off K=2"]["flip_rate"] is None, "shuffled at K = 1"
    assert grid["off K=1"]["overall"]["accuracy"] == result["styles"]["plain"]["overall"]["accuracy"], \
        "off at K = 1 is the plain style's own pass"
    assert all(0 <= b["noul_true_rate"] <= 1 for b in grid.values())
    tokens = result["tokens"]
    assert tokens["off K=1"]["ratio_p50_prior_warm"] == 1.0
    assert tokens["empty K=1"]["tokens_p50_prior_warm"] == tokens["off K=1"]["tokens_p50_prior_warm"], \
        "a cached prior costs nothing"
    assert tokens["empty K=1"]["tokens_p50_cold"] > tokens["off K=1"]["tokens_p50_cold"]
    assert tokens["off K=2"]["tokens_p50_prior_warm"] > tokens["off K=1"]["tokens_p50_prior_warm"]
    assert result["chosen"]["pair"] in grid and set(result["cost"]) == set(tokens)
    assert sum(f["tasks"] for f in result["rule_out_of_fold"]["folds"]) == 6
    assert result["calibration"]["before"]["ece_10"] >= 0
    assert (tmp_path / "reliability-after-calibration.png").read_bytes()[:4] == b"\x89PNG"
    assert "Chosen by the rule" in (tmp_path / "accuracy.md").read_text()
    assert "| overall | 6 |" in (tmp_path / "accuracy.md").read_text()
    # The debias section re-analysed from the raw readouts (none scored again): the same figures.
    again = tmp_path / "again"
    done = subprocess.run([*command[:-4], "--raw", str(tmp_path / "raw.json.gz"), "--cost",
                           str(tmp_path / "accuracy.json"), "--out", str(again)], cwd=repo,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    redone = json.loads((again / "accuracy.json").read_text())
    assert redone["debias"] == grid
    assert redone["cost"] == result["cost"] and redone["chosen"] == result["chosen"], "the same timings, the same rule"
    assert result["chosen"]["latency"]["reference"] == "empty K=1"
    assert "timed by `" in (again / "accuracy.md").read_text()
    # Nothing timed: the rule, which weighs latency, chooses nothing rather than choosing blind.
    untimed = tmp_path / "untimed"
    done = subprocess.run([*command[:-4], "--raw", str(tmp_path / "raw.json.gz"), "--no-calibration", "--out",
                           str(untimed)], cwd=repo, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no default chosen" in done.stdout
    assert not {"chosen", "cost", "rule_out_of_fold"} & set(json.loads((untimed / "accuracy.json").read_text()))


# ---- the test suite's time ---------------------------------------------------------------------


def test_the_suite_time_sums_each_folder_and_file_from_a_junit_report(tmp_path):
    from benchmarks.suite_time import cases, markdown as suite_markdown, summary

    report = tmp_path / "report.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.cdk.test_cdk_nag" name="test_a" time="2.5"/>'
        '<testcase classname="tests.cdk.test_cdk_nag" name="test_b" time="1.5"><skipped/></testcase>'
        '<testcase classname="tests.adapter.test_adapter_prefix.TestGroup" name="test_c" time="10.0">'
        '<failure message="no"/></testcase>'
        '<testcase classname="tests.test_docs_links" name="test_d" time="0.25"/>'
        '</testsuite></testsuites>')
    found = cases(report)
    assert [c["file"] for c in found] == ["tests/cdk/test_cdk_nag.py"] * 2 + [
        "tests/adapter/test_adapter_prefix.py", "tests/test_docs_links.py"]
    result = summary(found)
    assert result["outcomes"] == {"passed": 2, "skipped": 1, "failed": 1}
    assert result["folders"] == [{"path": "tests/adapter", "tests": 1, "seconds": 10.0},
                                 {"path": "tests/cdk", "tests": 2, "seconds": 4.0},
                                 {"path": "tests/test_docs_links.py", "tests": 1, "seconds": 0.2}]
    assert result["slowest"][0] == {"test": "tests/adapter/test_adapter_prefix.py::test_c", "seconds": 10.0}
    text = suite_markdown({"command": "python -m benchmarks.suite_time", "wall_s": 12.0, "summary": result})
    assert "| tests/cdk | 2 | 4 |" in text and "wall time 12 s" in text


def test_async_long_state_grows_a_transcript_of_distinct_turns_and_reports_both_deployments():
    from benchmarks import async_long_state as bench

    turns = bench.transcript(40).splitlines()
    assert len(turns) == len(set(turns)) == 40
    assert bench.chosen({"option_ids": ["a", "b", "c"], "probabilities": [0.2, 0.5, 0.3]}) == "b (0.50)"
    assert bench.chosen({}) is None
    result = {"model": "m", "state_lines": 500, "prompt_tokens": 15993, "body_bytes": 46212, "held": True,
              "async": {"failed": False, "seconds": 120.5, "timing": {"evaluated_tokens": 16010}, "chosen": "b (0.50)",
                        "probabilities": [0.5, 0.5], "deadline_s": 3240.0},
              "realtime": {"status": 400, "seconds": 0.04, "error": "decision needs 16010 tokens of evaluation"},
              "provenance": {"load_average_1m": {"median": 1.9}}}
    table = bench.markdown(result)
    assert "| async (`invoke --async`, deadline 3240 s) | 200 | 120.5 | 16010 | b (0.50) |" in table
    assert "| realtime (deadline 55 s) | 400 | 0.04 | | decision needs 16010 tokens of evaluation |" in table
    assert "refused in real time with its 4xx: yes" in table
