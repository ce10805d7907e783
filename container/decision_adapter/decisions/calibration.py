"""Calibration bound to a model: one temperature per question type, fitted by negative log-likelihood.

``calibration.json`` (beside the GGUF) names the GGUF's SHA-256 and the prompt version it was fitted for; a
file for another model or prompt keeps the server from turning ready, because its temperatures would mean
nothing there. Probabilities become ``softmax(logits / T)`` for the question's type; the raw logits stay in
``option_logits``. Pure Python: fitting and group-disjoint cross-validation live here too, so the ``calibrate``
command and the benchmarks share them.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..engine.readout import log_sum_exp, softmax
from .labels import QUESTION_TYPES

FILE_NAME = "calibration.json"
DEFAULT_TYPE = "choice"  # the walkthrough's decisions carry no type: they are choices
LOG_T_RANGE = (math.log(0.05), math.log(20.0))


class CalibrationError(RuntimeError):
    """calibration.json is unreadable or fitted for another model or prompt; the message says which."""


@dataclass(frozen=True)
class Row:
    """One labelled decision as the model scored it: raw option logits, the right option, its group."""

    type: str
    logits: tuple[float, ...]
    answer: int
    group: str


@dataclass(frozen=True)
class Calibration:
    gguf_sha256: str
    prompt_version: str
    temperatures: Mapping[str, float]
    permutations: int = 1
    fitted: Mapping[str, Any] = field(default_factory=dict)  # rows, folds, out-of-fold metrics
    debias: str = "off"  # the debias mode of the answers it was fitted on (decisions.debias.MODES)

    def temperature(self, kind: str | None) -> float:
        return float(self.temperatures.get(kind or DEFAULT_TYPE, 1.0))

    def probabilities(self, logits: Sequence[float], kind: str | None) -> list[float]:
        t = self.temperature(kind)
        return softmax([x / t for x in logits])

    def describe(self, kind: str | None) -> dict[str, Any]:
        """What a response says about the calibration it applied."""
        return {"temperature": self.temperature(kind), "type": kind or DEFAULT_TYPE,
                "gguf_sha256": self.gguf_sha256, "prompt_version": self.prompt_version}

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"


def load(folder: Path, *, gguf_sha256: str, prompt_version: str, permutations: int | None = None,
         debias: str | None = None) -> Calibration | None:
    """The folder's calibration, or None without one; refuses one fitted for another model or prompt, or (when
    ``permutations`` and ``debias`` are given: the server's defaults) for another number of orderings or another
    debias mode: a temperature fitted on other logits means nothing for these."""
    path = Path(folder) / FILE_NAME
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        calibration = Calibration(gguf_sha256=str(data["gguf_sha256"]), prompt_version=str(data["prompt_version"]),
                                  temperatures={k: float(v) for k, v in data["temperatures"].items()},
                                  permutations=int(data.get("permutations", 1)), fitted=data.get("fitted", {}),
                                  debias=str(data.get("debias", "off")))
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
    if debias is not None and calibration.debias != debias:
        raise CalibrationError(f"{FILE_NAME} was fitted on answers debiased with {calibration.debias!r}; "
                               f"ADAPTER_DEBIAS is {debias!r}: fit it again with --debias {debias}, or set "
                               f"ADAPTER_DEBIAS={calibration.debias}")
    bad = {k: t for k, t in calibration.temperatures.items() if k not in QUESTION_TYPES or not 0 < t < math.inf}
    if bad:
        raise CalibrationError(f"{FILE_NAME} has invalid temperatures {bad} (types: {', '.join(QUESTION_TYPES)})")
    return calibration


# ---- fitting -------------------------------------------------------------------------------------

def nll(rows: Sequence[Row], temperature: float) -> float:
    """Mean negative log-likelihood of the right options at ``temperature``."""
    total = 0.0
    for row in rows:
        scaled = [x / temperature for x in row.logits]
        total += log_sum_exp(scaled) - scaled[row.answer]
    return total / len(rows)


def fit_temperature(rows: Sequence[Row]) -> float:
    """The temperature with the least NLL (convex in 1/T), by golden-section search over log T."""
    if not rows:
        return 1.0
    lo, hi = LOG_T_RANGE
    ratio = (math.sqrt(5) - 1) / 2
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = nll(rows, math.exp(a)), nll(rows, math.exp(b))
    for _ in range(80):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = nll(rows, math.exp(a))
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = nll(rows, math.exp(b))
    return math.exp((lo + hi) / 2)


def fit(rows: Sequence[Row]) -> dict[str, float]:
    return {kind: fit_temperature([r for r in rows if r.type == kind]) for kind in QUESTION_TYPES
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


def out_of_fold(rows: Sequence[Row], folds: int = 5) -> list[list[float]]:
    """Each row's calibrated probabilities from temperatures fitted on the other folds only."""
    calibrated: list[list[float] | None] = [None] * len(rows)
    for held in group_folds(rows, folds):
        held_set = set(held)
        temperatures = fit([r for i, r in enumerate(rows) if i not in held_set])
        for i in held:
            t = temperatures.get(rows[i].type, 1.0)
            calibrated[i] = softmax([x / t for x in rows[i].logits])
    return [p for p in calibrated if p is not None]
