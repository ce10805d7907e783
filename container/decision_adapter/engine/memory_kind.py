"""What a model's memory is made of, and so which reuse the engine can give it exactly. Pure: no llama.cpp.

llama.cpp keeps a sequence's past in one of a few kinds of memory, and each allows different things:

* **plain** attention (SmolLM2, Qwen2.5): every position has its cells; a sequence cut back to an earlier position
  (``llama_memory_seq_rm``) holds exactly what a decode up to there held, restored or live.
* **sliding-window** attention (Gemma 2 and 3, gpt-oss, Cohere2; Llama 4's chunked attention takes the same path):
  some layers attend over the last ``window`` positions only. A live context keeps every cell (``swa_full``), but a
  saved sequence holds those layers' cells for the last ``window`` positions of what was saved (``state_write``
  skips the masked ones), so a saved state cut back to an earlier position lacks the window there; and a restored
  window sits in other cells than a decode put it in, which changes the sums' order.
* **recurrent** layers (Mamba, RWKV; the gated delta-net of *hybrid* models beside their attention: Qwen3.5, LFM2,
  Granite 4, Nemotron-H, Falcon-H1, Jamba): one state per sequence, updated in place, that no cut can take back to
  an earlier position.

What a cut cannot bring back (the window, the recurrent state) llama.cpp saves and restores on its own
(``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``): a *checkpoint*. The engine takes checkpoints at the positions it may
return to (a state's micro-batch boundaries, a prompt's stem), and returns to one by restoring the saved sequence,
then the checkpoint, then cutting the attention cells back: exact by layout (``plan``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MemoryKind:
    window: int = 0  # the sliding window's width in positions (llama_model_n_swa); 0: no sliding window
    recurrent: bool = False  # a recurrent state per sequence (recurrent and hybrid models)
    attention: bool = True  # attention cells (every model but a purely recurrent one)

    @property
    def name(self) -> str:
        if self.recurrent:
            base = "hybrid" if self.attention else "recurrent"
            return f"{base}, sliding-window" if self.window else base
        return "sliding-window" if self.window else "plain"

    @property
    def checkpoints(self) -> bool:
        """Whether a position returned to needs a checkpoint: part of the memory cannot be cut back to it."""
        return bool(self.window) or self.recurrent

    @property
    def compacts(self) -> bool:
        """Whether the state is laid out by restoring its own checkpoint at each micro-batch boundary (and at its
        end): a sliding window restored from a saved state sits in the first cells, so a decode puts it there too,
        and a state decoded, restored whole or restored in part lays its window out alike."""
        return bool(self.window)

    @property
    def splits_stems(self) -> bool:
        """Whether a prompt with a stem is always decoded as its stem, then the rest: the recurrent state at the
        stem is only there to keep (a checkpoint) after a decode that ends on it, and a decode split elsewhere
        computes the recurrence in other chunks, so the split is part of every prompt's layout, alone or not."""
        return self.recurrent

    def describe(self, *, stems: bool) -> dict[str, Any]:
        """What each reuse does on this memory (``/ping`` and the start-up log): ``stems`` says whether orderings
        share their stem here (a start-up probe can turn them off)."""
        via = "restored with a checkpoint of the " + ("sliding window" if not self.recurrent else "recurrent state") \
            if self.checkpoints else "restored and cut back"
        return {"memory": self.name, "window": self.window,
                "reuse": {"states": "restored whole" + (" (its window laid out as restored)" if self.compacts else ""),
                          "prefixes": f"longest cached prefix ending on a micro-batch boundary, {via}",
                          "stems": ("orderings share their stem: " + ("a checkpoint at the stem" if self.splits_stems
                                                                       else "the sequence cut back to it"))
                          if stems else "off: each ordering decodes its question"}}
