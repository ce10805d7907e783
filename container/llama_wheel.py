"""Builds llama-cpp-python's wheel once per version, flag set and CPU variant set, into a cache outside the checkout.

``python3 container/llama_wheel.py build --variants local`` (what ``make run`` and ``make test`` do) compiles the
pinned source package with llama.cpp's release layout (``IMAGE_CMAKE_ARGS``: every CPU variant its own backend
library, the best loaded at start-up by engine/backends.py) restricted to the variants this machine needs: the
x86-64 baseline (tests force it) and the best one for this CPU (``engine/cpu_variants.py``). ``--variants all``
builds every variant, as the image does (``make image-test`` hands that wheel to the image build). pip's own cache
ignores ``CMAKE_ARGS``, hence this cache; its folder name carries everything the wheel depends on.

ggml has no switch for a subset of its variants, and llama-cpp-python forces llama.cpp's ``common`` library on,
which nothing in the Python package loads (about half of the compile time on 2 cores). So the source package is
unpacked and edited in two places, each of which must match exactly once (``EDITS``); with ``--variants all`` and
``common`` on the build is the unedited one. Before building, the x86 variant list of the pinned ggml is compared
with ``cpu_variants.VARIANTS``: a llama-cpp-python upgrade that changes it fails here, not at start-up.

Subcommands: ``build`` (prints the folder holding the wheel), ``folder`` (prints it without building), ``sdist``
(prints the cached source package). Standard library only; runs before any virtual environment exists.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("DECISION_ADAPTER_CACHE", Path.home() / ".cache" / "decision-adapter"))
# llama.cpp's release layout for x86-64 (the Dockerfile's LLAMA_CMAKE_ARGS; a test keeps the two equal).
IMAGE_CMAKE_ARGS = ("-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON "
                    "-DGGML_BACKEND_DIR:STRING=llama_cpp/lib")
# (file in the source package, text, replacement): a variant list ggml honours, and common made optional.
EDITS = (
    ("vendor/llama.cpp/ggml/src/CMakeLists.txt",
     "function(ggml_add_cpu_backend_variant tag_name)\n",
     "function(ggml_add_cpu_backend_variant tag_name)\n"
     "    if (GGML_CPU_VARIANTS AND NOT tag_name IN_LIST GGML_CPU_VARIANTS)\n"
     "        return()\n"
     "    endif()\n"),
    ("CMakeLists.txt",
     'set(LLAMA_BUILD_COMMON ON CACHE BOOL "Build llama.cpp common library" FORCE)',
     'set(LLAMA_BUILD_COMMON ON CACHE BOOL "Build llama.cpp common library")'),
)


def _cpu_variants():
    spec = importlib.util.spec_from_file_location("cpu_variants", HERE / "decision_adapter/engine/cpu_variants.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cpu_variants = _cpu_variants()


def version() -> str:
    for line in (HERE / "requirements.txt").read_text().splitlines():
        if line.startswith("llama-cpp-python=="):
            return line.split("==", 1)[1].strip()
    raise SystemExit("container/requirements.txt pins no llama-cpp-python")


def resolve_variants(spec: str) -> tuple[str, ...] | None:
    """``local`` (baseline and best for this CPU), ``all`` (None: ggml's whole list) or names separated by commas."""
    if spec == "all":
        return None
    if spec == "local":
        flags = cpu_variants.cpu_flags()
        if flags is None:
            raise SystemExit("llama_wheel: no /proc/cpuinfo flags to choose this CPU's variant; use --variants all")
        return cpu_variants.local_build(flags)
    names = tuple(dict.fromkeys(n.strip() for n in spec.split(",") if n.strip()))
    unknown = [n for n in names if n not in cpu_variants.VARIANTS]
    if unknown or not names:
        raise SystemExit(f"llama_wheel: unknown CPU variants {unknown or spec!r}; known: {', '.join(cpu_variants.VARIANTS)}")
    return names


def cmake_args(flags: str, variants: tuple[str, ...] | None) -> str:
    """The flags a build passes: ``flags`` as given where every variant is built; with a subset, that subset and
    llama.cpp's ``common`` left out (both need ``EDITS``)."""
    if variants is None:
        return flags
    return f"{flags} -DGGML_CPU_VARIANTS={';'.join(variants)} -DLLAMA_BUILD_COMMON=OFF"


def folder(flags: str, variants: tuple[str, ...] | None) -> Path:
    """The cache folder of a wheel: the version, the variants, and a digest of the flags and of this file's edits."""
    key = "\n".join([cmake_args(flags, variants), repr(EDITS)])
    label = "all" if variants is None else "-".join(variants)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return CACHE / "wheels" / f"llama-cpp-python-{version()}-{label}-{digest}"


def sdist() -> Path:
    """The pinned source package, downloaded once (pip checks it against the index's hash)."""
    target = CACHE / "sdist" / f"llama_cpp_python-{version()}.tar.gz"
    if not target.exists():
        # A folder of its own per download: `make test` builds the wheel and llama-server at once, and both may
        # fetch the package; each renames its complete file into place (the same bytes, pip checked the hash).
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=target.name + ".partial-", dir=target.parent))
        try:
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                            "--no-deps", "--no-binary", ":all:", f"llama-cpp-python=={version()}", "-d", str(partial)],
                           check=True, stdout=sys.stderr)
            (downloaded,) = partial.glob("llama_cpp_python-*.tar.gz")
            os.replace(downloaded, target)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return target


def ggml_x86_variants(tree: Path) -> dict[str, tuple[str, ...]]:
    """The x86 variants the source tree's ggml declares, with their features."""
    text = (tree / "vendor/llama.cpp/ggml/src/CMakeLists.txt").read_text()
    block = re.search(r'\nif \(GGML_CPU_ALL_VARIANTS\)\n.*?if \(GGML_SYSTEM_ARCH STREQUAL "x86"\)\n(.*?)\n\s*elseif ?'
                      r'\(GGML_SYSTEM_ARCH', text, re.S)
    if not block:
        raise SystemExit("llama_wheel: ggml's CMakeLists.txt has no x86 variant list where expected")
    return {m[1]: tuple(m[2].split()) for m in re.finditer(r"ggml_add_cpu_backend_variant\((\w+)\s*([^)]*)\)",
                                                             block[1])}


def unpack(archive: Path, into: Path) -> Path:
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    (tree,) = into.glob("llama_cpp_python-*")
    declared = ggml_x86_variants(tree)
    if declared != cpu_variants.VARIANTS:
        raise SystemExit(f"llama_wheel: the pinned ggml's x86 variants differ from engine/cpu_variants.py VARIANTS:\n"
                         f"ggml: {declared}\ncpu_variants: {cpu_variants.VARIANTS}")
    for path, old, new in EDITS:
        text = (tree / path).read_text()
        if text.count(old) != 1:
            raise SystemExit(f"llama_wheel: {path} of llama-cpp-python {version()} no longer holds {old!r} once")
        (tree / path).write_text(text.replace(old, new))
    return tree


def build(flags: str, variants: tuple[str, ...] | None) -> Path:
    """The folder holding the wheel, built first where it is not complete."""
    target = folder(flags, variants)
    if (target / ".complete").exists():
        return target
    label = "every CPU variant" if variants is None else "CPU variants " + ", ".join(variants)
    print(f"Building llama-cpp-python {version()} ({label}) once into {target}...", file=sys.stderr, flush=True)
    partial = target.parent / (target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="llama-wheel-") as work:
        tree = unpack(sdist(), Path(work))
        env = {**os.environ, "CMAKE_ARGS": cmake_args(flags, variants)}
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "--no-deps",
                        "--no-cache-dir", "-w", str(partial), str(tree)], env=env, check=True, stdout=sys.stderr)
    (partial / ".complete").touch()
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("build", "folder", "sdist"))
    parser.add_argument("--variants", default="local", help="local, all, or CPU variant names separated by commas")
    parser.add_argument("--cmake-args", default=IMAGE_CMAKE_ARGS,
                        help="llama.cpp's CMake flags (default: the image's release layout)")
    args = parser.parse_args(argv)
    if args.command == "sdist":
        print(sdist())
        return 0
    variants = resolve_variants(args.variants)
    print(build(args.cmake_args, variants) if args.command == "build" else folder(args.cmake_args, variants))
    return 0


if __name__ == "__main__":
    sys.exit(main())
