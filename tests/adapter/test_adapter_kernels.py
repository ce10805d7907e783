"""llama.cpp's CPU kernels: the wheel ships every variant, the engine loads the best for this CPU and says which.

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
import requests

from adapter_server import live_server
from decision_adapter.engine import backends

LIB = Path(llama_cpp.__file__).parent / "lib"
# ggml's feature names against /proc/cpuinfo's flags, for the instruction sets a variant can be compiled for.
CPUINFO = {"AVX": "avx", "AVX2": "avx2", "F16C": "f16c", "FMA": "fma", "BMI2": "bmi2", "AVX_VNNI": "avx_vnni",
           "AVX512": "avx512f", "AVX512_VBMI": "avx512vbmi", "AVX512_VNNI": "avx512_vnni",
           "AVX512_BF16": "avx512_bf16", "AMX_INT8": "amx_int8"}


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    raise AssertionError("/proc/cpuinfo has no flags line")


def test_the_wheel_ships_the_x86_64_variants():
    shipped = set(backends.variant_files(LIB))
    assert {"x64", "haswell", "skylakex", "icelake", "zen4", "sapphirerapids"} <= shipped, shipped
    assert not (LIB / "libggml-cpu.so").exists(), "a built-in CPU backend beside the variants"


def test_the_engine_runs_the_best_variant_for_this_cpu(engine):
    kernels = engine.kernels
    scores = {name: backends.probe(path) for name, path in backends.variant_files(LIB).items()}
    assert kernels.variant == max(scores, key=scores.get) and scores[kernels.variant] > 0, (kernels, scores)
    assert kernels.library == f"libggml-cpu-{kernels.variant}.so"
    assert kernels.backends == ("CPU",)
    flags = cpu_flags()
    isa = [f for f in kernels.features if f in CPUINFO]
    assert isa and all(CPUINFO[f] in flags for f in isa), (isa, sorted(flags & set(CPUINFO.values())))
    # every instruction set this CPU has and some variant is built for is used (zen4, icelake... have no AMX)
    for feature in ("AVX2", "AVX512", "AVX512_VNNI"):
        assert (feature in kernels.features) == (CPUINFO[feature] in flags), feature


def test_results_and_ping_name_the_kernels(client, example, engine):
    ping = client.get("/ping").get_json()
    assert ping["cpu_variant"] == engine.kernels.variant
    assert ping["cpu_features"] == list(engine.kernels.features)
    model = client.post("/invocations", json=example).get_json()["result"]["model"]
    assert model["cpu_variant"] == engine.kernels.variant and model["cpu_features"] == list(engine.kernels.features)


def test_a_named_variant_is_loaded_instead_of_the_best(model_dir):
    code = ("from decision_adapter.engine.core import Engine, EngineOptions; import sys; "
            "e = Engine(sys.argv[1], EngineOptions(threads=1, cpu_variant='x64')); "
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
    assert "ADAPTER_CPU_VARIANT=pentium names no CPU variant of this build" in detail and "zen4" in detail, detail


def test_a_bad_variant_name_is_refused_before_start(tmp_path, model_dir):
    done = subprocess.run([sys.executable, "-m", "decision_adapter.server.serve"], capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", "ADAPTER_MODEL_DIR": str(model_dir),
                                           "ADAPTER_CPU_VARIANT": "../evil"})
    assert done.returncode == 2 and "ADAPTER_CPU_VARIANT='../evil'" in done.stderr, done.stderr
