"""The model's memory: sequences in llama.cpp's KV cache, forks, and sequences saved to host RAM.

``Memory`` is the only code that changes which cells hold what: it empties the memory between jobs, restores
saved sequences (the resident head, cached states), forks a sequence (``llama_memory_seq_cp``, which shares
cells, or a save and restore of the sequence), serialises a sequence for the state cache, saves and restores a
sequence's checkpoint (the part of its memory no cut brings back: a sliding window, a recurrent state;
``memory_kind``), cuts a sequence back and releases sequences.
"""

from __future__ import annotations

import ctypes
from typing import Iterable

import llama_cpp as llama

from .errors import CutRefused, EngineError, RestoreFailed

# A saved sequence: the buffer llama_state_seq_get_data filled, kept and restored from without copies.
Blob = ctypes.Array


class Memory:
    def __init__(self, ctx, fork_by: str):
        self._ctx = ctx
        self._memory = llama.llama_get_memory(ctx)
        self.fork_by = fork_by

    def reset(self) -> None:
        """Empty every sequence: the next cells used are 0, 1, ... (the layout every job starts from)."""
        llama.llama_memory_clear(self._memory, False)

    def load(self, seq: int, blob: Blob) -> None:
        """Restore a saved sequence into ``seq``, reading the saved buffer in place (no copy)."""
        if llama.llama_state_seq_set_data(self._ctx, blob, ctypes.sizeof(blob), seq) == 0:
            raise RestoreFailed("llama_state_seq_set_data could not restore a saved sequence")

    def save(self, seq: int) -> Blob:
        """``seq`` serialised into a buffer of its own, which the state cache keeps as it is."""
        size = llama.llama_state_seq_get_size(self._ctx, seq)
        buf = (ctypes.c_uint8 * size)()
        written = llama.llama_state_seq_get_data(self._ctx, buf, size, seq)
        if written != size:
            raise EngineError(f"llama_state_seq_get_data wrote {written} of {size} bytes")
        return buf

    def save_checkpoint(self, seq: int) -> Blob:
        """The part of ``seq``'s memory that no cut brings back (its sliding window, its recurrent state), serialised
        into a buffer of its own (``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``)."""
        flags = llama.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = llama.llama_state_seq_get_size_ext(self._ctx, seq, flags)
        buf = (ctypes.c_uint8 * size)()
        written = llama.llama_state_seq_get_data_ext(self._ctx, buf, size, seq, flags)
        if written != size:
            raise EngineError(f"llama_state_seq_get_data_ext wrote {written} of {size} bytes of a checkpoint")
        return buf

    def load_checkpoint(self, seq: int, blob: Blob) -> None:
        """Put a checkpoint back into ``seq`` in place of that part of its memory (its attention cells stay)."""
        if llama.llama_state_seq_set_data_ext(self._ctx, blob, ctypes.sizeof(blob), seq,
                                              llama.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) == 0:
            raise RestoreFailed("llama_state_seq_set_data_ext could not restore a checkpoint")

    def cut(self, seq: int, tokens: int) -> None:
        """Keep only ``seq``'s first ``tokens`` positions: the cells past them are free again, and the next
        cells used are the first of them (llama.cpp's search for a slot restarts at the lowest cell freed), as
        after a decode of those tokens alone. ``CutRefused`` where the memory cannot be cut there (a recurrent
        state that is not at that position)."""
        if not llama.llama_memory_seq_rm(self._memory, seq, tokens, -1):
            raise CutRefused(f"llama_memory_seq_rm could not cut a sequence at {tokens}")

    def fork(self, src: int, dst: int) -> None:
        if self.fork_by == "copy":
            llama.llama_memory_seq_cp(self._memory, src, dst, -1, -1)
        else:
            self.load(dst, self.save(src))

    def release(self, seqs: Iterable[int]) -> None:
        for seq in seqs:
            llama.llama_memory_seq_rm(self._memory, seq, -1, -1)
