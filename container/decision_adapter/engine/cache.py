"""The cross-request cache: saved sequences (head and state) and whole answers, least recently used first out.

Pure Python, no llama.cpp: values are saved sequences (``ctypes`` arrays filled by ``llama_state_seq_get_data``,
restored from as they are, without a copy) or readouts, each counted at the bytes it really holds. Keys are
SHA-256 digests of exact token ids, so a hit means the very same tokens (and, for answers, the same labels).
Bounded by bytes (``ADAPTER_STATE_CACHE_MB``), each entry counted with what keeping it costs (its key, its
bookkeeping); an entry larger than the whole budget is not kept. An entry a running job holds (``acquire`` ..
``release``) is not evicted, so the memory it takes stays counted; met on the way while making room, it counts
as just used. A put evicts from the least recently used end, each eviction O(1).
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


# What CPython's OrderedDict takes per item beyond the key and the value: a dict slot and its node (85 to 105
# bytes measured with tracemalloc on CPython 3.11, with the table's growth).
ORDERED_DICT_ITEM = 96


def size_of(value: Any) -> int:
    """The bytes ``value`` holds: a buffer's length (and its object), or the deep size of a readout (slots
    dataclasses, tuples, numbers; the shared singletons None, True and False cost nothing)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return sys.getsizeof(value)
    if isinstance(value, ctypes.Array):
        return ctypes.sizeof(value) + sys.getsizeof(value)
    seen: set[int] = set()
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if id(item) in seen or item is None or isinstance(item, bool):
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


@dataclass(slots=True)
class _Entry:
    value: Any
    size: int  # what keeping it costs: the value, its key and the bookkeeping
    pins: int = 0


def entry_cost(key: bytes, size: int) -> int:
    """Bytes an entry of ``size`` bytes of value costs the cache: the value, its key, its ``_Entry`` (with the
    number it holds) and its slot."""
    return size + sys.getsizeof(key) + _ENTRY_BYTES + sys.getsizeof(size) + ORDERED_DICT_ITEM


_ENTRY_BYTES = sys.getsizeof(_Entry(None, 0))


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
        size = entry_cost(key, size if size is not None else size_of(value))
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.size
            if size > self.budget_bytes:
                return False
            self._make_room(size)
            if self._bytes + size > self.budget_bytes:
                return False  # what is left is held by the running job
            self._entries[key] = _Entry(value, size, old.pins if old is not None else 0)
            self._bytes += size
            return True

    def _make_room(self, size: int) -> None:
        """Evict from the least recently used end until ``size`` more bytes fit: O(1) an eviction. An entry a
        job holds is moved to the recent end instead (it is in use), each at most once a put, so the loop ends
        when only held entries are left."""
        held_seen = 0
        while self._bytes + size > self.budget_bytes and held_seen < len(self._entries):
            key, entry = next(iter(self._entries.items()))
            if entry.pins:
                self._entries.move_to_end(key)
                held_seen += 1
                continue
            del self._entries[key]
            self._bytes -= entry.size
            self.stats.evictions += 1

    def discard(self, key: bytes) -> None:
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._bytes -= entry.size

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
