"""The cross-request cache: saved sequences (head and state) and whole answers, least recently used first out.

Pure Python, no llama.cpp: values are saved sequences (``ctypes`` arrays filled by ``llama_state_seq_get_data``,
restored from as they are, without a copy) or readouts, each counted at the bytes it really holds. Keys are
SHA-256 digests of exact token ids, so a hit means the very same tokens (and, for answers, the same labels).
Bounded by bytes (``ADAPTER_STATE_CACHE_MB``); an entry larger than the whole budget is not kept. An entry a
running job holds (``acquire`` .. ``release``) is not evicted, so the memory it takes stays counted.
"""

from __future__ import annotations

import array
import ctypes
import dataclasses
import hashlib
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterable, Sequence


def tokens_key(kind: str, tokens: Sequence[int], *extra: Iterable[Sequence[int]]) -> bytes:
    """A digest of ``tokens`` (and of any further token sequences, such as the labels), tagged by kind: each token
    as 4 bytes, little-endian and signed."""
    digest = hashlib.sha256(kind.encode() + b"\0")
    digest.update(len(tokens).to_bytes(4, "little"))
    digest.update(_token_bytes(tokens))
    for group in extra:
        for seq in group:
            digest.update(b"\1" + _token_bytes(seq))
    return digest.digest()


def _token_bytes(tokens: Sequence[int]) -> bytes:
    packed = array.array("i", tokens)  # C int: 4 bytes wherever llama.cpp runs
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def size_of(value: Any) -> int:
    """The bytes ``value`` holds: a buffer's length, or the deep size of a readout (dataclasses, tuples, numbers)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    if isinstance(value, ctypes.Array):
        return ctypes.sizeof(value)
    seen: set[int] = set()
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if dataclasses.is_dataclass(item) and not isinstance(item, type):
            stack.extend(getattr(item, f.name) for f in dataclasses.fields(item))
        elif isinstance(item, (tuple, list)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
    return total


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0


@dataclass
class _Entry:
    value: Any
    size: int
    pins: int = 0


class PrefixCache:
    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
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
            return self._find(key, pin=False)

    def acquire(self, key: bytes) -> Any | None:
        """``get``, and hold the entry until ``release``: it is not evicted while a job restores from it."""
        with self._lock:
            return self._find(key, pin=True)

    def release(self, key: bytes) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.pins:
                entry.pins -= 1

    def _find(self, key: bytes, *, pin: bool) -> Any | None:
        entry = self._entries.get(key)
        if entry is None:
            self.stats.misses += 1
            return None
        self._entries.move_to_end(key)
        self.stats.hits += 1
        entry.pins += pin
        return entry.value

    def put(self, key: bytes, value: Any, size: int | None = None) -> bool:
        """Keep ``value``; evicts the least recently used entries nobody holds to make room. False if it
        cannot fit."""
        size = size if size is not None else size_of(value)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.size
            if size > self.budget_bytes:
                return False
            for victim in [k for k, e in self._entries.items() if not e.pins]:
                if self._bytes + size <= self.budget_bytes:
                    break
                self._bytes -= self._entries.pop(victim).size
                self.stats.evictions += 1
            if self._bytes + size > self.budget_bytes:
                return False  # what is left is held by the running job
            self._entries[key] = _Entry(value, size, old.pins if old is not None else 0)
            self._bytes += size
            return True

    def discard(self, key: bytes) -> None:
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._bytes -= entry.size

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
