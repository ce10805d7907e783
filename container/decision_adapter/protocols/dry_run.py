"""The dry run, as both protocols answer it: what a request would do now, decoding nothing.

A body with ``"x_dry_run": true`` at its top level (the decision schema's and System One's, on ``/invocations``
too) is validated and prepared exactly as for real, so a request refused for its content (validation, a prompt or
a request too long, a plan too large) is refused the same way, with the same status and body. Otherwise it is
answered 200 with each question's prompts (each ordering's rendered text, the one whose SHA-256 makes
``prompt_sha256``, and its tokens) and the figures below (``DecisionModel.dry_run``); nothing is decoded, queued or
cached. The figures are those the real request then reports, while nothing else changes the cache or the queue:
``cached_tokens`` is its ``timing.cached_tokens`` / ``x_cached_tokens``, ``decode_tokens`` its
``timing.evaluated_tokens`` (System One: ``x_evaluated_tokens``). A refusal admission would make now is reported with the status and the error
body the request would get, classified by the server's one classifier (``Call.classify``) and rendered by the
protocol's own ``render``.

The prompts' details (each prompt's text and options) are answered up to ``PROMPT_DETAIL_BYTES`` of JSON, in the
request's order; past that each prompt says its tokens only, and ``prompts_omitted`` counts them. A request's
prompts can be many times its own size (a state of thousands of tokens in each of hundreds of orderings: about
10 MB), and SageMaker's real-time responses are at most 6 MB: the answer stays far below.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from ..decisions.model import DryRun
from ..errors import Failure
from .call import Call
from .orderings import Orderings

DESCRIPTION = ("Answer what the request would do instead of scoring it: each question's rendered prompts and their "
               "tokens, the tokens the cache would serve and those the request would decode, admission's estimate "
               "and whether it would be admitted now (else the status and error body it would get). Nothing is "
               "decoded. A request refused for its content is refused the same way. Works on /invocations too.")


# The most bytes of prompt details (texts and options, as JSON) one dry run answers: SageMaker's real-time response
# limit is 6 MB.
PROMPT_DETAIL_BYTES = 1 << 20


class PromptDetail:
    """What is left of one answer's ``PROMPT_DETAIL_BYTES``, spent in the order the prompts are answered."""

    def __init__(self, budget: int | None = None):
        self.left, self.omitted = PROMPT_DETAIL_BYTES if budget is None else budget, 0

    def entry(self, text: str, tokens: int, options: list[str]) -> dict[str, Any]:
        entry = {"text": text, "tokens": tokens, "options": options}
        cost = len(json.dumps(entry))     # ASCII-escaped: never fewer bytes than the response spends on it
        if self.omitted == 0 and cost <= self.left:
            self.left -= cost
            return entry
        self.omitted += 1                 # once one is left out, so is every later one: the details are a prefix
        return {"text": None, "tokens": tokens, "options": None}


def figures(dry: DryRun, call: Call, render: Callable[[Failure], tuple[dict[str, Any], int]],
            detail: PromptDetail) -> dict[str, Any]:
    """The totals of a dry run and admission's verdict, the refusal rendered as the protocol renders errors."""
    out: dict[str, Any] = {
        "prompt_tokens": dry.prompt_tokens, "cached_tokens": dry.cached_tokens, "decode_tokens": dry.decode_tokens,
        "readout_tokens": dry.readout_tokens, "prior_tokens": dry.prior_tokens, "queued_tokens": dry.queued_tokens,
        "tokens_per_s": dry.tokens_per_s, "estimate_s": dry.estimate_s, "admitted": dry.admitted, "status": 200,
        "prompts_omitted": detail.omitted}
    if dry.refusal is not None:
        body, status = render(call.classify(dry.refusal))
        out.update(status=status, refusal=body)
    return out


def prompts(dry: DryRun, question: int, names: tuple[str, ...], detail: PromptDetail) -> dict[str, Any]:
    """Question ``question``'s prompts, its options named by ``names`` (in the request's order), their details while
    ``detail`` lasts."""
    mine = dry.prompts[question]
    fewer = dry.fewer[question] if dry.fewer else None
    return {"prompt_sha256": dry.digests[question], "input_tokens": sum(p.tokens for p in mine),
            "orderings": {"averaged": len(mine), **({"fewer": fewer} if fewer else {})},
            "prompts": [detail.entry(p.text, p.tokens, [names[j] for j in p.order]) for p in mine]}


def log_fields(dry: DryRun) -> dict[str, Any]:
    """The request's log line: a dry run decodes nothing, so none of the fields the timing metrics count."""
    return {"dry_runs": 1, "input_tokens": dry.prompt_tokens, "dry_decode_tokens": dry.decode_tokens}


# ---- Responses (closed, as every response model is) ----------------------------------------------------------

class Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DryPrompt(Closed):
    """One prompt a question would be scored with (one per ordering of its options)."""

    text: str | None = Field(description="The whole rendered prompt: with one ordering its SHA-256 is the answer's "
                                         "prompt_sha256; with several, prompt_sha256 is that of the orderings' texts "
                                         "joined by NUL. null past the answer's 1 MiB of prompt details "
                                         "(prompts_omitted).")
    tokens: int = Field(description="Its tokens, the template's head included.")
    options: list[str] | None = Field(description="The options it shows, in label order (A, B, ...): their ids "
                                                  "(System One: names; score levels: their keys; noul: true and "
                                                  "false). null where text is.")


class DryQuestion(Closed):
    prompt_sha256: str = Field(description="What the answer's prompt_sha256 (x_prompt_sha256) will be.")
    input_tokens: int = Field(description="Its prompts' tokens: what the answer's input_tokens will be.")
    orderings: Orderings = Field(description="The orderings it would average, and why fewer than the server's "
                                             "default where they would be: the answer's orderings (x_orderings).")
    prompts: list[DryPrompt]


class DryRunFigures(Closed):
    """What the request would do now. Its figures are those the real request then reports while nothing else
    changes the cache or the queue."""

    prompt_tokens: int = Field(description="Every prompt's tokens, the template's head included (the answers' "
                                           "input_tokens summed; System One: usage.input_tokens).")
    cached_tokens: int = Field(description="Prompt tokens the state cache would serve (its state, or whole "
                                           "prompts whose answers it holds; the resident head is not counted): "
                                           "what timing.cached_tokens (x_cached_tokens) will say.")
    decode_tokens: int = Field(description="Tokens the request would decode: the state, each prompt's own tokens "
                                           "and label paths, and the priors' jobs (prior_tokens); what admission "
                                           "charges it. timing.evaluated_tokens (System One: "
                                           "x_evaluated_tokens) will say the same.")
    readout_tokens: int = Field(description="Of decode_tokens, the answers' label-path tokens (labels of several "
                                            "tokens, past 26 options).")
    prior_tokens: int = Field(description="Of decode_tokens, the debias priors' (timing.prior_tokens, "
                                          "x_prior_tokens); 0 when the cache holds them.")
    queued_tokens: int = Field(description="Tokens of the work queued and running ahead of it.")
    tokens_per_s: float | None = Field(description="The decode speed admission reckons with, measured on the jobs "
                                                   "run so far; null before the first.")
    estimate_s: float | None = Field(description="Seconds admission estimates until its work is done: "
                                                 "queued_tokens and decode_tokens at tokens_per_s (0 when the cache "
                                                 "answers it whole; null before any job has run).")
    admitted: bool = Field(description="Whether admission would take it now.")
    prompts_omitted: int = Field(description="Prompts answered without their text and options: an answer holds at "
                                             "most 1 MiB of them, in the request's order (SageMaker's responses are "
                                             "at most 6 MB).")
    status: int = Field(description="The status the request would get now: 200, else that of refusal (503 busy "
                                    "or too slow, retryable; 400, System One 422, value_error.request_too_slow "
                                    "when its work can never fit a request's time here).")
