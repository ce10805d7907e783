"""`python -m benchmarks.checkpoints`: which boundaries of a saved state keep a checkpoint, by memory and by waste.

On a memory a cut cannot bring back (a sliding window, a recurrent state: ``engine.memory_kind``), a saved state
serves as a prefix only at the boundaries it kept a checkpoint at, and each checkpoint costs host memory (a window of
cells, or a recurrent state). This runs the agent loop of ``benchmarks.agent_loop`` (the same seeded event log,
steps growing) in-process, once per rule of ``engine.plan.kept_boundaries`` (``every`` boundary, the ``last`` two,
``spaced``: the last three, then powers of two back), then one more step whose log was edited early on (an event
near ``--edit-at`` of the way in changed): per step the state tokens decoded, the cache's bytes and the checkpoints'
share of them, and the seconds (decodes, memory steps). The loop shows what growth needs (the last boundary or
two); the edited step shows what an earlier checkpoint saves when a state changes in the middle.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import agent_loop
from .provenance import Provenance

POLICIES = ("every", "last", "spaced")


def run_policy(model, steps: list[agent_loop.Step], edited: dict[str, Any]) -> list[dict[str, Any]]:
    """Every step on ``model`` (one warm server: its cache kept), then the edited step; each step's figures."""
    from decision_adapter.protocols import decision_schema
    from decision_adapter.protocols.fields import RequestContext

    rows = []
    bodies = [(f"step {s.step}", s.body) for s in steps] + [("edited", edited)]
    for name, body in bodies:
        decisions, _ = decision_schema.parse(body, RequestContext.of(model, max_decisions=1))
        prepared = model.prepare([d.question for d in decisions])
        started = time.perf_counter()
        answered = model.score(prepared)
        wall = time.perf_counter() - started
        stats, cache = answered.stats, model.engine.cache
        state = prepared.state[1] - prepared.state[0]
        rows.append({"step": name, "state_tokens": state, "cached_tokens": stats.cached_tokens,
                     "state_decoded": stats.shared_tokens, "decoded_tokens": stats.evaluated_tokens,
                     "decoded_fraction": stats.evaluated_tokens / (len(prepared.tokens[0]) - prepared.state[0]),
                     "compute_s": stats.compute_s, "memory_s": stats.memory_s, "wall_s": wall,
                     "cache_bytes": cache.bytes, "checkpoints": cache.stats.checkpoints,
                     "checkpoint_bytes": cache.stats.checkpoint_bytes, "saved_states": cache.holder_count,
                     "probabilities": list(answered.results[0].probabilities)})
        print(f"{name}: {stats.shared_tokens} state tokens decoded of {state}, cache {cache.bytes / 2**20:.1f} MiB "
              f"({cache.stats.checkpoints} checkpoints, {cache.stats.checkpoint_bytes / 2**20:.1f} MiB)", flush=True)
    return rows


def edited_body(steps: list[agent_loop.Step], at: float, kind: str) -> dict[str, Any]:
    """The last step's request with one event near ``at`` of the way into its log changed."""
    last = steps[-1]
    log = list(agent_loop.events())[:last.events]
    i = int(at * len(log))
    log[i] = {**log[i], "text": log[i]["text"] + " (edited by the operator afterwards)"}
    return agent_loop.decision_body(agent_loop.state_of(log, kind), last.step + 1)


def markdown(result: dict[str, Any]) -> str:
    lines = [f"Model `{result['model']}` (memory: {result['memory']}), the agent loop of {len(result['steps'])} steps "
             f"over a {result['state']} log of about {result['log_tokens']} tokens growing "
             f"{100 * result['growth']:.0f}% a step, then the last step's log edited {100 * result['edit_at']:.0f}% "
             f"of the way in; micro-batches of {result['batch_tokens']}. Reproduce: `{result['command']}`", "",
             "| rule | steps 2-n: state decoded / state | edited step: state decoded | cache at the end (MiB) | "
             "checkpoints (MiB) | memory steps (s) |", "|---|---:|---:|---:|---:|---:|"]
    for policy, rows in result["runs"].items():
        loop = rows[1:-1]
        decoded, state = sum(r["state_decoded"] for r in loop), sum(r["state_tokens"] for r in loop)
        last, edited = rows[-2], rows[-1]
        lines.append(f"| {policy} | {decoded:,} / {state:,} ({decoded / state:.3f}) | {edited['state_decoded']:,} "
                     f"of {edited['state_tokens']:,} | {last['cache_bytes'] / 2**20:.1f} | "
                     f"{last['checkpoints']} ({last['checkpoint_bytes'] / 2**20:.1f}) | "
                     f"{sum(r['memory_s'] for r in rows):.2f} |")
    same = all(r["probabilities"] == rows[i]["probabilities"] for rows in result["runs"].values()
               for i, r in enumerate(next(iter(result["runs"].values()))))
    lines += ["", f"Answers the same under every rule: {'yes' if same else 'no'}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.checkpoints", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", help="the model folder (default: the embedded model)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--growth", type=float, default=0.05)
    parser.add_argument("--log-tokens", type=int, default=3900)
    parser.add_argument("--state", choices=("text", "json"), default="text")
    parser.add_argument("--edit-at", type=float, default=0.4, help="where the edited step changes its log (share)")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--out", type=Path, default=Path("benchmark-results"))
    args = parser.parse_args(argv)

    from decision_adapter.decisions.model_files import embedded_model_dir
    from decision_adapter.settings import Settings
    from decision_adapter.startup import Experiment, load_decision_model

    model_dir = args.model_dir or str(embedded_model_dir())
    settings = replace(Settings.from_env(os.environ), model_dir=model_dir, threads=args.threads,
                       permutations=1, debias="off")
    runs: dict[str, list[dict[str, Any]]] = {}
    with Provenance("benchmarks.checkpoints", argv) as provenance:
        memory = None
        for policy in args.policies.split(","):
            model = load_decision_model(settings, experiment=Experiment(checkpoints=policy))
            try:
                memory = model.engine.memory.name
                steps = agent_loop.prepare_steps(model, args.state, args.log_tokens, args.growth, args.steps)
                model.engine.cache.clear()
                runs[policy] = run_policy(model, steps, edited_body(steps, args.edit_at, args.state))
            finally:
                model.close()
    result = {"model": Path(model_dir).name, "memory": memory, "state": args.state, "log_tokens": args.log_tokens,
              "growth": args.growth, "edit_at": args.edit_at, "batch_tokens": settings.batch_tokens,
              "steps": [r["step"] for r in next(iter(runs.values()))][:-1], "runs": runs,
              "command": provenance.command, "provenance": provenance.record()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "checkpoints.json").write_text(json.dumps(result, indent=1) + "\n")
    table = markdown(result)
    (args.out / "checkpoints.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
