"""The benchmark harness end to end on a handful of tasks: the real adapter, llama-server and the floor.

`make bench` runs the same command on all 231 public JevBench tasks; here six tasks of our own in the
same format prove that every part of a run works and that its outputs are complete and consistent.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from decision_adapter.engine import cpu_variants

REPO = Path(__file__).resolve().parents[2]
SAMPLE = Path(__file__).with_name("tasks-sample.jsonl")


def assert_traceable(record: dict, *, kernels: bool = True, **settings) -> dict:
    """A benchmark's result names its run: the commit, the command, when, the load meanwhile, this CPU's flags, the
    adapter settings it ran with (``settings``: fields the test set) and the kernels that answered."""
    from decision_adapter.engine import cpu_variants

    provenance = record["provenance"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert provenance["commit"] == head and isinstance(provenance["dirty"], bool)
    assert provenance["command"].startswith("python -m benchmarks")
    assert provenance["started"] <= provenance["finished"]
    load = provenance["load_average_1m"]
    assert load["samples"] >= 2 and load["min"] <= load["median"] <= load["max"]
    assert set(provenance["cpu"]["flags"]) == cpu_variants.cpu_flags()
    assert provenance["cpu"]["best_variant"] == cpu_variants.best(cpu_variants.cpu_flags())
    recorded = provenance["settings"]
    assert {"layout", "cpu_variant", "debias", "permutations", "threads", "thread_wait"} <= set(recorded)
    assert "api_key" not in recorded
    for name, value in settings.items():
        assert recorded[name] == value, (name, recorded[name], value)
    if kernels:
        assert provenance["kernels"]["cpu_variant"] and provenance["kernels"]["cpu_features"]
    return provenance


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    done = subprocess.run([sys.executable, "-m", "benchmarks", "--tasks", str(SAMPLE), "--out", str(out),
                           "--threads", "2", "--shared-questions", "3"],
                          cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, done.stdout, json.loads((out / "results.json").read_text())


def test_every_task_is_answered_by_the_decision_endpoint(run):
    _, _, result = run
    overall = result["decision"]["overall"]
    assert (overall["n"], overall["answered"], overall["failures"]) == (6, 6, 0)
    assert set(result["decision"]["tiers"]) == {"easy", "original", "hard"}
    for row in result["rows"]:
        assert row["error"] is None and math.isclose(sum(row["distribution"]), 1.0, abs_tol=1e-6), row
        assert row["predicted"] in {"track_order", "cancel_order", "billing_question", "no", "yes", "0", "1", "2",
                                    "Billing", "Technical", "Sales", "currency_convert", "weather", "calculator",
                                    "web_search"}
    correct = sum(r["predicted"] == str(r["expected"]) for r in result["rows"])
    assert overall["accuracy"] == pytest.approx(correct / 6)
    assert 0 <= overall["brier"] <= 2 and 0 <= overall["ece_10"] <= 1
    latency = result["decision"]["latency"]
    assert latency["n"] == 6 and 0 < latency["p50_s"] <= latency["p95_s"] <= latency["max_s"]
    provenance = assert_traceable(result, threads=2)
    assert provenance["builds"] == {"llama-server": cpu_variants.native_cmake(cpu_variants.cpu_flags())}


def test_the_generation_baseline_ran_on_llama_server_in_the_same_run(run):
    _, _, result = run
    generation = result["generation"]
    assert result["config"]["generation"].endswith("/v1/chat/completions")
    assert generation["overall"]["n"] == 6 and generation["latency"]["n"] == 6
    assert 0 <= generation["overall"]["parse_failures"] <= 6
    assert all(isinstance(row["generation"]["reply"], str) for row in result["rows"])


def test_the_prefill_floor_and_the_shared_state_comparison_are_measured(run):
    _, _, result = run
    floor = result["prefill_floor"]
    misses = [row for row in result["rows"] if not row["cached_tokens"]]
    assert floor["tasks"] == len(misses) == floor["latency"]["n"] > 0
    assert floor["ratio_p50"] > 0 and floor["prompt_tokens_p50"] > 50
    assert all(row["floor_s"] > 0 and row["prompt_tokens"] > 0 for row in result["rows"])
    own = floor["after_resident"]
    assert own["latency"]["n"] == len(misses) and own["ratio_p50"] > 0
    # Forked from the resident prefix, the floor decodes only what the adapter itself evaluates.
    assert all(0 < row["own_tokens"] < row["prompt_tokens"] and row["own_floor_s"] > 0 for row in result["rows"])
    shared = result["shared_state"]
    assert shared["questions"] == 3 and shared["state_tokens"] > 0
    assert shared["one_request_s"] > 0 and shared["separate_requests_s"] > 0
    assert shared["speedup"] == pytest.approx(shared["separate_requests_s"] / shared["one_request_s"])


def test_the_repeated_state_comparison_runs_on_both_paths(run):
    out, _, result = run
    repeated = result["repeated_state"]
    assert repeated["decision_cached_tokens_p50"] > 0, "the new question found the state in the cache"
    for path in ("decision", "generation"):
        r = repeated[path]
        assert r["first_s"] > 0 and r["new_question_s"] > 0 and r["identical_repeat_s"] > 0
        assert r["new_question_ratio"] == pytest.approx(r["new_question_s"] / r["first_s"])
    assert "Repeated state" in (out / "results.md").read_text()


def test_outputs_are_a_json_file_a_markdown_table_and_two_png_plots(run):
    out, stdout, result = run
    assert result["command"].startswith("python -m benchmarks --tasks")
    table = (out / "results.md").read_text()
    assert "| overall | 6 |" in table and "prefill floor" in table and "Shared state: 3 questions" in table
    assert table in stdout
    for name in ("reliability.png", "latency.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name


def test_the_prefill_sweep_writes_a_row_per_size_and_length(tmp_path):
    done = subprocess.run([sys.executable, "-m", "benchmarks.prefill", "--tokens", "80", "200", "--sizes", "32", "64",
                           "--attention", "fp32", "flash", "--rounds", "1", "--threads", "2", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "prefill.json").read_text())
    assert [(r["attention"], r["batch_tokens"]) for r in result["rows"]] == [
        ("fp32", 32), ("fp32", 32), ("fp32", 64), ("fp32", 64), ("flash", 32), ("flash", 32), ("flash", 64), ("flash", 64)]
    assert all(r["median_s"] > 0 for r in result["rows"]) and result["rows"][0]["tokens"] < result["rows"][1]["tokens"]
    table = (tmp_path / "prefill.md").read_text()
    assert_traceable(result, threads=2)
    assert "| fp32 | 32 | " in table and "| flash | 64 | " in table and "(1.00x)" in table and "Reproduce: `python -m benchmarks.prefill --tokens 80" in table


def test_the_concurrency_benchmark_measures_both_paths_at_each_level(tmp_path):
    done = subprocess.run([sys.executable, "-m", "benchmarks.concurrency", "--tasks", str(SAMPLE), "--count", "4",
                           "--levels", "1", "2", "--threads", "2", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "concurrency.json").read_text())
    for level in ("1", "2"):
        for path in ("decision", "generation"):
            block = result["levels"][level][path]
            assert block["requests"] == 4 and block["failures"] == 0 and block["decisions_per_s"] > 0
            assert block["latency"]["n"] == 4
    assert result["levels"]["2"]["decision"]["wall_vs_serial"] > 0
    assert assert_traceable(result, threads=2)["builds"] == {
        "llama-server": cpu_variants.native_cmake(cpu_variants.cpu_flags())}
    assert "| 2 | " in (tmp_path / "concurrency.md").read_text()


def test_a_batch_transform_job_driven_as_sagemaker_drives_it_holds(tmp_path):
    """The shorter variant of `make bench`'s transform run: two mini-batches of distinct records, every tenth one
    that can never be answered, sent the way SageMaker sends them (GET /execution-parameters, then whole lines,
    MaxConcurrentTransforms at a time, each request failed past the invocation timeout)."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.transform", "--strategy", "MULTI_RECORD",
                           "--payload-kb", "16", "--batches", "2", "--never-fits-every", "10", "--timeout", "600",
                           "--large-record", "padded", "--threads", "2", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "transform.json").read_text())
    assert result["execution_parameters"]["MaxConcurrentTransforms"] == 1
    assert result["execution_parameters"]["BatchStrategy"] in ("MULTI_RECORD", "SINGLE_RECORD")
    batches = result["mini_batches"]
    assert len(batches) == 3 and all(b["status"] == 200 and b["on_time"] for b in batches)
    assert all(b["answered"] + b["error_lines"] == b["records"] > 10 for b in batches[:2]), "a line for every record"
    assert batches[2] == {**batches[2], "records": 1, "answered": 1}, "the record of 1.2 MB, answered"
    assert result["largest_record_bytes"] > 1 << 20 and result["records_within_max_payload"], \
        "larger than the 1 MiB once advertised, and within MaxPayloadInMB: SageMaker would not fail the job"
    assert result["error_lines"] == (result["records"] - 1) // 10, "the records that never fit, and only those"
    assert_traceable(result, threads=2, batch_timeout_s=600)
    assert result["held"] and "every mini-batch answered in time with a line per record: yes" in \
        (tmp_path / "transform.md").read_text()


def test_each_servers_own_timing_fields_are_reported_side_by_side(run):
    out, _, result = run
    servers = result["servers_own_timing"]
    assert servers["tasks"] >= 1
    ours, theirs = servers["decision"], servers["generation"]
    assert ours["prompt_tokens_p50"] > 20 and ours["prompt_s_p50"] > 0 and ours["answer_tokens"] == [0, 0]
    assert theirs["prompt_tokens_p50"] > 20 and theirs["answer_tokens"][1] >= 1, "generation spends answer tokens"
    assert servers["prompt_tokens_per_s_ratio"] > 0 and result["decision_over_generation_p50"] > 0
    rows = [r for r in result["rows"] if r["ours_timing"] and r["generation_timing"]]
    assert rows and all(r["ours_timing"]["prompt_tokens"] > 0 for r in rows)
    table = (out / "results.md").read_text()
    assert "Each server's own timing fields" in table and "| llama-server | " in table


def test_the_adapters_own_seconds_count_its_priors_job_as_its_tokens_do():
    """x_evaluated_tokens counts a prior's tokens; the seconds set beside them must count the prior's job too."""
    from benchmarks.run import own_timing

    body = {"x_evaluated_tokens": 190, "x_prior_tokens": 87,
            "x_timing": {"queue": 0.001, "prefill": 0.25, "readout": 0.05, "prior": 0.3, "total": 0.7}}
    assert own_timing(body) == {"prompt_tokens": 190, "prompt_s": 0.6, "answer_tokens": 0, "answer_s": 0.0}
    del body["x_timing"]["prior"]
    assert own_timing({**body, "x_evaluated_tokens": 103})["prompt_s"] == 0.3
    assert own_timing({"x_timing": {"total": 1.0}}) is None


def test_the_kernels_benchmark_forces_each_variant_of_the_dispatched_build(tmp_path):
    """`make bench`'s kernel comparison, on the embedded model and the dispatched build alone (the AVX2 and native
    comparison builds are compiled by `make bench`, not here): the best variant, and the baseline forced."""
    import llama_cpp

    from decision_adapter.decisions.model_files import embedded_model_dir
    from decision_adapter.engine import backends, cpu_variants

    done = subprocess.run([sys.executable, "-m", "benchmarks.kernels", "--model-dir", str(embedded_model_dir()),
                           "--builds", "dispatched", "--variants", "auto", cpu_variants.BASELINE, "--tokens", "32", "--rounds", "1",
                           "--repeats", "1", "--threads", "2", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "kernels.json").read_text())
    loaded = {r["config"]: r["variant"] for r in result["rows"]}
    # expectations from this CPU's own flags, as the dispatcher reads them: auto is the best variant the wheel ships
    shipped = backends.variant_files(Path(llama_cpp.__file__).parent / "lib")
    assert loaded[f"dispatched {cpu_variants.BASELINE}"] == cpu_variants.BASELINE
    assert loaded["dispatched auto"] == cpu_variants.best(cpu_variants.cpu_flags(), among=shipped)
    assert all(r["tokens_per_s"] > 0 for r in result["rows"])
    assert_traceable(result, kernels=False, threads=2)  # each row names the variant it ran
    assert "| dispatched auto | " in (tmp_path / "kernels.md").read_text()


def test_the_threads_benchmark_times_a_decode_alone_and_beside_busy_http_threads(tmp_path):
    done = subprocess.run([sys.executable, "-m", "benchmarks.threads", "--configs", "2:passive", "--rounds", "1",
                           "--requests", "2", "--state-tokens", "100", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    record = json.loads((tmp_path / "threads.json").read_text())
    [row] = record["rows"]
    assert_traceable(record, kernels=False, threads=2)
    assert record["runs"]["2:passive"][0]["kernels"]["cpu_variant"]
    assert row["threads"] == 2 and row["wait"] == "passive"
    assert record["provenance"]["settings"]["thread_wait"] == "passive", "the wait policy the server loaded with"
    table = (tmp_path / "threads.md").read_text()
    assert "| 2 | passive | " in table
