"""Content-free calibration: the model's prior over the answer labels for one question, divided out of its answer.

A small model often prefers an answer whatever the state says: a position (the first label), or a word (*Yes*).
Order averaging removes the first; the second survives it. Contextual calibration (Zhao et al. 2021, "Calibrate
Before Use") estimates that preference for *this* question and options by scoring them with the state replaced by
input that carries no content ("N/A", an empty state, "[MASK]"), and divides it out of the answer. It needs no
labels, and the prior depends only on the question, the options, their orderings and the prompt, so repeated
question sets (routing, policy) compute it once: its prompts are answered from the engine's answer cache
afterwards, with no job.

How it composes (``DecisionModel._results``), for each question:

1. order averaging: each ordering's label log-probabilities, normalised over the labels and aligned back to the
   options, averaged (log space; the geometric mean of the orderings' distributions);
2. the prior: the same for each content-free state, with the same layout, orderings and readout, averaged over
   the orderings and then over the states, and subtracted (log space: the answer's distribution divided by the
   prior's, renormalised by the softmax);
3. the temperature of ``calibration.json`` (when there is one, fitted on answers debiased the same way).

The prior is estimated under the same orderings as the answer so that what it removes is the bias left in that
answer: at K = 1 the position and the word, at K >= 2 the word alone. The temperature comes last because it is the
only step fitted on labels; fitted before the debiasing (on biased answers), it can only flatten a bias (the
benchmark model's ``noul`` temperature hit its cap of 20), where dividing the prior out removes it.

Pure Python: the modes and the arithmetic; the decision model does the scoring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ..engine.readout import log_sum_exp


@dataclass(frozen=True)
class DebiasMode:
    """A way to estimate the prior: the content-free states it is averaged over (none: no debiasing)."""

    name: str
    states: tuple[str, ...]
    description: str

    @property
    def active(self) -> bool:
        return bool(self.states)

    def describe(self) -> dict[str, object]:
        """What an answer says about the debiasing it applied."""
        return {"mode": self.name, "states": list(self.states)}


MODES = {mode.name: mode for mode in (
    DebiasMode("off", (), "no debiasing: the probabilities are the model's own"),
    DebiasMode("empty", ("",),
               "the prior from the empty state: one prior prompt per ordering, the best measured on the benchmark "
               "model (docs/benchmarks.md)"),
    DebiasMode("content-free", ("N/A", "", "[MASK]"),
               "the prior from three content-free states (N/A, an empty state, [MASK]), averaged in log space"),
)}
OFF = "off"
DEFAULT_MODE = "empty"  # chosen by measurement: benchmarks.accuracy.choose, docs/benchmarks.md


def normalised(values: Sequence[float]) -> list[float]:
    """Log-probabilities over the labels: ``values`` minus their log-sum-exp."""
    total = log_sum_exp(values)
    return [v - total for v in values]


def aligned_mean(rows: Sequence[tuple[Sequence[float], Sequence[int]]], n: int) -> tuple[float, ...]:
    """The mean over ``rows`` of each row's normalised log-probabilities, aligned back to the options: a row is
    (values by position, the option shown at each position). Summed with ``math.fsum`` in row order, so the same
    rows give the same floats bit for bit."""
    columns: list[list[float]] = [[] for _ in range(n)]
    for values, order in rows:
        for option, value in zip(order, normalised(values)):
            columns[option].append(value)
    return tuple(math.fsum(column) / len(column) for column in columns)
