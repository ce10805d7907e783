"""Request bodies before any protocol reads them: bytes within the limit, decoded, bounded in depth, parsed.

- ``read_body``: at most the byte limit, sent or decoded (413 above); ``Content-Encoding`` zstd (every
  frame) and gzip (every member) are decoded whole, or refused: never truncated.
- ``check_depth``: arrays and objects nested deeper than ``MAX_DEPTH`` are refused from the bytes, with
  no recursion, before ``json`` would recurse into them.
- ``parse_json``: strict UTF-8 JSON, no ``NaN``/``Infinity``; ``split_records``: a JSON-lines body, or
  an ``application/json`` body holding several objects one per line (Batch Transform's SplitType=Line),
  into numbered records.
- ``dumps``: every response body, as JSON that any parser reads (no NaN or infinity, valid UTF-8).
"""

from __future__ import annotations

import json
import re
import zlib
from itertools import accumulate
from typing import Any, BinaryIO

import zstandard

from ..errors import ApiError, InputError

MAX_DEPTH = 64
ZSTD_PIECE = 64  # compressed bytes per step: at most a few MB of output each
GZIP_PIECE = 64 * 1024  # compressed bytes per step; the output of each is capped at what the limit leaves
# Frames (zstd) or members (gzip) one body may hold: clients send one; thousands of empty ones cost time only.
MAX_FRAMES = 64

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
_DECODER = json.JSONDecoder()


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


def check_depth(data: bytes, limit: int = MAX_DEPTH) -> None:
    """Refuse JSON that nests arrays and objects deeper than ``limit``, without parsing or recursing."""
    if data.count(b"[") + data.count(b"{") <= limit:
        return
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    depth = max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)
    if depth > limit:
        raise InputError((), f"the body nests arrays and objects {depth} levels deep, over the limit of {limit}",
                         "json_too_deep")


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


def holds_lines(data: bytes) -> bool:
    """Whether an ``application/json`` body holds several JSON values, one per line (Batch Transform's
    SplitType=Line with BatchStrategy=MultiRecord), rather than one value (which may span lines): its first
    value is followed by more on another line, or (a malformed first record) it is no single value and one of its
    other lines is a request object on its own."""
    text = data.decode("utf-8", errors="replace").lstrip()
    if not text or "\n" not in text:
        return False
    try:
        check_depth(data)
        _, end = _DECODER.raw_decode(text)
    except InputError:
        return False
    except ValueError:
        return any(_is_record(line) for line in text.split("\n")[1:])
    rest = text[end:]
    gap = rest[:len(rest) - len(rest.lstrip())]
    return bool(rest.strip()) and "\n" in gap


def _is_record(line: str) -> bool:
    """A whole request object on one line (``decision``, ``decisions`` or ``questions``)."""
    line = line.strip()
    if not line.startswith("{"):
        return False
    try:
        check_depth(line.encode("utf-8"))
        value = json.loads(line)
    except (ValueError, InputError):
        return False
    return isinstance(value, dict) and bool(value.keys() & {"decision", "decisions", "questions"})


def split_records(data: bytes, max_lines: int) -> list[tuple[int, bytes]]:
    """Numbered lines of a JSON-lines body (a last empty line ends the body, it is no record)."""
    lines = data.split(b"\n")
    if lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise ApiError(400, "the JSON-lines body has no lines")
    if len(lines) > max_lines:
        raise ApiError(400, f"the JSON-lines body has {len(lines)} lines, over the limit of {max_lines}")
    return [(number, line.rstrip(b"\r")) for number, line in enumerate(lines, start=1)]


def dumps(payload: Any) -> str:
    """A response body: strict JSON (``allow_nan=False``), with any stray surrogate escaped."""
    return json.dumps(payload, ensure_ascii=False, allow_nan=False).encode("utf-8", "backslashreplace").decode()
