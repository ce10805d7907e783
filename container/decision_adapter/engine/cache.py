"""The cross-request cache: saved sequences (head and state) and whole answers, least recently used first out.

Pure Python, no llama.cpp: values are bytes (a sequence serialised by ``llama_state_seq_get_data``) or
readouts, each stored with its size. Keys are SHA-256 digests of exact token ids, so a hit means the very same
tokens (and, for answers, the same labels). Bounded by bytes (``ADAPTER_STATE_CACHE_MB``); an entry larger than
the whole budget is not kept.
"""

from __future__ import annotations

import hashlib
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterable, Sequence


def tokens_key(kind: str, tokens: Sequence[int], *extra: Iterable[Sequence[int]]) -> bytes:
    """A digest of ``tokens`` (and of any further token sequences, such as the labels), tagged by kind."""
    digest = hashlib.sha256(kind.encode() + b"\0")
    digest.update(len(tokens).to_bytes(4, "little"))
    digest.update(b"".join(t.to_bytes(4, "little", signed=True) for t in tokens))
    for group in extra:
        for seq in group:
            digest.update(b"\1" + b"".join(t.to_bytes(4, "little", signed=True) for t in seq))
    return digest.digest()


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0


class PrefixCache:
    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[bytes, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.stats = CacheStats()

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: bytes) -> bool:
        return key in self._entries

    def get(self, key: bytes) -> Any | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.stats.misses += 1
                return None
            self._entries.move_to_end(key)
            self.stats.hits += 1
            return entry[0]

    def put(self, key: bytes, value: Any, size: int | None = None) -> bool:
        """Keep ``value``; evicts the least recently used entries to make room. False if it cannot fit."""
        size = size if size is not None else _size(value)
        with self._lock:
            if key in self._entries:
                self._bytes -= self._entries.pop(key)[1]
            if size > self.budget_bytes:
                return False
            while self._bytes + size > self.budget_bytes:
                _, (_, freed) = self._entries.popitem(last=False)
                self._bytes -= freed
                self.stats.evictions += 1
            self._entries[key] = (value, size)
            self._bytes += size
            return True

    def discard(self, key: bytes) -> None:
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._bytes -= entry[1]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


def _size(value: Any) -> int:
    return len(value) if isinstance(value, (bytes, bytearray)) else sys.getsizeof(value) + 64
