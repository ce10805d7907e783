"""What a job costs in seconds, from its shape: the work a plan does, and a cost model learnt from the jobs that ran.

One speed (tokens over seconds) cannot foresee both a short state and a long one: attention makes a token at
position 4,000 dearer than one at 100, and a question of 255 options decodes hundreds of small label-path
batches, each with its fixed cost. So a plan's ``Work`` counts, besides its tokens, the jobs, the ``llama_decode``
calls and the positions its tokens attend over (a chunk of ``n`` tokens from position ``p`` attends over
``n * p + n * (n + 1) / 2`` cells), and ``CostModel`` fits seconds as a non-negative combination of them to the
recent jobs, each weighed by the inverse of its seconds (relative errors: short and long jobs count alike) and by
its recency. The per-token term is always in the model; the others come in only where the jobs seen pin them
down (full rank) and they explain the seconds markedly better, so that a few jobs of one shape do not extrapolate
wildly to another.

``CostModel.fastest`` is the most optimistic estimate the model's own record allows: its estimate times a low
quantile (``OPTIMISM_QUANTILE``) of the ratios of seconds taken to seconds foreseen among the recent jobs, never
the lowest ratio alone and never more than half of the estimate. A request is told that it can never fit (the
non-retryable 4xx) only when even that is over what a request may take: a margin the estimate's error cannot
explain. Not the lowest ratio: one job the model overestimated (the start-up probe's second job, typically, foreseen
from the first's fixed costs) would otherwise make it lenient for the next ``MEMORY`` jobs, and an oversized request
would run into its deadline (a fault the rollback alarm counts) instead of being refused at once.

Pure: no llama.cpp; numpy for the fit.
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass, fields
from typing import Iterable

import numpy as np

from .plan import Decode, Plan, Step

# Recent jobs the model is fitted to, and how much each older one weighs less than the one after it.
MEMORY = 64
RECENCY = 0.95
# A term beyond the per-token one joins the model only if it cuts the weighted squared error by this share.
IMPROVEMENT = 0.2
# The optimistic estimate is at most this share of the estimate, whatever the record says.
MARGIN = 0.5
# The share of the recent ratios (seconds taken / foreseen) below the one the optimistic estimate uses; at least the
# lowest one is always below it, so one bad estimate never decides (and one ratio alone decides nothing).
OPTIMISM_QUANTILE = 0.1


@dataclass(frozen=True)
class Work:
    """What a job decodes, by what its seconds depend on."""

    jobs: int = 0
    decodes: int = 0  # llama_decode calls
    tokens: int = 0
    attended: int = 0  # the cells each token attends over, summed

    def __add__(self, other: "Work") -> "Work":
        return Work(*(a + b for a, b in zip(self.features(), other.features())))

    def __sub__(self, other: "Work") -> "Work":
        """What is left of this work once ``other`` of it is done (never below nothing)."""
        return Work(*(max(0, a - b) for a, b in zip(self.features(), other.features())))

    def features(self) -> tuple[int, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))


NOTHING = Work()
FEATURES = tuple(f.name for f in fields(Work))
TOKENS = FEATURES.index("tokens")


def _decode_work(step: Decode, tokens: int | None = None) -> Work:
    """The work of one micro-batch (its first ``tokens`` only, where given: a step cut short)."""
    left = step.tokens if tokens is None else tokens
    count = attended = 0
    for chunk in step.chunks:
        n = min(len(chunk.tokens), left)
        count += n
        attended += n * chunk.pos + n * (n + 1) // 2
        left -= n
    return Work(0, 1, count, attended)


def plan_work(plan: Plan) -> Work:
    """The work of a whole plan: one job."""
    return steps_work(plan.steps, jobs=1)


def steps_work(steps: Iterable[Step], *, jobs: int = 0) -> Work:
    work = Work(jobs=jobs)
    for step in steps:
        if isinstance(step, Decode):
            work = work + _decode_work(step)
    return work


def done_work(plan: Plan, decoded_tokens: int) -> Work:
    """The work of ``plan`` once its first ``decoded_tokens`` tokens are decoded (a job stopped part way: its
    micro-batches in order, the last one counted for the tokens of it that count)."""
    work, left = Work(jobs=1), decoded_tokens
    for step in plan.steps:
        if left <= 0:
            break
        if isinstance(step, Decode):
            work = work + _decode_work(step, min(left, step.tokens))
            left -= step.tokens
    return work


@dataclass(frozen=True)
class Sample:
    work: Work
    seconds: float
    foreseen_s: float | None  # what the model said before the job ran (None: it could not say yet)


class CostModel:
    """Seconds of work, fitted to the recent jobs (see the module's text). Not thread-safe: its owner (the
    scheduler) calls it under its lock."""

    def __init__(self, memory: int = MEMORY):
        self._samples: collections.deque[Sample] = collections.deque(maxlen=memory)
        self._coefficients: np.ndarray | None = None

    def learn(self, work: Work, seconds: float, foreseen_s: float | None) -> None:
        """A job (or the part of one that ran) did ``work`` in ``seconds``; ``foreseen_s``: the model's estimate
        of that work before it ran."""
        if work.tokens <= 0 or seconds <= 0:
            return
        self._samples.append(Sample(work, seconds, foreseen_s))
        self._coefficients = _fit(list(self._samples))

    def seconds(self, work: Work) -> float | None:
        """The estimate; None before any job ran; 0 for no work."""
        if work.tokens <= 0 and work.jobs <= 0:
            return 0.0
        if self._coefficients is None:
            return None
        return float(np.dot(self._coefficients, work.features()))

    def fastest(self, work: Work) -> float | None:
        """The most optimistic estimate the record allows (see the module's text)."""
        estimate = self.seconds(work)
        if estimate is None:
            return None
        ratios = sorted(self.errors())
        if len(ratios) < 2:
            return estimate * MARGIN
        return estimate * min(MARGIN, ratios[max(1, int(OPTIMISM_QUANTILE * len(ratios)))])

    def errors(self) -> list[float]:
        """Seconds taken over seconds foreseen, for each recent job the model could foresee."""
        return [s.seconds / s.foreseen_s for s in self._samples if s.foreseen_s]

    @property
    def terms(self) -> dict[str, float]:
        """The fitted seconds per unit of each feature (those the model uses; for docs and benchmarks)."""
        if self._coefficients is None:
            return {}
        return {name: float(c) for name, c in zip(FEATURES, self._coefficients) if c}


def _fit(samples: list[Sample]) -> np.ndarray:
    """Non-negative weighted least squares of seconds on the features, the per-token term always in, each other
    term in only where it is pinned down and cuts the error by ``IMPROVEMENT`` (see the module's text)."""
    x = np.array([s.work.features() for s in samples], dtype=float)
    y = np.array([s.seconds for s in samples], dtype=float)
    weight = RECENCY ** np.arange(len(samples) - 1, -1, -1) / y  # relative errors, recent jobs first
    xw, yw = x * weight[:, None], y * weight
    others = [i for i in range(len(FEATURES)) if i != TOKENS]
    best: tuple[float, np.ndarray] | None = None
    for size in range(len(others) + 1):
        for extra in itertools.combinations(others, size):
            columns = [TOKENS, *extra]
            a = xw[:, columns]
            if len(samples) < 2 * len(columns) and size:
                continue
            if np.linalg.matrix_rank(a) < len(columns):
                continue
            solution, *_ = np.linalg.lstsq(a, yw, rcond=None)
            if (solution < 0).any():
                continue
            error = float(np.sum((a @ solution - yw) ** 2))
            if best is None or error < best[0] * (1 - IMPROVEMENT):
                coefficients = np.zeros(len(FEATURES))
                coefficients[columns] = solution
                best = (error, coefficients)
    if best is None:  # the per-token term alone is always pinned down by a job with tokens
        raise AssertionError("no fit")  # pragma: no cover
    return best[1]
