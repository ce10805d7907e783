"""Download of a pinned GGUF: streamed to a `.part` file, resumed with HTTP Range, verified against the pin.

Inside the downloads folder a file is `<pin sha256>.gguf.part` while incomplete and `<pin sha256>.gguf` once
its size and sha256 match the pin. Naming both by the hash the pin expects means a partial file is only ever
resumed towards the same bytes, and a verified file is reused by later runs (after hashing it again).

A response that ends before its declared Content-Length is an interruption: the `.part` file is kept and the
download resumes from its end, within this run (`attempts`) or the next. A response that ends cleanly, or
declares a size, is taken as the server's whole file and checked against the pin.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests
import urllib3

from model_build import __version__
from model_build.digests import sha256_file
from model_build.errors import BuildError, ExitCode
from model_build.pins import Pin
from model_build.progress import Progress

DEFAULT_ATTEMPTS = 3
_CHUNK_BYTES = 1 << 20
_TIMEOUT_S = (30, 120)  # (connect, between two reads)
_RETRIED_STATUSES = (429, 500, 502, 503, 504)


class _ServerBusy(Exception):
    """A response that says "try again later" rather than "no"."""


# Reading the body from urllib3 directly raises urllib3's errors rather than requests' wrappers.
_INTERRUPTIONS = (requests.ConnectionError, requests.Timeout, urllib3.exceptions.HTTPError, _ServerBusy)
_CONTENT_RANGE = re.compile(r"bytes (?:(\d+)-\d+|\*)/(\d+)")


@dataclass(frozen=True)
class VerifiedFile:
    path: Path
    sha256: str
    size_bytes: int


def fetch(pin: Pin, url: str, downloads_dir: Path, attempts: int = DEFAULT_ATTEMPTS) -> VerifiedFile:
    """Return the pinned file from `downloads_dir`, downloading or resuming it first when needed."""
    downloads_dir.mkdir(parents=True, exist_ok=True)
    verified_path = downloads_dir / f"{pin.sha256}.gguf"
    part_path = downloads_dir / f"{pin.sha256}.gguf.part"

    if verified_path.exists():
        _log(f"found {verified_path} from an earlier run; checking it again")
        if verified_path.stat().st_size == pin.size_bytes and sha256_file(verified_path) == pin.sha256:
            return VerifiedFile(verified_path, pin.sha256, pin.size_bytes)
        _log(f"{verified_path} no longer matches pin {pin.name!r}; downloading again")
        verified_path.unlink()

    session = requests.Session()
    session.headers["User-Agent"] = f"model-build/{__version__}"
    for attempt in range(1, attempts + 1):
        try:
            _download_into(part_path, url, pin, session)
            break
        except _INTERRUPTIONS as error:
            have = _size(part_path)
            if attempt == attempts:
                raise BuildError(
                    f"download of {url} stopped at byte {have:,} of {pin.size_bytes:,} "
                    f"after {attempts} attempt(s): {_describe(error)}\n"
                    f"rerun the same command to resume from {part_path}",
                    ExitCode.TRANSFER_FAILED,
                ) from None
            _log(f"download stopped at byte {have:,} ({_describe(error)}); "
                 f"resuming, attempt {attempt + 1} of {attempts}")
            time.sleep(attempt)

    _verify(part_path, pin, url)
    part_path.replace(verified_path)
    return VerifiedFile(verified_path, pin.sha256, pin.size_bytes)


def _download_into(part_path: Path, url: str, pin: Pin, session: requests.Session) -> None:
    have = _size(part_path)
    if have > pin.size_bytes:
        _log(f"{part_path} is larger than pin {pin.name!r} allows; starting over")
        part_path.unlink()
        have = 0
    if have == pin.size_bytes:
        return  # completed by an earlier run that stopped before verifying

    # Range counts the bytes of the file as stored, so no transfer compression may be applied.
    headers = {"Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
        _log(f"resuming {part_path.name} from byte {have:,}")
    _log(f"downloading {url}")
    with session.get(url, headers=headers, stream=True, timeout=_TIMEOUT_S) as response:
        if response.status_code == 206 and have:
            first_byte, server_total = _parse_content_range(response, url)
            if first_byte != have:
                raise BuildError(f"GET {url}: asked for bytes from {have:,}, the server sent bytes from "
                                 f"{first_byte:,}", ExitCode.TRANSFER_FAILED)
            mode = "ab"
        elif response.status_code == 200:
            if have:
                _log("the server ignored the Range request; downloading from the start")
            have, mode = 0, "wb"
            declared = response.headers.get("Content-Length")
            server_total = int(declared) if declared and declared.isdigit() else None
        elif response.status_code == 416 and have:
            # Nothing exists after our last byte: the server's file is shorter than the pin says.
            _, server_total = _parse_content_range(response, url)
            if server_total == pin.size_bytes:
                raise BuildError(f"GET {url}: the server refused bytes {have:,}- of a {server_total:,}-byte "
                                 "file", ExitCode.TRANSFER_FAILED)
        elif response.status_code in _RETRIED_STATUSES:
            raise _ServerBusy(f"HTTP {response.status_code} {response.reason}")
        else:
            raise BuildError(f"GET {url}: HTTP {response.status_code} {response.reason}",
                             ExitCode.TRANSFER_FAILED)

        if server_total is not None and server_total != pin.size_bytes:
            part_path.unlink(missing_ok=True)
            raise BuildError(
                f"size mismatch for pin {pin.name!r}: the server reports {server_total:,} bytes, "
                f"the pin expects {pin.size_bytes:,}\n  from {url}\n"
                "the download was discarded and nothing was uploaded",
                ExitCode.VERIFICATION_FAILED,
            )

        with part_path.open(mode) as out, \
                Progress(f"downloading {pin.gguf_name}", pin.size_bytes, already_done=have) as progress:
            # read1 hands over bytes as they arrive, so an interruption loses none of them (iter_content
            # buffers up to a whole chunk and drops it when the connection breaks).
            while chunk := response.raw.read1(_CHUNK_BYTES, decode_content=False):
                out.write(chunk)
                have += len(chunk)
                progress.advance(len(chunk))
                if have > pin.size_bytes:
                    break  # more than pinned already; _verify reports it without filling the disk


def _verify(part_path: Path, pin: Pin, url: str) -> None:
    size = part_path.stat().st_size
    _log(f"checking sha256 of {size:,} bytes")
    sha256 = sha256_file(part_path)
    if size == pin.size_bytes and sha256 == pin.sha256:
        return
    part_path.unlink()
    what = "size" if size != pin.size_bytes else "sha256"
    raise BuildError(
        f"{what} mismatch for pin {pin.name!r}:\n"
        f"  the pin expects {pin.size_bytes:,} bytes with sha256 {pin.sha256}\n"
        f"  the download has {size:,} bytes with sha256 {sha256}\n"
        f"  from {url}\n"
        "the download was discarded and nothing was uploaded",
        ExitCode.VERIFICATION_FAILED,
    )


def _parse_content_range(response: requests.Response, url: str) -> tuple[int, int]:
    match = _CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", "").strip())
    if match is None:
        raise BuildError(f"GET {url}: HTTP {response.status_code} without a usable Content-Range header",
                         ExitCode.TRANSFER_FAILED)
    first_byte, total = match.groups()
    return int(first_byte or 0), int(total)


def _describe(error: Exception) -> str:
    # urllib3 errors carry (message, cause) tuples; the message alone reads better.
    first = error.args[0] if error.args else None
    return first if isinstance(first, str) else str(error)


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
