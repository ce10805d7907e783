"""`python -m benchmarks.layout`: what the exact layout costs against the fused one, and how far answers move.

The same tasks (one question each, over a state neither model has seen: the state cache is off) are scored by two
decision models over the same GGUF and settings, one with ``ADAPTER_LAYOUT=exact`` (the state, then the question
from its own first token: two ``llama_decode`` calls for a short state) and one with ``fused`` (the state's last
micro-batch and the question in one call), interleaved task by task so that both see the same machine. Reported:
each layout's prefill seconds (the engine's own timing), their per-task ratio, the llama_decode calls, and the
largest change of a probability between the layouts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from .provenance import Provenance
from .tasks import DEFAULT_TASKS, add_selection_options, load, selected


def score(model, task, context) -> tuple[tuple[float, ...], float, int]:
    from decision_adapter.protocols import systemone

    body = {"model": systemone.ALIAS, "state": task.state, "questions": {"q": task.question}}
    _, _, [item] = systemone.parse(body, context(model))
    prepared = model.prepare([item.question])
    answered = model.score(prepared)
    decodes = sum(1 for step in prepared.plan.steps if type(step).__name__ == "Decode")
    return answered.results[0].probabilities, answered.stats.prefill_s, decodes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.layout", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", type=Path, default=[DEFAULT_TASKS])
    parser.add_argument("--model-dir", help="the model folder (default: the embedded model)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--rounds", type=int, default=2, help="times each task is scored by each layout")
    parser.add_argument("--out", type=Path, default=Path("benchmark-results"))
    add_selection_options(parser)
    args = parser.parse_args(argv)

    from decision_adapter.decisions.model_files import embedded_model_dir
    from decision_adapter.protocols.fields import RequestContext
    from decision_adapter.settings import Settings
    from decision_adapter.startup import Experiment, load_decision_model

    tasks = selected(load(args.tasks), args)
    model_dir = args.model_dir or str(embedded_model_dir())
    base = replace(Settings.from_env(), model_dir=model_dir, threads=args.threads, state_cache_mb=0)
    context = lambda model: RequestContext.of(model, max_decisions=1)  # noqa: E731
    models = {}
    rows = []
    with Provenance("benchmarks.layout", argv) as provenance:
        try:
            for layout in ("exact", "fused"):
                experiment = Experiment(layout=layout)
                models[layout] = load_decision_model(base, experiment=experiment)
                provenance.ran_with(base, experiment=experiment)
                provenance.kernels_of(models[layout].model_info)
            for task in tasks:
                seconds: dict[str, list[float]] = {"exact": [], "fused": []}
                answers: dict[str, tuple[float, ...]] = {}
                decodes: dict[str, int] = {}
                for _ in range(args.rounds):
                    for layout, model in models.items():
                        p, s, d = score(model, task, context)
                        seconds[layout].append(s)
                        answers[layout], decodes[layout] = p, d
                exact, fused = statistics.median(seconds["exact"]), statistics.median(seconds["fused"])
                rows.append({"task": task.id, "tier": task.tier, "exact_s": exact, "fused_s": fused,
                             "fused_over_exact": fused / exact, "decodes": decodes,
                             "max_abs_dp": max(abs(a - b) for a, b in zip(answers["exact"], answers["fused"]))})
        finally:
            for model in models.values():
                model.close()
    ratios = [r["fused_over_exact"] for r in rows]
    result = {"model": Path(model_dir).name, "threads": args.threads, "tasks": len(rows), "rounds": args.rounds,
              "median_exact_s": statistics.median(r["exact_s"] for r in rows),
              "median_fused_s": statistics.median(r["fused_s"] for r in rows),
              "median_fused_over_exact": statistics.median(ratios),
              "max_abs_dp": max(r["max_abs_dp"] for r in rows),
              "median_abs_dp": statistics.median(r["max_abs_dp"] for r in rows), "rows": rows,
              "command": provenance.command, "provenance": provenance.record()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "layout.json").write_text(json.dumps(result, indent=1) + "\n")
    table = markdown(result)
    (args.out / "layout.md").write_text(table)
    print(table)
    return 0


def markdown(result: dict[str, Any]) -> str:
    return "\n".join([
        f"Model `{result['model']}`, {result['tasks']} tasks (one question each, unseen states), {result['threads']} "
        f"threads, median of {result['rounds']} rounds per task. Reproduce: `{result['command']}`", "",
        "| layout | prefill (median) | llama_decode calls (first task) | fused / exact (per-task median) | "
        "largest change of a probability (median over tasks) |",
        "|---|---:|---:|---:|---:|",
        f"| exact | {1000 * result['median_exact_s']:.0f} ms | {result['rows'][0]['decodes']['exact']} | 1.00 | - |",
        f"| fused | {1000 * result['median_fused_s']:.0f} ms | {result['rows'][0]['decodes']['fused']} | "
        f"{result['median_fused_over_exact']:.3f} | {result['max_abs_dp']:.4f} ({result['median_abs_dp']:.4f}) |",
    ]) + "\n"


if __name__ == "__main__":
    sys.exit(main())
