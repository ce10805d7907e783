"""`python -m benchmarks.prefill`: how fast one long state prefills at each micro-batch size and attention mode.

The engine decodes a state, and each question, in ADAPTER_BATCH_TOKENS micro-batches, with attention computed in
32-bit floats (ADAPTER_FLASH_ATTENTION=off, ADAPTER_KV_CACHE_TYPE=f32) unless told otherwise; this measures what
those settings cost: Engine.prefill of the same tokens after the saved head, at each size and mode, median of a
few rounds, in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from .provenance import Provenance

SIZES = (32, 64, 128, 256, 512)
ATTENTION = {"fp32": {"flash_attention": "off", "kv_cache_type": "f32"},
             "flash": {"flash_attention": "on", "kv_cache_type": "f16"}}


def state_text(tokens_wanted: int) -> str:
    """A support-ticket-like state of roughly ``tokens_wanted`` tokens (about 20 tokens a line)."""
    return "\n".join(f"Line {i}: the customer reports problem number {i} with order {1000 + i}."
                     for i in range(tokens_wanted // 20 + 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.prefill", description=__doc__)
    parser.add_argument("--tokens", type=int, nargs="+", default=[500, 2500])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--attention", nargs="+", choices=list(ATTENTION), default=list(ATTENTION),
                        help="fp32: flash attention off, f32 KV cache (the default); flash: on, f16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--gpu-layers", type=int, default=0, metavar="N",
                        help="layers offloaded to the GPU (-1: all; needs a GPU build of llama-cpp-python)")
    parser.add_argument("--model-dir", help="GGUF folder (default: the embedded SmolLM2 model)")
    parser.add_argument("--out", type=Path, help="write prefill.json and prefill.md here")
    args = parser.parse_args(argv)

    from decision_adapter.decisions.model_files import embedded_model_dir
    from decision_adapter.settings import Settings
    from decision_adapter.startup import load_decision_model

    base = replace(Settings.from_env(), model_dir=args.model_dir or str(embedded_model_dir()), threads=args.threads,
                   gpu_layers=args.gpu_layers)
    rows = []
    with Provenance("benchmarks.prefill", argv) as provenance:
        for attention in args.attention:
            for size in args.sizes:
                settings = replace(base, batch_tokens=size, **ATTENTION[attention])
                model = load_decision_model(settings)
                provenance.ran_with(settings)
                provenance.kernels_of(model.model_info)
                try:
                    for wanted in args.tokens:
                        tokens = model.engine.vocabulary.tokenize(model.render(state_text(wanted), "Which?", ("A", "B"),
                                                                    ("x", "y")))
                        times = [model.engine.runner.prefill(tokens, reuse_resident=True) for _ in range(args.rounds)]
                        rows.append({"attention": attention, "batch_tokens": size, "tokens": times[0][1],
                                     "median_s": statistics.median(t for t, _ in times)})
                        print(f"{attention:5s} micro-batch {size:4d}: {times[0][1]:5d} tokens in "
                              f"{rows[-1]['median_s']:.2f} s", flush=True)
                finally:
                    model.close()

    command = provenance.command
    table = markdown(rows, args, command)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        record = {"command": command, "threads": args.threads, "gpu_layers": args.gpu_layers,
                  "rounds": args.rounds, "rows": rows, "provenance": provenance.record()}
        (args.out / "prefill.json").write_text(json.dumps(record, indent=1) + "\n")
        (args.out / "prefill.md").write_text(table)
    return 0


def markdown(rows: list[dict], args: argparse.Namespace, command: str) -> str:
    counts = sorted({r["tokens"] for r in rows})
    by = {(r["attention"], r["batch_tokens"], r["tokens"]): r["median_s"] for r in rows}
    reference = (rows[0]["attention"], rows[0]["batch_tokens"])
    lines = [f"Prefill of one state after the saved head, {args.threads} threads, {args.gpu_layers} GPU layers, "
             f"median of {args.rounds} rounds; in brackets the speed against {reference[0]} attention in "
             f"micro-batches of {reference[1]}. Reproduce: `{command}`", "",
             "| attention | micro-batch | " + " | ".join(f"{n} tokens" for n in counts) + " |",
             "|---|---:|" + "---:|" * len(counts)]
    for attention, size in dict.fromkeys((r["attention"], r["batch_tokens"]) for r in rows):
        cells = [f"{by[attention, size, n]:.2f} s ({by[(*reference, n)] / by[attention, size, n]:.2f}x)"
                 for n in counts]
        lines.append(f"| {attention} | {size} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
