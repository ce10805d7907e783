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
   plans (deterministic); and (``--cost-per-tier N``) the first N tasks of each tier timed three ways: with the
   cache emptied (a new state and a new question: the prior is scored too), then with the state and the answer
   dropped but the prior kept (a new state, a question asked before: the routing and policy case), then with the
   answer alone dropped (the state seen before too). The defaults are chosen by the rule in ``choose``, on the
   tokens: seconds on a shared machine move between runs, the tokens do not.
4. **Calibration**: temperatures fitted per question type on the first style's answers (K = 1, options as
   given, no debiasing) with group-disjoint cross-validation; ECE and Brier before and after, out of fold, with a
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
from .tasks import DEFAULT_TASKS, TIERS, Task, add_selection_options, first_per_tier, load, selected

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


def prepared_task(model, task: Task, permutations: int = 1, debias: str = "off"):
    """(the System One item, the prepared request) of a task, as the adapter would prepare it; InputError when
    the adapter refuses it."""
    from decision_adapter.protocols import systemone
    from decision_adapter.protocols.fields import RequestContext

    body = {"model": systemone.ALIAS, "state": task.state, "questions": {"q": task.question}}
    _, _, [item] = systemone.parse(body, RequestContext.of(model, max_decisions=1))
    return item, model.prepare([replace(item.question, permutations=permutations, debias=debias)])


def score_one(model, task: Task, permutations: int = 1, debias: str = "off") -> Scored | None:
    """The task scored through ``DecisionModel.score``, None if the adapter refuses it (counted wrong in
    accuracy(); it has no logits to calibrate). Its logits are what a temperature applies to: averaged over the
    orderings, debiased."""
    from decision_adapter.engine.readout import softmax
    from decision_adapter.errors import InputError

    started = time.perf_counter()
    try:
        item, prepared = prepared_task(model, task, permutations, debias)
        [result] = model.score(prepared).results
    except InputError:
        return None
    seconds = time.perf_counter() - started
    names = {"true": "yes", "false": "no"} if item.type == "noul" else {}
    by_label = {names.get(n, n): x for n, x in zip(item.names, result.adjusted_logits)}
    logits = tuple(by_label[label] for label in task.labels)
    return Scored(task, logits, tuple(softmax(logits)), seconds)


def score_tasks(model, tasks: list[Task], permutations: int = 1, debias: str = "off") -> list[Scored]:
    return [s for task in tasks if (s := score_one(model, task, permutations, debias)) is not None]


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
        "types": {kind: block([o for o, t in zip(outcomes, tasks) if t.kind == kind])
                  for kind in ("noul", "choice", "score") if any(t.kind == kind for t in tasks)},
        "families": {f"{t.tier}/{t.family}": block([o for o, t2 in zip(outcomes, tasks) if
                                                    (t2.tier, t2.family) == (t.tier, t.family)])
                     for t in tasks},
        "noul_true_rate": statistics.fmean(s.distribution[s.task.labels.index("yes")] > 0.5 for s in noul)
        if noul else None,
        "noul_true_expected": statistics.fmean(s.task.expected == "yes" for s in noul) if noul else None,
        "score_extremes_right": statistics.fmean(s.outcome().correct for s in extremes) if extremes else None,
        "seconds_p50": statistics.median(s.seconds for s in scored) if scored else None,
    }


def pair_name(mode: str, k: int) -> str:
    return f"{mode} K={k}"


def debias_section(model, tasks: list[Task], orders: list[int], modes: list[str], folds: int = 5) -> dict[str, Any]:
    """Every task in each debias mode at each K, choice and score tasks also shuffled: accuracy, noul answered
    true, flips, ECE and Brier before and after a group-disjoint temperature (see the module's docstring). The
    cache is emptied once; tasks are scored task by task, every pair in a row."""
    from decision_adapter.decisions.calibration import Row, out_of_fold

    rng = random.Random(ORDER_SEED)
    moved = {t.id: shuffled(t, rng) for t in tasks if t.kind in ("choice", "score")}
    pairs = [(mode, k) for mode in modes for k in orders]
    given: dict[tuple[str, int], list[Scored]] = {pair: [] for pair in pairs}
    other: dict[tuple[str, int], list[Scored]] = {pair: [] for pair in pairs}
    model.engine.cache.clear()
    started = time.perf_counter()
    for n, task in enumerate(tasks, start=1):
        for mode, k in pairs:
            if (scored := score_one(model, task, k, mode)) is not None:
                given[mode, k].append(scored)
            if task.id in moved and (scored := score_one(model, moved[task.id], k, mode)) is not None:
                other[mode, k].append(scored)
        if n % 20 == 0:
            print(f"debias: {n}/{len(tasks)} tasks, {time.perf_counter() - started:.0f} s", flush=True)
    out = {}
    for mode, k in pairs:
        mine, shuffled_ = given[mode, k], other[mode, k]
        by_id = {s.task.id: s for s in mine}
        flips = [answer_key(s.task, s.distribution) != answer_key(by_id[s.task.id].task, by_id[s.task.id].distribution)
                 for s in shuffled_ if s.task.id in by_id]
        rows = [Row(s.task.kind, s.logits, s.task.labels.index(s.task.expected), s.task.group or s.task.id)
                for s in mine]
        after = [s.outcome(tuple(p)) for s, p in zip(mine, out_of_fold(rows, folds))]
        block = summary(tasks, mine)
        del block["seconds_p50"]  # the cache shared between pairs makes seconds meaningless here: see cost
        block.update({"mode": mode, "k": k, "flip_tasks": len(flips),
                      "flip_rate": statistics.fmean(flips) if flips else None,
                      "accuracy_shuffled": accuracy([s.outcome() for s in shuffled_]) if shuffled_ else None,
                      "calibrated_out_of_fold": {"ece_10": ece(after), "brier": brier(after), "folds": folds}})
        out[pair_name(mode, k)] = block
        print(f"{pair_name(mode, k)}: accuracy {block['overall']['accuracy']:.3f}, noul true "
              f"{block['noul_true_rate'] if block['noul_true_rate'] is not None else float('nan'):.2f}, flips "
              f"{block['flip_rate'] if block['flip_rate'] is not None else float('nan'):.3f}", flush=True)
    return out


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


# The rule the defaults are chosen by: the most tasks right among the pairs that cost at most COST_LIMIT times the
# tokens of off at K = 1 per decision on a new state with the prior cached (the routing and policy case: each
# request brings a new state, the questions repeat), per-task median over every task of the section; among those
# within one task of the best, the cheapest (with the prior cached, then cold). 1.5x keeps a default decision as
# cheap as one prompt where the questions repeat, so that it stays faster than generating the answer; a request that
# wants more accuracy asks for more orderings (docs/benchmarks.md gives every pair's accuracy and tokens).
COST_LIMIT = 1.5
COST_CONDITION = "prior_warm"


def choose(debias: dict[str, Any], tokens: dict[str, Any]) -> dict[str, Any] | None:
    """The defaults by the rule above (``COST_LIMIT``)."""
    key = f"ratio_p50_{COST_CONDITION}"
    allowed = [name for name, row in tokens.items() if name in debias and row[key] <= COST_LIMIT]
    if not allowed:
        return None
    right = {name: round(debias[name]["overall"]["accuracy"] * debias[name]["overall"]["n"]) for name in allowed}
    best = max(right.values())
    near = [name for name in allowed if right[name] >= best - 1]
    chosen = min(near, key=lambda name: (tokens[name][key], tokens[name]["ratio_p50_cold"], name))
    return {"pair": chosen, "mode": debias[chosen]["mode"], "k": debias[chosen]["k"],
            "rule": f"the most tasks right within {COST_LIMIT}x the tokens of off at K = 1 per decision on a new "
                    f"state with the prior cached (per-task median over every task); the cheapest of those within "
                    f"one task of the best, with the prior cached, then cold",
            "right": right}


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
    grid = result["debias"]
    names = list(grid)
    first = grid[names[0]]
    lines = ["", f"Debias and order averaging (style `{style}`, tiers {', '.join(result['order_tiers'])}: "
             f"{first['overall']['n']} tasks; choice and score tasks also shuffled for the flip rate; ECE and Brier "
             f"of the probabilities as served, then after a temperature per type fitted on the other "
             f"{first['calibrated_out_of_fold']['folds']} group-disjoint folds):", "",
             "| debias | K | accuracy | " + " | ".join(f"{t} ({b['n']})" for t, b in first["tiers"].items())
             + " | " + " | ".join(f"{t} ({b['n']})" for t, b in first["types"].items())
             + " | noul true / expected | flip rate | ECE | Brier | ECE, T out of fold | Brier, T out of fold |",
             "|---|---:|---:|" + "---:|" * (len(first["tiers"]) + len(first["types"])) + "---:|---:|---:|---:|---:|---:|"]
    for name in names:
        b = grid[name]
        noul = (f"{pct(b['noul_true_rate'], 0)} / {pct(b['noul_true_expected'], 0)}"
                if b["noul_true_rate"] is not None else "-")
        lines.append(f"| {b['mode']} | {b['k']} | **{pct(b['overall']['accuracy'])}** | "
                     + " | ".join(pct(x["accuracy"]) for x in b["tiers"].values()) + " | "
                     + " | ".join(pct(x["accuracy"]) for x in b["types"].values())
                     + f" | {noul} | {pct(b['flip_rate'])} | {b['overall']['ece_10']:.3f} | {b['overall']['brier']:.3f}"
                     f" | {b['calibrated_out_of_fold']['ece_10']:.3f} | {b['calibrated_out_of_fold']['brier']:.3f} |")
    lines += ["", "Tasks right per family (n tasks):", "",
              "| family | n | " + " | ".join(f"{grid[n]['mode']} K={grid[n]['k']}" for n in names) + " |",
              "|---|---:|" + "---:|" * len(names)]
    for family, block in first["families"].items():
        lines.append(f"| {family} | {block['n']} | " + " | ".join(
            str(round(grid[n]["families"][family]["accuracy"] * block["n"])) for n in names) + " |")
    return lines


def cost_markdown(result: dict[str, Any]) -> list[str]:
    cost = result["cost"]
    tasks = next(iter(cost.values()))["tasks"]
    lines = ["", f"Cost per decision ({tasks} tasks, the first {result['cost_per_tier']} of each tier; prepare and "
             f"score in-process; medians over the tasks, and the per-task median ratio to off at K = 1 in the same "
             f"condition; seconds from a machine shared with other work):", "",
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
        lines += ["", f"Chosen by the rule ({chosen['rule']}): **debias {chosen['mode']}, K = {chosen['k']}**."]
    return lines


def main(argv: list[str] | None = None) -> int:
    from decision_adapter.decisions.debias import MODES
    from decision_adapter.decisions.prompt import DEFAULT_STYLE, STYLES

    parser = argparse.ArgumentParser(prog="python -m benchmarks.accuracy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", type=Path, default=[DEFAULT_TASKS])
    parser.add_argument("--model-dir", help="GGUF folder (default: the embedded SmolLM2 model)")
    add_selection_options(parser)
    parser.add_argument("--order-tiers", nargs="+", choices=TIERS, default=list(TIERS),
                        help="tiers whose tasks the debias and order section scores")
    parser.add_argument("--styles", nargs="+", choices=list(STYLES), default=[DEFAULT_STYLE],
                        help="prompt styles to compare; the first is used for the other sections")
    parser.add_argument("--orders", type=int, nargs="*", default=[1, 2, 4], help="K values of order averaging")
    parser.add_argument("--debias", nargs="*", choices=list(MODES), default=list(MODES),
                        help="debias modes to compare (none: skip the debias and order section)")
    parser.add_argument("--cost-per-tier", type=int, default=0, metavar="N",
                        help="time each debias mode and K on the first N tasks of each tier (0: skip)")
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
                              "order_tiers": args.order_tiers, "cost_per_tier": args.cost_per_tier, "styles": {}}
    first_scored = None
    for i, style in enumerate(args.styles):
        model = load_decision_model(replace(base, prompt_style=style), calibrated=False)
        try:
            scored = score_tasks(model, tasks)
            result["styles"][style] = {"version": model.prompt_version, **summary(tasks, scored)}
            print(f"style {style}: accuracy {result['styles'][style]['overall']['accuracy']:.3f}", flush=True)
            if i == 0:
                first_scored = scored
                if args.orders and args.debias:
                    result["debias"] = debias_section(model, [t for t in tasks if t.tier in args.order_tiers],
                                                      args.orders, args.debias)
                if args.orders and args.debias:
                    section = [t for t in tasks if t.tier in args.order_tiers]
                    result["tokens"] = token_section(model, section, args.orders, args.debias)
                    result["chosen"] = choose(result["debias"], result["tokens"])
                if args.orders and args.debias and args.cost_per_tier:
                    result["cost"] = cost_section(model, first_per_tier(tasks, args.cost_per_tier), args.orders,
                                                  args.debias)
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
