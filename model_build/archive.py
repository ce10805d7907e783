"""`model.tar.gz`: the GGUF, `model-manifest.json` and, when the pin has one, `calibration.json` at the root
of a gzip tar, never overwriting a file.

SageMaker unpacks the archive into /opt/ml/model, so the root of the archive is what the adapter sees.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from model_build.calibration import ARCHIVE_NAME as CALIBRATION_NAME
from model_build.digests import HashingWriter
from model_build.errors import BuildError, ExitCode
from model_build.manifest import MANIFEST_NAME
from model_build.progress import Progress

# Quantized weights hardly compress (about 6% for Q4 files) while higher levels cost CPU time on every
# build; level 1 keeps most of the small gain at the lowest cost.
GZIP_LEVEL = 1


@dataclass(frozen=True)
class Archive:
    path: Path
    sha256: str
    size_bytes: int


def refuse_existing(path: Path) -> None:
    if path.exists():
        raise BuildError(f"{path} already exists; archives are never overwritten "
                         "(delete it or choose another --output)", ExitCode.OUTPUT_EXISTS)


def write_archive(destination: Path, gguf_path: Path, gguf_name: str, manifest: bytes,
                  built_at: datetime, calibration: bytes | None = None) -> Archive:
    """Write the archive to `destination`, hashing it on the way; fail if `destination` exists.

    `calibration` is the content of calibration.json, or None for an archive without one.
    """
    refuse_existing(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    mtime = int(built_at.timestamp())
    gguf_size = gguf_path.stat().st_size
    # Written under a temporary name so that a crash never leaves a truncated archive at the final name.
    partial = destination.with_name(f".{destination.name}.{os.getpid()}.partial")
    try:
        with partial.open("xb") as raw_file:
            hashing = HashingWriter(raw_file)
            with gzip.GzipFile(filename="", mode="wb", compresslevel=GZIP_LEVEL, fileobj=hashing,
                               mtime=mtime) as compressed, \
                    tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as tar:
                # The small files go first, so that a reader of the stream finds them without reading the GGUF.
                tar.addfile(_regular_file(MANIFEST_NAME, len(manifest), mtime), io.BytesIO(manifest))
                if calibration is not None:
                    tar.addfile(_regular_file(CALIBRATION_NAME, len(calibration), mtime), io.BytesIO(calibration))
                with gguf_path.open("rb") as gguf, \
                        Progress(f"archiving {gguf_name}", gguf_size) as progress:
                    tar.addfile(_regular_file(gguf_name, gguf_size, mtime), _CountingReader(gguf, progress))
        try:
            # A hard link, unlike a rename, fails instead of replacing a file that appeared meanwhile.
            os.link(partial, destination)
        except FileExistsError:
            refuse_existing(destination)
            raise
    finally:
        partial.unlink(missing_ok=True)
    return Archive(destination, hashing.hexdigest(), hashing.bytes_written)


def _regular_file(name: str, size: int, mtime: int) -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.size = size
    member.mtime = mtime
    member.mode = 0o644
    return member


class _CountingReader:
    """A read-only file wrapper that reports each read to a progress counter."""

    def __init__(self, source: io.BufferedReader, progress: Progress):
        self._source = source
        self._progress = progress

    def read(self, size: int = -1) -> bytes:
        block = self._source.read(size)
        self._progress.advance(len(block))
        return block
