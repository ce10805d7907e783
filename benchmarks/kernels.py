"""`python -m benchmarks.kernels`: prefill speed of llama.cpp's CPU kernels, build against build, same prompts.

What is compared, on the same model, threads and token ids:
- ``dispatched``: the adapter's installed wheel (its CPU variants, the best loaded at start-up: locally the baseline
  and the best for this CPU, every variant with ``LLAMA_VARIANTS=all``), once with ``auto`` and once per variant
  forced with ADAPTER_CPU_VARIANT (the kernels each instance family would run);
- ``avx2``: llama-cpp-python built with the adapter's former flags (``-DGGML_NATIVE=OFF -DGGML_AVX2=ON ...``);
- ``native``: built with ``-DGGML_NATIVE=ON`` for this very CPU, the upper bound here.
The other builds are compiled once each (about 7 minutes on 2 cores) into the same wheel cache
(container/llama_wheel.py),
unpacked beside it, and run from a child process that puts them first on ``sys.path``.

Each measurement is a child process that loads the model with the adapter's engine and times ``Engine.prefill``
(one ``llama_decode`` per micro-batch from empty memory, no readout) of the same token ids: one warm-up, then
``--repeats``. Rounds interleave the configurations (A, B, C, A, B, C, ...) so that drift on a shared machine hits
all alike; the table gives the median over rounds of each round's median, and the spread over rounds.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import zipfile
from pathlib import Path

from .provenance import Provenance, settings_fields

REPO = Path(__file__).resolve().parents[1]
# The comparison builds' flags (each its own cache folder): the adapter's former flags, and native.
BUILDS = {
    "avx2": "-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON",
    "native": "-DLLAVA_BUILD=OFF -DGGML_NATIVE=ON",
}


def _llama_wheel():
    """container/llama_wheel.py, which builds (and caches) every llama-cpp-python wheel the project uses."""
    spec = importlib.util.spec_from_file_location("llama_wheel", REPO / "container" / "llama_wheel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(flags: str) -> Path:
    """A folder holding llama-cpp-python's ``llama_cpp`` package compiled with ``flags``: the wheel is built once
    into the wheel cache (container/llama_wheel.py) and unpacked once beside it."""
    wheels = _llama_wheel().build(flags, None)
    unpacked = wheels / "site"
    if not (unpacked / ".complete").exists():
        shutil.rmtree(unpacked, ignore_errors=True)
        [wheel] = wheels.glob("llama_cpp_python-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.infolist():
                if member.filename.startswith("llama_cpp/"):
                    archive.extract(member, unpacked)
        for library in (unpacked / "llama_cpp" / "lib").iterdir():
            library.chmod(0o755)
        (unpacked / ".complete").touch()
    return unpacked


def default_variants() -> list[str]:
    """``auto``, then every variant the installed build ships and this CPU runs, but the baseline (x64: SSE only,
    no SIMD dot products for k-quants, minutes per prompt here; name it with --variants to see)."""
    import llama_cpp

    from decision_adapter.engine import backends, cpu_variants

    flags = cpu_variants.cpu_flags() or frozenset()
    shipped = backends.variant_files(Path(llama_cpp.__file__).parent / "lib")
    return ["auto", *(name for name in shipped if name in cpu_variants.VARIANTS and name != cpu_variants.BASELINE
                      and cpu_variants.runs(name, flags))]


def prompt_tokens(engine, count: int) -> list[int]:
    """The first ``count`` tokens of a support-ticket-like text: the same ids for every build."""
    from .prefill import state_text

    tokens = engine.vocabulary.tokenize(state_text(count * 2))
    if len(tokens) < count:
        raise RuntimeError(f"the text has only {len(tokens)} tokens")
    return tokens[:count]


def worker(args: argparse.Namespace) -> int:
    """One configuration in this process: load, warm up, time; print one JSON line."""
    import llama_cpp

    from decision_adapter.decisions.model_files import find_gguf
    from decision_adapter.engine.core import Engine
    from decision_adapter.settings import Settings
    from decision_adapter.startup import engine_options

    settings = Settings(model_dir=args.model_dir, threads=args.threads, cpu_variant=args.variant, state_cache_mb=0)
    rows = []
    with Engine(str(find_gguf(settings.model_dir)), engine_options(settings)) as engine:
        for count in args.tokens:
            tokens = prompt_tokens(engine, count)
            engine.runner.prefill(tokens)  # warm-up: first-use allocations
            seconds, cpu_seconds = [], []
            for _ in range(args.repeats):
                before = resource.getrusage(resource.RUSAGE_SELF)
                seconds.append(engine.runner.prefill(tokens)[0])
                after = resource.getrusage(resource.RUSAGE_SELF)
                cpu_seconds.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            rows.append({"tokens": count, "seconds": seconds, "cpu_seconds": cpu_seconds})
        kernels = engine.kernels
    print(json.dumps({"library": str(Path(llama_cpp.__file__).parent), "variant": kernels.variant,
                      "features": list(kernels.features), "cpu": kernels.cpu, "rows": rows,
                      # thread_wait: as the parent gave it to this process (OMP_WAIT_POLICY, read when llama.cpp
                      # loads)
                      "settings": {**settings_fields(settings), "thread_wait": args.thread_wait}}))
    return 0


def measure(config: dict, args: argparse.Namespace) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [config.get("path"), str(REPO),
                                                                       os.environ.get("PYTHONPATH")]))}
    # OpenMP reads its wait policy when llama.cpp's libraries load: the child gets it in its environment.
    env.pop("OMP_WAIT_POLICY", None)
    if args.thread_wait != "openmp":
        env["OMP_WAIT_POLICY"] = args.thread_wait
    command = [sys.executable, "-m", "benchmarks.kernels", "--worker", "--variant", config["variant"],
               "--model-dir", args.model_dir, "--threads", str(args.threads), "--repeats", str(args.repeats),
               "--thread-wait", args.thread_wait, "--tokens", *map(str, args.tokens)]
    load = os.getloadavg()[0]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(f"{config['name']} failed:\n{done.stderr[-3000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "load_before": load}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kernels", description=__doc__)
    parser.add_argument("--model-dir", help="GGUF folder (default: the benchmark model, make bench-model)")
    parser.add_argument("--tokens", type=int, nargs="+", default=[110, 500],
                        help="prompt lengths; 110 is a decision's size on the benchmark model")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--thread-wait", choices=["openmp", "passive", "active"], default="openmp",
                        help="how llama.cpp's OpenMP threads wait (OMP_WAIT_POLICY), for every configuration "
                             "(default: OpenMP's own, as the adapter runs)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="timed prefills per prompt in each round")
    parser.add_argument("--builds", nargs="+", choices=["dispatched", *BUILDS], default=["dispatched", *BUILDS])
    parser.add_argument("--variants", nargs="+",
                        help="CPU variants of the dispatched build to force (auto: the one it picks; default: auto "
                             "and every variant the build ships that this CPU runs, but the baseline)")
    parser.add_argument("--out", type=Path, help="write kernels.json and kernels.md here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", default="auto", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # subprocess.run then kills the child measuring
    if args.model_dir is None:
        from .bench_model import ensure

        args.model_dir = str(ensure())
    if args.worker:
        return worker(args)
    if args.variants is None:
        args.variants = default_variants()

    # Each row names the variant it ran: the record's provenance has no one `kernels`.
    with Provenance("benchmarks.kernels", argv) as provenance:
        configs = []
        if "dispatched" in args.builds:
            configs += [{"name": f"dispatched {v}", "build": "dispatched", "variant": v} for v in args.variants]
        configs += [{"name": b, "build": b, "variant": "auto", "path": str(build(BUILDS[b]))}
                    for b in args.builds if b in BUILDS]
        for b in args.builds:
            if b in BUILDS:
                provenance.built(f"llama-cpp-python {b}", BUILDS[b])
        runs: dict[str, list[dict]] = {c["name"]: [] for c in configs}
        for round_number in range(1, args.rounds + 1):
            for config in configs:
                result = measure(config, args)
                provenance.ran_with(result.pop("settings"))
                runs[config["name"]].append(result)
                speeds = ", ".join(f"{r['tokens']} tokens {r['tokens'] / statistics.median(r['seconds']):.0f}/s"
                                   for r in result["rows"])
                print(f"round {round_number} {config['name']:20s} ({result['variant']}): {speeds}", flush=True)

    rows = summarise(configs, runs, args.tokens)
    command = provenance.command
    table = markdown(rows, args, command, cpu=runs[configs[0]["name"]][0]["cpu"])
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        record = {"command": command, "machine": platform.processor() or platform.machine(),
                  "thread_wait": args.thread_wait,
                  "cpu": runs[configs[0]["name"]][0]["cpu"], "threads": args.threads, "rounds": args.rounds,
                  "repeats": args.repeats, "model_dir": args.model_dir, "rows": rows,
                  "runs": {name: [{k: v for k, v in r.items() if k != "library"} for r in results]
                           for name, results in runs.items()},
                  "provenance": provenance.record()}
        (args.out / "kernels.json").write_text(json.dumps(record, indent=1) + "\n")
        (args.out / "kernels.md").write_text(table)
    return 0


def summarise(configs: list[dict], runs: dict[str, list[dict]], counts: list[int]) -> list[dict]:
    """Per configuration and prompt length: tokens/s (median over rounds of each round's median), its spread
    over rounds, and the ratio to native's (or to the first configuration's when native was not run)."""
    rows = []
    for config in configs:
        results = runs[config["name"]]
        for count in counts:
            mine = [next(r for r in result["rows"] if r["tokens"] == count) for result in results]
            per_round = [count / statistics.median(r["seconds"]) for r in mine]
            per_cpu_second = [count / statistics.median(r["cpu_seconds"]) for r in mine]
            rows.append({"config": config["name"], "build": config["build"], "variant": results[0]["variant"],
                         "features": results[0]["features"], "tokens": count,
                         "tokens_per_s": statistics.median(per_round), "min": min(per_round), "max": max(per_round),
                         "tokens_per_cpu_s": statistics.median(per_cpu_second)})
    reference = "native" if "native" in runs else configs[0]["name"]
    for row in rows:
        base = next(r for r in rows if r["config"] == reference and r["tokens"] == row["tokens"])
        row["vs_" + reference.replace(" ", "_")] = row["tokens_per_s"] / base["tokens_per_s"]
    return rows


def markdown(rows: list[dict], args: argparse.Namespace, command: str, cpu: str) -> str:
    reference = next(k for k in rows[0] if k.startswith("vs_"))[3:].replace("_", " ")
    counts = sorted({r["tokens"] for r in rows})
    lines = [f"Prefill tokens/s by CPU kernels ({cpu}, {args.threads} threads, model {Path(args.model_dir).name}): "
             f"median over {args.rounds} interleaved rounds of the median of {args.repeats} prefills, "
             f"[lowest-highest round], and against {reference}. Reproduce: `{command}`", "",
             "| build | variant loaded | " + " | ".join(f"{n} tokens" for n in counts) + " |",
             "|---|---|" + "---:|" * len(counts)]
    key = "vs_" + reference.replace(" ", "_")
    for config in dict.fromkeys(r["config"] for r in rows):
        mine = {r["tokens"]: r for r in rows if r["config"] == config}
        first = mine[counts[0]]
        cells = [f"{mine[n]['tokens_per_s']:.0f} [{mine[n]['min']:.0f}-{mine[n]['max']:.0f}] "
                 f"({mine[n][key]:.2f}x)" for n in counts]
        isa = ", ".join(f for f in first["features"] if f.startswith(("AVX", "AMX")))
        lines.append(f"| {config} | {first['variant']} ({isa}) | " + " | ".join(cells) + " |")
    lines += ["", "Tokens per CPU-second (the CPU time of all the process's threads, median over rounds): less moved "
              "by other load on a shared machine than wall time, but spin-waiting threads count too.", "",
              "| build | " + " | ".join(f"{n} tokens" for n in counts) + " |", "|---|" + "---:|" * len(counts)]
    for config in dict.fromkeys(r["config"] for r in rows):
        mine = {r["tokens"]: r for r in rows if r["config"] == config}
        lines.append(f"| {config} | " + " | ".join(f"{mine[n]['tokens_per_cpu_s']:.0f}" for n in counts) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
