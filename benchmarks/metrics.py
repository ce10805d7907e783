"""Scores for decisions: accuracy, multi-class Brier score, expected calibration error, latency."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Outcome:
    """One task's result. `distribution` is None when the request failed or was refused."""

    task_id: str
    tier: str
    labels: tuple[str, ...]
    expected: str
    distribution: tuple[float, ...] | None
    latency_s: float | None
    error: str | None = None

    @property
    def predicted(self) -> str | None:
        if self.distribution is None:
            return None
        return self.labels[max(range(len(self.labels)), key=self.distribution.__getitem__)]

    @property
    def correct(self) -> bool:
        return self.predicted == self.expected


def accuracy(outcomes: Sequence[Outcome]) -> float:
    """Failures and refusals count as wrong."""
    return sum(o.correct for o in outcomes) / len(outcomes) if outcomes else math.nan


def brier(outcomes: Sequence[Outcome]) -> float:
    """Mean over answered tasks of sum_k (p_k - y_k)^2: 0 is perfect, 2 is confidently wrong."""
    scores = [sum((p - (label == o.expected)) ** 2 for p, label in zip(o.distribution, o.labels))
              for o in outcomes if o.distribution is not None]
    return statistics.fmean(scores) if scores else math.nan


def ece(outcomes: Sequence[Outcome], bins: int = 10) -> float:
    """Expected calibration error of the top probability, over `bins` equal-width bins."""
    answered = [o for o in outcomes if o.distribution is not None]
    if not answered:
        return math.nan
    total = 0.0
    for lo, hi, members in reliability(answered, bins):
        if members:
            confidence = statistics.fmean(max(o.distribution) for o in members)
            hit_rate = statistics.fmean(o.correct for o in members)
            total += len(members) / len(answered) * abs(hit_rate - confidence)
    return total


def reliability(outcomes: Sequence[Outcome], bins: int = 10):
    """(low, high, members) per bin of the top probability; the last bin includes 1.0."""
    edges = [i / bins for i in range(bins + 1)]
    out = []
    for i in range(bins):
        lo, hi = edges[i], edges[i + 1]
        members = [o for o in outcomes if o.distribution is not None
                   and (lo <= max(o.distribution) < hi or (i == bins - 1 and max(o.distribution) == 1.0))]
        out.append((lo, hi, members))
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def latency_summary(latencies: Sequence[float]) -> dict[str, float]:
    return {"p50_s": percentile(latencies, 50), "p95_s": percentile(latencies, 95),
            "max_s": max(latencies) if latencies else math.nan, "n": len(latencies)}
