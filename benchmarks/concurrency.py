"""`python -m benchmarks.concurrency`: decisions per second and latency under concurrent clients.

The same tasks, sent by 1, 4 and 16 concurrent clients (each client takes the next task until none is left),
to the decision adapter and to llama-server generating the answer with as many slots as clients (continuous
batching on), in one run. Every level sends states no server has seen before (a first line of their own), so
neither the adapter's state cache nor llama-server's prompt cache carries work from one level to the next.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import threading
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from . import generation
from .clients import EndpointError, HttpEndpoint
from .metrics import latency_summary
from .provenance import Provenance
from .run import _unseen
from .tasks import DEFAULT_TASKS, Task, load

LEVELS = (1, 4, 16)


def measure(call: Callable[[Task], Any], tasks: list[Task], clients: int) -> dict[str, Any]:
    """Wall time and per-request latency for ``tasks`` sent by ``clients`` threads; failures are counted."""
    pending = list(reversed(tasks))
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()

    def client() -> None:
        while True:
            try:
                task = pending.pop()
            except IndexError:
                return
            started = time.perf_counter()
            try:
                call(task)
                with lock:
                    latencies.append(time.perf_counter() - started)
            except (EndpointError, KeyError, ValueError) as exc:
                with lock:
                    failures.append(str(exc)[:200])

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(client) for _ in range(clients)]:
            future.result()
    wall = time.perf_counter() - started
    return {"clients": clients, "requests": len(tasks), "failures": len(failures), "failure_samples": failures[:3],
            "wall_s": wall,
            "decisions_per_s": len(latencies) / wall, "latency": latency_summary(latencies)}


def run(tasks: list[Task], model_dir: str, threads: int, gpu_layers: int, levels: tuple[int, ...],
        out: Path, generation_baseline: bool = True, provenance: Provenance | None = None) -> dict[str, Any]:
    from .servers import adapter, llama_server
    from decision_adapter.decisions.model_files import find_gguf

    result: dict[str, Any] = {"tasks": len(tasks), "threads": threads, "gpu_layers": gpu_layers, "levels": {}}
    with adapter(model_dir, threads, gpu_layers, out / "adapter-concurrency.log", provenance=provenance) as base:
        ours = HttpEndpoint(f"{base}/v1/systemone")
        for level in levels:
            batch = [replace(t, state=_unseen(t.state, 1000 + level)) for t in tasks]
            result["levels"].setdefault(str(level), {})["decision"] = measure(
                lambda t: ours.call(t.system_one()), batch, level)
            print(f"decision, {level:2d} clients: {result['levels'][str(level)]['decision']['decisions_per_s']:.2f}/s",
                  flush=True)
    if generation_baseline:
        gguf = str(find_gguf(model_dir))
        for level in levels:
            with contextlib.ExitStack() as stack:
                base = stack.enter_context(llama_server(gguf, threads, gpu_layers, out / f"llama-server-{level}.log",
                                                        ctx_tokens=8192 * level, parallel=level,
                                                        provenance=provenance))
                chat = HttpEndpoint(f"{base}/v1/chat/completions")
                batch = [replace(t, state=_unseen(t.state, 2000 + level)) for t in tasks]
                result["levels"][str(level)]["generation"] = measure(
                    lambda t: chat.call(generation.request(t)), batch, level)
                print(f"generation, {level:2d} slots: "
                      f"{result['levels'][str(level)]['generation']['decisions_per_s']:.2f}/s", flush=True)
    serial = result["levels"].get("1", {}).get("decision")
    for block in result["levels"].values():
        if serial and "decision" in block:
            block["decision"]["speedup_vs_one_client"] = block["decision"]["decisions_per_s"] / serial["decisions_per_s"]
            block["decision"]["wall_vs_serial"] = block["decision"]["wall_s"] / serial["wall_s"]
    return result


def markdown(result: dict[str, Any], command: str) -> str:
    lines = [f"{result['tasks']} tasks per level, {result['threads']} threads, {result['gpu_layers']} GPU layers. "
             f"Reproduce: `{command}`", "",
             "| clients | decision/s | p50 | p95 | wall / one client | generation/s (slots = clients) | p50 | p95 |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for level, block in result["levels"].items():
        d, g = block.get("decision"), block.get("generation")
        cells = [level]
        cells += [f"{d['decisions_per_s']:.2f}", _ms(d["latency"]["p50_s"]), _ms(d["latency"]["p95_s"]),
                  f"{d.get('wall_vs_serial', 1.0):.2f}"] if d else ["-"] * 4
        cells += [f"{g['decisions_per_s']:.2f}", _ms(g["latency"]["p50_s"]), _ms(g["latency"]["p95_s"])] if g \
            else ["-"] * 3
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:.0f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.concurrency", description=__doc__)
    parser.add_argument("--tasks", nargs="+", type=Path, default=[DEFAULT_TASKS])
    parser.add_argument("--count", type=int, default=48, help="tasks per level: the shortest prompts first")
    parser.add_argument("--levels", type=int, nargs="+", default=list(LEVELS))
    parser.add_argument("--model-dir", help="GGUF folder (default: the embedded SmolLM2 model)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--gpu-layers", type=int, default=0)
    parser.add_argument("--no-generation", dest="generation", action="store_false")
    parser.add_argument("--out", type=Path, default=Path("benchmark-results"))
    args = parser.parse_args(argv)

    from decision_adapter.decisions.model_files import embedded_model_dir

    tasks = sorted(load(args.tasks), key=lambda t: len(json.dumps(t.state)) + len(json.dumps(t.question)))
    tasks = tasks[:args.count]
    args.out.mkdir(parents=True, exist_ok=True)
    with Provenance("benchmarks.concurrency", argv) as provenance:
        result = run(tasks, args.model_dir or str(embedded_model_dir()), args.threads, args.gpu_layers,
                     tuple(args.levels), args.out, args.generation, provenance)
    result["command"] = provenance.command
    result["provenance"] = provenance.record()
    (args.out / "concurrency.json").write_text(json.dumps(result, indent=1) + "\n")
    table = markdown(result, provenance.command)
    (args.out / "concurrency.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
