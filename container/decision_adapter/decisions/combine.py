"""Combining what the engine read into each question's answer: pure, no engine and no scheduler.

For each question of a ``Prepared`` request: its rows (one per ordering) and its prior's rows, composed by
``debias.compose`` (orderings averaged, the prior floored, raised to its strength and divided out, then the
temperature and the softmax), with the calibration that applies to it, and the ``readout`` line that says how the
numbers were read and what was, or was not, applied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from ..engine.readout import PromptScore, ScoreStats
from .calibration import Calibration
from .debias import MODES, OFF, DebiasMode, Row, compose
from .prepare import Prepared

READOUT_SINGLE = ("softmax over the declared answer labels' logits at the first answer position "
                  "(last prompt position); no tokens generated")
READOUT_CHAIN = ("chain rule over each label's tokens, every step the full-vocabulary probability of the label's "
                 "next token, then normalised over the declared labels; option_logits are those log-probabilities; "
                 "no tokens generated")


@dataclass(frozen=True)
class Scored:
    probabilities: tuple[float, ...]
    option_logits: tuple[float, ...]
    prompt_sha256: str
    input_tokens: int
    readout: str
    label_mass: float  # full-vocabulary probability the labels' first tokens hold at the answer position
    top_token_is_label: bool
    calibration: dict[str, Any] | None = None  # the calibration applied to the probabilities, if any
    # What the softmax (and the temperature) apply to: option_logits, minus the prior's log-probabilities (floored,
    # raised to the strength) when debiased.
    adjusted_logits: tuple[float, ...] = ()
    debias: dict[str, Any] | None = None  # the debiasing applied ({"mode", "states", "strength", "floor"}), if any
    prior: tuple[float, ...] | None = None  # the prior's own distribution over the options, when debiased
    # A decision GGUF's own answer figures (decisions.letter): "noul", or "confidence" (and "score"), computed by its
    # type's rules; None: the protocols compute them from the probabilities.
    answer: dict[str, float] | None = None
    temperature: float | None = None  # the file's temperature a decision GGUF's answer was read at
    orderings: int = 1  # orderings of the options read and averaged (a decision GGUF's: its variants)
    fewer_orderings: str | None = None  # why fewer than the server's default were averaged, where they were


@dataclass(frozen=True)
class Readouts:
    """What the engine read for a prepared request: a score per prompt of its answer's job and of each prior job
    (in ``Prepared.priors`` order), with each job's stats."""

    scores: list[PromptScore]
    stats: ScoreStats
    prior_scores: tuple[list[PromptScore], ...]
    prior_stats: tuple[ScoreStats, ...]
    queue_s: float
    jobs: int  # jobs queued in the scheduler (0: answered from the cache)


@dataclass(frozen=True)
class Answered:
    """A scored request: one result per question, what the engine did, and how long the job waited."""

    results: list[Scored]
    stats: ScoreStats
    queue_s: float
    prior_stats: tuple[ScoreStats, ...] = ()  # the prior jobs' (none answered from the cache: zero tokens)
    jobs: int = 0  # jobs this request queued in the scheduler (0: answered from the cache)

    @property
    def prior_tokens(self) -> int:
        """Tokens decoded for the priors: 0 when the cache held them."""
        return sum(s.shared_tokens + sum(s.own_tokens) + s.readout_tokens for s in self.prior_stats)

    @property
    def prior_s(self) -> float:
        return math.fsum(s.prefill_s + s.readout_s for s in self.prior_stats)


@dataclass(frozen=True)
class Defaults:
    """The strength and floor of a prior where no calibration fits its own (ADAPTER_DEBIAS_STRENGTH, _FLOOR)."""

    strength: float
    floor: float


def question_rows(prepared: Prepared, read: Readouts, i: int,
                  mode: DebiasMode | None = None) -> tuple[list[Row], dict[str, list[Row]], bool]:
    """Question ``i``'s readouts as ``debias.compose`` takes them: its answer's rows (one per ordering), its
    prior's rows per content-free state of ``mode`` (its own mode unless given; none for a question whose prior
    would be its own prompt), and whether its labels are single tokens (first-token logits) or chains (label
    log-probabilities)."""
    mode = prepared.modes[i] if mode is None else mode
    mine = prepared.prompts_of(i)
    single = all(prepared.tries[k].depth == 1 for k in mine)

    def values(score: PromptScore) -> Sequence[float]:
        return score.first_token_logits if single else score.label_logprobs

    answer = [(values(read.scores[k]), prepared.orders[k]) for k in mine]
    prior: dict[str, list[Row]] = {}
    if mode.active and i not in prepared.no_prior:
        jobs = {p.key: (p, found) for p, found in zip(prepared.priors, read.prior_scores)}
        for text in mode.states:
            job, found = jobs[text, mode.question]
            prior[text] = [(values(found[j]), prepared.orders[k]) for j, k in enumerate(job.prompts)
                           if prepared.owners[k] == i]
    return answer, prior, single


def combine(prepared: Prepared, read: Readouts, calibration: Calibration | None, defaults: Defaults) -> list[Scored]:
    """One result per question, in the request's option order."""
    return [combine_question(prepared, read, i, calibration, defaults) for i in range(len(prepared.questions))]


def combine_question(prepared: Prepared, read: Readouts, i: int, calibration: Calibration | None,
                     defaults: Defaults) -> Scored:
    """Question ``i``'s answer: the orderings averaged, the prior (floored, raised to its strength) divided out,
    then the temperature, if calibrated, and the softmax. The strength and the temperature come from the
    calibration when it was fitted for this question's orderings and mode; otherwise the defaults apply, without
    a temperature."""
    kind = prepared.questions[i].kind
    mode = prepared.modes[i]
    mine = prepared.prompts_of(i)
    answer, prior, single = question_rows(prepared, read, i)
    readout = (READOUT_SINGLE if single else READOUT_CHAIN) + (
        f"; averaged in log space over {len(mine)} orderings of the options" if len(mine) > 1 else "")
    if fewer := prepared.fewer_orderings(i):
        readout += f"; {fewer}"
    applied = mode if prior else MODES[OFF]
    if mode.active and not prior:
        readout += (f"; not debiased ({mode.name}): the state carries no content (a content-free state), so a state "
                    f"prior would be this prompt itself; no prior is divided out and it is answered as with debias "
                    f"off")
    calibration, refused = applicable(calibration, prepared.permutations[i], applied)
    readout += refused
    if calibration is not None:
        strength, floor = calibration.strength(kind, defaults.strength), calibration.floor
    else:
        strength, floor = defaults.strength, defaults.floor
    composed = compose(answer, len(prepared.orders[mine[0]]), [row for text in applied.states
                                                               for row in prior.get(text, ())],
                       strength=strength, floor=floor, temperature=calibration.temperature(kind) if calibration else 1.0)
    debias = None
    if prior:
        what = "the state" if mode.question is None else "the state and the question"
        readout += (f"; debiased ({mode.name}): a {mode.kind} prior, scored the same way with {what} replaced by "
                    f"content-free text ({len(mode.states)} state{'s' if len(mode.states) > 1 else ''}, averaged in "
                    f"log space)" + (f", mixed with the uniform ({floor:g} of it)" if floor else "")
                    + f", raised to the strength {strength:g} and subtracted")
        debias = {**mode.describe(), "strength": strength, "floor": floor}
    return Scored(
        probabilities=composed.probabilities,
        option_logits=composed.logits,
        prompt_sha256=prepared.digests[i],
        input_tokens=sum(len(prepared.tokens[k]) for k in mine),
        readout=readout,
        label_mass=math.fsum(read.scores[k].label_mass for k in mine) / len(mine),
        top_token_is_label=all(read.scores[k].top_token_is_label for k in mine),
        calibration=calibration.describe(kind) if calibration else None,
        adjusted_logits=composed.adjusted,
        debias=debias,
        prior=composed.prior,
        orderings=len(mine),
        fewer_orderings=fewer)


def applicable(calibration: Calibration | None, permutations: int,
               applied: DebiasMode) -> tuple[Calibration | None, str]:
    """The calibration, if it was fitted for answers like this one (the same orderings, the same debiasing: a
    temperature and a strength fitted otherwise mean nothing here), else None and what the readout says why."""
    if calibration is None:
        return None, ""
    if calibration.permutations != permutations:
        return None, (f"; not calibrated: calibration.json was fitted with {calibration.permutations} orderings, "
                      f"this question asked for {permutations}")
    if calibration.debias != applied.name:
        return None, (f"; not calibrated: calibration.json was fitted with debias {calibration.debias!r}"
                      f"{' (a file from before strengths were fitted)' if calibration.strengths is None else ''}"
                      f", this question is answered with {applied.name!r}")
    return calibration, ""
