"""Debias priors scored once, every configuration evaluated arithmetically (``python -m benchmarks.accuracy``).

``measure`` scores, for every task and each K of order averaging, the answer's label readout per ordering and the
readouts of every measured prior's content-free prompts per ordering (``decision_adapter.decisions.debias.PRIORS``: the served modes and the explored ones), through
``DecisionModel.readouts`` (the server's own scoring path). The engine's answer cache holds each prompt once, so
a prompt shared by two modes or two K (the empty state's prior, an ordering K = 2 and 4 share) is decoded once.
Choice and score tasks are also scored with their options shuffled (seeded) at K = 1, for the flip rate, in the
modes of ``FLIP_MODES`` only (at K >= 2 the orderings depend on the option set alone: nothing to flip). The raw
readouts are kept (``raw.json.gz``), so re-analysis costs no scoring (``--raw``).

``evaluate`` composes each task's answer for a configuration (mode, strength alpha, floor, K) with
``decision_adapter.decisions.debias.compose``: the server's own arithmetic, so a configuration's figures are what
serving it answers (tests/benchmarks check one against the live adapter, ``==``).

``choose`` is the rule the defaults follow: accuracy first, "never worse" than the model's own answer (see
``NEVER_WORSE``), within a latency bound against the served defaults (``LATENCY_LIMIT``).
"""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from .scoring import ORDER_SEED, Scored, answer_key, in_label_order, prepared_task, shuffled, summary
from .metrics import accuracy, brier, ece
from .tasks import Task

RAW_VERSION = 1
QUESTION_BORNE = "bias/question_borne"
FLIP_MODES = ("off", "empty", "label")


@dataclass(frozen=True)
class Config:
    """One way of serving a decision: a debias mode, the prior's strength and floor, and K orderings."""

    mode: str
    strength: float
    floor: float
    k: int

    @property
    def name(self) -> str:
        if self.mode == "off":
            return f"off K={self.k}"
        return f"{self.mode} a={self.strength:g} f={self.floor:g} K={self.k}"


def grid(modes: Sequence[str], strengths: Sequence[float], floors: Sequence[float],
         orders: Sequence[int]) -> list[Config]:
    """off at each K, and every other mode at each strength (0 is off: left out) and floor at each K."""
    out = []
    for mode in modes:
        for k in orders:
            if mode == "off":
                out.append(Config("off", 0.0, 0.0, k))
            else:
                out += [Config(mode, a, f, k) for a in strengths if a > 0 for f in floors]
    return out


# ---- scoring ----------------------------------------------------------------------------------------------------

def _rows_json(rows) -> list[list[list[float]]]:
    return [[list(values), list(order)] for values, order in rows]


def read_task(model, task: Task, k: int, modes: Sequence[str]) -> dict[str, Any] | None:
    """The raw readouts of one task at K = ``k``: the answer's rows, each content-free prompt kind's rows (keyed by
    ``prompt_key``), and for each mode the kinds it averages (None: the prior's prompt is the question's own, so
    none is divided out; "refused": the prior's tokens are over the request's budget, so the adapter refuses the
    request); None when the adapter refuses the task itself."""
    from decision_adapter.decisions.combine import question_rows
    from decision_adapter.decisions.debias import OFF, PRIORS
    from decision_adapter.errors import InputError

    try:
        item, prepared = prepared_task(model, task, k, OFF)
    except InputError:
        return None
    answer, _, single = question_rows(prepared, model.readouts(prepared), 0, PRIORS[OFF])
    rec: dict[str, Any] = {"names": list(item.names), "single": single, "answer": _rows_json(answer), "priors": {},
                           "prior_rows": {}}
    for mode in modes:
        if mode == OFF:
            continue
        try:
            _, prepared = prepared_task(model, task, k, mode)
        except InputError:
            rec["priors"][mode] = "refused"
            continue
        again, prior, _ = question_rows(prepared, model.readouts(prepared), 0, PRIORS[mode])
        if _rows_json(again) != rec["answer"]:
            raise AssertionError(f"{task.id}: the answer's readouts moved between modes")
        if not prior:
            rec["priors"][mode] = None
            continue
        keys = [prompt_key(text, PRIORS[mode].question) for text in PRIORS[mode].states]
        for key, text in zip(keys, PRIORS[mode].states):
            rows = _rows_json(prior[text])
            if rec["prior_rows"].setdefault(key, rows) != rows:
                raise AssertionError(f"{task.id}: the readouts of the prior prompt {key} moved between modes")
        rec["priors"][mode] = keys
    return rec


def prompt_key(state: str, question: str | None) -> str:
    """A content-free prompt kind as a JSON key: its state, and the question's replacement (none: kept)."""
    return json.dumps([state, question])


def measure(model, tasks: Sequence[Task], orders: Sequence[int], modes: Sequence[str]) -> dict[str, Any]:
    """The raw readouts of every task at each K for each mode, and of its shuffled variant at K = 1 for the
    modes of FLIP_MODES (see the module)."""
    rng = random.Random(ORDER_SEED)
    moved = {t.id: shuffled(t, rng) for t in tasks if t.kind in ("choice", "score")}
    out: dict[str, Any] = {}
    started = time.perf_counter()
    for n, task in enumerate(tasks, start=1):
        entry: dict[str, Any] = {"given": {str(k): read_task(model, task, k, modes) for k in orders}}
        if task.id in moved and 1 in orders:
            entry["shuffled"] = {"1": read_task(model, moved[task.id], 1, [m for m in modes if m in FLIP_MODES])}
        out[task.id] = entry
        if n % 20 == 0:
            print(f"priors: {n}/{len(tasks)} tasks, {time.perf_counter() - started:.0f} s", flush=True)
    return {"version": RAW_VERSION, "seed": ORDER_SEED, "orders": list(orders), "modes": list(modes),
            "prompt_version": model.prompt_version, "gguf_sha256": model.identity.sha256,
            "task_ids": [t.id for t in tasks], "tasks": out}


# ---- evaluation -------------------------------------------------------------------------------------------------

def _rows(rows) -> list[tuple[tuple[float, ...], tuple[int, ...]]]:
    return [(tuple(values), tuple(order)) for values, order in rows]


def prior_rows(rec: dict[str, Any], mode: str,
               own_state: bool = False) -> list[tuple[tuple[float, ...], tuple[int, ...]]] | None:
    """The rows of ``mode``'s prior in ``compose``'s order (each content-free state's in turn); [] without one
    (mode off, or ``own_state``: the question's state is one of the mode's content-free states, for which the
    adapter divides no prior out); None when the adapter refuses the request."""
    keys = None if mode == "off" or own_state else rec["priors"][mode]
    if keys == "refused":
        return None
    return [row for key in keys or () for row in _rows(rec["prior_rows"][key])]


def compose_record(rec: dict[str, Any], config: Config, own_state: bool = False, temperature: float = 1.0):
    """``debias.compose`` for one raw record and configuration; None when the adapter refuses the request."""
    from decision_adapter.decisions.debias import compose

    prior = prior_rows(rec, config.mode, own_state)
    if prior is None:
        return None
    return compose(_rows(rec["answer"]), len(rec["names"]), prior, strength=config.strength, floor=config.floor,
                   temperature=temperature)


def prior_logprobs(rec: dict[str, Any], config: Config, own_state: bool = False) -> tuple[float, ...] | None:
    """The floored log-prior ``compose`` subtracts (before the strength), in option order; None without one."""
    from decision_adapter.decisions.debias import aligned_mean, floored

    prior = prior_rows(rec, config.mode, own_state)
    if not prior:
        return None
    return floored(aligned_mean(prior, len(rec["names"])), config.floor)


@dataclass(frozen=True)
class Evaluated:
    """A configuration's answers: per task (as given and shuffled) the probabilities and logits in label order,
    and what calibrating it needs (the order-averaged logits and the floored log-prior)."""

    config: Config
    given: list[Scored]
    shuffled: list[Scored]
    raw_logits: dict[str, tuple[float, ...]]
    log_prior: dict[str, tuple[float, ...] | None]


def own_state(task: Task, mode: str) -> bool:
    """Whether the adapter divides no prior out for this task in ``mode``: a state prior, and its state carries no
    content (``debias.content_free``; ``DecisionModel``, ``Prepared.no_prior``)."""
    from decision_adapter.decisions.debias import PRIORS, content_free
    from decision_adapter.decisions.prompt import state_text

    return mode != "off" and PRIORS[mode].question is None and content_free(state_text(task.state))


def evaluate(raw: dict[str, Any], tasks: Sequence[Task], config: Config, *,
             skip_label_on_content_free: bool = False) -> Evaluated:
    """The configuration's answers from the raw readouts, as the adapter serves them; ``skip_label_on_content_free``
    answers a label prior's questions with a content-free state as off, as a state prior's are (what the adapter
    does not do: measured to show what dividing it out keeps)."""
    from decision_adapter.decisions.debias import content_free
    from decision_adapter.decisions.prompt import state_text

    rng = random.Random(raw["seed"])
    moved = {t.id: shuffled(t, rng) for t in tasks if t.kind in ("choice", "score")}
    given, other, logits, priors = [], [], {}, {}
    for task in tasks:
        entry = raw["tasks"][task.id]
        for variant, t, out in (("given", task, given), ("shuffled", moved.get(task.id), other)):
            rec = entry.get(variant, {}).get(str(config.k))
            if t is None or rec is None or (config.mode != "off" and config.mode not in rec["priors"]):
                continue
            own = config.mode != "off" and (own_state(t, config.mode) or (
                skip_label_on_content_free and content_free(state_text(t.state))))
            composed = compose_record(rec, config, own)
            if composed is None:
                continue
            out.append(Scored(t, in_label_order(t, rec["names"], composed.adjusted),
                              in_label_order(t, rec["names"], composed.probabilities), 0.0))
            if variant == "given":
                logits[task.id] = in_label_order(t, rec["names"], composed.logits)
                lp = prior_logprobs(rec, config, own)
                priors[task.id] = None if lp is None else in_label_order(t, rec["names"], lp)
    return Evaluated(config, given, other, logits, priors)


def block(tasks: Sequence[Task], ev: Evaluated, folds: int = 5, calibrate: bool = False) -> dict[str, Any]:
    """A configuration's figures: ``summary`` (accuracy per tier, family and type, noul answered true), the flip
    rate under the shuffle, ECE and Brier; with ``calibrate``, ECE, Brier and accuracy after a temperature per type
    fitted out of fold (strength as configured), and after a strength and a temperature per type fitted out of fold
    (what ``python -m decision_adapter.calibrate`` fits)."""
    from decision_adapter.decisions.calibration import Row, out_of_fold

    out = summary(list(tasks), ev.given)
    del out["seconds_p50"]
    by_id = {s.task.id: s for s in ev.given}
    flips = [answer_key(s.task, s.distribution) != answer_key(by_id[s.task.id].task, by_id[s.task.id].distribution)
             for s in ev.shuffled if s.task.id in by_id]
    out.update({"mode": ev.config.mode, "strength": ev.config.strength, "floor": ev.config.floor, "k": ev.config.k,
                "flip_tasks": len(flips), "flip_rate": statistics.fmean(flips) if flips else None,
                "accuracy_shuffled": accuracy([s.outcome() for s in ev.shuffled]) if ev.shuffled else None})
    if calibrate:
        rows = [Row(s.task.kind, s.logits, s.task.labels.index(s.task.expected), s.task.group or s.task.id)
                for s in ev.given]
        after = [s.outcome(tuple(p)) for s, p in zip(ev.given, out_of_fold(rows, folds))]
        out["calibrated_out_of_fold"] = {"ece_10": ece(after), "brier": brier(after), "accuracy": accuracy(after),
                                         "folds": folds}
        if ev.config.mode != "off":
            rows = [Row(s.task.kind, ev.raw_logits[s.task.id], s.task.labels.index(s.task.expected),
                        s.task.group or s.task.id, ev.log_prior[s.task.id]) for s in ev.given]
            after = [s.outcome(tuple(p)) for s, p in zip(ev.given, out_of_fold(rows, folds, strengths=True))]
            out["strength_fitted_out_of_fold"] = {"ece_10": ece(after), "brier": brier(after),
                                                  "accuracy": accuracy(after), "folds": folds,
                                                  "families": _families(tasks, after)}
    return out


def _families(tasks: Sequence[Task], outcomes) -> dict[str, int]:
    right = {o.task_id: o.correct for o in outcomes}
    out: dict[str, int] = {}
    for t in tasks:
        out[f"{t.tier}/{t.family}"] = out.get(f"{t.tier}/{t.family}", 0) + bool(right.get(t.id))
    return out


def sweep(raw: dict[str, Any], tasks: Sequence[Task], configs: Iterable[Config],
          calibrated: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
    """Every configuration's block (``calibrated``: the names that also get the out-of-fold calibrations)."""
    return {c.name: block(tasks, evaluate(raw, tasks, c), calibrate=c.name in calibrated) for c in configs}


# ---- the rule ---------------------------------------------------------------------------------------------------

# The rule the defaults follow, accuracy first within a latency bound: a configuration may be the default only if,
# on the benchmark model, against off at K = 1 (the model's own answer, one prompt), it loses at most one task in
# any family, none in the question-borne family (questions that carry their content, with an empty or generic
# state), and gets more tasks right overall ("never worse"); and only if its median seconds per decision on a new
# state with a new question (the JevBench case: the cache emptied, the prior scored too) are at most LATENCY_LIMIT
# times those of the served defaults (``reference``: the debias mode and K the adapter serves when a request names
# none), timed in one run. Among those, the most tasks right; within one task of that, the fewest tokens on a new
# state with a new question (the tokens, unlike seconds on a shared machine, do not move between runs), then the
# noul answered-true rate nearest the truth. If none qualifies, the default is off at K = 1. Only served modes
# (debias.MODES) can be chosen; the explored priors are measured beside them.
LATENCY_LIMIT = 1.3
LATENCY_CONDITION = "cold"
NEVER_WORSE = ("at most one task lost in any family, none in the question-borne family, and more tasks right "
               "overall, against off at K = 1")


def reference() -> str:
    """The served defaults' mode and K, as the cost section names them ("empty K=1"): what the bound is weighed
    against, read from the adapter's own defaults so that the rule follows them."""
    from decision_adapter.decisions import debias
    from decision_adapter.settings import Settings

    return f"{debias.DEFAULT_MODE} K={Settings.fields()['permutations'].default}"


def latency_bound(seconds: dict[str, dict[str, Any]]) -> float:
    """LATENCY_LIMIT times the served defaults' median seconds on a new state with a new question."""
    key = f"seconds_p50_{LATENCY_CONDITION}"
    row = seconds.get(reference())
    if not row or row.get(key) is None:
        raise ValueError(f"the cost section has no timing of the served defaults ({reference()}): the latency "
                         f"bound is weighed against them")
    return LATENCY_LIMIT * row[key]


def right(block_: dict[str, Any], family: str | None = None) -> int:
    b = block_["overall"] if family is None else block_["families"][family]
    return round(b["accuracy"] * b["n"])


def losses(candidate: dict[str, Any], base: dict[str, Any]) -> dict[str, int]:
    """Tasks lost per family against ``base`` (only families that lose)."""
    return {f: right(base, f) - right(candidate, f) for f in base["families"] if right(candidate, f) < right(base, f)}


def never_worse(candidate: dict[str, Any], base: dict[str, Any]) -> bool:
    lost = losses(candidate, base)
    return (all(n <= 1 for n in lost.values()) and lost.get(QUESTION_BORNE, 0) == 0
            and right(candidate) > right(base))


def choose(results: dict[str, dict[str, Any]], tokens: dict[str, dict[str, Any]],
           seconds: dict[str, dict[str, Any]], base: str = "off K=1") -> dict[str, Any]:
    """The default configuration by the rule above (``NEVER_WORSE``, ``LATENCY_LIMIT``): ``results`` the blocks of
    every configuration, ``tokens`` the token section (per mode and K), ``seconds`` the cost section (per mode and
    K, timed; a pair it did not time cannot be chosen, except ``base``)."""
    from decision_adapter.decisions.debias import MODES

    bound = latency_bound(seconds)
    key = f"seconds_p50_{LATENCY_CONDITION}"

    def pair(name: str) -> str:
        return f"{results[name]['mode']} K={results[name]['k']}"

    def timed(name: str) -> float | None:
        return (seconds.get(pair(name)) or {}).get(key)

    allowed = [n for n in results if results[n]["mode"] in MODES and timed(n) is not None and timed(n) <= bound]
    passing = [n for n in allowed if n != base and never_worse(results[n], results[base])]
    chosen = base
    if passing:
        best = max(right(results[n]) for n in passing)
        near = [n for n in passing if right(results[n]) >= best - 1]

        def noul_gap(n: str) -> float:
            b = results[n]
            return abs(b["noul_true_rate"] - b["noul_true_expected"]) if b["noul_true_rate"] is not None else 0.0

        chosen = min(near, key=lambda n: (tokens[pair(n)]["ratio_p50_cold"], noul_gap(n), -right(results[n]), n))
    b = results[chosen]
    return {"pair": chosen, "mode": b["mode"], "strength": b["strength"], "floor": b["floor"], "k": b["k"],
            "rule": f"never worse: {NEVER_WORSE}; a median latency on a new state with a new question at most "
                    f"{LATENCY_LIMIT}x the served defaults' ({reference()}); the most tasks right, then (within one "
                    f"task of it) the fewest tokens on a new state with a new question, then noul answered true "
                    f"nearest the truth; off at K = 1 if none qualifies",
            "passing": len(passing), "allowed": len(allowed),
            "latency": {"reference": reference(), "condition": LATENCY_CONDITION,
                        "reference_seconds": seconds[reference()][key], "limit_seconds": bound,
                        "chosen_seconds": timed(chosen)},
            "right": {n: right(results[n]) for n in [base, *passing]}}


def rule_out_of_fold(raw: dict[str, Any], tasks: Sequence[Task], configs: Sequence[Config],
                     tokens: dict[str, dict[str, Any]], seconds: dict[str, dict[str, Any]],
                     folds: int = 5) -> dict[str, Any]:
    """How the rule does on tasks it did not choose on: the tasks in group-disjoint folds; for each, ``choose`` on
    the other folds' tasks and the chosen configuration scored on the held fold (with off at K = 1 beside it).
    The configurations are chosen among many on the same tasks that report them; this says how much of the gain
    survives that selection. The latency bound is the whole run's (the cost is timed on a few tasks per tier)."""
    from decision_adapter.decisions.calibration import Row, group_folds

    evaluated = {c.name: evaluate(raw, tasks, c) for c in configs}

    def block_of(name: str, members: Sequence[Task]) -> dict[str, Any]:
        ids = {t.id for t in members}
        ev = evaluated[name]
        b = summary(list(members), [s for s in ev.given if s.task.id in ids])
        b.update({"mode": ev.config.mode, "strength": ev.config.strength, "floor": ev.config.floor,
                  "k": ev.config.k})
        return b

    rows = [Row(t.kind, (0.0,), 0, t.group or t.id) for t in tasks]
    out = {"folds": [], "off": 0, "chosen": 0, "tasks": len(tasks)}
    for fold in group_folds(rows, folds):
        held = [tasks[i] for i in fold]
        kept = [t for i, t in enumerate(tasks) if i not in set(fold)]
        chosen = choose({c.name: block_of(c.name, kept) for c in configs}, tokens, seconds)["pair"]
        off, got = right(block_of("off K=1", held)), right(block_of(chosen, held))
        out["folds"].append({"chosen": chosen, "tasks": len(held), "off": off, "right": got})
        out["off"] += off
        out["chosen"] += got
    return out


def best_per_mode(results: dict[str, dict[str, Any]], k: int) -> dict[str, str]:
    """For each mode, its configuration at K = ``k`` with the most tasks right (the fewest family losses against
    off at the same K among equals): what a request can ask for where the rule's latency bound does not bind."""
    base = results[f"off K={k}"]
    out: dict[str, str] = {}
    for name, b in results.items():
        if b["k"] != k or b["mode"] == "off":
            continue
        current = out.get(b["mode"])
        score = (right(b), -sum(losses(b, base).values()))
        if current is None or score > (right(results[current]), -sum(losses(results[current], base).values())):
            out[b["mode"]] = name
    return out


def noul_gap_points(b: dict[str, Any]) -> float | None:
    if b["noul_true_rate"] is None:
        return None
    return 100 * abs(b["noul_true_rate"] - b["noul_true_expected"])


def favourite_check(raw: dict[str, Any], tasks: Sequence[Task], mode: str = "label") -> dict[str, int]:
    """How many tasks of the favourite family have their right option as the ``mode`` prior's top at K = 1."""
    from decision_adapter.decisions.debias import aligned_mean

    members = [t for t in tasks if (t.tier, t.family) == ("bias", "favourite")]
    top = 0
    for t in members:
        rec = raw["tasks"][t.id]["given"]["1"]
        prior = prior_rows(rec, mode) if rec else None
        if prior:
            lp = in_label_order(t, rec["names"], aligned_mean(prior, len(rec["names"])))
            top += t.labels[max(range(len(lp)), key=lp.__getitem__)] == t.expected
    return {"tasks": len(members), "right_is_prior_top": top}


def mean_or_nan(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else math.nan


# ---- the readouts of an earlier run, measured again -------------------------------------------------------------

def same_as(raw: dict[str, Any], again: dict[str, Any]) -> dict[str, Any]:
    """How the readouts measured again (``measure``'s output) compare with ``raw``'s, record by record (a task at
    one K): equal bit for bit (every logit of the answer's rows and of every prior's rows, ``==``), or not, with
    the largest difference of a logit."""
    equal = differ = 0
    largest = 0.0
    for task_id, entry in again["tasks"].items():
        for k, rec in entry["given"].items():
            before = raw["tasks"].get(task_id, {}).get("given", {}).get(k)
            if before is None or rec is None:
                continue
            if rec == before:
                equal += 1
                continue
            differ += 1
            pairs = [(rec["answer"], before["answer"])] + [(rec["prior_rows"][key], before["prior_rows"].get(key, []))
                                                           for key in rec["prior_rows"]]
            for new_rows, old_rows in pairs:
                for (new, _), (old, _) in zip(new_rows, old_rows):
                    largest = max(largest, max(abs(a - b) for a, b in zip(new, old)))
    return {"records_equal": equal, "records_different": differ, "largest_logit_difference": largest}


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.priors --same-as RAW``: the raw readouts of an earlier run (``raw.json.gz``) measured
    again with this code, on the tasks selected, at the K and modes given: whether a change of the engine moved
    any of them."""
    import argparse
    import gzip
    import os
    from pathlib import Path

    from .tasks import BIAS_TASKS, DEFAULT_TASKS, add_selection_options, load, selected

    parser = argparse.ArgumentParser(prog="python -m benchmarks.priors", description=main.__doc__)
    parser.add_argument("--same-as", type=Path, required=True, help="the raw.json.gz of the earlier run")
    parser.add_argument("--tasks", nargs="+", type=Path, default=[DEFAULT_TASKS, BIAS_TASKS])
    parser.add_argument("--model-dir", required=True)
    add_selection_options(parser)
    parser.add_argument("--orders", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--modes", nargs="+", default=["off", "empty", "content-free", "label"])
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--save", type=Path, help="keep the readouts measured again here (a raw.json.gz)")
    args = parser.parse_args(argv)

    from decision_adapter.settings import Settings
    from decision_adapter.startup import load_decision_model
    from dataclasses import replace

    from .provenance import Provenance

    raw = json.loads(gzip.decompress(args.same_as.read_bytes()))
    tasks = [t for t in selected(load(args.tasks), args) if t.id in raw["tasks"]]
    settings = replace(Settings.from_env(), model_dir=args.model_dir, threads=args.threads)
    with Provenance("benchmarks.priors", argv) as provenance:
        provenance.ran_with(settings)
        model = load_decision_model(settings, calibrated=False)
        try:
            provenance.kernels_of(model.model_info)
            if model.prompt_version != raw["prompt_version"]:
                raise SystemExit(f"the prompt is {model.prompt_version}, the raw readouts' {raw['prompt_version']}")
            again = measure(model, tasks, args.orders, args.modes)
            if args.save:
                args.save.write_bytes(gzip.compress(json.dumps(again).encode(), mtime=0))
        finally:
            model.close()
        found = same_as(raw, again)
        print(json.dumps({"tasks": len(tasks), "orders": args.orders, "modes": args.modes, **found,
                          "provenance": provenance.record()}))
    return 0 if not found["records_different"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
