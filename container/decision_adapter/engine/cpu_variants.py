"""llama.cpp's x86-64 CPU variants: which instruction sets each needs, which this CPU runs, and the best of them.

One definition for everyone who must agree on the kernels: the engine (``backends.load`` picks the best variant
the operating system enables, not only the one CPUID reports), the local build (``make`` compiles the baseline and
the best variant for this machine, ``container/llama_wheel.py``), the image (every variant) and the tests (which
variant must load here). The table is ggml's own (``ggml_add_cpu_backend_variant`` in ggml/src/CMakeLists.txt
of the pinned llama.cpp; ``llama_wheel.py`` checks the two are equal before it builds), and a variant's score is
the one ggml's ``ggml_backend_cpu_x86_score`` gives it, so the best variant here is the one ggml would load.

What this CPU runs is read from the kernel's ``/proc/cpuinfo`` flags: Linux lists an AVX or AVX-512 flag only
where the operating system saves that register state (XCR0), which CPUID alone does not say, so a variant that
CPUID allows and the OS does not is never loaded (it would die of SIGILL at the first kernel it runs).

Standard library only: the Makefile runs this file by path before llama-cpp-python is installed
(``python3 container/decision_adapter/engine/cpu_variants.py local``).

may import from the package: nothing
"""

from __future__ import annotations

import sys
from pathlib import Path

# ggml_add_cpu_backend_variant(name FEATURES...) for x86, in ggml's order (GCC and Clang: the MSVC exceptions apply
# to none of our builds).
VARIANTS: dict[str, tuple[str, ...]] = {
    "x64": (),
    "sse42": ("SSE42",),
    "sandybridge": ("SSE42", "AVX"),
    "ivybridge": ("SSE42", "AVX", "F16C"),
    "piledriver": ("SSE42", "AVX", "F16C", "FMA"),
    "haswell": ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2"),
    "skylakex": ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512"),
    "cannonlake": ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512", "AVX512_VBMI"),
    "cascadelake": ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512", "AVX512_VNNI"),
    "icelake": ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512", "AVX512_VBMI", "AVX512_VNNI"),
    "cooperlake": ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512", "AVX512_VNNI", "AVX512_BF16"),
    "zen4": ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16"),
    "alderlake": ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX_VNNI"),
    "sapphirerapids": ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512", "AVX512_VBMI", "AVX512_VNNI",
                       "AVX512_BF16", "AMX_TILE", "AMX_INT8"),
}
# The baseline every x86-64 CPU runs; the local build ships it beside the best variant (tests force it).
BASELINE = "x64"
# What makes a variant's kernels use AMX tiles. ``best`` (and so ``auto`` and the local build) leaves such variants
# out: on an Intel Xeon guest whose CPUID, kernel flags (amx_tile, amx_int8) and arch_prctl all enable AMX, the AMX
# kernels of the pinned llama.cpp (b11312) died of SIGILL at their first quantized matrix product (gdb: tileloadd
# in ggml_backend_amx_mul_mat, on the embedded model), where the same CPU's AVX-512 variant runs; a server that
# dies at its first request restarts into the same death. ``ADAPTER_CPU_VARIANT=sapphirerapids`` still loads them,
# for a fleet that verified them.
AMX_FEATURES = frozenset({"AMX_TILE", "AMX_INT8"})

# What ggml's score checks for each feature (cpuid_x86 in ggml-cpu/arch/x86/cpu-feats.cpp), as Linux names the flags.
FLAGS: dict[str, tuple[str, ...]] = {
    "SSE42": ("sse4_2",), "AVX": ("avx",), "F16C": ("f16c",), "FMA": ("fma",), "AVX2": ("avx2",),
    "BMI2": ("bmi2",), "AVX_VNNI": ("avx_vnni",),
    "AVX512": ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"),
    "AVX512_VBMI": ("avx512vbmi",), "AVX512_VNNI": ("avx512_vnni",), "AVX512_BF16": ("avx512_bf16",),
    "AMX_TILE": ("amx_tile",), "AMX_INT8": ("amx_int8",),
}
# ggml_backend_cpu_x86_score: 1, plus one bit per feature compiled in (AMX_TILE adds none).
SCORE_BITS: dict[str, int] = {
    "FMA": 1, "F16C": 1 << 1, "SSE42": 1 << 2, "BMI2": 1 << 3, "AVX": 1 << 4, "AVX2": 1 << 5, "AVX_VNNI": 1 << 6,
    "AVX512": 1 << 7, "AVX512_VBMI": 1 << 8, "AVX512_BF16": 1 << 9, "AVX512_VNNI": 1 << 10, "AMX_TILE": 0,
    "AMX_INT8": 1 << 11,
}


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str] | None:
    """The first processor's flags as the kernel reports them, or None where there is no such file (not Linux)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return None


def runs(variant: str, flags: frozenset[str]) -> bool:
    """Whether a CPU (and its operating system) with ``flags`` runs every instruction ``variant`` is compiled for."""
    return all(flag in flags for feature in VARIANTS[variant] for flag in FLAGS[feature])


def score(variant: str) -> int:
    """ggml's score of ``variant`` on a CPU that runs it."""
    return 1 + sum(SCORE_BITS[feature] for feature in VARIANTS[variant])


def uses_amx(variant: str) -> bool:
    """Whether ``variant``'s kernels use AMX tiles (see ``AMX_FEATURES``: never chosen by ``best``)."""
    return bool(AMX_FEATURES.intersection(VARIANTS[variant]))


def best(flags: frozenset[str], among: object = None) -> str:
    """The variant to load on a CPU with ``flags``, among ``among`` (names; default: every variant): the one ggml
    would load, AMX variants left out (``AMX_FEATURES``)."""
    names = [name for name in (VARIANTS if among is None else among)
             if name in VARIANTS and runs(name, flags) and not uses_amx(name)]
    if not names:
        raise LookupError("no x86-64 CPU variant of llama.cpp runs on this CPU")
    return max(names, key=score)


def local_build(flags: frozenset[str]) -> tuple[str, ...]:
    """The variants a local build compiles for a machine with ``flags``: the baseline and the best one."""
    return tuple(dict.fromkeys((BASELINE, best(flags))))


def native_cmake(flags: frozenset[str]) -> str:
    """The CMake flags of a llama.cpp built for this CPU alone (the benchmarks' llama-server): ``-DGGML_NATIVE=ON``,
    except on a CPU with AMX, where ``-march=native`` would compile the AMX kernels that ``AMX_FEATURES`` keeps out
    (a native llama-server died at its first decode there): then every instruction set of the best variant, named."""
    if not any(uses_amx(name) and runs(name, flags) for name in VARIANTS):
        return "-DGGML_NATIVE=ON"
    return " ".join(["-DGGML_NATIVE=OFF", *(f"-DGGML_{feature}=ON" for feature in VARIANTS[best(flags)])])


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "best"
    flags = cpu_flags()
    if flags is None:
        print("cpu_variants: no /proc/cpuinfo flags on this machine", file=sys.stderr)
        return 2
    if command == "best":
        print(best(flags))
    elif command == "local":
        print(",".join(local_build(flags)))
    elif command == "all":
        print(",".join(VARIANTS))
    elif command == "native-cmake":
        print(native_cmake(flags))
    else:
        print(f"usage: {Path(__file__).name} [best|local|all|native-cmake]", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
