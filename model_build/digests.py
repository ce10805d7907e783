"""sha256 of files on disk and of bytes as they are written; every hash this tool reports comes from here."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import BinaryIO

_READ_BYTES = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while block := source.read(_READ_BYTES):
            digest.update(block)
    return digest.hexdigest()


class HashingWriter:
    """Passes writes through to a binary file and hashes them, so an archive is hashed while it is written."""

    def __init__(self, target: BinaryIO):
        self._target = target
        self._digest = hashlib.sha256()
        self.bytes_written = 0

    def write(self, data: bytes) -> int:
        self._digest.update(data)
        self.bytes_written += len(data)
        return self._target.write(data)

    def flush(self) -> None:
        self._target.flush()

    def hexdigest(self) -> str:
        return self._digest.hexdigest()
