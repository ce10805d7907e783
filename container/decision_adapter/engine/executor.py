"""The executor: the only code that calls ``llama_decode``.

It runs a plan's steps in order against a ``Memory``: restores, checkpoints, forks, saves, cuts and releases go to
the memory, each ``Decode`` step becomes exactly one ``llama_decode`` whose micro-batch holds the step's chunks and
nothing else (the context's micro-batch size is the largest step, so llama.cpp never splits it), and after
each decode it reads what the plan asked for: the logits of a label-trie node's children, the log-normaliser
of the whole vocabulary and the top token. Decodes and memory steps are timed apart: the seconds a release
computes in (``prefill_s``, ``readout_s``) are its decodes', whatever share of the traffic restores saved states.
"""

from __future__ import annotations

import ctypes
import math
import time
from dataclasses import dataclass, field

import llama_cpp as llama
import numpy as np

from .errors import DecodeAborted, EngineError
from .memory import Blob, Memory
from .plan import BlobKey, Checkpoint, Cut, Decode, Fork, Read, Release, Restore, RestoreCheckpoint, Save, Step
from .readout import NodeRead

DECODE_FAILURES = {1: "no free memory cells for the batch", 2: "aborted", -1: "invalid batch"}


@dataclass
class Outcome:
    """What running a plan produced: every read, the states and checkpoints it saved, and the seconds its decodes
    took before and in the label paths and its memory steps (restores, checkpoints, forks, saves, cuts) took."""

    reads: dict[tuple[int, tuple[int, ...]], NodeRead] = field(default_factory=dict)
    saved: dict[bytes, Blob] = field(default_factory=dict)
    checkpoints: dict[BlobKey, Blob] = field(default_factory=dict)
    prefill_s: float = 0.0
    readout_s: float = 0.0
    memory_s: float = 0.0


class AbortFlag:
    """Stops a ``llama_decode`` between two graph nodes, set from any thread.

    llama.cpp asks its abort callback before every node of the graph (about 600 per micro-batch on the embedded
    model). A Python callback would take the GIL each time, and so wait behind every HTTP thread that is reading,
    decompressing or validating a body; the callback here is C's ``strlen`` over a two-byte buffer: it returns 0
    (go on) while the buffer is empty and 1 (abort) once ``set`` writes a byte, and it never enters Python. A
    ``bool`` return is read from the low byte of the return register on the ABIs llama.cpp runs on (x86-64 and
    AArch64 System V), where ``strlen``'s ``size_t`` 0 or 1 is the same value.
    """

    def __init__(self) -> None:
        self._buffer = ctypes.create_string_buffer(2)
        self.callback = ctypes.cast(ctypes.CDLL(None).strlen, llama.ggml_abort_callback)
        self.data = ctypes.cast(self._buffer, ctypes.c_void_p)

    def set(self) -> None:
        self._buffer[0] = b"x"

    def clear(self) -> None:
        self._buffer[0] = b"\0"

    @property
    def is_set(self) -> bool:
        return self._buffer[0] != b"\0"


class Executor:
    def __init__(self, ctx, n_vocab: int, batch_tokens: int):
        self._ctx = ctx
        self.n_vocab = n_vocab
        self.capacity = batch_tokens
        self._batch = llama.llama_batch_init(batch_tokens, 0, 2)  # a token may belong to two sequences
        # llama.cpp keeps the callback's C pointer: the flag (and its ctypes objects) lives as long as the executor.
        self.abort = AbortFlag()
        llama.llama_set_abort_callback(ctx, self.abort.callback, self.abort.data)

    def run_step(self, step: Step, memory: Memory, blobs: dict[BlobKey, Blob], outcome: Outcome) -> None:
        started = time.perf_counter()
        if isinstance(step, Decode):
            self.decode(step, outcome.reads)
            if any(c.read is not None and c.read.node for c in step.chunks):
                outcome.readout_s += time.perf_counter() - started
            else:
                outcome.prefill_s += time.perf_counter() - started
            return
        if isinstance(step, Restore):
            memory.load(step.seq, blobs[step.blob])
        elif isinstance(step, Checkpoint):
            blobs[step.key] = outcome.checkpoints[step.key] = memory.save_checkpoint(step.seq)
        elif isinstance(step, RestoreCheckpoint):
            memory.load_checkpoint(step.seq, blobs[step.key])
        elif isinstance(step, Fork):
            memory.fork(step.src, step.dst)
        elif isinstance(step, Save):
            outcome.saved[step.key] = memory.save(step.seq)
        elif isinstance(step, Release):
            memory.release(step.seqs)
        elif isinstance(step, Cut):
            memory.cut(step.seq, step.tokens)
        outcome.memory_s += time.perf_counter() - started

    def decode(self, step: Decode, reads: dict[tuple[int, tuple[int, ...]], NodeRead]) -> None:
        batch = self._batch
        wanted: list[tuple[int, Read]] = []
        n = 0
        for chunk in step.chunks:
            last = len(chunk.tokens) - 1
            seqs = (chunk.seq, *chunk.also)
            for j, token in enumerate(chunk.tokens):
                batch.token[n] = token
                batch.pos[n] = chunk.pos + j
                batch.n_seq_id[n] = len(seqs)
                for k, seq in enumerate(seqs):
                    batch.seq_id[n][k] = seq
                keep = chunk.read is not None and j == last
                batch.logits[n] = keep
                if keep:
                    wanted.append((n, chunk.read))
                n += 1
        if not 0 < n <= self.capacity:
            raise EngineError(f"a micro-batch of {n} tokens does not fit the context's {self.capacity}")
        batch.n_tokens = n
        rc = llama.llama_decode(self._ctx, batch)
        if rc == 2 and self.abort.is_set:
            raise DecodeAborted("the job's deadline passed inside llama_decode")
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
