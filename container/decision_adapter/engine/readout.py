"""Pure-Python pieces of the readout: answer-label tries, the engine's result types and small math.

Kept apart from ``core`` (which loads llama.cpp) so that the decisions layer and unit tests can use
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

    def logprobs(self, reads: "dict[tuple[int, ...], NodeRead]") -> tuple[float, ...]:
        """log P(label) by the chain rule, every step the model's full-vocabulary log-probability of the
        label's next token given its prefix; these do not sum to 1 over the labels."""
        out = []
        for label in self.sequences:
            out.append(math.fsum(reads[label[:d]].logprob(self.children[label[:d]].index(t))
                                 for d, t in enumerate(label)))
        return tuple(out)


@dataclass(frozen=True)
class NodeRead:
    """The model's next-token distribution at one label-trie node, as much of it as the readout needs:
    the logits of the node's children, the log-normaliser of the whole vocabulary and the top token."""

    logits: tuple[float, ...]  # raw logits of the node's children, in trie order
    log_normaliser: float  # log sum exp of the whole logits row
    top_token: int  # the token the model itself ranks first

    def logprob(self, child: int) -> float:
        return self.logits[child] - self.log_normaliser


@dataclass(frozen=True, slots=True)
class PromptScore:
    """One prompt's readout, in label order. Kept in the state cache: slots, so that its size is its fields'."""

    label_logprobs: tuple[float, ...]  # log P(label | prompt) over the full vocabulary (chain rule)
    first_token_logits: tuple[float, ...]  # raw logit of each label's first token at the answer position
    label_mass: float  # full-vocabulary probability the labels' first tokens hold at the answer position
    top_token_is_label: bool  # the model's own top token at the answer position begins a label


@dataclass(frozen=True)
class ScoreStats:
    resident_tokens: int  # tokens taken from the resident prefix, not evaluated again
    shared_tokens: int  # tokens evaluated once for all prompts of the call
    cached_tokens: int  # tokens an earlier request evaluated, taken from the state cache
    own_tokens: tuple[int, ...]  # tokens evaluated for each prompt alone
    readout_tokens: int  # label tokens evaluated for the chain rule
    prefill_s: float  # the decodes' seconds before the label paths
    readout_s: float  # the label paths' decodes
    memory_s: float = 0.0  # restores, checkpoints, forks, saves and cuts: memory moved, nothing computed

    @property
    def evaluated_tokens(self) -> int:
        """Tokens llama.cpp evaluated for the call (prefill_s and readout_s are their time): not those reused."""
        return self.shared_tokens + sum(self.own_tokens) + self.readout_tokens

    @property
    def compute_s(self) -> float:
        """The seconds the call's decodes took: what the release computes in, memory steps apart."""
        return self.prefill_s + self.readout_s


def common_prefix(sequences: Sequence[Sequence[int]]) -> int:
    first, n = sequences[0], min(len(s) for s in sequences)
    for i in range(n):
        token = first[i]
        if any(s[i] != token for s in sequences[1:]):
            return i
    return n


def prompt_score(trie: LabelTrie, reads: dict[tuple[int, ...], NodeRead]) -> PromptScore:
    """One prompt's readout from the reads at its trie nodes (the root is the answer position)."""
    root = reads[()]
    firsts = trie.children[()]
    first = tuple(root.logits[firsts.index(label[0])] for label in trie.sequences)
    mass = math.fsum(math.exp(root.logprob(i)) for i in range(len(firsts)))
    return PromptScore(trie.logprobs(reads), first, min(1.0, mass), root.top_token in firsts)


def log_sum_exp(values: Sequence[float]) -> float:
    top = max(values)
    return top + math.log(math.fsum(math.exp(v - top) for v in values))


def softmax(values: Sequence[float]) -> list[float]:
    top = max(values)
    weights = [math.exp(v - top) for v in values]
    total = math.fsum(weights)
    return [w / total for w in weights]
