"""One JevBench-format task scored on an in-process decision model, as the adapter would be asked it.

What ``benchmarks.accuracy`` and ``benchmarks.priors`` share: the task as the request the adapter gets (its labels
in a shuffled option order, for the flip rate), the answer key of a distribution, one task scored, and the summary
of a set (accuracy, Brier, ECE per tier and family). Neither of them is imported here: the two depend on this
module, never on each other's module level.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any, Sequence

from .metrics import Outcome, accuracy, brier, ece
from .tasks import TIERS, Task

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


NOUL_NAMES = {"true": "yes", "false": "no"}  # a noul question's option names, as its task's labels


def in_label_order(task: Task, names: Sequence[str], values: Sequence[float]) -> tuple[float, ...]:
    """``values`` given in the order of the request's option ``names``, in the task's label order."""
    by_label = {NOUL_NAMES.get(n, n) if task.kind == "noul" else n: v for n, v in zip(names, values)}
    return tuple(by_label[label] for label in task.labels)


def answered(model, task: Task, permutations: int = 1, debias: str = "off") -> tuple[Any, Any, float] | None:
    """(the System One item, its result from ``DecisionModel.score``, the seconds both took), None if the adapter
    refuses the task."""
    from decision_adapter.errors import InputError

    started = time.perf_counter()
    try:
        item, prepared = prepared_task(model, task, permutations, debias)
        [result] = model.score(prepared).results
    except InputError:
        return None
    return item, result, time.perf_counter() - started


def score_one(model, task: Task, permutations: int = 1, debias: str = "off") -> Scored | None:
    """The task scored through ``DecisionModel.score``, None if the adapter refuses it (counted wrong in
    accuracy(); it has no logits to calibrate). Its logits are what a temperature applies to: averaged over the
    orderings, debiased."""
    from decision_adapter.engine.readout import softmax

    found = answered(model, task, permutations, debias)
    if found is None:
        return None
    item, result, seconds = found
    logits = in_label_order(task, item.names, result.adjusted_logits)
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
