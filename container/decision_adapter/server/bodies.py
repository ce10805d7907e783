"""Request bodies before any protocol reads them: bytes within the limit, decoded, bounded in depth, parsed.

- ``read_body``: at most the byte limit, sent or decoded (413 above); ``Content-Encoding`` zstd (every
  frame) and gzip (every member) are decoded whole, or refused: never truncated.
- ``check_depth``: arrays and objects nested deeper than ``MAX_DEPTH``, or more than ``MAX_CONTAINERS`` of
  them, are refused from the bytes, with no recursion, before ``json`` would build them (``structure``: one pass
  in numpy).
- ``parse_json``: strict UTF-8 JSON, no ``NaN``/``Infinity``; ``parse_invocation``: one JSON value, or a
  JSON-lines body, or an ``application/json`` body holding several objects one per line (Batch Transform's
  SplitType=Line), as numbered records (``split_records``: counted against the line cap before any is read, then
  read one at a time; the blank lines that end a body are none), each body parsed once.
- ``dumps``: every response body, as JSON that any parser reads (no NaN or infinity, valid UTF-8).

Every step is linear in the body and none holds the GIL for long: decompression works in pieces (zlib and
zstd release the GIL inside), the depth pass in numpy over pieces of ``DEPTH_PIECE`` bytes, the scans for lines
and white space over pieces of ``LINE_PIECE`` bytes, UTF-8 decoding and ``json``'s scanner are linear C (``int``
refuses numbers of more than 4,300 digits before converting them), so ``/ping`` and the scheduler keep running
while a 6 MiB body is read. Splitting a body into lines keeps nothing per line: its peak is the body's text beside
one piece's working set, however many lines it has.
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator

import numpy as np
import zstandard

from ..errors import ApiError, InputError

MAX_DEPTH = 64
# Arrays and objects one body may hold. Each costs ~80 bytes as a Python object for its 2 bytes of JSON (40x: a
# 6 MiB body of them would take 240 MB); the largest valid request holds ~17,000 outside its states (64
# decisions of 255 options) and a state that fits a prompt a few thousand.
MAX_CONTAINERS = 1_000_000
ZSTD_PIECE = 64  # compressed bytes per step: at most a few MB of output each
GZIP_PIECE = 64 * 1024  # compressed bytes per step; the output of each is capped at what the limit leaves
# Frames (zstd) or members (gzip) one body may hold: clients send one; thousands of empty ones cost time only.
MAX_FRAMES = 64

DEPTH_PIECE = 256 * 1024  # bytes per step of the depth pass: the GIL can change hands between steps
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_WHITESPACE = re.compile(r"[ \t\n\r]*")


def read_body(stream: BinaryIO, content_length: int | None, encoding: str | None, limit: int) -> bytes:
    """The body, decoded per ``Content-Encoding``; over ``limit`` bytes, sent or decoded, is a 413."""
    if content_length is not None and content_length > limit:
        raise ApiError(413, f"the body has {content_length} bytes, over the limit of {limit}")
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise ApiError(413, f"the body is over the limit of {limit} bytes")
    encoding = (encoding or "identity").strip().lower()
    if encoding == "identity":
        return data
    if encoding == "zstd":
        decoded = _unzstd(data, limit)
    elif encoding in ("gzip", "x-gzip"):
        decoded = _gunzip(data, limit)
    else:
        raise ApiError(415, f"Content-Encoding {encoding!r} is not supported (use zstd, gzip or identity)")
    if len(decoded) > limit:
        raise ApiError(413, f"the decoded body is over the limit of {limit} bytes")
    return decoded


def _unzstd(data: bytes, limit: int) -> bytes:
    """Every frame of a zstd body, in order; a frame cut short is refused. The input goes in small pieces read
    at offsets (no copy of the rest per frame: linear in the body), so that a small body that expands hugely
    stops at the limit instead of filling memory; more than ``MAX_FRAMES`` frames are refused."""
    out = bytearray()
    view = memoryview(data)
    pos = frames = 0
    try:
        while pos < len(view):
            frames += 1
            if frames > MAX_FRAMES:
                raise ApiError(400, f"the body has more than {MAX_FRAMES} zstd frames")
            frame = zstandard.ZstdDecompressor().decompressobj()
            fed = pos
            while fed < len(view) and not frame.eof:
                out += frame.decompress(view[fed:fed + ZSTD_PIECE])
                fed = min(fed + ZSTD_PIECE, len(view))
                if len(out) > limit:
                    raise ApiError(413, f"the decoded body is over the limit of {limit} bytes")
            if not frame.eof:
                raise ApiError(400, "the body is not valid zstd data: it ends inside a frame (truncated)")
            pos = fed - len(frame.unused_data)
    except zstandard.ZstdError as exc:
        raise ApiError(400, f"the body is not valid zstd data: {exc}") from None
    return bytes(out)


def _gunzip(data: bytes, limit: int) -> bytes:
    """Every member of a gzip body, in order; a member cut short is refused. Read at offsets in pieces (linear
    in the body); more than ``MAX_FRAMES`` members are refused."""
    out = bytearray()
    view = memoryview(data)
    pos = members = 0
    try:
        while pos < len(view):
            members += 1
            if members > MAX_FRAMES:
                raise ApiError(400, f"the body has more than {MAX_FRAMES} gzip members")
            member = zlib.decompressobj(16 + zlib.MAX_WBITS)
            fed = pos
            while fed < len(view) and not member.eof:
                out += member.decompress(view[fed:fed + GZIP_PIECE], limit + 1 - len(out))
                fed = min(fed + GZIP_PIECE, len(view))
                if len(out) > limit or member.unconsumed_tail:
                    raise ApiError(413, f"the decoded body is over the limit of {limit} bytes")
            if not member.eof:
                raise ApiError(400, "the body is not valid gzip data: it ends inside a member (truncated)")
            pos = fed - len(member.unused_data)
    except zlib.error as exc:
        raise ApiError(400, f"the body is not valid gzip data: {exc}") from None
    return bytes(out)


def check_depth(data: bytes, limit: int = MAX_DEPTH, most: int = MAX_CONTAINERS) -> None:
    """Refuse JSON that nests arrays and objects deeper than ``limit``, or holds more than ``most`` of them,
    without parsing or recursing."""
    if data.count(b"[") + data.count(b"{") <= limit:
        return
    depth, containers = structure(data)
    if depth > limit:
        raise InputError((), f"the body nests arrays and objects {depth} levels deep, over the limit of {limit}",
                         "json_too_deep")
    if containers > most:
        raise InputError((), f"the body holds {containers} arrays and objects, over the limit of {most}",
                         "json_too_many_containers")


def structure(data: bytes) -> tuple[int, int]:
    """The deepest nesting of arrays and objects in ``data`` and how many it opens, brackets inside strings not
    counted: one pass over pieces of ``DEPTH_PIECE`` bytes in numpy (linear; the state between pieces is the
    nesting so far, whether a string is open and the backslashes just before). A quote closes or opens a string
    unless an odd run of backslashes precedes it. On valid JSON these are exact; on invalid JSON they are at least
    those of the part a parser reads before it fails, so a body they pass never makes ``json`` recurse deeper, or
    build more, than the limits."""
    view = np.frombuffer(data, np.uint8)
    depth = deepest = containers = 0
    in_string = False
    backslashes = 0  # the run of backslashes that ends the pieces read so far
    for start in range(0, len(view), DEPTH_PIECE):
        piece = view[start:start + DEPTH_PIECE]
        quotes = np.flatnonzero(piece == _QUOTE)
        slash = piece == _BACKSLASH
        if quotes.size and (backslashes or slash.any()):
            quotes = quotes[_unescaped(quotes, slash, backslashes)]
        opening = (piece == 0x5B) | (piece == 0x7B)  # [ {
        brackets = np.flatnonzero(opening | (piece == 0x5D) | (piece == 0x7D))  # ] }
        if brackets.size:
            # A bracket is outside strings where an even number of quotes precede it in the piece (odd when the
            # piece starts inside a string).
            outside = brackets[(np.searchsorted(quotes, brackets) + in_string) % 2 == 0]
            if outside.size:
                opens = opening[outside]
                containers += int(np.count_nonzero(opens))
                levels = np.cumsum(np.where(opens, 1, -1)) + depth
                deepest = max(deepest, int(levels.max()))
                depth = int(levels[-1])
        in_string ^= bool(quotes.size % 2)
        backslashes = _trailing_run(slash, backslashes)
    return deepest, containers


def _unescaped(quotes: np.ndarray, slash: np.ndarray, carried: int) -> np.ndarray:
    """Which of the quotes at ``quotes`` are not escaped: the run of backslashes just before each is even
    (``carried``: the run that ended the previous piece, for quotes it reaches back into)."""
    positions = np.arange(slash.size, dtype=np.int64)
    last_other = np.maximum.accumulate(np.where(slash, -1, positions))  # the last non-backslash at or before i
    before = quotes - 1
    reach = last_other[np.maximum(before, 0)]
    run = np.where(before >= 0, before - reach, 0) + np.where((before < 0) | (reach < 0), carried, 0)
    return run % 2 == 0


def _trailing_run(slash: np.ndarray, carried: int) -> int:
    """The run of backslashes that ends this piece (continuing ``carried`` when the piece is all backslashes)."""
    others = np.flatnonzero(~slash)
    return carried + slash.size if not others.size else slash.size - 1 - int(others[-1])


def _text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError((), f"the body is not valid JSON: it is not UTF-8 ({exc.reason} at byte {exc.start})",
                         "json_invalid") from None


def parse_json(data: bytes) -> Any:
    """One JSON value: depth-bounded, strict UTF-8, no NaN or Infinity."""
    check_depth(data)
    return _loads(_text(data))


def _loads(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise InputError((), f"the body is not valid JSON: {exc}", "json_invalid") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


@dataclass(frozen=True)
class Records:
    """The records of a body of lines, numbered from 1: ``for number, line in records`` reads them one at a time,
    each line a copy of its bytes made as it is read (its ``\\r`` ending dropped), so that splitting a body builds
    nothing per line and holds at most one line beside the body. Lines end at ``\\n``; the blank lines that end
    the body are no records (white space after the last record, as after a JSON value), a blank line between
    records is one (an empty record: its error line keeps the answer one line per line sent)."""

    data: bytes
    count: int
    end: int  # where the last record ends

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        data, end, pos = self.data, self.end, 0
        for number in range(1, self.count + 1):
            stop = data.find(b"\n", pos, end)
            if stop < 0:
                stop = end
            yield number, data[pos:stop].rstrip(b"\r")
            pos = stop + 1


@dataclass(frozen=True)
class Invocation:
    """A parsed ``/invocations`` body: one JSON value, or numbered records (one per line)."""

    value: Any = None
    records: Records | None = None


_STRICT = json.JSONDecoder(parse_constant=_reject_constant)
LINE_PIECE = 256 * 1024  # bytes per step of a scan for lines or white space: the GIL can change hands between steps


def parse_invocation(data: bytes, *, lines: bool, max_lines: int) -> Invocation:
    """A body of records (``lines``: JSON lines), or an ``application/json`` body: one JSON value (which may span
    lines), or several values one per line (Batch Transform's SplitType=Line with BatchStrategy=MultiRecord): its
    first value is followed by more on another line, or (a malformed first record) it is no single value and one
    of its other lines is a request object on its own (``_malformed``). The body is parsed once."""
    if lines:
        return Invocation(records=split_records(data, max_lines))
    first, end = _content(data)
    if _find(data, b"\n", first, end) < 0:
        return Invocation(parse_json(data))
    check_depth(data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return _malformed(data, None, max_lines)
    start = _WHITESPACE.match(text).end()
    try:
        value, end = _STRICT.raw_decode(text, start)
    except ValueError:
        return _malformed(data, text, max_lines)
    gap = _WHITESPACE.match(text, end).end()
    if gap == len(text):
        return Invocation(value)
    if "\n" in text[end:gap]:
        return Invocation(records=split_records(data, max_lines))
    return Invocation(_loads(text))  # raises "Extra data", in the parser's words


def _malformed(data: bytes, text: str | None, max_lines: int) -> Invocation:
    """An ``application/json`` body of several lines whose first value does not parse (``text``: the body decoded,
    None where it is not UTF-8): its records if a line after the first is a request object on its own (a malformed
    first record), else refused in the parser's words. Its lines are counted first, and none is read past
    ``max_lines``: such a body could not be answered as records either, and the refusal says both."""
    end = _content(data)[1]
    count = _line_count(data, end)
    if count <= max_lines:
        records = Records(data, count, end)
        lines = iter(records)
        next(lines)
        if any(_is_request_object(line) for _, line in lines):
            return Invocation(records=records)
    try:
        _loads(_text(data) if text is None else text)
    except InputError as exc:
        if count <= max_lines:
            raise
        raise InputError((), f"{exc.msg} (as records, one a line, its {count} lines are over the limit of "
                             f"{max_lines})", exc.kind) from None
    raise AssertionError("a body whose first value does not parse parsed")  # pragma: no cover


_OBJECT_START = re.compile(rb"[ \t\r\n\x0b\x0c]*\{")


def _is_request_object(line: bytes) -> bool:
    """Whether ``line`` is a whole request object on its own (``decision``, ``decisions`` or ``questions``): what
    makes a body whose first line is malformed a body of records. A line that cannot be one is not parsed: it does
    not start with ``{``, or spells none of the keys (a key is its letters, or holds a backslash escape)."""
    if not _OBJECT_START.match(line) or not (b"decision" in line or b"questions" in line or b"\\" in line):
        return False
    try:
        check_depth(line)
        value = _STRICT.decode(line.decode("utf-8"))
    except ValueError:  # the line's own errors (InputError, UnicodeDecodeError, JSONDecodeError): not a record
        return False
    return isinstance(value, dict) and bool(value.keys() & {"decision", "decisions", "questions"})


def split_records(data: bytes, max_lines: int) -> Records:
    """The numbered lines of a JSON-lines body (``Records``), counted before any is read: over ``max_lines`` (or
    none but blank ones) the body is refused. Linear in pieces of ``LINE_PIECE`` bytes, nothing kept per line."""
    end = _content(data)[1]
    if not end:
        raise ApiError(400, "the JSON-lines body has no lines" if not data else
                       "the JSON-lines body has no lines but blank ones")
    count = _line_count(data, end)
    if count > max_lines:
        raise ApiError(400, f"the JSON-lines body has {count} lines, over the limit of {max_lines}")
    return Records(data, count, end)


def _line_count(data: bytes, end: int) -> int:
    """The lines of ``data[:end]`` (``end`` > 0): its newlines and one, counted in pieces of ``LINE_PIECE`` bytes."""
    return 1 + sum(data.count(b"\n", at, min(at + LINE_PIECE, end)) for at in range(0, end, LINE_PIECE))


def _content(data: bytes) -> tuple[int, int]:
    """Where the body's first byte other than ASCII white space is, and where its last ends (for a body of
    white space: (0, 0)), read in pieces from each end."""
    end = len(data)
    while end:
        at = max(0, end - LINE_PIECE)
        kept = len(data[at:end].rstrip())
        if kept:
            end = at + kept
            break
        end = at
    first = 0
    while first < end:
        piece = data[first:min(first + LINE_PIECE, end)]
        skipped = len(piece) - len(piece.lstrip())
        first += skipped
        if skipped < len(piece):
            break
    return min(first, end), end


def _find(data: bytes, what: bytes, start: int, end: int) -> int:
    """``data.find(what, start, end)`` for a one-byte ``what``, in pieces of ``LINE_PIECE`` bytes."""
    for at in range(start, end, LINE_PIECE):
        found = data.find(what, at, min(at + LINE_PIECE, end))
        if found >= 0:
            return found
    return -1


def dumps(payload: Any) -> str:
    """A response body: strict JSON (``allow_nan=False``), with any stray surrogate escaped."""
    return json.dumps(payload, ensure_ascii=False, allow_nan=False).encode("utf-8", "backslashreplace").decode()
