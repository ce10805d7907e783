"""The cross-request cache: saved sequences (head and state) and whole answers, least recently used first out.

Pure Python, no llama.cpp: values are saved sequences (``ctypes`` arrays filled by ``llama_state_seq_get_data``,
restored from as they are, without a copy) or readouts, each counted at the bytes it really holds. Keys are
SHA-256 digests of exact token ids, so a hit means the very same tokens (and, for answers, the same labels).
Bounded by bytes (``ADAPTER_STATE_CACHE_MB``), each entry counted with what keeping it costs (its key, its
bookkeeping); an entry larger than the whole budget is not kept. An entry a running job holds (``acquire`` ..
``release``) is not evicted, so the memory it takes stays counted; met on the way while making room, it counts
as just used. A put evicts from the least recently used end, each eviction O(1).

A saved state also serves as a prefix of itself: it is put with the digests of its leading tokens at each of its
micro-batch boundaries (``boundary_keys``), and a state that shares such a prefix restores it (``acquire_prefix``)
and decodes only the rest. Where the model's memory has a part no cut brings back (a sliding window, a recurrent
state), the saved state is a ``SavedState``: the sequence and its checkpoints at the boundaries it keeps, each
counted in its entry, and it serves only those boundaries. The prefix index maps each boundary digest to the saved
states that hold it, and a lookup takes the smallest of them (a short prefix does not restore a long state where a
shorter one has it); what it costs is counted in its state's entry (``prefix_cost``) and leaves with it. A lookup is
one digest per boundary of the request's own state, whatever the cache holds.

A state that grows (an agent's transcript) keeps one entry: a state saved after restoring a prefix of another at
one of that one's last two prefixes *supersedes* it (``put``'s ``grown_from``): the state it grew from is dropped,
so a transcript's steps do not pile up one saved state each and evict everyone else's. A state that branched
further back (restored an earlier prefix) leaves it.
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


def answer_key(prompt: Sequence[int], labels: Sequence[Sequence[int]], state_end: int, stem_end: int) -> bytes:
    """Where a prompt's answer is cached: its tokens, its labels and its layout (where its state and its stem end):
    the same tokens laid out otherwise are another answer, never served for this one."""
    return tokens_key("answer", prompt, labels, [(state_end, stem_end)])


def boundary_keys(tokens: Sequence[int], start: int, last: int, step: int) -> tuple[tuple[int, bytes], ...]:
    """Each micro-batch boundary ``end`` of a decode of ``tokens`` from ``start`` in micro-batches of ``step``
    (``start + step``, ``start + 2 * step``, ... up to ``last``), with the digest of ``tokens[:end]``: one running
    SHA-256, copied at each boundary, so linear in the tokens."""
    digest = hashlib.sha256(b"prefix\0")
    digest.update(_token_bytes(tokens[:start]))
    found = []
    for end in range(start + step, last + 1, step):
        digest.update(_token_bytes(tokens[end - step:end]))
        found.append((end, digest.digest()))
    return tuple(found)


def _token_bytes(tokens: Sequence[int]) -> bytes:
    packed = array.array("i", tokens)  # C int: 4 bytes wherever llama.cpp runs
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


# What CPython's OrderedDict takes per item beyond the key and the value: a dict slot and its node (85 to 105
# bytes measured with tracemalloc on CPython 3.11, with the table's growth).
ORDERED_DICT_ITEM = 96


@dataclass(frozen=True)
class SavedState:
    """A saved state on a memory that needs checkpoints: the sequence (head and state) and the checkpoints it keeps,
    by the digest of the boundary each was taken at."""

    blob: Any  # the saved sequence (a ctypes array)
    checkpoints: dict[bytes, Any]  # boundary digest -> the checkpoint there

    @property
    def checkpoint_bytes(self) -> int:
        return sum(ctypes.sizeof(c) for c in self.checkpoints.values())


def size_of(value: Any) -> int:
    """The bytes ``value`` holds: a buffer's length (and its object), or the deep size of a readout or a
    ``SavedState`` (slots dataclasses, tuples, dicts, numbers, buffers; the shared singletons None, True and False
    cost nothing)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return sys.getsizeof(value)
    seen: set[int] = set()
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if id(item) in seen or item is None or isinstance(item, bool):
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if isinstance(item, ctypes.Array):
            total += ctypes.sizeof(item)
            continue
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
    prefix_hits: int = 0  # states restored in part: a saved state's prefix
    superseded: int = 0  # saved states dropped for the state that grew from them
    checkpoints: int = 0  # checkpoints the saved states hold now
    checkpoint_bytes: int = 0  # their bytes (counted in the budget with their states)


@dataclass(slots=True)
class _Entry:
    value: Any
    size: int  # what keeping it costs: the value, its key, its prefixes and the bookkeeping
    pins: int = 0
    prefixes: tuple[bytes, ...] = ()  # the digests of its micro-batch boundaries (a saved state's)


def entry_cost(key: bytes, size: int) -> int:
    """Bytes an entry of ``size`` bytes of value costs the cache: the value, its key, its ``_Entry`` (with the
    number it holds) and its slot."""
    return size + sys.getsizeof(key) + _ENTRY_BYTES + sys.getsizeof(size) + ORDERED_DICT_ITEM


_ENTRY_BYTES = sys.getsizeof(_Entry(None, 0))


def prefix_cost(prefixes: Sequence[bytes]) -> int:
    """Bytes the prefix index takes for a state saved with these boundary digests: each digest, its slot in the
    index and the set of states holding it (counted whole for each state, as if none shared it), and the tuple
    the entry keeps them in."""
    if not prefixes:
        return 0
    return sys.getsizeof(tuple(prefixes)) + len(prefixes) * (
        sys.getsizeof(prefixes[0]) + ORDERED_DICT_ITEM + _HOLDERS_BYTES)


_HOLDERS_BYTES = sys.getsizeof({b"": None})


class PrefixCache:
    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._prefixes: dict[bytes, dict[bytes, None]] = {}  # boundary digest -> the saved states holding it
        self._bytes = 0
        self._lock = threading.Lock()
        self.stats = CacheStats()

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def prefixes(self) -> int:
        """Boundary digests the prefix index holds."""
        return len(self._prefixes)

    @property
    def holder_count(self) -> int:
        """Saved states that serve as prefixes."""
        with self._lock:
            return len({key for holders in self._prefixes.values() for key in holders})

    def __contains__(self, key: bytes) -> bool:
        """An entry's key, or a boundary digest some saved state holds."""
        return key in self._entries or key in self._prefixes

    def get(self, key: bytes) -> Any | None:
        with self._lock:
            return self._find(key, pin=False)

    def peek(self, key: bytes) -> Any | None:
        """The value under ``key``, as ``get`` would give it, leaving the order and the stats as they are (a dry
        run looks, it does not use)."""
        with self._lock:
            entry = self._entries.get(key)
            return entry.value if entry is not None else None

    def acquire(self, key: bytes) -> Any | None:
        """``get``, and hold the entry until ``release``: it is not evicted while a job restores from it."""
        with self._lock:
            return self._find(key, pin=True)

    def acquire_prefix(self, digest: bytes) -> tuple[bytes, Any] | None:
        """The smallest saved state that holds the boundary ``digest`` (its key and value; of equal ones the most
        recently put), held until ``release(key)``; None when no state holds it."""
        with self._lock:
            holders = self._prefixes.get(digest)
            if not holders:
                return None
            key = min(reversed(holders), key=lambda k: self._entries[k].size)
            entry = self._entries[key]
            self._entries.move_to_end(key)
            self.stats.prefix_hits += 1
            entry.pins += 1
            return key, entry.value

    def prefixes_of(self, key: bytes) -> tuple[bytes, ...]:
        """The boundary digests the saved state under ``key`` serves (none when it is not cached)."""
        with self._lock:
            entry = self._entries.get(key)
            return entry.prefixes if entry is not None else ()

    def holders(self, boundaries: Sequence[tuple[int, bytes]]) -> list[bytes]:
        """The keys of the saved states that hold any of these boundaries (``JobSpec.boundaries``)."""
        with self._lock:
            return list({key: None for _, digest in boundaries for key in self._prefixes.get(digest, ())})

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

    def put(self, key: bytes, value: Any, size: int | None = None, prefixes: Sequence[bytes] = (),
            grown_from: tuple[bytes, bytes] | None = None) -> bool:
        """Keep ``value`` (a saved state with the digests of its micro-batch boundaries, ``prefixes``: it serves
        as each of those prefixes too); evicts the least recently used entries nobody holds to make room. False if
        it cannot fit. ``grown_from``: the saved state this one restored a prefix of and the digest of that prefix;
        where it is one of that state's last two prefixes, this one takes its place (the module's text)."""
        prefixes = tuple(prefixes)
        size = entry_cost(key, size if size is not None else size_of(value)) + prefix_cost(prefixes)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._forget(key, old)
            if grown_from is not None and grown_from[0] != key \
                    and (grown := self._entries.get(grown_from[0])) is not None \
                    and grown_from[1] in grown.prefixes[-2:]:
                del self._entries[grown_from[0]]
                self._forget(grown_from[0], grown)
                self.stats.superseded += 1
            if size > self.budget_bytes:
                return False
            self._make_room(size)
            if self._bytes + size > self.budget_bytes:
                return False  # what is left is held by the running job
            self._entries[key] = _Entry(value, size, old.pins if old is not None else 0, prefixes)
            self._bytes += size
            if isinstance(value, SavedState):
                self.stats.checkpoints += len(value.checkpoints)
                self.stats.checkpoint_bytes += value.checkpoint_bytes
            for digest in prefixes:
                self._prefixes.setdefault(digest, {})[key] = None
            return True

    def fits(self, value: Any, key: bytes, prefixes: Sequence[bytes] = ()) -> bool:
        """Whether ``value`` under ``key`` with these prefixes could be kept at all: its cost within the budget."""
        return entry_cost(key, size_of(value)) + prefix_cost(tuple(prefixes)) <= self.budget_bytes

    def _forget(self, key: bytes, entry: _Entry) -> None:
        """Account for an entry taken out of ``_entries``: its bytes, its prefixes and its checkpoints."""
        self._bytes -= entry.size
        if isinstance(entry.value, SavedState):
            self.stats.checkpoints -= len(entry.value.checkpoints)
            self.stats.checkpoint_bytes -= entry.value.checkpoint_bytes
        for digest in entry.prefixes:
            holders = self._prefixes.get(digest)
            if holders is not None:
                holders.pop(key, None)
                if not holders:
                    del self._prefixes[digest]

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
            self._forget(key, entry)
            self.stats.evictions += 1

    def discard(self, key: bytes) -> None:
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._forget(key, entry)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._prefixes.clear()
            self._bytes = 0
            self.stats.checkpoints = self.stats.checkpoint_bytes = 0
