"""Scaling targets and latency thresholds: derived from docs/benchmarks.md's measured figures (stacks/sizing.py),
and the numbers cdk.json ships and README prints are exactly those derivations."""

from __future__ import annotations

import json
import re

import pytest

from cdk_testkit import REPOSITORY_ROOT, cdk_json_context
from stacks import instance_types, sizing

BENCHMARKS = (REPOSITORY_ROOT / "docs" / "benchmarks.md").read_text()
SECTION = BENCHMARKS.split("## Benchmark model on this machine", 1)[1].split("\n## ", 1)[0]


def table_row(label: str, section: str = SECTION) -> list[str]:
    (line,) = [line for line in section.splitlines() if line.startswith(f"| {label} |")]
    return [cell.strip() for cell in line.strip("|").split("|")][1:]


def ms(cell: str) -> float:
    return float(cell.removesuffix(" ms").replace(",", ""))


def test_the_measured_figures_are_docs_benchmarks_md():
    """A figure that changes in docs/benchmarks.md must be carried into stacks/sizing.py (and then cdk.json)."""
    heading = SECTION.split("Raw results", 1)[0]
    assert re.search(r"Q4_K_M \((\d+) MB", heading)[1] == str(sizing.BENCH_MODEL_BYTES // 1_000_000)
    assert f"{sizing.BENCH_VCPUS} vCPUs" in heading
    latency = SECTION.split("### Latency", 1)[1]
    concurrency = SECTION.split("### Concurrency", 1)[1]
    one, four = table_row("1", concurrency), table_row("4", concurrency)
    for measured, (p95_one, p95_four) in ((sizing.DECISION, (one[2], four[2])),
                                          (sizing.GENERATION, (one[6], four[6]))):
        p50, p95, slowest, per_second = table_row(measured.path, latency)
        assert (float(per_second), ms(slowest)) == (measured.per_second, measured.slowest_ms), measured.path
        assert (ms(p95_one), ms(p95_four)) == (measured.p95_one_ms, measured.p95_four_ms), measured.path


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_cdk_json_ships_the_derived_targets_and_thresholds(env):
    environment = cdk_json_context()["environments"][env]
    derived = sizing.for_environment(environment)
    assert derived
    for row in derived:
        settings = environment[row.kind]
        assert settings["target_invocations_per_instance"][row.instance_type] == \
            row.target_invocations_per_instance, (env, row)
        assert settings["model_latency_p99_ms"][row.instance_type] == row.model_latency_p99_ms, (env, row)
    for kind in ("cpu", "gpu", "text_generation"):
        types = {row.instance_type for row in derived if row.kind == kind}
        assert set(environment[kind]["target_invocations_per_instance"]) == types
        assert set(environment[kind]["model_latency_p99_ms"]) == types


def test_readme_prints_the_derivation():
    readme = (REPOSITORY_ROOT / "README.md").read_text()
    assert sizing.markdown(cdk_json_context()["environments"]) in readme


def test_the_formulas():
    gguf = sizing.model_bytes("qwen3.5-4b")
    assert gguf == json.loads((REPOSITORY_ROOT / "model_build" / "pins.json").read_text())["pins"]["qwen3.5-4b"]["bytes"]
    small, large = sizing.derive("cpu", "ml.c7i.2xlarge", gguf), sizing.derive("cpu", "ml.c7i.4xlarge", gguf)
    assert large.k == pytest.approx(small.k / 2)
    assert large.target_invocations_per_instance >= 2 * small.target_invocations_per_instance - 1
    assert large.model_latency_p99_ms < small.model_latency_p99_ms
    # The worked numbers of README: 8 vCPUs, the 4B pin.
    k = gguf / 491e6 * 2 / 8
    assert small.k == pytest.approx(k)
    assert small.target_invocations_per_instance == int(60 * 0.31 / k * 0.7)
    assert small.model_latency_p99_ms == -(-7787 * k * 4956 / 1319 // 1000) * 1000
    # Capped under SageMaker's 60 s invocation timeout; never below one invocation a minute.
    tiny = sizing.derive("cpu", "ml.c7i.large", gguf * 10)
    assert tiny.model_latency_p99_ms == 59_000 and tiny.target_invocations_per_instance == 1


def test_gpu_pools_get_the_bound_of_their_host_cpus():
    gguf = sizing.model_bytes("qwen3.5-4b")
    for pool in ("ml.g6e.xlarge", "ml.g4dn.xlarge", "ml.g5.2xlarge"):
        gpu = sizing.derive("gpu", pool, gguf)
        cpu_path = sizing.derive("cpu", f"ml.c7i.{pool.split('.')[2]}", gguf)
        assert instance_types.vcpus(pool) == instance_types.vcpus(cpu_path.instance_type)
        assert (gpu.target_invocations_per_instance, gpu.model_latency_p99_ms) == (
            cpu_path.target_invocations_per_instance, cpu_path.model_latency_p99_ms)
        assert "no GPU measured" in gpu.basis
