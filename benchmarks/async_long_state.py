"""`python -m benchmarks.async_long_state`: a decision over a long state (16,000 tokens by default) answered through
`python -m endpoint_client invoke --async` against the adapter in its async mode, and the same body sent to the
adapter deployed for real time (issue 48).

An agent's transcript of that size takes longer than a real-time invocation's 60 s on a CPU instance: the real-time
adapter (``ADAPTER_DEPLOYMENT=realtime``, its 55 s deadline) refuses it at once with its usual 4xx, which names
what it needs, while the asynchronous one (``ADAPTER_DEPLOYMENT=async``, 90% of ``ADAPTER_ASYNC_TIMEOUT_S``)
answers it. The asynchronous call goes through ``endpoint_client.invoke_async.invoke_local``, which plays SageMaker's
side (the body read from input/, sent to ``/invocations`` with its InferenceId, the answer written to output/):
the queue, the S3 transfer and the scale from zero are a real account's, not measured here.

The state's size is set from the model's own count: a dry run (nothing decoded) of a first state tells the tokens
per line, and the state is grown to ``--state-tokens``. The two servers run one after the other, never together.
Writes async-long-state.json and .md to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import requests

from .provenance import Provenance

QUESTION = "Which team should take over this conversation now?"
OPTIONS = [{"id": "billing", "description": "Payments, invoices and refunds."},
           {"id": "shipping", "description": "Parcels, delivery and returns."},
           {"id": "technical", "description": "Bugs, errors and outages in the product."},
           {"id": "sales", "description": "Quotes, plans and new orders."}]
TOPICS = ["the export to CSV fails with error {n}", "invoice {n} was charged twice", "parcel {n} has not arrived",
          "the app crashes on start after update {n}", "a quote for {n} seats is needed by Friday",
          "the password reset email for account {n} never came"]


def transcript(lines: int) -> str:
    """An agent's conversation with a customer, ``lines`` turns long, every turn different."""
    speakers = ("Customer", "Agent")
    return "\n".join(f"[turn {i}] {speakers[i % 2]}: about case {1000 + i}, " + TOPICS[i % len(TOPICS)].format(n=i * 7)
                     + (". Anything else?" if i % 2 else ". Please help.") for i in range(lines))


def body(lines: int, *, dry_run: bool = False) -> dict:
    decision = {"id": "transcript", "state": transcript(lines), "question": QUESTION, "options": OPTIONS}
    return {"decision": decision, **({"x_dry_run": True} if dry_run else {})}


def prompt_tokens(base: str, lines: int) -> int:
    response = requests.post(f"{base}/invocations", json=body(lines, dry_run=True), timeout=120)
    response.raise_for_status()
    return response.json()["dry_run"]["prompt_tokens"]


def lines_for(base: str, target: int) -> tuple[int, int]:
    """The number of turns whose prompt is closest to ``target`` tokens without passing it, and its tokens."""
    probe = 200
    per_line = prompt_tokens(base, probe) / probe
    lines = max(1, int(target / per_line))
    tokens = prompt_tokens(base, lines)
    while tokens > target:
        lines -= max(1, int((tokens - target) / per_line))
        tokens = prompt_tokens(base, lines)
    return lines, tokens


def server_env(deployment: str, args: argparse.Namespace) -> dict[str, str]:
    limit = str(args.state_tokens + 2048)
    return {"ADAPTER_DEPLOYMENT": deployment, "ADAPTER_ASYNC_TIMEOUT_S": str(args.async_timeout),
            "ADAPTER_MAX_PROMPT_TOKENS": limit, "ADAPTER_CTX_TOKENS": str(int(limit) + 1024),
            "ADAPTER_PERMUTATIONS": "1"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.async_long_state", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", help="the model folder (default: the benchmark model, make bench-model)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--state-tokens", type=int, default=16_000, help="the prompt's tokens (default 16,000)")
    parser.add_argument("--async-timeout", type=int, default=3600, help="ADAPTER_ASYNC_TIMEOUT_S (default 3600)")
    parser.add_argument("--out", type=Path, default=Path("benchmark-results"))
    args = parser.parse_args(argv)

    from endpoint_client.invoke_async import invoke_local

    from . import bench_model, servers

    model_dir = args.model_dir or str(bench_model.ensure())
    args.out.mkdir(parents=True, exist_ok=True)
    with Provenance("benchmarks.async_long_state", argv) as provenance:
        with servers.adapter_process(model_dir, args.threads, 0, args.out / "async-adapter.log",
                                     env=server_env("async", args), provenance=provenance) as (base, _):
            lines, tokens = lines_for(base, args.state_tokens)
            request = body(lines)
            with tempfile.TemporaryDirectory() as calls:
                answer = invoke_local(base, Path(calls), body=json.dumps(request).encode(),
                                      content_type="application/json", accept="application/json",
                                      inference_id="async-long-state", invocation_timeout_s=args.async_timeout)
        answered = json.loads(answer.body)
        with servers.adapter_process(model_dir, args.threads, 0, args.out / "realtime-adapter.log",
                                     env=server_env("realtime", args), provenance=provenance) as (base, _):
            started = time.monotonic()
            refused = requests.post(f"{base}/invocations", json=request, timeout=120)
            refused_s = time.monotonic() - started
    result = {
        "model": Path(model_dir).name, "state_lines": lines, "prompt_tokens": tokens, "body_bytes":
            len(json.dumps(request)),
        "async": {"failed": answer.failed, "seconds": round(answer.waited_s, 1),
                  "timing": answered.get("result", {}).get("timing"),
                  "chosen": chosen(answered.get("result", {})),
                  "probabilities": answered.get("result", {}).get("probabilities"),
                  "deadline_s": 0.9 * args.async_timeout},
        "realtime": {"status": refused.status_code, "seconds": round(refused_s, 2),
                     "error": refused.json().get("error") if refused.headers.get("Content-Type", "").startswith(
                         "application/json") else refused.text[:300]},
        "held": not answer.failed and refused.status_code == 400,
        "command": provenance.command, "provenance": provenance.record()}
    (args.out / "async-long-state.json").write_text(json.dumps(result, indent=1) + "\n")
    table = markdown(result)
    (args.out / "async-long-state.md").write_text(table)
    print(table)
    return 0 if result["held"] else 1


def chosen(result: dict) -> str | None:
    """The option the answer puts first, with its probability."""
    ids, probabilities = result.get("option_ids"), result.get("probabilities")
    if not ids or not probabilities:
        return None
    best = max(range(len(ids)), key=probabilities.__getitem__)
    return f"{ids[best]} ({probabilities[best]:.2f})"


def markdown(result: dict) -> str:
    a, r = result["async"], result["realtime"]
    timing = a["timing"] or {}
    return "\n".join([
        f"A decision over {result['prompt_tokens']:,} prompt tokens ({result['state_lines']} turns, "
        f"{result['body_bytes']:,} bytes), model {result['model']}:", "",
        "| deployment | status | seconds | evaluated tokens | what it said |",
        "|---|---|---:|---:|---|",
        f"| async (`invoke --async`, deadline {a['deadline_s']:.0f} s) | {'failed' if a['failed'] else '200'} | "
        f"{a['seconds']} | {timing.get('evaluated_tokens', '')} | {a['chosen']} |",
        f"| realtime (deadline 55 s) | {r['status']} | {r['seconds']} | | {r['error']} |", "",
        f"Answered asynchronously and refused in real time with its 4xx: {'yes' if result['held'] else 'NO'}. "
        f"Load average (1 min) during the run: median {result['provenance']['load_average_1m']['median']:.1f}.",
        ""])


if __name__ == "__main__":
    sys.exit(main())
