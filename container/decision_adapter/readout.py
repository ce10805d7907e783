"""Pure-Python pieces of the readout: answer-label tries, the engine's result types and small math.

Kept apart from ``engine`` (which loads llama.cpp) so that the scoring layer and unit tests can use
them without the native library.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence


@dataclass(frozen=True)
class LabelTrie:
    """Answer labels as token sequences, none a prefix of another, indexed for the chain rule."""

    sequences: tuple[tuple[int, ...], ...]
    children: dict[tuple[int, ...], tuple[int, ...]] = field(compare=False)

    @classmethod
    def build(cls, sequences: Iterable[Sequence[int]]) -> "LabelTrie":
        seqs = tuple(tuple(s) for s in sequences)
        if len(set(seqs)) != len(seqs) or any(not s for s in seqs):
            raise ValueError("labels must be distinct, non-empty token sequences")
        children: dict[tuple[int, ...], list[int]] = {}
        for s in seqs:
            for depth in range(len(s)):
                kids = children.setdefault(s[:depth], [])
                if s[depth] not in kids:
                    kids.append(s[depth])
        if any(s in children for s in seqs):
            raise ValueError("a label's tokens are a prefix of another label's tokens")
        return cls(seqs, {k: tuple(v) for k, v in children.items()})

    @property
    def inner_nodes(self) -> list[tuple[int, ...]]:
        """Token paths below the answer position whose next-token logits are needed, shortest first."""
        return sorted((k for k in self.children if k), key=lambda k: (len(k), k))

    @property
    def depth(self) -> int:
        return max(len(s) for s in self.sequences)

    def logprobs(self, node_logits: dict[tuple[int, ...], Sequence[float]]) -> tuple[float, ...]:
        """log P(label) by the chain rule, each step a softmax over the node's children only."""
        steps = {node: log_softmax(values) for node, values in node_logits.items()}
        out = []
        for label in self.sequences:
            out.append(math.fsum(steps[label[:d]][self.children[label[:d]].index(t)] for d, t in enumerate(label)))
        return tuple(out)


@dataclass(frozen=True)
class PromptScore:
    """One prompt's readout, in label order."""

    label_logprobs: tuple[float, ...]  # log P(label | prompt), restricted to the declared labels
    first_token_logits: tuple[float, ...]  # raw logit of each label's first token at the answer position


@dataclass(frozen=True)
class ScoreStats:
    resident_tokens: int  # tokens taken from the resident prefix, not evaluated again
    shared_tokens: int  # tokens evaluated once for all prompts of the call
    own_tokens: tuple[int, ...]  # tokens evaluated for each prompt alone
    readout_tokens: int  # label tokens evaluated for the chain rule
    prefill_s: float
    readout_s: float


def common_prefix(sequences: Sequence[Sequence[int]]) -> int:
    first, n = sequences[0], min(len(s) for s in sequences)
    for i in range(n):
        token = first[i]
        if any(s[i] != token for s in sequences[1:]):
            return i
    return n


def log_softmax(values: Sequence[float]) -> list[float]:
    top = max(values)
    total = math.log(math.fsum(math.exp(v - top) for v in values))
    return [v - top - total for v in values]
