"""`python -m benchmarks.hybrid_model`: a Qwen3.5-architecture GGUF with random weights, for tests and benchmarks.

The project's pinned model, Qwen3.5-4B, is *hybrid* in llama.cpp (``qwen35``: gated delta-net layers, whose memory is
a recurrent state, beside full-attention layers every fourth layer), and no hybrid GGUF small enough for a test is in
any registry. This writes one: llama.cpp's own ``qwen35`` loader and graph, the embedded model's tokenizer and chat
template (SmolLM2's byte-level BPE and ChatML, copied from its GGUF), and weights drawn from a seeded generator, so
the same shape and seed give the same file, byte for byte. Its answers mean nothing; what the engine does with its
memory (restores, cuts, checkpoints) and what that costs are the same as on the real model: a decode's time depends
on the tensors' shapes and types, not their values.

Two shapes (``SHAPES``): ``tiny`` (4 layers, 3 recurrent and 1 attention, F16: a few MB, for tests) and ``4b`` (the
layer shapes of Qwen3.5-4B as its published configuration gives them: 32 layers of width 2560, every fourth full
attention with 16 query and 4 key-value heads of 256, delta-net layers of 16 key and 32 value heads of 128, feed
forward 9216; Q4_0 weights, about 2 GB, for the agent-loop benchmark). The vocabulary is the embedded model's (49,152
tokens against Qwen's 248,320): it changes only the embedding table and the output projection, which the adapter
evaluates for a handful of rows per request.

Files are kept in ``~/.cache/decision-adapter/models/<name>/`` (one GGUF per folder, as the adapter takes a model
folder); ``ensure(shape)`` writes one once and returns its folder.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .bench_model import CACHE

ARCH = "qwen35"


@dataclass(frozen=True)
class HybridShape:
    name: str  # the folder and file name
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    full_attention_interval: int  # every n-th layer is full attention, the others gated delta-net
    ssm_state: int  # the delta-net's key and value head size
    ssm_key_heads: int
    ssm_value_heads: int
    ssm_conv: int  # the short convolution's kernel
    weights: str  # the matrices' GGML type: "F16" or "Q4_0"
    rope_dims: int
    context: int = 32768
    seed: int = 35

    @property
    def file(self) -> str:
        return f"{self.name}.gguf"


SHAPES = {
    "tiny": HybridShape("qwen35-tiny-random", n_embd=128, n_layer=4, n_ff=384, n_head=4, n_head_kv=2, head_dim=32,
                        full_attention_interval=4, ssm_state=32, ssm_key_heads=2, ssm_value_heads=4, ssm_conv=4,
                        weights="F16", rope_dims=16),
    "4b": HybridShape("qwen35-4b-shape-random", n_embd=2560, n_layer=32, n_ff=9216, n_head=16, n_head_kv=4,
                      head_dim=256, full_attention_interval=4, ssm_state=128, ssm_key_heads=16, ssm_value_heads=32,
                      ssm_conv=4, weights="Q4_0", rope_dims=64),
}


def tensors(shape: HybridShape, n_vocab: int) -> list[tuple[str, tuple[int, ...], str]]:
    """Every tensor ``qwen35``'s loader reads, in order: its name, its shape as numpy holds it (rows, then the row's
    length: llama.cpp's dimensions reversed) and its kind (``norm``: ones; ``matrix``; ``vector``; ``decay``: the
    delta-net's A, kept negative)."""
    s = shape
    key_dim, value_dim = s.ssm_state * s.ssm_key_heads, s.ssm_state * s.ssm_value_heads
    out = [("token_embd.weight", (n_vocab, s.n_embd), "matrix"), ("output_norm.weight", (s.n_embd,), "norm")]
    for i in range(s.n_layer):
        blk = f"blk.{i}."
        out += [(blk + "attn_norm.weight", (s.n_embd,), "norm"), (blk + "post_attention_norm.weight", (s.n_embd,), "norm")]
        if (i + 1) % s.full_attention_interval == 0:  # full attention: the query carries its gate (twice as wide)
            out += [(blk + "attn_q.weight", (s.head_dim * s.n_head * 2, s.n_embd), "matrix"),
                    (blk + "attn_k.weight", (s.head_dim * s.n_head_kv, s.n_embd), "matrix"),
                    (blk + "attn_v.weight", (s.head_dim * s.n_head_kv, s.n_embd), "matrix"),
                    (blk + "attn_output.weight", (s.n_embd, s.head_dim * s.n_head), "matrix"),
                    (blk + "attn_q_norm.weight", (s.head_dim,), "norm"),
                    (blk + "attn_k_norm.weight", (s.head_dim,), "norm")]
        else:  # gated delta-net
            out += [(blk + "attn_qkv.weight", (key_dim * 2 + value_dim, s.n_embd), "matrix"),
                    (blk + "attn_gate.weight", (value_dim, s.n_embd), "matrix"),
                    (blk + "ssm_conv1d.weight", (key_dim * 2 + value_dim, s.ssm_conv), "vector"),
                    (blk + "ssm_dt.bias", (s.ssm_value_heads,), "vector"),
                    (blk + "ssm_a", (s.ssm_value_heads,), "decay"),
                    (blk + "ssm_beta.weight", (s.ssm_value_heads, s.n_embd), "matrix"),
                    (blk + "ssm_alpha.weight", (s.ssm_value_heads, s.n_embd), "matrix"),
                    (blk + "ssm_norm.weight", (s.ssm_state,), "norm"),
                    (blk + "ssm_out.weight", (s.n_embd, value_dim), "matrix")]
        out += [(blk + "ffn_gate.weight", (s.n_ff, s.n_embd), "matrix"),
                (blk + "ffn_down.weight", (s.n_embd, s.n_ff), "matrix"),
                (blk + "ffn_up.weight", (s.n_ff, s.n_embd), "matrix")]
    return out


def write(shape: HybridShape, tokenizer_gguf: Path, target: Path) -> Path:
    """Write ``shape`` with random weights and ``tokenizer_gguf``'s tokenizer and chat template to ``target``."""
    import gguf
    from gguf.quants import quantize

    source = gguf.GGUFReader(tokenizer_gguf, "r")
    n_vocab = len(source.fields[gguf.Keys.Tokenizer.LIST].data)
    s = shape
    writer = gguf.GGUFWriter(target, ARCH)
    writer.add_name(s.name)
    writer.add_context_length(s.context)
    writer.add_embedding_length(s.n_embd)
    writer.add_block_count(s.n_layer)
    writer.add_feed_forward_length(s.n_ff)
    writer.add_head_count(s.n_head)
    writer.add_head_count_kv(s.n_head_kv)
    writer.add_key_length(s.head_dim)
    writer.add_value_length(s.head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1e7)
    writer.add_rope_dimension_count(s.rope_dims)
    sections = s.rope_dims // 2
    writer.add_rope_dimension_sections([sections - 2 * (sections // 3), sections // 3, sections // 3, 0])
    writer.add_ssm_conv_kernel(s.ssm_conv)
    writer.add_ssm_inner_size(s.ssm_state * s.ssm_value_heads)
    writer.add_ssm_state_size(s.ssm_state)
    writer.add_ssm_time_step_rank(s.ssm_value_heads)
    writer.add_ssm_group_count(s.ssm_key_heads)
    writer.add_full_attention_interval(s.full_attention_interval)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if s.weights == "F16" else gguf.LlamaFileType.MOSTLY_Q4_0)
    for field in source.fields.values():  # the tokenizer and its chat template, as the embedded model has them
        if not field.name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        writer.add_key_value(field.name, field.contents(), kind,
                             sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    rng = np.random.default_rng(s.seed)
    qtype = gguf.GGMLQuantizationType[s.weights]
    for name, dims, kind in tensors(s, n_vocab):
        if kind == "norm":
            data = np.ones(dims, dtype=np.float32)
        elif kind == "decay":
            data = -np.exp(rng.standard_normal(dims, dtype=np.float32) * 0.5)
        elif kind == "vector":
            data = rng.standard_normal(dims, dtype=np.float32) * 0.1
        else:  # a matrix, scaled so that activations stay near unit size whatever the width
            data = rng.standard_normal(dims, dtype=np.float32) * (1.0 / np.sqrt(dims[-1]))
        if kind == "matrix" and qtype != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


def embedded_tokenizer() -> Path:
    """The embedded model's GGUF, whose tokenizer and chat template the random models take."""
    from decision_adapter.decisions.model_files import embedded_model_dir, find_gguf

    return Path(find_gguf(str(embedded_model_dir())))


def ensure(shape: HybridShape, cache: Path = CACHE) -> Path:
    """The folder holding ``shape``'s GGUF, written on first use (atomically: a partial file is never kept)."""
    folder = cache / shape.name
    target = folder / shape.file
    if target.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=folder, prefix=f".{shape.file}.", delete=False) as partial:
        path = Path(partial.name)
    try:
        write(shape, embedded_tokenizer(), path)
        os.replace(path, target)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hybrid_model", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--cache", type=Path, default=CACHE, help=f"where models are kept (default {CACHE})")
    args = parser.parse_args(argv)
    print(ensure(SHAPES[args.shape], args.cache))
    return 0


if __name__ == "__main__":
    sys.exit(main())
