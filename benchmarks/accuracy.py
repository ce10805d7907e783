"""`python -m benchmarks.accuracy`: accuracy by prompt style, by debias mode and order averaging, calibration,
and what each costs, in-process.

For a model folder and a task set (default: the public JevBench tasks):

1. **Prompt styles** (``--styles``): every task scored with each style of ``decision_adapter.decisions.prompt.STYLES``,
   accuracy per tier and per family, the share of ``noul`` answers that say *true*, and how often score
   answers land on an extreme level.
2. **Debias and order** (``--debias`` x ``--orders``): for the first style, every task of ``--order-tiers`` scored
   in each debias mode (``decision_adapter.decisions.debias.MODES``) at each K of order averaging; choice and
   score tasks also with their options shuffled (seeded). Per pair: accuracy per tier, family and type, the
   ``noul`` answered-true rate against the expected-true rate, the flip rate (answers that change under the
   shuffle, compared by option name, or by level text for scores), ECE and Brier, and both again after a
   temperature per question type fitted on the other folds (group-disjoint). Tasks are scored task by task
   through ``DecisionModel.score``, every pair of a task in a row, so that what pairs share (the state, the
   orderings K = 2 and 4 have in common, the priors of a question asked again) comes from the cache: seconds
   here mean nothing, section 3 times them.
3. **Cost**: the tokens each pair makes the model decode per decision, for every task of the section, from the
   plans (deterministic); and (``--cost-per-tier N``) the first N tasks of each tier timed three ways, before any
   other scoring and with the cache emptied after: with the cache emptied (a new state and a new question: the
   prior is scored too), then with the state and the answer dropped but the prior kept (a new state, a question
   asked before: the routing and policy case), then with the answer alone dropped (the state seen before too).
   ``--cost FILE`` takes these timings from an earlier run's cost.json or accuracy.json instead (``--cost-only``
   writes one). The defaults are chosen by the rule in ``benchmarks.priors.choose``: accuracy first, within a
   median latency on a new state with a new question at most 1.3x the served defaults'; without timings no
   default is chosen.
4. **Calibration**: temperatures fitted per question type on the first style's answers (K = 1, options as
   given, no debiasing) with group-disjoint cross-validation; ECE and Brier before and after, out of fold, with a
   reliability plot for each.

The decision model runs in this process (no HTTP): this is about what the model answers, not about serving.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from .metrics import accuracy, brier, ece
from .provenance import Provenance
from .scoring import Scored, prepared_task, score_tasks, summary
from .tasks import BIAS_TASKS, DEFAULT_TASKS, TIERS, Task, add_selection_options, first_per_tier, load, selected

def pair_name(mode: str, k: int) -> str:
    return f"{mode} K={k}"


def debias_section(model, tasks: list[Task], orders: list[int], modes: list[str], strengths: list[float],
                   floors: list[float], raw: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the raw readouts, every configuration's block): each task's answer and every measured prior scored once
    per K (``priors.measure``, unless ``raw`` holds them already), then each (mode, strength, floor, K) composed
    from them arithmetically (``priors.sweep``). Choice and score tasks are also scored shuffled, for the flip
    rate. Seconds here mean nothing (the cache is shared): section 3 times them."""
    from . import priors

    if raw is None:
        raw = priors.measure(model, tasks, orders, modes)
    elif raw["task_ids"] != [t.id for t in tasks] or raw["prompt_version"] != model.prompt_version:
        raise SystemExit("--raw holds readouts of other tasks or another prompt version")
    results = priors.sweep(raw, tasks, priors.grid(modes, strengths, floors, orders))
    for name, b in results.items():
        if b["mode"] == "off" or (b["strength"] == 1.0 and b["floor"] == 0.0):
            print(f"{name}: accuracy {b['overall']['accuracy']:.3f}, noul true "
                  f"{b['noul_true_rate'] if b['noul_true_rate'] is not None else float('nan'):.2f}", flush=True)
    return raw, results


def table_rows(results: dict[str, Any], chosen: str | None, orders: list[int]) -> list[str]:
    """The configurations the markdown shows: off at each K; each mode at full strength without a floor at K = 1
    (the served modes at every K); each served mode at the chosen strength and floor at every K; each mode's best at
    K = 1; and the chosen one."""
    from decision_adapter.decisions.debias import MODES

    from . import priors

    picked = results.get(chosen or "", {})
    names = []
    for n, b in results.items():
        full = b["strength"] == 1.0 and b["floor"] == 0.0
        as_chosen = (b["mode"] in MODES and picked.get("mode") not in (None, "off")
                     and (b["strength"], b["floor"]) == (picked["strength"], picked["floor"]))
        if b["mode"] == "off" or (full and (b["k"] == 1 or b["mode"] in MODES)) or as_chosen:
            names.append(n)
    if 1 in orders:
        names += [n for n in priors.best_per_mode(results, 1).values() if n not in names]
    if chosen and chosen not in names:
        names.append(chosen)
    return sorted(names, key=lambda n: (results[n]["k"], list(results).index(n)))


def cost_section(model, tasks: list[Task], orders: list[int], modes: list[str]) -> dict[str, Any]:
    """Seconds (prepare and score) and tokens decoded per decision for each pair, in three conditions: cache
    emptied (new state, new question), state and answer dropped (new state, prior warm), answer dropped (state
    and prior warm). Medians over the tasks; ratios to off at K = 1 in the same condition, per task."""
    from decision_adapter.errors import InputError

    conditions = ("cold", "prior_warm", "state_warm")
    times: dict[tuple[str, int], dict[str, list[float]]] = {}
    tokens: dict[tuple[str, int], dict[str, list[int]]] = {}
    for task in tasks:
        for mode in modes:
            for k in orders:
                t = times.setdefault((mode, k), {c: [] for c in conditions})
                n = tokens.setdefault((mode, k), {c: [] for c in conditions})
                model.engine.cache.clear()
                for condition in conditions:
                    started = time.perf_counter()
                    try:
                        _, prepared = prepared_task(model, task, k, mode)
                        answered = model.score(prepared)
                    except InputError:
                        break
                    t[condition].append(time.perf_counter() - started)
                    n[condition].append(answered.stats.shared_tokens + sum(answered.stats.own_tokens)
                                        + answered.stats.readout_tokens + answered.prior_tokens)
                    # Next: the same request on a new state with the prior kept, then on the state seen before.
                    model.engine.forget(prepared.spec, state=condition == "cold")
    base = times.get(("off", 1))
    out = {}
    for (mode, k), t in times.items():
        row: dict[str, Any] = {"mode": mode, "k": k, "tasks": len(t["cold"])}
        for condition in conditions:
            row[f"seconds_p50_{condition}"] = statistics.median(t[condition]) if t[condition] else None
            row[f"tokens_p50_{condition}"] = statistics.median(tokens[mode, k][condition]) if t[condition] else None
            if base and len(base[condition]) == len(t[condition]) and t[condition]:
                row[f"ratio_p50_{condition}"] = statistics.median(
                    x / b for x, b in zip(t[condition], base[condition]))
        out[pair_name(mode, k)] = row
        print(f"cost {pair_name(mode, k)}: " + ", ".join(
            f"{c} {row[f'seconds_p50_{c}']:.2f} s" for c in conditions if row[f"seconds_p50_{c}"] is not None),
            flush=True)
    return out


def token_section(model, tasks: list[Task], orders: list[int], modes: list[str]) -> dict[str, Any]:
    """Tokens each pair makes the model decode per decision, for every task of the section (prepare only: the
    plans are exact and need no scoring): on a new state with the prior cached (the answer's job: the state once,
    each ordering's question after it), and cold (the prior's jobs too). Per task, the ratio to off at K = 1;
    medians over the tasks. On the CPU a decision's time follows these tokens (prefill-bound), and unlike seconds
    on a shared machine they do not move between runs."""
    from decision_adapter.errors import InputError

    warm: dict[tuple[str, int], dict[str, int]] = {(m, k): {} for m in modes for k in orders}
    cold: dict[tuple[str, int], dict[str, int]] = {(m, k): {} for m in modes for k in orders}
    for task in tasks:
        for mode, k in warm:
            try:
                _, prepared = prepared_task(model, task, k, mode)
            except InputError:
                continue
            warm[mode, k][task.id] = prepared.plan.tokens
            cold[mode, k][task.id] = prepared.plan.tokens + sum(p.plan.tokens for p in prepared.priors)
    base = warm.get(("off", 1)) or next(iter(warm.values()))
    out = {}
    for (mode, k), mine in warm.items():
        ids = [i for i in mine if i in base]
        out[pair_name(mode, k)] = {
            "mode": mode, "k": k, "tasks": len(ids),
            "tokens_p50_prior_warm": statistics.median(mine[i] for i in ids),
            "tokens_p50_cold": statistics.median(cold[mode, k][i] for i in ids),
            "ratio_p50_prior_warm": statistics.median(mine[i] / base[i] for i in ids),
            "ratio_p50_cold": statistics.median(cold[mode, k][i] / base[i] for i in ids)}
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
    lines.append("| median s per decision | | " + " | ".join(
        f"{styles[s]['seconds_p50']:.2f}" if styles[s]["seconds_p50"] is not None else "- (not timed)"
        for s in names) + " |")
    if result.get("debias"):
        lines += debias_markdown(result, names[0])
    if result.get("tokens"):
        lines += tokens_markdown(result)
    if result.get("cost"):
        lines += cost_markdown(result)
    cal = result.get("calibration")
    if cal:
        t = ", ".join(f"{k} {v:.2f}" for k, v in cal["temperatures_all_rows"].items())
        lines += ["", f"Calibration (style `{names[0]}`, K = 1, {cal['folds']} group-disjoint folds; temperatures "
                      f"on all rows: {t}):", "", "| | ECE (10 bins) | Brier | accuracy |", "|---|---:|---:|---:|"]
        for label, key in (("before", "before"), ("after, out of fold", "after_out_of_fold")):
            b = cal[key]
            lines.append(f"| {label} | {b['ece_10']:.3f} | {b['brier']:.3f} | {100 * b['accuracy']:.1f}% |")
    return "\n".join(lines) + "\n"


def pct(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def debias_markdown(result: dict[str, Any], style: str) -> list[str]:
    from . import priors

    grid = result["debias"]
    names = result.get("debias_table") or list(grid)
    first = grid[names[0]]
    lines = ["", f"Debias and order averaging (style `{style}`, tiers {', '.join(result['order_tiers'])}: "
             f"{first['overall']['n']} tasks; {len(grid)} configurations evaluated, these shown: off, each mode at "
             f"full strength without a floor, each mode's best, the chosen; choice and score tasks also shuffled "
             f"for the flip rate; ECE and Brier as served, then after a temperature per type fitted on the other "
             f"group-disjoint folds; the last columns fit a strength and a temperature per type out of fold, as "
             f"`python -m decision_adapter.calibrate` does):", "",
             "| debias | alpha | floor | K | accuracy | " + " | ".join(f"{t} ({b['n']})" for t, b in first["tiers"].items())
             + " | " + " | ".join(f"{t} ({b['n']})" for t, b in first["types"].items())
             + " | noul true / expected | flip rate | ECE | ECE, T out of fold | accuracy, alpha and T out of fold |",
             "|---|---:|---:|---:|---:|" + "---:|" * (len(first["tiers"]) + len(first["types"]))
             + "---:|---:|---:|---:|---:|"]
    for name in names:
        b = grid[name]
        noul = (f"{pct(b['noul_true_rate'], 0)} / {pct(b['noul_true_expected'], 0)}"
                if b["noul_true_rate"] is not None else "-")
        oof = b.get("calibrated_out_of_fold")
        fitted = b.get("strength_fitted_out_of_fold")
        off = b["mode"] == "off"
        alpha, floor = ("-", "-") if off else (f"{b['strength']:g}", f"{b['floor']:g}")
        lines.append(f"| {b['mode']} | {alpha} | {floor} | {b['k']} | **{pct(b['overall']['accuracy'])}** | "
                     + " | ".join(pct(x["accuracy"]) for x in b["tiers"].values()) + " | "
                     + " | ".join(pct(x["accuracy"]) for x in b["types"].values())
                     + f" | {noul} | {pct(b['flip_rate'])} | {b['overall']['ece_10']:.3f}"
                     + (f" | {oof['ece_10']:.3f}" if oof else " | -")
                     + (f" | {pct(fitted['accuracy'])} |" if fitted else " | - |"))
    lines += ["", "Tasks right per family (n tasks; a minus sign: more than one task lost against off at the same K, or "
              "any in the question-borne family):", "",
              "| family | n | " + " | ".join(_short(grid[n]) for n in names) + " |",
              "|---|---:|" + "---:|" * len(names)]
    for family, fam in first["families"].items():
        cells = []
        for n in names:
            b, base = grid[n], grid[f"off K={grid[n]['k']}"]
            got, had = priors.right(b, family), priors.right(base, family)
            bad = got < had - 1 or (family == priors.QUESTION_BORNE and got < had)
            cells.append(f"{got}{' (-)' if bad else ''}")
        lines.append(f"| {family} | {fam['n']} | " + " | ".join(cells) + " |")
    lines.append("| overall | " + str(first["overall"]["n"]) + " | "
                 + " | ".join(str(priors.right(grid[n])) for n in names) + " |")
    return lines


def _short(b: dict[str, Any]) -> str:
    return f"off K={b['k']}" if b["mode"] == "off" else f"{b['mode']} {b['strength']:g}/{b['floor']:g} K={b['k']}"


def cost_markdown(result: dict[str, Any]) -> list[str]:
    cost = result["cost"]
    tasks = next(iter(cost.values()))["tasks"]
    source = (f"timed by `{result['cost_from']['command']}`" if result.get("cost_from", {}).get("command")
              else "timed in this run")
    lines = ["", f"Cost per decision ({tasks} tasks, the first {result['cost_per_tier']} of each tier, {source}; "
             f"prepare and score in-process; medians over the tasks, and the per-task median ratio to off at K = 1 "
             f"in the same condition; seconds from a machine shared with other work):", "",
             "| debias | K | new state, new question: tokens / s (x) | new state, prior cached: tokens / s (x) | "
             "state and prior cached: tokens / s (x) |", "|---|---:|---:|---:|---:|"]

    def cell(row: dict[str, Any], condition: str) -> str:
        if row[f"seconds_p50_{condition}"] is None:
            return "-"
        ratio = row.get(f"ratio_p50_{condition}")
        return (f"{row[f'tokens_p50_{condition}']:.0f} / {row[f'seconds_p50_{condition}']:.2f}"
                + (f" ({ratio:.2f}x)" if ratio is not None else ""))

    for row in cost.values():
        lines.append(f"| {row['mode']} | {row['k']} | {cell(row, 'cold')} | {cell(row, 'prior_warm')} | "
                     f"{cell(row, 'state_warm')} |")
    return lines


def tokens_markdown(result: dict[str, Any]) -> list[str]:
    rows = result["tokens"]
    tasks = next(iter(rows.values()))["tasks"]
    lines = ["", f"Tokens decoded per decision ({tasks} tasks: every task of the section, from the plans; median, and "
             f"the per-task median ratio to off at K = 1):", "",
             "| debias | K | new state, prior cached | new state, new question |", "|---|---:|---:|---:|"]
    for row in rows.values():
        lines.append(f"| {row['mode']} | {row['k']} | {row['tokens_p50_prior_warm']:.0f} "
                     f"({row['ratio_p50_prior_warm']:.2f}x) | {row['tokens_p50_cold']:.0f} ({row['ratio_p50_cold']:.2f}x) |")
    chosen = result.get("chosen")
    if chosen:
        what = (f"debias {chosen['mode']}, K = {chosen['k']}" if chosen["mode"] == "off" else
                f"debias {chosen['mode']}, strength {chosen['strength']:g}, floor {chosen['floor']:g}, K = {chosen['k']}")
        bound = chosen["latency"]
        lines += ["", f"Chosen by the rule ({chosen['rule']}; the bound {bound['limit_seconds']:.2f} s, "
                      f"{bound['reference']} taking {bound['reference_seconds']:.2f} s; {chosen['passing']} of "
                      f"{chosen['allowed']} configurations within the bound qualify): **{what}**"
                      + (f", {bound['chosen_seconds']:.2f} s." if bound["chosen_seconds"] is not None else ".")]
        lines += goals_markdown(result)
    return lines


def goals_markdown(result: dict[str, Any]) -> list[str]:
    """The chosen default against off at K = 1, goal by goal, and the rule out of fold."""
    from . import priors

    grid, chosen = result["debias"], result["chosen"]["pair"]
    b, base = grid[chosen], grid["off K=1"]
    lost = priors.losses(b, base)
    n = b["overall"]["n"]
    points = 100 * (priors.right(b) - priors.right(base)) / n
    lines = ["", f"At the chosen default against off at K = 1: families that lose tasks "
                 f"{', '.join(f'{f} {k}' for f, k in lost.items()) or 'none'}; "
                 f"question-borne {priors.right(b, priors.QUESTION_BORNE) if priors.QUESTION_BORNE in b['families'] else '-'}"
                 f" against {priors.right(base, priors.QUESTION_BORNE) if priors.QUESTION_BORNE in base['families'] else '-'}; "
                 f"overall {priors.right(b)} against {priors.right(base)} of {n} ({points:+.1f} points); noul answered "
                 f"true {pct(b['noul_true_rate'], 0)} against {pct(b['noul_true_expected'], 0)} true."]
    oof = result.get("rule_out_of_fold")
    if oof:
        picks = ", ".join(f"{f['chosen']} ({f['right']} against {f['off']} of {f['tasks']})" for f in oof["folds"])
        lines.append(f"The rule out of fold ({len(oof['folds'])} group-disjoint folds: chosen on the others, scored "
                     f"on the fold): {oof['chosen']} right against off's {oof['off']} of {oof['tasks']} "
                     f"({100 * (oof['chosen'] - oof['off']) / oof['tasks']:+.1f} points); per fold {picks}.")
    return lines


def cost_only(base, tasks: list[Task], args: Any, argv: list[str] | None, result: dict[str, Any]) -> int:
    """Section 3 alone (``--cost-only``): seconds and tokens per decision of each served mode and K, on the first
    ``--cost-per-tier`` tasks of each tier, with the first style; cost.json and a table."""
    from decision_adapter.decisions.debias import MODES as MODES_SERVED
    from decision_adapter.startup import Experiment, load_decision_model

    experiment = Experiment(prompt_style=args.styles[0])
    with Provenance("benchmarks.accuracy", argv) as provenance:
        model = load_decision_model(base, calibrated=False, experiment=experiment)
        provenance.ran_with(base, experiment=experiment)
        provenance.kernels_of(model.model_info)
        try:
            result["cost"] = cost_section(model, first_per_tier(tasks, args.cost_per_tier), args.orders,
                                          [m for m in args.debias if m in MODES_SERVED])
        finally:
            model.close()
    result["command"] = provenance.command
    result["provenance"] = provenance.record()
    (args.out / "cost.json").write_text(json.dumps(result, indent=1) + "\n")
    print("| mode, K | tokens new state, new question | s | tokens new state, question seen | s | "
          "ratio to K=1 (s, new question) | ratio to K=1 (s, question seen) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, row in result["cost"].items():
        one = result["cost"].get(pair_name(row["mode"], 1))
        ratio = {c: row[f"seconds_p50_{c}"] / one[f"seconds_p50_{c}"] if one else float("nan")
                 for c in ("cold", "prior_warm")}
        print(f"| {name} | {row['tokens_p50_cold']} | {row['seconds_p50_cold']:.3f} | {row['tokens_p50_prior_warm']} | "
              f"{row['seconds_p50_prior_warm']:.3f} | {ratio['cold']:.2f} | {ratio['prior_warm']:.2f} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    from decision_adapter.decisions.debias import PRIORS
    from decision_adapter.decisions.prompt import DEFAULT_STYLE, STYLES

    parser = argparse.ArgumentParser(prog="python -m benchmarks.accuracy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", type=Path, default=[DEFAULT_TASKS, BIAS_TASKS],
                        help="JevBench folders or .jsonl files (default: the public JevBench tasks and "
                             "benchmarks/bias-tasks)")
    parser.add_argument("--model-dir", help="GGUF folder (default: the embedded SmolLM2 model)")
    add_selection_options(parser)
    parser.add_argument("--order-tiers", nargs="+", choices=TIERS, default=list(TIERS),
                        help="tiers whose tasks the debias and order section scores")
    parser.add_argument("--styles", nargs="+", choices=list(STYLES), default=[DEFAULT_STYLE],
                        help="prompt styles to compare; the first is used for the other sections")
    parser.add_argument("--orders", type=int, nargs="*", default=[1, 2, 4], help="K values of order averaging")
    parser.add_argument("--debias", nargs="*", choices=list(PRIORS), default=list(PRIORS),
                        help="debias modes to compare, the served ones and the explored priors (none: skip the "
                             "debias and order section)")
    parser.add_argument("--strengths", type=float, nargs="+", default=[0.25, 0.5, 0.75, 1.0],
                        help="strengths (alpha) of the prior to compare, each in (0, 1]")
    parser.add_argument("--floors", type=float, nargs="+", default=[0.0, 0.25, 0.5],
                        help="floors (the uniform's share mixed into the prior) to compare, each in [0, 1)")
    parser.add_argument("--raw", type=Path, help="the raw.json.gz of an earlier run on the same tasks, model and "
                                                 "prompt: the debias section is evaluated from it, nothing scored")
    parser.add_argument("--cost-per-tier", type=int, default=0, metavar="N",
                        help="time each debias mode and K on the first N tasks of each tier (0: skip)")
    parser.add_argument("--cost", type=Path, metavar="FILE",
                        help="the timings of an earlier run (its cost.json or accuracy.json) instead of timing again")
    parser.add_argument("--cost-only", action="store_true",
                        help="only section 3, the cost (with --cost-per-tier N, --orders and --debias): cost.json")
    parser.add_argument("--no-calibration", dest="calibration", action="store_false")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--out", type=Path, default=Path("benchmark-results"))
    args = parser.parse_args(argv)

    from decision_adapter.decisions.debias import MODES as MODES_SERVED
    from decision_adapter.decisions.model_files import embedded_model_dir

    from . import priors
    from decision_adapter.settings import Settings
    from decision_adapter.startup import Experiment, load_decision_model

    tasks = load(args.tasks)
    tasks = selected(tasks, args)
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = args.model_dir or str(embedded_model_dir())
    base = replace(Settings.from_env(), model_dir=model_dir, threads=args.threads)
    result: dict[str, Any] = {"model": Path(model_dir).name, "tasks": len(tasks), "threads": args.threads,
                              "order_tiers": args.order_tiers, "cost_per_tier": args.cost_per_tier, "styles": {}}
    if args.cost_only:
        return cost_only(base, tasks, args, argv, result)
    if args.cost:
        earlier = json.loads(args.cost.read_text())
        if not earlier.get("cost"):
            raise SystemExit(f"--cost {args.cost}: no cost section (write one with --cost-only --cost-per-tier N)")
        result["cost"], result["cost_per_tier"] = earlier["cost"], earlier["cost_per_tier"]
        result["cost_from"] = {"file": str(args.cost), "command": earlier.get("command")}
    with Provenance("benchmarks.accuracy", argv) as provenance:
        first_scored = None
        section = [t for t in tasks if t.tier in args.order_tiers]
        for i, style in enumerate(args.styles):
            experiment = Experiment(prompt_style=style)
            model = load_decision_model(base, calibrated=False, experiment=experiment)
            provenance.ran_with(base, experiment=experiment)
            provenance.kernels_of(model.model_info)
            try:
                swept = i == 0 and bool(args.orders and args.debias)
                if swept and args.cost_per_tier and not args.cost:
                    # Timed first, on an engine nothing else has warmed; the cache is emptied after, so that what
                    # the timing decoded is not what the readouts below reuse.
                    result["cost"] = cost_section(model, first_per_tier(tasks, args.cost_per_tier), args.orders,
                                                  [m for m in args.debias if m in MODES_SERVED])
                    model.engine.cache.clear()
                if swept:
                    raw = json.loads(gzip.decompress(args.raw.read_bytes())) if args.raw else None
                    raw, results = debias_section(model, section, args.orders, args.debias, args.strengths,
                                                  args.floors, raw)
                    (args.out / "raw.json.gz").write_bytes(gzip.compress(json.dumps(raw).encode(), mtime=0))
                    result["tokens"] = token_section(model, section, args.orders, args.debias)
                    if result.get("cost"):
                        result["chosen"] = priors.choose(results, result["tokens"], result["cost"])
                    else:
                        print("no default chosen: the rule weighs latency, and nothing was timed (--cost-per-tier "
                              "N or --cost FILE)", flush=True)
                    names = table_rows(results, result.get("chosen", {}).get("pair"), args.orders)
                    for name in names:  # the rows shown also get the out-of-fold calibrations
                        b = results[name]
                        config = priors.Config(b["mode"], b["strength"], b["floor"], b["k"])
                        results[name] = priors.block(section, priors.evaluate(raw, section, config), calibrate=True)
                    for name in names:  # what a label prior keeps by being divided out where the state is empty
                        b = results[name]
                        if b["mode"] in ("label", "label-mask"):
                            config = priors.Config(b["mode"], b["strength"], b["floor"], b["k"])
                            ev = priors.evaluate(raw, section, config, skip_label_on_content_free=True)
                            families = summary(section, ev.given)["families"]
                            b["families_if_off_on_content_free_states"] = {
                                f: round(x["accuracy"] * x["n"]) for f, x in families.items()}
                    result["debias"], result["debias_table"] = results, names
                    if result.get("chosen"):
                        result["rule_out_of_fold"] = priors.rule_out_of_fold(
                            raw, section, priors.grid(args.debias, args.strengths, args.floors, args.orders),
                            result["tokens"], result["cost"])
                    if any(t.family == "favourite" for t in section) and "label" in args.debias:
                        result["favourite_check"] = priors.favourite_check(raw, section)
                if swept and section == tasks and 1 in args.orders and "off" in args.debias:
                    # off at K = 1 is this style's own pass: taken from the readouts above, not scored again
                    scored = priors.evaluate(raw, tasks, priors.Config("off", 0.0, 0.0, 1)).given
                    timed = False
                else:
                    scored, timed = score_tasks(model, tasks), True
                result["styles"][style] = {"version": model.prompt_version, **summary(tasks, scored)}
                if not timed:
                    result["styles"][style]["seconds_p50"] = None
                print(f"style {style}: accuracy {result['styles'][style]['overall']['accuracy']:.3f}", flush=True)
                if i == 0:
                    first_scored = scored
            finally:
                model.close()
        if args.calibration and first_scored:
            result["calibration"] = calibration_section(first_scored, args.out)
    result["command"] = provenance.command
    result["provenance"] = provenance.record()
    (args.out / "accuracy.json").write_text(json.dumps(result, indent=1) + "\n")
    table = markdown(result)
    (args.out / "accuracy.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
