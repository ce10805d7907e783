"""Content-free calibration: the model's prior over the answer labels for one question, divided out of its answer.

A small model often prefers an answer whatever the state says: a position (the first label), or a word (*Yes*).
Order averaging removes the first; the second survives it. Contextual calibration (Zhao et al. 2021, "Calibrate
Before Use") estimates that preference by scoring the prompt with its content replaced by text that carries none,
and divides it out of the answer. It needs no labels, and the prior depends only on what is left of the prompt (the
question, the options, their orderings and the prompt's own text), so repeated question sets (routing, policy)
compute it once: its prompts are answered from the engine's answer cache afterwards, with no job.

Two kinds of prior (``DebiasMode``): a *state prior* replaces the state alone (``empty``, ``content-free``), so
whatever the question carries is in the prior too and is divided out with the bias; a *label prior* (``label``)
replaces the state and the question's own text, and keeps the options, their labels, the prompt and the orderings:
what the model prefers among these label words and positions, whatever is asked. A question whose state carries no
content (``content_free``, by content: white space, a placeholder such as N/A, none or -, empty JSON) has no state prior
divided out: the prior's prompt would be (nearly) its own prompt, the answer divided by itself, and its content
sits in its question. A label prior never holds the question, so it is divided out there too (measured: 12 of the
24 question-borne tasks right against 10 if it were not, docs/benchmarks.md).

How it composes (``compose``, pure), for each question:

1. order averaging (``answer_logits``): each ordering's label log-probabilities, normalised over the labels and
   aligned back to the options, averaged (log space; the geometric mean of the orderings' distributions);
2. the prior: the same for each content-free prompt, with the same layout, orderings and readout, averaged over
   the orderings and the content-free states (``aligned_mean``); floored by mixing its distribution with the
   uniform (``floor``: a confident prior cannot flip a confident answer on its own), raised to ``strength`` (alpha
   in [0, 1]: 0 is no debiasing, 1 divides the whole prior out), and subtracted (log space: the answer's
   distribution divided by the prior's, renormalised by the softmax);
3. the temperature of ``calibration.json`` (when there is one, fitted on answers debiased the same way; the
   calibration may carry a strength per question type fitted beside it).

The prior is estimated under the same orderings as the answer so that what it removes is the bias left in that
answer: at K = 1 the position and the word, at K >= 2 the word alone. The temperature comes last because it is the
only step fitted on labels; fitted before the debiasing (on biased answers), it can only flatten a bias (the
benchmark model's ``noul`` temperature hit its cap of 20), where dividing the prior out removes it.

Pure Python: the modes and the arithmetic; the decision model does the scoring.
"""

from __future__ import annotations

import json

import math
from dataclasses import dataclass
from typing import Sequence

from ..engine.readout import log_sum_exp, softmax

# One ordering's readout: the label values by position (first-token logits, or chain log-probabilities), and the
# option (request index) shown at each position.
Row = tuple[Sequence[float], Sequence[int]]


@dataclass(frozen=True)
class DebiasMode:
    """A way to estimate the prior: the content-free states it is averaged over (none: no debiasing), and the text
    the question is replaced with (None: the question kept, a state prior; text: a label prior)."""

    name: str
    states: tuple[str, ...]
    description: str
    question: str | None = None

    @property
    def active(self) -> bool:
        return bool(self.states)

    @property
    def kind(self) -> str:
        return "label" if self.question is not None else "state"

    def describe(self) -> dict[str, object]:
        """What an answer says about the debiasing it applied (a label prior: also what replaced the question)."""
        return {"mode": self.name, "states": list(self.states),
                **({"question": self.question} if self.question is not None else {})}


MODES = {mode.name: mode for mode in (
    DebiasMode("off", (), "no debiasing: the probabilities are the model's own"),
    DebiasMode("empty", ("",),
               "a state prior: the question and options scored with an empty state; divides out whatever the "
               "question carries too, and a question whose state is empty is answered as with off"),
    DebiasMode("content-free", ("N/A", "", "[MASK]"),
               "a state prior from three content-free states (N/A, an empty state, [MASK]), averaged in log space"),
    DebiasMode("label", ("",),
               "a label prior: the options, their labels and orderings scored with an empty state and the question "
               "replaced by N/A; what the model prefers among these labels and words whatever is asked",
               question="N/A"),
)}
# Priors measured by the benchmark beside the served modes (benchmarks.accuracy), never served.
EXPLORED = {mode.name: mode for mode in (
    DebiasMode("na", ("N/A",), "a state prior from the state N/A alone"),
    DebiasMode("mask", ("[MASK]",), "a state prior from the state [MASK] alone"),
    DebiasMode("label-mask", ("[MASK]",), "a label prior with the state and the question [MASK]", question="[MASK]"),
)}
PRIORS = {**MODES, **EXPLORED}
CONTENT_FREE_STATES = frozenset(text for mode in PRIORS.values() for text in mode.states)
OFF = "off"
# Chosen by measurement (benchmarks.priors.choose, "never worse"; docs/benchmarks.md): the empty-state prior at
# three quarters of its strength, mixed with a quarter of the uniform, one ordering.
DEFAULT_MODE = "empty"
DEFAULT_STRENGTH = 0.75  # alpha without a calibration that fits one
DEFAULT_FLOOR = 0.25  # the uniform's share mixed into the prior


# What a state says when it says nothing, once case, white space, brackets, quotes and dashes are stripped: the
# priors' own content-free states and the placeholders integrators send for "no state".
PLACEHOLDERS = frozenset({
    "", "n/a", "na", "none", "null", "nil", "mask", "tbd", "undefined", "not available", "not applicable",
    "no state", "no context", "no data",
})
_STRIP = " \t\r\n\f\v.,;:!?*_-\u2010\u2011\u2012\u2013\u2014\u2015\u2026()[]{}<>\"'`"
# A state longer than this carries content whatever it spells: the check stays O(1) on a 6 MiB state.
PLACEHOLDER_CHARS = 256


def content_free(state: str) -> bool:
    """Whether a state (as the model reads it) carries no content, by content, not spelling: white space, a
    placeholder (``PLACEHOLDERS``: N/A, none, -, [MASK], ... in any case, bracketed or quoted), or JSON whose every
    value is such (``{}``, ``[]``, ``{"events": []}``, ``{"note": "n/a"}``: the keys name fields, not content).
    No state prior is divided out of its answers."""
    text = state.strip()
    if len(text) > PLACEHOLDER_CHARS:
        return False
    if text.casefold().strip(_STRIP) in PLACEHOLDERS:
        return True
    if text[:1] in ("{", "["):
        try:
            return _empty_json(json.loads(text))
        except ValueError:
            return False
    return False


def _empty_json(value: object) -> bool:
    if isinstance(value, dict):
        return all(_empty_json(v) for v in value.values())
    if isinstance(value, list):
        return all(_empty_json(v) for v in value)
    if isinstance(value, str):
        return value.casefold().strip(_STRIP) in PLACEHOLDERS
    return value is None


def normalised(values: Sequence[float]) -> list[float]:
    """Log-probabilities over the labels: ``values`` minus their log-sum-exp."""
    total = log_sum_exp(values)
    return [v - total for v in values]


def aligned_mean(rows: Sequence[Row], n: int) -> tuple[float, ...]:
    """The mean over ``rows`` of each row's normalised log-probabilities, aligned back to the options: a row is
    (values by position, the option shown at each position). Summed with ``math.fsum`` in row order, so the same
    rows give the same floats bit for bit."""
    columns: list[list[float]] = [[] for _ in range(n)]
    for values, order in rows:
        for option, value in zip(order, normalised(values)):
            columns[option].append(value)
    return tuple(math.fsum(column) / len(column) for column in columns)


def answer_logits(rows: Sequence[Row], n: int) -> tuple[float, ...]:
    """The answer's option logits: one ordering's values as the model gave them, aligned to the options; several
    orderings' normalised log-probabilities averaged (``aligned_mean``)."""
    if len(rows) > 1:
        return aligned_mean(rows, n)
    [(values, order)] = rows
    out = [0.0] * n
    for position, option in enumerate(order):
        out[option] = values[position]
    return tuple(out)


def floored(prior_logprobs: Sequence[float], floor: float) -> tuple[float, ...]:
    """The prior mixed with the uniform, ``(1 - floor) * prior + floor / n``, as log-probabilities; ``floor`` 0 keeps
    the values as they are (bit for bit)."""
    if floor == 0.0:
        return tuple(prior_logprobs)
    n = len(prior_logprobs)
    return tuple(math.log((1.0 - floor) * p + floor / n) for p in softmax(prior_logprobs))


@dataclass(frozen=True)
class Composed:
    """One question's answer composed from its readouts."""

    logits: tuple[float, ...]  # the order-averaged answer: the model's own (option_logits)
    adjusted: tuple[float, ...]  # logits minus strength x the floored log-prior: what the temperature divides
    probabilities: tuple[float, ...]
    prior: tuple[float, ...] | None = None  # the prior's own distribution (before floor and strength), if any


def compose(answer: Sequence[Row], n: int, prior: Sequence[Row] = (), *, strength: float = 1.0, floor: float = 0.0,
            temperature: float = 1.0) -> Composed:
    """The answer's probabilities from its readouts (the order of the steps and why: the module's docstring). No
    ``prior`` rows, or ``strength`` 0, is no debiasing: bit for bit the model's own distribution (at temperature 1).
    """
    if not 0.0 <= strength <= 1.0 or not 0.0 <= floor <= 1.0 or not temperature > 0.0:
        raise ValueError(f"strength {strength} and floor {floor} must lie in [0, 1], temperature {temperature} > 0")
    logits = answer_logits(answer, n)
    adjusted, shown = logits, None
    if prior:
        log_prior = aligned_mean(prior, n)
        shown = tuple(softmax(log_prior))
        if strength > 0.0:
            adjusted = tuple(a - strength * b for a, b in zip(logits, floored(log_prior, floor)))
    return Composed(logits, adjusted, tuple(softmax([x / temperature for x in adjusted])), shown)
