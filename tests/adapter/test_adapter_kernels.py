"""llama.cpp's CPU kernels: the wheel ships its variants, the engine loads the best for this CPU and says which.

The variant is chosen once per process (ggml's registry is global), so each failure is a `serve` of its own over a
copy of llama-cpp-python's library folder (``LLAMA_CPP_LIB_PATH``, which llama-cpp-python honours) with a variant
missing, damaged or unrunnable: the server must stay up with /ping at 503 and the reason, never crash.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import llama_cpp
import pytest
import requests

from adapter_server import live_server
from decision_adapter.engine import backends, cpu_variants
from decision_adapter.engine.errors import BackendUnavailable

LIB = Path(llama_cpp.__file__).parent / "lib"
SHIPPED = set(backends.variant_files(LIB))
# This CPU's flags as the kernel reports them, which the engine reads too (what the OS enables, not only CPUID).
FLAGS = cpu_variants.cpu_flags()


def test_the_wheel_ships_the_baseline_and_the_best_variant_for_this_cpu():
    """A local build ships the x86-64 baseline and the best variant for its machine; the image every variant
    (make image-test checks that one); either way only variants ggml declares."""
    assert FLAGS is not None, "/proc/cpuinfo has no flags line"
    assert SHIPPED <= set(cpu_variants.VARIANTS), SHIPPED - set(cpu_variants.VARIANTS)
    assert set(cpu_variants.local_build(FLAGS)) <= SHIPPED, (cpu_variants.local_build(FLAGS), SHIPPED)
    assert not (LIB / "libggml-cpu.so").exists(), "a built-in CPU backend beside the variants"


def test_the_engine_runs_the_best_variant_for_this_cpu(engine):
    kernels = engine.kernels
    scores = {name: backends.probe(path) for name, path in backends.variant_files(LIB).items()}
    assert kernels.variant == cpu_variants.best(FLAGS, among=SHIPPED), (kernels, sorted(FLAGS))
    # where the operating system enables everything CPUID reports, that is ggml's own choice, AMX variants left out
    scores = {name: score for name, score in scores.items() if not cpu_variants.uses_amx(name)}
    if all(cpu_variants.runs(name, FLAGS) for name, score in scores.items() if score):
        assert kernels.variant == max(scores, key=scores.get), scores
    assert kernels.library == f"libggml-cpu-{kernels.variant}.so"
    assert kernels.backends == ("CPU",)
    # the instruction sets the kernels report are those the variant declares (ggml names neither SSE42 nor
    # AMX_TILE among its features), and this CPU has each one
    declared = set(cpu_variants.VARIANTS[kernels.variant])
    reported = {f for f in kernels.features if f in cpu_variants.FLAGS}
    assert reported <= declared and declared - reported <= {"SSE42", "AMX_TILE"}, (kernels.features, declared)
    assert cpu_variants.runs(kernels.variant, FLAGS)


def test_a_variant_the_os_does_not_enable_is_never_chosen(tmp_path):
    """CPUID may report AVX-512 where the OS keeps its registers off (XCR0): ggml then scores skylakex as runnable,
    and loading it would die of SIGILL. The kernel's flags rule it out, for auto and for a named variant."""
    scores = {"x64": cpu_variants.score("x64"), "haswell": cpu_variants.score("haswell"),
              "skylakex": cpu_variants.score("skylakex")}
    avx2_only = frozenset(flag for feature in cpu_variants.VARIANTS["haswell"] for flag in cpu_variants.FLAGS[feature])
    assert backends.choose("auto", scores, avx2_only, tmp_path) == "haswell"
    assert backends.choose("auto", scores, None, tmp_path) == "skylakex", "without flags, ggml's word"
    with pytest.raises(BackendUnavailable, match="the operating system does not enable instructions that "
                                                 "llama.cpp's skylakex kernels need; variants this CPU runs: "
                                                 "x64, haswell"):
        backends.choose("skylakex", scores, avx2_only, tmp_path)
    with pytest.raises(BackendUnavailable, match="the operating system enables the instructions of none of skylakex"):
        backends.choose("auto", {"skylakex": scores["skylakex"]}, avx2_only, tmp_path)


def test_auto_leaves_amx_variants_out(tmp_path):
    """AMX kernels died of SIGILL on a CPU and OS that enable AMX (cpu_variants.AMX_FEATURES): auto takes the best
    variant without them; a named AMX variant is still loaded where the CPU runs it."""
    spr = frozenset(flag for feature in cpu_variants.VARIANTS["sapphirerapids"] for flag in cpu_variants.FLAGS[feature])
    scores = {name: cpu_variants.score(name) for name in ("x64", "zen4", "sapphirerapids")}
    assert backends.choose("auto", scores, spr, tmp_path) == "zen4"
    assert backends.choose("sapphirerapids", scores, spr, tmp_path) == "sapphirerapids"
    assert cpu_variants.best(spr) == "zen4" and cpu_variants.local_build(spr) == ("x64", "zen4")


def test_results_and_ping_name_the_kernels(client, example, engine):
    ping = client.get("/ping").get_json()
    assert ping["cpu_variant"] == engine.kernels.variant
    assert ping["cpu_features"] == list(engine.kernels.features)
    model = client.post("/invocations", json=example).get_json()["result"]["model"]
    assert model["cpu_variant"] == engine.kernels.variant and model["cpu_features"] == list(engine.kernels.features)


def test_a_named_variant_is_loaded_instead_of_the_best(model_dir):
    code = ("from decision_adapter.engine.core import Engine; from decision_adapter.settings import Settings; "
            "from decision_adapter.startup import engine_options; import sys; "
            "e = Engine(sys.argv[1], engine_options(Settings(threads=1, ctx_tokens=1024, max_prompt_tokens=512, "
            "cpu_variant='x64'))); "
            "print(e.kernels.variant, e.kernels.library, ' '.join(e.kernels.features))")
    from decision_adapter.decisions.model_files import find_gguf

    done = subprocess.run([sys.executable, "-c", code, str(find_gguf(model_dir))], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    variant, library, *features = done.stdout.split()
    assert (variant, library) == ("x64", "libggml-cpu-x64.so")
    assert not {"AVX", "AVX2", "AVX512"} & set(features), features


def lib_copy(tmp_path: Path, *, variants: bool = True) -> Path:
    folder = tmp_path / "lib"
    folder.mkdir()
    for path in LIB.iterdir():
        if variants or not path.name.startswith("libggml-cpu-"):
            shutil.copy2(path, folder / path.name)
    return folder


def fake_variant(folder: Path, name: str, score: int) -> None:
    """A ggml backend library whose ggml_backend_score says ``score`` on any CPU."""
    source = folder / f"{name}.c"
    source.write_text(f"int ggml_backend_score(void) {{ return {score}; }}\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(folder / f"libggml-cpu-{name}.so"), str(source)], check=True)


def failed_start(model_dir: Path, folder: Path, **env: str) -> str:
    with live_server(str(model_dir), until="failed", LLAMA_CPP_LIB_PATH=str(folder), **env) as (base, process):
        ping = requests.get(f"{base}/ping", timeout=5)
        assert ping.status_code == 503 and ping.json()["status"] == "failed", ping.text
        assert "cpu_variant" not in ping.json()
        assert process.poll() is None, "the server must stay up and say why"
        return ping.json()["detail"]


def test_missing_variants_keep_ping_at_503_with_the_reason(tmp_path, model_dir):
    folder = lib_copy(tmp_path, variants=False)
    detail = failed_start(model_dir, folder)
    assert f"no CPU backend in {folder}" in detail and "GGML_CPU_ALL_VARIANTS" in detail, detail


def test_a_damaged_variant_keeps_ping_at_503_with_the_reason(tmp_path, model_dir, engine):
    folder = lib_copy(tmp_path)
    damaged = folder / f"libggml-cpu-{engine.kernels.variant}.so"
    damaged.write_bytes(b"not a shared library")
    detail = failed_start(model_dir, folder)
    assert f"llama.cpp's CPU backend {damaged} cannot be loaded" in detail, detail


def test_no_variant_this_cpu_runs_keeps_ping_at_503(tmp_path, model_dir):
    folder = lib_copy(tmp_path, variants=False)
    fake_variant(folder, "future", 0)
    detail = failed_start(model_dir, folder)
    assert f"no CPU variant in {folder} runs on this CPU (scores: future=0)" in detail, detail


def test_a_named_variant_this_cpu_cannot_run_or_that_does_not_exist_is_refused(tmp_path, model_dir):
    folder = lib_copy(tmp_path)
    fake_variant(folder, "future", 0)
    detail = failed_start(model_dir, folder, ADAPTER_CPU_VARIANT="future")
    assert "ADAPTER_CPU_VARIANT=future: this CPU lacks instructions that llama.cpp's future kernels need" in detail
    detail = failed_start(model_dir, LIB, ADAPTER_CPU_VARIANT="pentium")
    assert "ADAPTER_CPU_VARIANT=pentium names no CPU variant of this build" in detail
    assert cpu_variants.BASELINE in detail, detail


def test_a_bad_variant_name_is_refused_before_start(tmp_path, model_dir):
    done = subprocess.run([sys.executable, "-m", "decision_adapter.server.serve"], capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", "ADAPTER_MODEL_DIR": str(model_dir),
                                           "ADAPTER_CPU_VARIANT": "../evil"})
    assert done.returncode == 2 and "ADAPTER_CPU_VARIANT='../evil'" in done.stderr, done.stderr


def test_the_native_comparison_build_leaves_amx_out_where_the_cpu_has_it():
    """llama-server for the benchmarks is built for this CPU alone: -DGGML_NATIVE=ON, except where the CPU has AMX
    (-march=native would compile the AMX kernels auto leaves out): then the best variant's instruction sets, named."""
    spr = frozenset(flag for feature in cpu_variants.VARIANTS["sapphirerapids"] for flag in cpu_variants.FLAGS[feature])
    zen4 = frozenset(flag for feature in cpu_variants.VARIANTS["zen4"] for flag in cpu_variants.FLAGS[feature])
    assert cpu_variants.native_cmake(zen4) == "-DGGML_NATIVE=ON"
    flags = cpu_variants.native_cmake(spr).split()
    assert flags[0] == "-DGGML_NATIVE=OFF" and "-DGGML_AVX512_BF16=ON" in flags
    assert not [f for f in flags if "AMX" in f]
