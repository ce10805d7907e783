"""`python -m benchmarks.estimates`: how well admission foresees a request's seconds, short states and long.

Admission refuses a request for good (the non-retryable "split it" 4xx) when its work cannot be done in the time a
request may take even on an idle server, and for now (retryable) when it cannot be done before its deadline behind
the work queued. Both rest on an estimate of seconds. Before issue 35 that estimate was one mean speed (tokens over
seconds, recent jobs weighing most); now it is the cost model of ``engine/cost.py`` (tokens, ``llama_decode`` calls
and the cells attended over, fitted to the recent jobs). This runs one adapter through a sequence of requests that
one speed cannot fit: short states, long states (attention makes a token at position 3,000 dearer), one question
of 255 options (hundreds of label paths), then long and short states again. Before each request a dry run
(``x_dry_run``) reports both estimates as the server would use them: ``estimate_s`` (the cost model) and
``(queued_tokens + decode_tokens) / tokens_per_s`` (the mean speed, which the server still keeps); then the request
runs and its own ``timing`` gives the seconds it took (prefill + readout + prior). Every state is new, so nothing
is served from the cache; requests go one at a time, so nothing is queued.

Per request: its kind, tokens, both estimates, the seconds taken, each estimate's ratio to them, and whether each
rule would have refused it for good (the mean speed: its estimate over the time allowed; the cost model: what the
server answered). Per kind: the median ratio for each estimate.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Iterator

import requests

from .agent_loop import events, line
from .provenance import Provenance

QUESTION = "Given the log so far, which action should the on-call engineer take next?"
OPTIONS = (
    {"id": "inspect_logs", "description": "Read the failing service's recent error logs."},
    {"id": "rollback", "description": "Roll back the most recent deployment."},
    {"id": "page_oncall", "description": "Page the on-call engineer."},
)
# (kind, state bytes, options): short states to learn from, long ones, the heavy question, then both again.
SEQUENCE = (
    *(("short", 600 + 300 * i, 3) for i in range(6)),
    ("long", 4_000, 3), ("long", 6_000, 3), ("long", 8_000, 3),
    ("255 options", 600, 255),
    *(("long", 8_000, 3) for _ in range(3)),
    *(("short", 900, 3) for _ in range(3)),
)


def log_text(lines: Iterator[str], size: int) -> str:
    """Whole lines of the log, about ``size`` bytes of them."""
    out, total = [], 0
    while total < size:
        out.append(next(lines))
        total += len(out[-1]) + 1
    return "\n".join(out)


def body_of(state: str, options: int) -> dict[str, Any]:
    if options == len(OPTIONS):
        choices = list(OPTIONS)
    else:
        choices = [{"id": f"runbook_{i:03d}", "description": f"Follow runbook {i:03d} for the affected service."}
                   for i in range(options)]
    return {"decision": {"id": "next", "state": state, "question": QUESTION, "options": choices}}


def one(url: str, body: dict[str, Any], allowed_s: float) -> dict[str, Any]:
    """The dry run's estimates, then the real run's seconds."""
    dry = requests.post(url, json={**body, "x_dry_run": True}, timeout=600)
    dry.raise_for_status()
    report = dry.json()["dry_run"]
    by_speed = (report["queued_tokens"] + report["decode_tokens"]) / report["tokens_per_s"]
    real = requests.post(url, json=body, timeout=600)
    row = {"tokens": report["decode_tokens"], "estimate_s": report["estimate_s"], "speed_estimate_s": by_speed,
           "tokens_per_s": report["tokens_per_s"], "status": real.status_code,
           "refused_for_good": not report["admitted"] and report["status"] in (400, 422),
           "speed_would_refuse_for_good": by_speed > allowed_s}
    if real.status_code == 200:
        timing = real.json()["result"]["timing"]
        row["seconds"] = timing["prefill"] + timing["readout"] + timing.get("memory", 0.0) + timing.get("prior", 0.0)
        row["ratio"] = row["estimate_s"] / row["seconds"] if row["estimate_s"] else None
        row["speed_ratio"] = by_speed / row["seconds"]
    else:
        row["answer"] = real.json()
    return row


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind, group in itertools.groupby(sorted(rows, key=lambda r: r["kind"]), key=lambda r: r["kind"]):
        group = [r for r in group if r.get("ratio")]
        if group:
            out[kind] = {"requests": len(group),
                         "median_ratio": statistics.median(r["ratio"] for r in group),
                         "median_speed_ratio": statistics.median(r["speed_ratio"] for r in group)}
    out["refused_for_good"] = sum(r["refused_for_good"] for r in rows)
    out["speed_would_refuse_for_good"] = sum(r["speed_would_refuse_for_good"] for r in rows)
    return out


def markdown(result: dict[str, Any]) -> str:
    lines = [f"`{result['command']}` ({result['model']}, {result['threads']} threads, {result['allowed_s']:.0f} s "
             "allowed)", "",
             "| # | kind | tokens | seconds | cost model: estimate (ratio) | mean speed: estimate (ratio) | "
             "refused for good: cost model / mean speed |",
             "|---:|---|---:|---:|---:|---:|---|"]
    for i, r in enumerate(result["rows"], 1):
        seconds = f"{r['seconds']:.1f}" if "seconds" in r else f"{r['status']}"
        ratio = f" ({r['ratio']:.2f})" if r.get("ratio") else ""
        speed_ratio = f" ({r['speed_ratio']:.2f})" if r.get("speed_ratio") else ""
        lines.append(f"| {i} | {r['kind']} | {r['tokens']} | {seconds} | {r['estimate_s']:.1f}{ratio} | "
                     f"{r['speed_estimate_s']:.1f}{speed_ratio} | "
                     f"{'yes' if r['refused_for_good'] else 'no'} / {'yes' if r['speed_would_refuse_for_good'] else 'no'} |")
    lines += ["", "| kind | requests | median estimate / seconds: cost model | mean speed |", "|---|---:|---:|---:|"]
    for kind, s in result["summary"].items():
        if isinstance(s, dict):
            lines.append(f"| {kind} | {s['requests']} | {s['median_ratio']:.2f} | {s['median_speed_ratio']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.estimates", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", help="the model folder (default: the embedded model)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--gpu-layers", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmark-results"))
    args = parser.parse_args(argv)

    from decision_adapter.decisions.model_files import embedded_model_dir
    from decision_adapter.settings import Settings

    from . import servers

    model_dir = args.model_dir or str(embedded_model_dir())
    allowed_s = Settings.from_env(os.environ).request_budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    lines = map(line, events())
    rows = []
    with Provenance("benchmarks.estimates", argv) as provenance:
        with servers.adapter_process(model_dir, args.threads, args.gpu_layers, args.out / "adapter-estimates.log",
                                     env={}, provenance=provenance) as (base, _):
            for kind, size, options in SEQUENCE:
                row = {"kind": kind, **one(f"{base}/invocations", body_of(log_text(lines, size), options), allowed_s)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    result = {"model": Path(model_dir).name, "threads": args.threads, "allowed_s": allowed_s,
              "summary": summary(rows), "rows": rows, "command": provenance.command,
              "provenance": provenance.record()}
    (args.out / "estimates.json").write_text(json.dumps(result, indent=1) + "\n")
    table = markdown(result)
    (args.out / "estimates.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
