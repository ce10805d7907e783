"""Calibration bound to a model: per question type, a temperature and the strength of the debiasing prior, fitted
by negative log-likelihood.

``calibration.json`` (beside the GGUF) names the GGUF's SHA-256 and the prompt version it was fitted for; a
file for another model or prompt keeps the server from turning ready, because its temperatures would mean
nothing there. Probabilities become ``softmax((logits - alpha * log prior) / T)`` for the question's type
(``debias.compose``); the raw logits stay in ``option_logits``. A file written before strengths were fitted (no
``strengths``; before debiasing existed, no ``debias`` either: fitted on answers without a prior) loads as what it
was fitted on: its mode at full strength; questions answered in another mode are answered uncalibrated and say so.
Pure Python: fitting and group-disjoint cross-validation live here too, so the ``calibrate`` command and the
benchmarks share them.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..engine.readout import log_sum_exp, softmax
from .debias import floored
from .labels import QUESTION_TYPES

FILE_NAME = "calibration.json"
DEFAULT_TYPE = "choice"  # the walkthrough's decisions carry no type: they are choices
LOG_T_RANGE = (math.log(0.05), math.log(20.0))
STRENGTHS = tuple(i / 20 for i in range(21))  # the strengths a fit tries: 0, 0.05, ..., 1


class CalibrationError(RuntimeError):
    """calibration.json is unreadable or fitted for another model or prompt; the message says which."""


@dataclass(frozen=True)
class Row:
    """One labelled decision as the model scored it: its option logits (order-averaged, before any prior), the
    right option, its group, and the log-probabilities of its prior as floored (None: no prior divided out)."""

    type: str
    logits: tuple[float, ...]
    answer: int
    group: str
    prior: tuple[float, ...] | None = None

    def adjusted(self, strength: float) -> tuple[float, ...]:
        """The logits with the prior raised to ``strength`` divided out (``debias.compose``'s arithmetic)."""
        if self.prior is None or strength == 0.0:
            return self.logits
        return tuple(a - strength * b for a, b in zip(self.logits, self.prior))


@dataclass(frozen=True)
class Calibration:
    gguf_sha256: str
    prompt_version: str
    temperatures: Mapping[str, float]
    permutations: int = 1
    fitted: Mapping[str, Any] = field(default_factory=dict)  # rows, folds, out-of-fold metrics
    debias: str = "off"  # the debias mode of the answers it was fitted on (decisions.debias.MODES)
    # The strength (alpha) of the prior per question type, fitted beside the temperature; None: a file from before
    # strengths were fitted, whose temperatures were fitted at full strength (or on answers without a prior).
    strengths: Mapping[str, float] | None = None
    floor: float = 0.0  # the uniform's share mixed into the prior it was fitted with

    def temperature(self, kind: str | None) -> float:
        return float(self.temperatures.get(kind or DEFAULT_TYPE, 1.0))

    def strength(self, kind: str | None, default: float) -> float:
        """The fitted strength for the question's type; ``default`` for a type it has none for; 1 (full strength,
        as it was fitted) for a file from before strengths."""
        if self.strengths is None:
            return 1.0
        return float(self.strengths.get(kind or DEFAULT_TYPE, default))

    def probabilities(self, logits: Sequence[float], kind: str | None) -> list[float]:
        t = self.temperature(kind)
        return softmax([x / t for x in logits])

    def describe(self, kind: str | None) -> dict[str, Any]:
        """What a response says about the calibration it applied (the strength: in the answer's debias)."""
        return {"temperature": self.temperature(kind), "type": kind or DEFAULT_TYPE,
                "gguf_sha256": self.gguf_sha256, "prompt_version": self.prompt_version}

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"


def load(folder: Path, *, gguf_sha256: str, prompt_version: str, permutations: int | None = None,
         debias: str | None = None) -> Calibration | None:
    """The folder's calibration, or None without one; refuses one fitted for another model or prompt, or (when
    ``permutations`` and ``debias`` are given: the server's defaults) for another number of orderings or, for a
    file that records its strengths, another debias mode: a temperature fitted on other logits means nothing for
    these. A file from before strengths (or before debiasing) is loaded whatever its mode: the questions it does
    not fit are answered uncalibrated, their readout saying why."""
    path = Path(folder) / FILE_NAME
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        calibration = Calibration(gguf_sha256=str(data["gguf_sha256"]), prompt_version=str(data["prompt_version"]),
                                  temperatures={k: float(v) for k, v in data["temperatures"].items()},
                                  permutations=int(data.get("permutations", 1)), fitted=data.get("fitted", {}),
                                  debias=str(data.get("debias", "off")),
                                  strengths=None if data.get("strengths") is None else
                                  {k: float(v) for k, v in data["strengths"].items()},
                                  floor=float(data.get("floor", 0.0)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CalibrationError(f"{path} is not a calibration file: {exc}") from None
    if calibration.gguf_sha256 != gguf_sha256:
        raise CalibrationError(f"{FILE_NAME} was fitted for the GGUF with sha256 {calibration.gguf_sha256}, "
                               f"not this one ({gguf_sha256}); fit it again with python -m decision_adapter.calibrate")
    if calibration.prompt_version != prompt_version:
        raise CalibrationError(f"{FILE_NAME} was fitted for prompt version {calibration.prompt_version!r}, "
                               f"this adapter renders version {prompt_version!r}; fit it again")
    if permutations is not None and calibration.permutations != permutations:
        raise CalibrationError(f"{FILE_NAME} was fitted on answers averaged over {calibration.permutations} "
                               f"orderings; ADAPTER_PERMUTATIONS is {permutations}: fit it again with "
                               f"--permutations {permutations}, or set ADAPTER_PERMUTATIONS={calibration.permutations}")
    if debias is not None and calibration.debias != debias and calibration.strengths is not None:
        raise CalibrationError(f"{FILE_NAME} was fitted on answers debiased with {calibration.debias!r}; "
                               f"ADAPTER_DEBIAS is {debias!r}: fit it again with --debias {debias}, or set "
                               f"ADAPTER_DEBIAS={calibration.debias}")
    bad = {k: t for k, t in calibration.temperatures.items() if k not in QUESTION_TYPES or not 0 < t < math.inf}
    if bad:
        raise CalibrationError(f"{FILE_NAME} has invalid temperatures {bad} (types: {', '.join(QUESTION_TYPES)})")
    bad = {k: a for k, a in (calibration.strengths or {}).items() if k not in QUESTION_TYPES or not 0 <= a <= 1}
    if bad or not 0 <= calibration.floor <= 1:
        raise CalibrationError(f"{FILE_NAME} has invalid strengths {bad} or floor {calibration.floor} (each in [0, 1])")
    return calibration


# ---- fitting -------------------------------------------------------------------------------------

def nll(rows: Sequence[Row], temperature: float, strength: float = 0.0) -> float:
    """Mean negative log-likelihood of the right options at ``temperature`` (and the prior at ``strength``)."""
    total = 0.0
    for row in rows:
        scaled = [x / temperature for x in row.adjusted(strength)]
        total += log_sum_exp(scaled) - scaled[row.answer]
    return total / len(rows)


def fit_temperature(rows: Sequence[Row], strength: float = 0.0) -> float:
    """The temperature with the least NLL (convex in 1/T), by golden-section search over log T."""
    if not rows:
        return 1.0
    lo, hi = LOG_T_RANGE
    ratio = (math.sqrt(5) - 1) / 2
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = nll(rows, math.exp(a), strength), nll(rows, math.exp(b), strength)
    while hi - lo > 1e-7:  # T to within 1e-7 of its own size: about 35 steps
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = nll(rows, math.exp(a), strength)
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = nll(rows, math.exp(b), strength)
    return math.exp((lo + hi) / 2)


def fit_strength(rows: Sequence[Row]) -> tuple[float, float]:
    """(strength, temperature) with the least NLL: each strength of ``STRENGTHS`` with its best temperature; the
    smallest strength among equals. Rows without a prior do not depend on it: only those with one choose it."""
    if not any(r.prior is not None for r in rows):
        return 0.0, fit_temperature(rows)
    best = min(((nll(rows, t := fit_temperature(rows, a), a), a, t) for a in STRENGTHS), key=lambda x: (x[0], x[1]))
    return best[1], best[2]


def fit(rows: Sequence[Row]) -> dict[str, float]:
    """The temperature per question type, for rows whose logits are what it divides (no prior, or one at full
    strength already subtracted)."""
    return {kind: fit_temperature([r for r in rows if r.type == kind]) for kind in QUESTION_TYPES
            if any(r.type == kind for r in rows)}


def fit_both(rows: Sequence[Row]) -> dict[str, tuple[float, float]]:
    """(strength, temperature) per question type (``fit_strength``)."""
    return {kind: fit_strength([r for r in rows if r.type == kind]) for kind in QUESTION_TYPES
            if any(r.type == kind for r in rows)}


def group_folds(rows: Sequence[Row], folds: int) -> list[list[int]]:
    """Row indices in ``folds`` folds, every group in exactly one, the largest groups spread first."""
    groups: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(row.group, []).append(i)
    out: list[list[int]] = [[] for _ in range(max(2, folds))]
    for members in sorted(groups.values(), key=lambda m: (-len(m), m[0])):
        min(out, key=len).extend(members)
    return [sorted(f) for f in out if f]


def out_of_fold(rows: Sequence[Row], folds: int = 5, *, strengths: bool = False) -> list[list[float]]:
    """Each row's calibrated probabilities from temperatures (with ``strengths``: and strengths) fitted on the
    other folds only. Without ``strengths`` a row's prior, if any, is divided out at full strength."""
    calibrated: list[list[float] | None] = [None] * len(rows)
    for held in group_folds(rows, folds):
        held_set = set(held)
        train = [r for i, r in enumerate(rows) if i not in held_set]
        fitted = fit_both(train) if strengths else {
            kind: (1.0, t) for kind, t in fit([replace(r, logits=r.adjusted(1.0), prior=None) for r in train]).items()}
        for i in held:
            a, t = fitted.get(rows[i].type, (1.0, 1.0))
            calibrated[i] = softmax([x / t for x in rows[i].adjusted(a)])
    return [p for p in calibrated if p is not None]


def prior_row(kind: str, logits: Sequence[float], answer: int, group: str, prior: Sequence[float] | None,
              floor: float) -> Row:
    """A row from an answer's order-averaged logits and its prior's log-probabilities (``debias.aligned_mean``),
    floored as the server floors them."""
    return Row(kind, tuple(logits), answer, group, None if prior is None else floored(prior, floor))
