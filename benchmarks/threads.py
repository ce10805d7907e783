"""`python -m benchmarks.threads`: decode time alone and while the adapter's own HTTP threads work beside it.

Each configuration (llama.cpp threads, and how its OpenMP threads wait between operations: OMP_WAIT_POLICY in the
server's environment, which libgomp reads when llama.cpp loads) is a fresh `serve` on loopback with the state cache off. A timed client sends decisions one after another, each over a state of about
``--state-tokens`` tokens it has not sent before, and reads the engine's own prefill seconds from the answer
(``timing.prefill``: the `llama_decode` calls of the job, nothing of HTTP). First alone, then while ``--load``
other clients keep sending what costs the server's HTTP threads the most CPU: a zstd body that decodes to just
under the 6 MiB limit, one decision over a ~6 MiB state, which the server decompresses, parses, validates,
renders and tokenizes before refusing it (400: the prompt is over its token limit), so it never reaches the
model. Rounds interleave the configurations; the table gives medians over all timed requests of a configuration
and their ratio under load to alone.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

import requests
import zstandard

from . import servers
from .prefill import state_text
from .provenance import KERNEL_KEYS, Provenance

CONFIGS = ("2:openmp", "2:passive", "1:openmp")
BODY_BYTES = 6 * 1024 * 1024 - 4096


def decision(state: str) -> dict:
    return {"decision": {"id": "route", "state": state, "question": "Which queue should handle this request?",
                         "options": [{"id": "account_access", "description": "Account access and authentication."},
                                     {"id": "billing", "description": "Billing and payment."},
                                     {"id": "sales", "description": "Sales and product evaluation."}]}}


def heavy_body() -> bytes:
    """A decision whose JSON decodes to just under 6 MiB (the body limit), zstd-compressed."""
    filler = "The customer wrote again about order 1234 and the refund that has not arrived yet. "
    state = (filler * (BODY_BYTES // len(filler)))[:BODY_BYTES - 1024]
    raw = json.dumps(decision(state)).encode()
    assert len(raw) < BODY_BYTES + 4096, len(raw)
    return zstandard.ZstdCompressor(level=3).compress(raw)


def timed(base: str, number: int, state_tokens: int) -> dict:
    state = f"Request {number} at {time.time_ns()}.\n" + state_text(state_tokens)
    started = time.perf_counter()
    response = requests.post(base + "/invocations", json=decision(state), timeout=120)
    response.raise_for_status()
    result = response.json()["result"]
    return {"prefill_s": result["timing"]["prefill"], "latency_s": time.perf_counter() - started,
            "tokens": result["input_tokens"]}


def load_client(base: str, body: bytes, stop: threading.Event, counts: list[int]) -> None:
    with requests.Session() as session:
        while not stop.is_set():
            response = session.post(base + "/invocations", data=body, timeout=120,
                                    headers={"Content-Type": "application/json", "Content-Encoding": "zstd"})
            if response.status_code != 400:
                raise RuntimeError(f"the heavy body got {response.status_code}, not 400: {response.text[:200]}")
            counts.append(1)


def run_config(model_dir: str, threads: int, wait: str, args: argparse.Namespace, body: bytes,
               log_dir: Path, provenance: Provenance | None = None) -> dict:
    os.environ["ADAPTER_STATE_CACHE_MB"] = "0"
    os.environ.pop("OMP_WAIT_POLICY", None)
    if wait != "openmp":  # the server inherits it; its llama.cpp loads with it
        os.environ["OMP_WAIT_POLICY"] = wait
    alone, loaded, heavy = [], [], []
    with servers.adapter(model_dir, threads, 0, log_dir / f"threads-{threads}-{wait}.log",
                         provenance=provenance) as base:
        kernels = {key: value for key, value in servers.ping(base).items() if key in KERNEL_KEYS}
        timed(base, -1, args.state_tokens)  # warm-up
        alone = [timed(base, i, args.state_tokens) for i in range(args.requests)]
        stop = threading.Event()
        clients = [threading.Thread(target=load_client, args=(base, body, stop, heavy)) for _ in range(args.load)]
        for client in clients:
            client.start()
        try:
            time.sleep(1.0)
            started, served = time.perf_counter(), len(heavy)
            loaded = [timed(base, 1000 + i, args.state_tokens) for i in range(args.requests)]
            phase_s, phase_heavy = time.perf_counter() - started, len(heavy) - served
        finally:
            stop.set()
            for client in clients:
                client.join()
    return {"alone": alone, "loaded": loaded, "heavy_requests": len(heavy), "phase_s": phase_s,
            "phase_heavy": phase_heavy, "kernels": kernels}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.threads", description=__doc__)
    parser.add_argument("--model-dir", help="GGUF folder (default: the embedded SmolLM2 model)")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), metavar="THREADS:WAIT",
                        help="llama.cpp threads, and OMP_WAIT_POLICY (openmp: unset, passive, active)")
    parser.add_argument("--state-tokens", type=int, default=300)
    parser.add_argument("--requests", type=int, default=6, help="timed requests per phase and round")
    parser.add_argument("--load", type=int, default=1, help="clients sending heavy bodies during the load phase")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write threads.json and threads.md here")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the server started here, too

    from decision_adapter.decisions.model_files import embedded_model_dir

    model_dir = args.model_dir or str(embedded_model_dir())
    body = heavy_body()
    log_dir = args.out or Path("benchmark-results")
    log_dir.mkdir(parents=True, exist_ok=True)
    configs = [(int(t), w) for t, w in (c.split(":") for c in args.configs)]
    runs: dict[str, list[dict]] = {f"{t}:{w}": [] for t, w in configs}
    # Each run names the kernels its server ran (runs[config][round]["kernels"]).
    with Provenance("benchmarks.threads", argv) as provenance:
        for round_number in range(1, args.rounds + 1):
            for threads, wait in configs:
                result = run_config(model_dir, threads, wait, args, body, log_dir, provenance)
                runs[f"{threads}:{wait}"].append(result)
                print(f"round {round_number} threads {threads} wait {wait:7s}: prefill alone "
                      f"{statistics.median(r['prefill_s'] for r in result['alone']):.3f} s, under load "
                      f"{statistics.median(r['prefill_s'] for r in result['loaded']):.3f} s "
                      f"({result['heavy_requests']} heavy bodies)", flush=True)

    rows = []
    for name, results in runs.items():
        alone = [r["prefill_s"] for result in results for r in result["alone"]]
        loaded = [r["prefill_s"] for result in results for r in result["loaded"]]
        threads, wait = name.split(":")
        rows.append({"config": name, "threads": int(threads), "wait": wait,
                     "tokens": results[0]["alone"][0]["tokens"], "alone_s": statistics.median(alone),
                     "loaded_s": statistics.median(loaded), "alone_p90_s": _p90(alone), "loaded_p90_s": _p90(loaded),
                     "heavy_per_min": 60 * sum(r["phase_heavy"] for r in results) / sum(r["phase_s"] for r in results),
                     "timed_requests": len(alone)})
    command = provenance.command
    table = markdown(rows, args, command, Path(model_dir).name)
    print(table)
    if args.out:
        record = {"command": command, "machine": platform.machine(), "cpus": len(os.sched_getaffinity(0)),
                  "model_dir": model_dir, "rows": rows, "runs": runs, "provenance": provenance.record()}
        (args.out / "threads.json").write_text(json.dumps(record, indent=1) + "\n")
        (args.out / "threads.md").write_text(table)
    return 0


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) >= 2 else values[0]


def markdown(rows: list[dict], args: argparse.Namespace, command: str, model: str) -> str:
    lines = [f"Engine prefill seconds of one decision (~{rows[0]['tokens']} tokens, model {model}, "
             f"{len(os.sched_getaffinity(0))} CPUs), alone and while {args.load} client(s) keep the server's HTTP "
             f"threads busy with ~6 MiB zstd bodies (decompress, parse, validate, tokenize, refuse); median "
             f"[90th percentile] of {rows[0]['timed_requests']} requests per phase over {args.rounds} interleaved "
             f"rounds. Reproduce: `{command}`", "",
             "| ADAPTER_THREADS | OMP_WAIT_POLICY | alone | under load | load / alone | heavy bodies / min |",
             "|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['threads']} | {r['wait']} | "
                     f"{r['alone_s']:.3f} s [{r['alone_p90_s']:.3f}] | "
                     f"{r['loaded_s']:.3f} s [{r['loaded_p90_s']:.3f}] | {r['loaded_s'] / r['alone_s']:.2f}x | "
                     f"{r['heavy_per_min']:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
