"""The executor: the only code that calls ``llama_decode``.

It runs a plan's steps in order against a ``Memory``: restores, forks, saves and releases go to the memory,
each ``Decode`` step becomes exactly one ``llama_decode`` whose micro-batch holds the step's chunks and
nothing else (the context's micro-batch size is the largest step, so llama.cpp never splits it), and after
each decode it reads what the plan asked for: the logits of a label-trie node's children, the log-normaliser
of the whole vocabulary and the top token.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import llama_cpp as llama
import numpy as np

from .errors import EngineError
from .memory import Memory
from .plan import Decode, Fork, Read, Release, Restore, Save, Step
from .readout import NodeRead

DECODE_FAILURES = {1: "no free memory cells for the batch", 2: "aborted", -1: "invalid batch"}


@dataclass
class Outcome:
    """What running a plan produced: every read, and the seconds spent before and in the label paths."""

    reads: dict[tuple[int, tuple[int, ...]], NodeRead] = field(default_factory=dict)
    saved: dict[bytes, bytes] = field(default_factory=dict)
    prefill_s: float = 0.0
    readout_s: float = 0.0


class Executor:
    def __init__(self, ctx, n_vocab: int, batch_tokens: int):
        self._ctx = ctx
        self.n_vocab = n_vocab
        self.capacity = batch_tokens
        self._batch = llama.llama_batch_init(batch_tokens, 0, 1)

    def run_step(self, step: Step, memory: Memory, blobs: dict[str | bytes, bytes], outcome: Outcome) -> None:
        started = time.perf_counter()
        if isinstance(step, Decode):
            self.decode(step, outcome.reads)
            if any(c.read is not None and c.read.node for c in step.chunks):
                outcome.readout_s += time.perf_counter() - started
                return
        elif isinstance(step, Restore):
            memory.load(step.seq, blobs[step.blob])
        elif isinstance(step, Fork):
            memory.fork(step.src, step.dst)
        elif isinstance(step, Save):
            outcome.saved[step.key] = memory.save(step.seq)
        elif isinstance(step, Release):
            memory.release(step.seqs)
        outcome.prefill_s += time.perf_counter() - started

    def decode(self, step: Decode, reads: dict[tuple[int, tuple[int, ...]], NodeRead]) -> None:
        batch = self._batch
        wanted: list[tuple[int, Read]] = []
        n = 0
        for chunk in step.chunks:
            last = len(chunk.tokens) - 1
            for j, token in enumerate(chunk.tokens):
                batch.token[n] = token
                batch.pos[n] = chunk.pos + j
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = chunk.seq
                keep = chunk.read is not None and j == last
                batch.logits[n] = keep
                if keep:
                    wanted.append((n, chunk.read))
                n += 1
        if not 0 < n <= self.capacity:
            raise EngineError(f"a micro-batch of {n} tokens does not fit the context's {self.capacity}")
        batch.n_tokens = n
        rc = llama.llama_decode(self._ctx, batch)
        if rc != 0:
            raise EngineError(f"llama_decode failed with {rc} ({DECODE_FAILURES.get(rc, 'fatal error')})")
        for index, read in wanted:
            row = np.ctypeslib.as_array(llama.llama_get_logits_ith(self._ctx, index), shape=(self.n_vocab,))
            reads[read.prompt, read.node] = node_read(row, read.tokens)

    def close(self) -> None:
        if self._batch is not None:
            llama.llama_batch_free(self._batch)
            self._batch = None


def node_read(row: np.ndarray, tokens: tuple[int, ...]) -> NodeRead:
    """The children's logits, the whole row's log-sum-exp (in double precision) and its top token."""
    values = row.astype(np.float64)
    top = float(values.max())
    log_normaliser = top + math.log(float(np.exp(values - top).sum()))
    return NodeRead(tuple(float(row[t]) for t in tokens), log_normaliser, int(values.argmax()))
