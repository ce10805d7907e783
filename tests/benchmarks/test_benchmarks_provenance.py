"""benchmarks/provenance.py, without a model: what a run's record says, typed as the adapter reads its settings,
never the API key; and that every benchmark entry point goes through it (one definition, no copies).

The benchmarks' own records are checked end to end by test_benchmarks_run.py's ``assert_traceable``."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from benchmarks import provenance, servers
from benchmarks.provenance import Provenance
from decision_adapter.engine import cpu_variants
from decision_adapter.settings import Settings

REPO = Path(__file__).resolve().parents[2]
REQUIRED = {"layout", "cpu_variant", "debias", "permutations", "threads", "thread_wait"}


def test_a_short_run_names_its_commit_command_times_load_and_cpu():
    with Provenance("benchmarks.prefill", ["--tokens", "80", "--out", "a folder"], interval_s=0.05) as run:
        run.ran_with(Settings(model_dir="/models/m", threads=2))
    record = run.record()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert record["commit"] == head and isinstance(record["dirty"], bool)
    assert record["command"] == "python -m benchmarks.prefill --tokens 80 --out 'a folder'"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", record["started"])
    assert record["started"] <= record["finished"] and record["seconds"] >= 0
    load = record["load_average_1m"]
    assert load["samples"] >= 2 and load["min"] <= load["median"] <= load["max"]  # the start and the finish
    assert set(record["cpu"]["flags"]) == cpu_variants.cpu_flags() and record["cpu"]["flags"] == sorted(
        record["cpu"]["flags"])
    assert record["cpu"]["best_variant"] == cpu_variants.best(cpu_variants.cpu_flags())
    assert REQUIRED <= set(record["settings"]) and record["settings"]["threads"] == 2
    assert "kernels" not in record and record["builds"] == {}
    assert run.record() == record, "the first record() stamps the finish; later ones repeat it"
    json.dumps(record)


def test_a_server_environment_is_read_as_serve_reads_it_and_the_key_never_written():
    environ = servers._adapter_environ(8123, "/models/m", 2, 0, {
        "ADAPTER_BATCH_TIMEOUT_S": "600", "ADAPTER_DEPLOYMENT": "transform", "ADAPTER_API_KEY": "sk-do-not-write"})
    with Provenance("benchmarks.transform", []) as run:
        run.served(environ, {"status": "ready", "detail": "x", "cpu_variant": "haswell", "cpu_features": ["AVX2"]})
        run.built("llama-server", "-DGGML_NATIVE=ON")
    record = run.record()
    settings = record["settings"]
    assert settings["threads"] == 2 and settings["batch_timeout_s"] == 600 and settings["deployment"] == "transform"
    assert settings["debias"] == Settings().debias, "what the server was not given is the adapter's default"
    assert "api_key" not in settings and "port" not in settings
    assert "sk-do-not-write" not in json.dumps(record)
    assert record["kernels"] == {"cpu_variant": "haswell", "cpu_features": ["AVX2"]}
    assert record["builds"] == {"llama-server": "-DGGML_NATIVE=ON"}
    assert record["command"] == "python -m benchmarks.transform"


def test_settings_that_differ_between_the_models_of_a_run_are_listed_and_named():
    from decision_adapter.startup import Experiment

    base = Settings(model_dir="/models/m", threads=2)
    with Provenance("benchmarks.layout", []) as run:
        for layout in ("exact", "fused", "exact"):
            run.ran_with(base, experiment=Experiment(layout=layout))
    record = run.record()
    assert record["settings"]["layout"] == ["exact", "fused"] and record["varied"] == ["layout"]
    assert record["settings"]["threads"] == 2 and record["settings"]["prompt_style"] == "lean"


def test_the_wait_policy_is_what_the_environment_gave_openmp():
    with Provenance("benchmarks.threads", []) as run:
        run.ran_with(environ={"ADAPTER_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"})
        run.ran_with(environ={"ADAPTER_THREADS": "2"})
    record = run.record()
    assert record["settings"]["thread_wait"] == ["passive", "openmp"] and record["varied"] == ["thread_wait"]


def test_a_decision_endpoint_started_elsewhere_has_unknown_settings_not_the_defaults():
    with Provenance("benchmarks", ["--endpoint", "sagemaker:x"]) as run:
        run.ran_elsewhere("sagemaker:x")
    settings = run.record()["settings"]
    assert settings["endpoint"] == "sagemaker:x" and REQUIRED <= set(settings)
    assert all(settings[name] is None for name in REQUIRED) and "api_key" not in settings


def test_the_llama_server_build_names_its_flags_without_building():
    environ = {k: v for k, v in os.environ.items() if k != "LLAMA_SERVER_CMAKE_ARGS"}
    script = str(REPO / "benchmarks" / "build-llama-server.sh")
    done = subprocess.run([script, "--flags"], capture_output=True, text=True, env=environ, timeout=60)
    assert done.stdout == cpu_variants.native_cmake(cpu_variants.cpu_flags()) + "\n", done.stderr
    done = subprocess.run([script, "--flags"], capture_output=True, text=True, timeout=60,
                          env={**environ, "LLAMA_SERVER_CMAKE_ARGS": "-DGGML_CUDA=ON"})
    assert done.stdout == "-DGGML_CUDA=ON\n", done.stderr


def test_every_benchmark_entry_point_names_its_run_through_the_one_module():
    modules = sorted((REPO / "benchmarks").glob("*.py"))
    entry_points = [p for p in modules if 'if __name__ == "__main__"' in p.read_text()]
    assert len(entry_points) >= 9
    for path in entry_points:
        if path.name in ("bench_model.py", "hybrid_model.py"):  # assemble test models, measure nothing
            continue
        text = path.read_text()
        module = "benchmarks" if path.name == "__main__.py" else f"benchmarks.{path.stem}"
        assert f'Provenance("{module}", argv)' in text, path.name
    for path in modules:  # no copies: the commit is looked up in one place
        assert path.name == "provenance.py" or "rev-parse" not in path.read_text(), path.name
    assert provenance.SECRET == {"api_key"}
