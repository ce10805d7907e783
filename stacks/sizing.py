"""Scaling targets, the slow-release threshold and the storage volume, derived from measured figures and the model.

cdk.json holds, per endpoint and instance type, ``target_invocations_per_instance`` (what target tracking keeps
each instance at, per minute): the value this module derives, which ``python -m stacks.sizing`` prints with its
formula (docs/deploy.md, "Thresholds and scaling targets"); tests/cdk/test_cdk_sizing.py checks that cdk.json,
docs/deploy.md and docs/benchmarks.md agree. The stacks derive the other two themselves, from the pinned model: the
adapter's slow-release threshold (compute time per evaluated token) and the storage volume of EBS-backed instances.

What was measured (docs/benchmarks.md, "Benchmark model on this machine"): the benchmark model (491 MB GGUF) with 2
llama.cpp threads on 2 cores, one decision per request on states of at most 2,000 characters; decisions per second
with one client (the latency table), about 67 tokens/s of prefill, and the same for llama-server's generation
(max_tokens 48) for the text-generation endpoint. To carry those to a deployment, two assumptions, both to be
replaced by a measurement of the deployed endpoint (``python -m benchmarks --endpoint sagemaker:NAME``):

- the work per decision, and per token, scales with the pinned GGUF's size (same quantisation family), and
- throughput scales with llama.cpp's threads, which are the instance's physical cores (one thread per core: a
  second on the other hyperthread of a core only adds synchronisation; docs/adapter.md, "CPU kernels and threads").

    work factor       k = (pinned GGUF bytes / 491 MB) x (2 / instance physical cores)
    target            = floor(60 s x measured decisions/s / k x 0.7)                  invocations per instance-minute
    slow release      = ceil(1000 ms / 67 tokens/s x k x 1.5)                         ms per evaluated token

0.7 is the headroom: scaling holds each instance at 70 % of what it can serve, so a burst finds 30 % spare while
new instances start. The slow-release threshold is 1.5 times the derived compute per token, so that a release that
computes at half that speed (2x per token) rolls back (tests/cdk/test_cdk_rollback_alarms.py derives it from the
alarms as synthesized) while load does not: the engine runs one job at a time, so queueing adds nothing to a job's
own compute, and at 16 concurrent clients the same work took 1.00x the wall time of one client (docs/benchmarks.md,
"Concurrency"). What stays above it: the server's own threads parsing 6 MiB bodies slowed llama.cpp by up to 2.28x
on 2 cores (docs/adapter.md, "CPU kernels and threads"), so a sustained flood of the largest bodies during a bake
can roll a healthy release back on a 2-core instance; and the threshold is only as good as the derived speed
(the two assumptions above) until the deployed endpoint is measured. It must stay reachable: a request of the
fewest tokens the metric counts (metric_logs.MIN_TIMED_TOKENS) computed at the threshold still finishes before the
adapter's deadline (tests/cdk check it); a job that runs into its deadline is measured too (metric_logs).

GPU instances: nothing has been measured on a GPU yet (docs/benchmarks.md, "GPU, and endpoints on SageMaker"). The
GPU pools get the bound the measurements do give: the CPU path on the instance's own cores. A GPU instance that
served less, or computed slower, than its host CPUs would is broken, so these figures catch faults, and the
targets scale the fleet out early (cost, not failures) until GPU figures replace them. Every pool then has the
same figures, so the single scaling target and threshold are those of the slowest pool.

Storage: an EBS-backed instance (no local NVMe) gets a volume of ``storage_gib``: SageMaker downloads the model
archive (a gzip of the GGUF, which hardly compresses: as large as the GGUF) onto it and extracts the GGUF beside
it, so the model takes twice its bytes; the volume is sized so that they fill at most half of it, far below the
DiskUtilization alarm's 85 %. The default volume of an instance type is smaller the smaller the instance.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from stacks import instance_types

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
MODEL_PINS = REPOSITORY_ROOT / "model_build" / "pins.json"

HEADROOM = 0.7
BENCH_MODEL_BYTES = 491_000_000     # Qwen2.5-Coder-0.5B-Instruct Q4_K_M, "491 MB"
BENCH_THREADS = 2                   # llama.cpp threads, one per core of the 2-core machine
PREFILL_TOKENS_PER_S = 67           # "About 67 tokens/s of prefill here"
SLOW_RELEASE_FACTOR = 1.5           # below a release 2x slower per token, above load at concurrency (1.00x)
MODEL_SHARE_OF_VOLUME = 0.5         # the archive and the extracted GGUF fill at most this much of the volume
MAX_VOLUME_GIB = 512                # ProductionVariant.VolumeSizeInGB: 1..512


@dataclass(frozen=True)
class Measured:
    """One path's figures from docs/benchmarks.md (benchmark model, 2 threads on 2 cores)."""
    path: str                   # the row's name in the latency table
    per_second: float           # decisions (generations) per second, one client


DECISION = Measured("decision endpoint (logit readout)", 0.31)
GENERATION = Measured("generation (llama-server chat completion, max_tokens 48)", 0.35)
MEASURED_FOR_KIND = {"cpu": DECISION, "gpu": DECISION, "text_generation": GENERATION}


@dataclass(frozen=True)
class Sizing:
    kind: str
    instance_type: str
    k: float
    target_invocations_per_instance: int
    slow_release_ms_per_token: int | None       # the adapter's kinds only (llama-server logs no compute time)

    @property
    def basis(self) -> str:
        cores = instance_types.physical_cores(self.instance_type)
        if self.kind == "gpu":
            return f"bound: the CPU path on its {cores} cores (no GPU measured)"
        return f"measured: {MEASURED_FOR_KIND[self.kind].path}, {cores} threads"


def model_bytes(pin_name: str, gguf_sha256: str | None = None) -> int:
    """The GGUF's bytes of a pin of model_build/pins.json (checked against ``gguf_sha256`` when given)."""
    pins = json.loads(MODEL_PINS.read_text())["pins"]
    if pin_name not in pins:
        raise KeyError(f"{pin_name!r} is not a pin of model_build/pins.json ({', '.join(sorted(pins))})")
    pin = pins[pin_name]
    if gguf_sha256 is not None and pin["sha256"] != gguf_sha256:
        raise KeyError(f"pin {pin_name!r} of model_build/pins.json has sha256 {pin['sha256'][:12]}..., not "
                       f"{gguf_sha256[:12]}...")
    return pin["bytes"]


def work_factor(instance_type: str, gguf_bytes: int) -> float:
    return (gguf_bytes / BENCH_MODEL_BYTES) * (BENCH_THREADS / instance_types.physical_cores(instance_type))


def ms_per_token(instance_type: str, gguf_bytes: int) -> float:
    """The compute time per evaluated token derived for a healthy release (milliseconds)."""
    return 1000 / PREFILL_TOKENS_PER_S * work_factor(instance_type, gguf_bytes)


def tokens_per_decision() -> float:
    """The tokens a measured decision evaluated: the measured prefill speed over decisions per second."""
    return PREFILL_TOKENS_PER_S / DECISION.per_second


def slow_release_ms_per_token(instance_type: str, gguf_bytes: int) -> int:
    """The compute time per evaluated token above which a release is too slow (milliseconds, whole)."""
    return math.ceil(ms_per_token(instance_type, gguf_bytes) * SLOW_RELEASE_FACTOR)


def storage_gib(gguf_bytes: int) -> int:
    """VolumeSizeInGB for an EBS-backed instance serving a GGUF of gguf_bytes: the archive and the extracted file
    fill at most MODEL_SHARE_OF_VOLUME of it."""
    needed = 2 * gguf_bytes / MODEL_SHARE_OF_VOLUME
    gib = math.ceil(needed / 2**30)
    if gib > MAX_VOLUME_GIB:
        raise ValueError(f"a {gguf_bytes:,}-byte model needs {gib} GiB, more than SageMaker's {MAX_VOLUME_GIB}")
    return gib


def derive(kind: str, instance_type: str, gguf_bytes: int) -> Sizing:
    measured = MEASURED_FOR_KIND[kind]
    k = work_factor(instance_type, gguf_bytes)
    target = max(1, math.floor(60 * measured.per_second / k * HEADROOM))
    slow = slow_release_ms_per_token(instance_type, gguf_bytes) if kind != "text_generation" else None
    return Sizing(kind, instance_type, k, target, slow)


def for_environment(environment: Mapping[str, Any], environments: Mapping[str, Mapping[str, Any]]) -> list[Sizing]:
    """Every (endpoint kind, instance type) of a cdk.json environment, derived for its model pin: its build's, or
    that of the environment it takes its artifacts from."""
    builder = environments[environment["artifacts_from"]] if environment.get("artifacts_from") else environment
    gguf_bytes = model_bytes(builder["build"]["model_pin"])
    found = []
    for kind in ("cpu", "gpu", "text_generation"):
        settings = environment[kind]
        types = settings.get("instance_pools") or ([settings["instance_type"]] if "instance_type" in settings else
                                                    list(settings["target_invocations_per_instance"]))
        found += [derive(kind, instance_type, gguf_bytes) for instance_type in types]
    return found


def markdown(environments: Mapping[str, Mapping[str, Any]]) -> str:
    """docs/deploy.md's table ("Thresholds and scaling targets"): every environment's figures with the work factor
    they come from."""
    lines = ["| environment | endpoint | instance type | k | target invocations / instance-minute | "
             "slow release (ms per evaluated token) | basis |", "|---|---|---|---:|---:|---:|---|"]
    for name, environment in environments.items():
        for sizing in for_environment(environment, environments):
            slow = "-" if sizing.slow_release_ms_per_token is None else f"{sizing.slow_release_ms_per_token:,}"
            lines.append(f"| {name} | {sizing.kind} | {sizing.instance_type} | {sizing.k:.3f} | "
                         f"{sizing.target_invocations_per_instance} | {slow} | {sizing.basis} |")
    return "\n".join(lines)


def main() -> int:
    cdk_json = json.loads((REPOSITORY_ROOT / "cdk.json").read_text())
    print(markdown(cdk_json["context"]["environments"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
