"""Scaling targets and latency thresholds, derived from the figures measured in docs/benchmarks.md.

cdk.json holds, per endpoint and instance type, ``target_invocations_per_instance`` (what target tracking keeps
each instance at, per minute) and ``model_latency_p99_ms`` (the rollback alarm's threshold). The shipped values are
the ones this module derives; ``python -m stacks.sizing`` prints them with their formulas (README, "Thresholds and
scaling targets"), and tests/cdk/test_cdk_sizing.py checks that cdk.json, README and docs/benchmarks.md agree.

What was measured (docs/benchmarks.md, "Benchmark model on this machine"): the benchmark model (491 MB GGUF) on 2
vCPUs, one decision per request on states of at most 2,000 characters; decisions per second with one client and
the slowest request (the latency table), and how p95 grows from 1 to 4 concurrent clients (the concurrency table);
the same for llama-server's generation (max_tokens 48) for the text-generation endpoint. To carry those to a
deployment, two assumptions, both to be replaced by a measurement of the deployed endpoint
(``python -m benchmarks --endpoint sagemaker:NAME``):

- the work per decision scales with the pinned GGUF's size (same quantisation family, prefill-bound), and
- throughput scales with the instance's vCPUs (llama.cpp's threads = vCPUs).

    work factor       k = (pinned GGUF bytes / 491 MB) x (2 / instance vCPUs)
    target            = floor(60 s x measured decisions/s / k x 0.7)                  invocations per instance-minute
    latency p99       = min(59 s, ceil_s(measured slowest ms x k x p95 at 4 clients / p95 at 1 client))

0.7 is the headroom: scaling holds each instance at 70 % of what it can serve, so a burst finds 30 % spare while
new instances start. The latency threshold is the slowest measured request, scaled, as it is when 4 requests queue
for one instance (the adapter runs them one after another); it is capped one second under SageMaker's 60 s
invocation timeout, past which an answer fails anyway.

GPU instances: nothing has been measured on a GPU yet (docs/benchmarks.md, "GPU, and endpoints on SageMaker"). The
GPU pools get the bound the measurements do give: the CPU path on the instance's own vCPUs. A GPU instance that
served less, or answered slower, than its host CPUs would is broken, so these thresholds catch faults, and the
targets scale the fleet out early (cost, not failures) until GPU figures replace them. Every pool then has the
same figures, so the single latency alarm and the single scaling target are those of the slowest pool.
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
LATENCY_CEILING_MS = 59_000         # SageMaker real-time invocations time out at 60 s
BENCH_MODEL_BYTES = 491_000_000     # Qwen2.5-Coder-0.5B-Instruct Q4_K_M, "491 MB"
BENCH_VCPUS = 2


@dataclass(frozen=True)
class Measured:
    """One path's figures from docs/benchmarks.md (benchmark model, 2 vCPUs)."""
    path: str                   # the row's name in the latency table
    per_second: float           # decisions (generations) per second, one client
    slowest_ms: float           # the latency table's max
    p95_one_ms: float           # the concurrency table's p95 at 1 client (slot)
    p95_four_ms: float          # ... at 4 clients (slots)

    @property
    def queueing(self) -> float:
        return self.p95_four_ms / self.p95_one_ms


DECISION = Measured("decision endpoint (logit readout)", 0.31, 7787, 1319, 4956)
GENERATION = Measured("generation (llama-server chat completion, max_tokens 48)", 0.35, 7041, 1137, 6223)
MEASURED_FOR_KIND = {"cpu": DECISION, "gpu": DECISION, "text_generation": GENERATION}


@dataclass(frozen=True)
class Sizing:
    kind: str
    instance_type: str
    k: float
    target_invocations_per_instance: int
    model_latency_p99_ms: int

    @property
    def basis(self) -> str:
        if self.kind == "gpu":
            return f"bound: the CPU path on its {instance_types.vcpus(self.instance_type)} vCPUs (no GPU measured)"
        return "measured: " + MEASURED_FOR_KIND[self.kind].path


def model_bytes(pin_name: str) -> int:
    return json.loads(MODEL_PINS.read_text())["pins"][pin_name]["bytes"]


def derive(kind: str, instance_type: str, gguf_bytes: int) -> Sizing:
    measured = MEASURED_FOR_KIND[kind]
    k = (gguf_bytes / BENCH_MODEL_BYTES) * (BENCH_VCPUS / instance_types.vcpus(instance_type))
    target = max(1, math.floor(60 * measured.per_second / k * HEADROOM))
    latency = min(LATENCY_CEILING_MS, math.ceil(measured.slowest_ms * k * measured.queueing / 1000) * 1000)
    return Sizing(kind, instance_type, k, target, latency)


def for_environment(environment: Mapping[str, Any]) -> list[Sizing]:
    """Every (endpoint kind, instance type) of a cdk.json environment, derived for its model pin."""
    gguf_bytes = model_bytes(environment["build"]["model_pin"])
    found = []
    for kind in ("cpu", "gpu", "text_generation"):
        settings = environment[kind]
        types = settings.get("instance_pools") or ([settings["instance_type"]] if "instance_type" in settings else
                                                    list(settings["target_invocations_per_instance"]))
        found += [derive(kind, instance_type, gguf_bytes) for instance_type in types]
    return found


def markdown(environments: Mapping[str, Mapping[str, Any]]) -> str:
    """README's table: every environment's figures with the work factor they come from."""
    lines = ["| environment | endpoint | instance type | k | target invocations / instance-minute | "
             "latency p99 alarm | basis |", "|---|---|---|---:|---:|---:|---|"]
    for name, environment in environments.items():
        for sizing in for_environment(environment):
            lines.append(f"| {name} | {sizing.kind} | {sizing.instance_type} | {sizing.k:.3f} | "
                         f"{sizing.target_invocations_per_instance} | {sizing.model_latency_p99_ms:,} ms | "
                         f"{sizing.basis} |")
    return "\n".join(lines)


def main() -> int:
    cdk_json = json.loads((REPOSITORY_ROOT / "cdk.json").read_text())
    print(markdown(cdk_json["context"]["environments"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
