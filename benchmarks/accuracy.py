"""`python -m benchmarks.accuracy`: accuracy by prompt style, order averaging and calibration, in-process.

For a model folder and a task set (default: the public JevBench tasks):

1. **Prompt styles** (``--styles``): every task scored with each style of ``decision_adapter.decisions.prompt.STYLES``,
   accuracy per tier and per family, the share of ``noul`` answers that say *true*, and how often score
   answers land on an extreme level.
2. **Order** (``--orders``): for the first style, every choice and score task scored with its options as given
   and shuffled (seeded), at each K of order averaging: accuracy, the share of answers that change (compared by
   option name, or by level text for scores), and the median seconds per decision.
3. **Calibration**: temperatures fitted per question type on the first style's answers (K = 1, options as
   given) with group-disjoint cross-validation; ECE and Brier before and after, out of fold, with a
   reliability plot for each.

The decision model runs in this process (no HTTP): this is about what the model answers, not about serving.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .metrics import Outcome, accuracy, brier, ece
from .tasks import DEFAULT_TASKS, TIERS, Task, add_selection_options, load, selected

ORDER_SEED = 20261201


@dataclass(frozen=True)
class Scored:
    task: Task
    logits: tuple[float, ...]  # raw option logits in the task's label order
    distribution: tuple[float, ...]
    seconds: float

    def outcome(self, distribution: tuple[float, ...] | None = None) -> Outcome:
        t = self.task
        return Outcome(t.id, t.tier, t.labels, t.expected, distribution or self.distribution, self.seconds)


def shuffled(task: Task, rng: random.Random) -> Task:
    """The task with its options in another order (choice: criteria; score: levels, with the expected level
    following its text)."""
    q = dict(task.question)
    if task.kind == "choice":
        names = list(q["criteria"])
        rng.shuffle(names)
        q["criteria"] = {name: q["criteria"][name] for name in names}
        return replace(task, question=q)
    if task.kind == "score":
        order = list(range(len(q["criteria"])))
        rng.shuffle(order)
        q["criteria"] = [q["criteria"][i] for i in order]
        return replace(task, question=q, expected=str(order.index(int(task.expected))))
    return task


def answer_key(task: Task, distribution: tuple[float, ...]) -> str:
    """The chosen option as the client means it: its name, or for a score its level's text."""
    top = task.labels[max(range(len(distribution)), key=distribution.__getitem__)]
    if task.kind == "score":
        return json.dumps(task.question["criteria"][int(top)], sort_keys=True)
    return top


def score_tasks(model, tasks: list[Task], permutations: int = 1) -> list[Scored]:
    from decision_adapter.engine.readout import softmax
    from decision_adapter.errors import InputError
    from decision_adapter.protocols import systemone
    from decision_adapter.protocols.fields import RequestContext

    context = RequestContext.of(model, max_decisions=1)

    out = []
    for task in tasks:
        body = {"model": systemone.ALIAS, "state": task.state, "questions": {"q": task.question}}
        started = time.perf_counter()
        try:
            _, _, [item] = systemone.parse(body, context)
            [result] = model.score(model.prepare([replace(item.question, permutations=permutations)])).results
        except InputError:
            continue  # a refused task counts as wrong in accuracy(); it has no logits to calibrate
        seconds = time.perf_counter() - started
        names = {"true": "yes", "false": "no"} if item.type == "noul" else {}
        by_label = {names.get(n, n): x for n, x in zip(item.names, result.option_logits)}
        logits = tuple(by_label[label] for label in task.labels)
        out.append(Scored(task, logits, tuple(softmax(logits)), seconds))
    return out


def summary(tasks: list[Task], scored: list[Scored]) -> dict[str, Any]:
    by_id = {s.task.id: s for s in scored}
    outcomes = [by_id[t.id].outcome() if t.id in by_id else
                Outcome(t.id, t.tier, t.labels, t.expected, None, None, "refused") for t in tasks]

    def block(members: list[Outcome]) -> dict[str, Any]:
        return {"n": len(members), "accuracy": accuracy(members)}

    noul = [s for s in scored if s.task.kind == "noul"]
    score = [s for s in scored if s.task.kind == "score"]
    extremes = [s for s in score if s.task.expected in (s.task.labels[0], s.task.labels[-1])]
    return {
        "overall": {**block(outcomes), "brier": brier(outcomes), "ece_10": ece(outcomes)},
        "tiers": {tier: block([o for o in outcomes if o.tier == tier]) for tier in TIERS
                  if any(o.tier == tier for o in outcomes)},
        "families": {f"{t.tier}/{t.family}": block([o for o, t2 in zip(outcomes, tasks) if
                                                    (t2.tier, t2.family) == (t.tier, t.family)])
                     for t in tasks},
        "noul_true_rate": statistics.fmean(s.distribution[s.task.labels.index("yes")] > 0.5 for s in noul)
        if noul else None,
        "noul_true_expected": statistics.fmean(s.task.expected == "yes" for s in noul) if noul else None,
        "score_extremes_right": statistics.fmean(s.outcome().correct for s in extremes) if extremes else None,
        "seconds_p50": statistics.median(s.seconds for s in scored) if scored else None,
    }


def order_section(model, tasks: list[Task], orders: list[int]) -> dict[str, Any]:
    """Choice and score tasks as given and shuffled at each K: flip rate, accuracy, seconds. ``noul`` tasks,
    whose two options the adapter orders itself (true is label A), at each K: accuracy and how often they say
    true, which is where position bias shows. The state cache is emptied before each K, so that every K pays
    for its own states (the shuffled copy of a task still finds the state its given order left)."""
    ordered = [t for t in tasks if t.kind in ("choice", "score")]
    nouls = [t for t in tasks if t.kind == "noul"]
    rng = random.Random(ORDER_SEED)
    moved = [shuffled(t, rng) for t in ordered]
    out = {}
    for k in orders:
        model.engine.cache.clear()
        given, other = score_tasks(model, ordered, k), score_tasks(model, moved, k)
        pairs = {s.task.id: s for s in given}
        flips = [answer_key(s.task, s.distribution) != answer_key(pairs[s.task.id].task, pairs[s.task.id].distribution)
                 for s in other if s.task.id in pairs]
        noul = score_tasks(model, nouls, k)
        out[str(k)] = {"tasks": len(ordered), "accuracy_given": accuracy([s.outcome() for s in given]),
                       "accuracy_shuffled": accuracy([s.outcome() for s in other]),
                       "flip_rate": statistics.fmean(flips) if flips else None,
                       "seconds_p50": statistics.median(s.seconds for s in given + other),
                       "noul_tasks": len(nouls),
                       "noul_accuracy": accuracy([s.outcome() for s in noul]) if noul else None,
                       "noul_true_rate": statistics.fmean(s.distribution[s.task.labels.index("yes")] > 0.5
                                                          for s in noul) if noul else None}
        print(f"order K={k}: flip rate {out[str(k)]['flip_rate']:.3f}, accuracy {out[str(k)]['accuracy_given']:.3f}",
              flush=True)
    return out


def calibration_section(scored: list[Scored], out: Path, folds: int = 5) -> dict[str, Any]:
    from decision_adapter.decisions.calibration import Row, fit, out_of_fold

    rows = [Row(s.task.kind, s.logits, s.task.labels.index(s.task.expected), s.task.group or s.task.id)
            for s in scored]
    calibrated = out_of_fold(rows, folds)
    before = [s.outcome() for s in scored]
    after = [s.outcome(tuple(p)) for s, p in zip(scored, calibrated)]
    from .report import reliability_plot

    for name, outcomes in (("before", before), ("after", after)):
        reliability_plot(outcomes, out / f"reliability-{name}-calibration.png",
                         f"Reliability {name} calibration, ECE {ece(outcomes):.3f}", "bins")
    return {"folds": folds, "temperatures_all_rows": fit(rows),
            "before": {"ece_10": ece(before), "brier": brier(before), "accuracy": accuracy(before)},
            "after_out_of_fold": {"ece_10": ece(after), "brier": brier(after), "accuracy": accuracy(after)}}


def markdown(result: dict[str, Any]) -> str:
    styles = result["styles"]
    names = list(styles)
    lines = [f"Model `{result['model']}`, {result['tasks']} tasks, {result['threads']} threads. "
             f"Reproduce: `{result['command']}`", "", "| family | n | " + " | ".join(names) + " |",
             "|---|---:|" + "---:|" * len(names)]
    first = styles[names[0]]
    for key in [*first["families"], *(f"tier {t}" for t in first["tiers"]), "overall"]:
        def cell(style):
            block = (style["overall"] if key == "overall" else style["tiers"][key[5:]] if key.startswith("tier ")
                     else style["families"][key])
            return f"{100 * block['accuracy']:.1f}%"
        n = (first["overall"] if key == "overall" else first["tiers"][key[5:]] if key.startswith("tier ")
             else first["families"][key])["n"]
        lines.append(f"| {key} | {n} | " + " | ".join(cell(styles[s]) for s in names) + " |")
    lines.append("| noul answered true / expected true | | " + " | ".join(
        f"{100 * styles[s]['noul_true_rate']:.0f}% / {100 * styles[s]['noul_true_expected']:.0f}%"
        for s in names) + " |")
    lines.append("| score extremes right | | " + " | ".join(
        f"{100 * styles[s]['score_extremes_right']:.0f}%" if styles[s]["score_extremes_right"] is not None else "-"
        for s in names) + " |")
    lines.append("| median s per decision | | " + " | ".join(f"{styles[s]['seconds_p50']:.2f}" for s in names) + " |")
    if result.get("orders"):
        lines += ["", f"Order averaging (style `{names[0]}`, choice and score tasks of tiers "
                  f"{', '.join(result.get('order_tiers', TIERS))}, options as given and shuffled):",
                  "", "| K | flip rate | accuracy (given) | accuracy (shuffled) | median s per decision | "
                      "noul accuracy | noul answered true |",
                  "|---:|---:|---:|---:|---:|---:|---:|"]
        for k, o in result["orders"].items():
            noul = (f"{100 * o['noul_accuracy']:.1f}% | {100 * o['noul_true_rate']:.0f}%"
                    if o.get("noul_accuracy") is not None else "- | -")
            lines.append(f"| {k} | {100 * o['flip_rate']:.1f}% | {100 * o['accuracy_given']:.1f}% | "
                         f"{100 * o['accuracy_shuffled']:.1f}% | {o['seconds_p50']:.2f} | {noul} |")
    cal = result.get("calibration")
    if cal:
        t = ", ".join(f"{k} {v:.2f}" for k, v in cal["temperatures_all_rows"].items())
        lines += ["", f"Calibration (style `{names[0]}`, K = 1, {cal['folds']} group-disjoint folds; temperatures "
                      f"on all rows: {t}):", "", "| | ECE (10 bins) | Brier | accuracy |", "|---|---:|---:|---:|"]
        for label, key in (("before", "before"), ("after, out of fold", "after_out_of_fold")):
            b = cal[key]
            lines.append(f"| {label} | {b['ece_10']:.3f} | {b['brier']:.3f} | {100 * b['accuracy']:.1f}% |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from decision_adapter.decisions.prompt import DEFAULT_STYLE, STYLES

    parser = argparse.ArgumentParser(prog="python -m benchmarks.accuracy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", type=Path, default=[DEFAULT_TASKS])
    parser.add_argument("--model-dir", help="GGUF folder (default: the embedded SmolLM2 model)")
    add_selection_options(parser)
    parser.add_argument("--order-tiers", nargs="+", choices=TIERS, default=list(TIERS),
                        help="tiers whose choice and score tasks the order section scores")
    parser.add_argument("--styles", nargs="+", choices=list(STYLES), default=[DEFAULT_STYLE],
                        help="prompt styles to compare; the first is used for the order and calibration sections")
    parser.add_argument("--orders", type=int, nargs="*", default=[1, 2, 4], help="K values of order averaging")
    parser.add_argument("--no-calibration", dest="calibration", action="store_false")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--out", type=Path, default=Path("benchmark-results"))
    args = parser.parse_args(argv)

    from decision_adapter.decisions.model_files import embedded_model_dir
    from decision_adapter.settings import Settings
    from decision_adapter.startup import load_decision_model

    tasks = load(args.tasks)
    tasks = selected(tasks, args)
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = args.model_dir or str(embedded_model_dir())
    base = replace(Settings.from_env(), model_dir=model_dir, threads=args.threads)
    result: dict[str, Any] = {"model": Path(model_dir).name, "tasks": len(tasks), "threads": args.threads,
                              "order_tiers": args.order_tiers, "styles": {}}
    first_scored = None
    for i, style in enumerate(args.styles):
        model = load_decision_model(replace(base, prompt_style=style), calibrated=False)
        try:
            scored = score_tasks(model, tasks)
            result["styles"][style] = {"version": model.prompt_version, **summary(tasks, scored)}
            print(f"style {style}: accuracy {result['styles'][style]['overall']['accuracy']:.3f}", flush=True)
            if i == 0:
                first_scored = scored
                if args.orders:
                    result["orders"] = order_section(model, [t for t in tasks if t.tier in args.order_tiers],
                                                     args.orders)
        finally:
            model.close()
    if args.calibration and first_scored:
        result["calibration"] = calibration_section(first_scored, args.out)
    result["command"] = "python -m benchmarks.accuracy " + " ".join(argv if argv is not None else sys.argv[1:])
    (args.out / "accuracy.json").write_text(json.dumps(result, indent=1) + "\n")
    table = markdown(result)
    (args.out / "accuracy.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
