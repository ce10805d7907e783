"""Pins: the named, checkable descriptions of the GGUF files this project may package.

A pin names one file and the size and sha256 it must have. It is either a plain HTTPS URL or a Hugging Face
(repository, revision, file) triple, and may name a calibration file fitted for that GGUF (calibration.py
checks it). Pins live in `pins.json` (configuration, not code); this module loads and validates that file
and owns the two things derived from a pin: its download URL and its archive key.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from model_build.calibration import PinnedCalibration, read_calibration
from model_build.errors import BuildError, ExitCode

SHIPPED_PINS_FILE = Path(__file__).with_name("pins.json")
HUGGING_FACE_ENDPOINT = "https://huggingface.co"
ARCHIVE_NAME = "model.tar.gz"

_PIN_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_REPOSITORY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_TOP_LEVEL_KEYS = ("default", "pins")
_PIN_KEYS = ("description", "url", "repository", "revision", "file", "sha256", "bytes", "calibration")


@dataclass(frozen=True)
class Pin:
    """One GGUF file and what it must hash to. Exactly one of `url` and `repository` is set."""

    name: str
    # For a Hugging Face pin: the path inside the repository. For a URL pin: the file name to use.
    file: str
    sha256: str
    size_bytes: int
    url: str | None = None
    repository: str | None = None
    revision: str | None = None
    description: str = ""
    # Read and checked against `sha256` when the pins file is loaded; archived as calibration.json.
    calibration: PinnedCalibration | None = None

    @property
    def source(self) -> str:
        """What the manifest reports as `source`: the repository for a Hugging Face pin, else the URL."""
        return self.repository or self.url or ""

    @property
    def gguf_name(self) -> str:
        """The name of the GGUF file at the root of the archive."""
        return PurePosixPath(self.file).name

    def download_url(self, hugging_face_endpoint: str = HUGGING_FACE_ENDPOINT) -> str:
        if self.url is not None:
            return self.url
        return (
            f"{hugging_face_endpoint.rstrip('/')}/{quote(self.repository or '', safe='/')}"
            f"/resolve/{self.revision}/{quote(self.file, safe='/')}"
        )

    def archive_key(self, prefix: str) -> str:
        """Where the archive goes: `<prefix><pin name>/<gguf sha256>/model.tar.gz`.

        The GGUF hash in the key means a changed pin can never land on an old archive's key, and the key is
        known before anything is downloaded, so an existing output is refused before the download starts.
        """
        return f"{normalize_prefix(prefix)}{self.name}/{self.sha256}/{ARCHIVE_NAME}"


@dataclass(frozen=True)
class PinSet:
    """All pins of one pins file, and the one deployed when nobody names a pin."""

    path: Path
    default: str
    pins: Mapping[str, Pin]

    def get(self, name: str | None) -> Pin:
        chosen = self.default if name is None else name
        if chosen not in self.pins:
            known = ", ".join(sorted(self.pins))
            raise BuildError(f"unknown pin {chosen!r} in {self.path} (known pins: {known})", ExitCode.BAD_INPUT)
        return self.pins[chosen]


def normalize_prefix(prefix: str) -> str:
    """`models` and `/models/` both mean the key prefix `models/`; the empty prefix stays empty."""
    stripped = prefix.strip("/")
    return f"{stripped}/" if stripped else ""


def check_download_base(url: str, where: str) -> list[str]:
    """Problems with a URL we would download from: HTTPS only, except plain HTTP to this machine (tests)."""
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        return [f"{where}: expected an https:// URL, got {url!r}"]
    if parts.scheme == "http" and not _is_loopback(parts.hostname):
        return [f"{where}: plain http is allowed only for a loopback host; use https:// for {parts.hostname}"]
    return []


def load_pins(path: Path = SHIPPED_PINS_FILE) -> PinSet:
    """Read and validate a pins file, reporting every problem at once, each prefixed with its key path."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BuildError(f"pins file {path} not found", ExitCode.BAD_INPUT) from None
    except json.JSONDecodeError as error:
        raise BuildError(
            f"pins file {path}: invalid JSON at line {error.lineno} column {error.colno}: {error.msg}",
            ExitCode.BAD_INPUT,
        ) from None

    problems: list[str] = []
    pins: dict[str, Pin] = {}
    default = ""
    if not isinstance(raw, dict):
        problems.append(f"(top level): expected an object with keys {', '.join(_TOP_LEVEL_KEYS)}")
    else:
        problems += [f"{key}: unknown key (expected one of {', '.join(_TOP_LEVEL_KEYS)})"
                     for key in raw if key not in _TOP_LEVEL_KEYS]
        raw_pins = raw.get("pins")
        if not isinstance(raw_pins, dict) or not raw_pins:
            problems.append("pins: expected an object with at least one named pin")
        else:
            for name, raw_pin in raw_pins.items():
                pin = _parse_pin(name, raw_pin, path.parent, problems)
                if pin is not None:
                    pins[name] = pin
        default = raw.get("default")
        if not isinstance(default, str) or not default:
            problems.append("default: expected the name of a pin")
        elif isinstance(raw_pins, dict) and raw_pins and default not in raw_pins:
            problems.append(f"default: {default!r} is not one of the pins ({', '.join(sorted(raw_pins))})")

    if problems:
        listed = "\n".join(f"  {problem}" for problem in problems)
        raise BuildError(f"invalid pins file {path}:\n{listed}", ExitCode.BAD_INPUT)
    return PinSet(path=path, default=default, pins=MappingProxyType(pins))


def _parse_pin(name: str, raw: Any, pins_folder: Path, problems: list[str]) -> Pin | None:
    where = f"pins.{name}"
    found_before = len(problems)
    if not _PIN_NAME.fullmatch(name):
        # The name becomes part of the S3 key and of local paths.
        problems.append(f"{where}: a pin name is 1 to 64 characters of a-z, 0-9, '.', '_' and '-', "
                        "starting with a letter or digit")
    if not isinstance(raw, dict):
        problems.append(f"{where}: expected an object")
        return None
    problems += [f"{where}.{key}: unknown key (expected one of {', '.join(_PIN_KEYS)})"
                 for key in raw if key not in _PIN_KEYS]

    sha256 = raw.get("sha256")
    sha256_is_valid = isinstance(sha256, str) and _SHA256.fullmatch(sha256) is not None
    if not sha256_is_valid:
        problems.append(f"{where}.sha256: expected 64 hex characters")
    size_bytes = raw.get("bytes")
    # bool is an int subclass; `true` is not a size.
    if not isinstance(size_bytes, int) or isinstance(size_bytes, bool) or size_bytes <= 0:
        problems.append(f"{where}.bytes: expected a positive whole number of bytes")
    description = raw.get("description", "")
    if not isinstance(description, str):
        problems.append(f"{where}.description: expected a string")

    file = ""
    url = raw.get("url")
    hugging_face_keys = [key for key in ("repository", "revision") if key in raw]
    if url is not None and hugging_face_keys:
        problems.append(f"{where}: give either url, or repository, revision and file, not both")
    elif url is not None:
        file = _check_url_pin(where, url, raw.get("file"), problems)
    elif hugging_face_keys:
        file = _check_hugging_face_pin(where, raw, problems)
    else:
        problems.append(f"{where}: missing url, or repository, revision and file")

    calibration = None
    if "calibration" in raw:
        calibration = read_calibration(f"{where}.calibration", raw["calibration"], pins_folder,
                                       sha256.lower() if sha256_is_valid else None, problems)

    if len(problems) > found_before:
        return None
    return Pin(name=name, file=file, sha256=sha256.lower(), size_bytes=size_bytes, url=url,
               repository=raw.get("repository"), revision=raw.get("revision"), description=description,
               calibration=calibration)


def _check_url_pin(where: str, url: Any, file: Any, problems: list[str]) -> str:
    if not isinstance(url, str):
        problems.append(f"{where}.url: expected a string")
        return ""
    problems += check_download_base(url, f"{where}.url")
    if file is None:
        file = unquote(PurePosixPath(urlsplit(url).path).name)
        _check_gguf_name(f"{where}.url", file, problems, what="the URL's last path segment")
    elif isinstance(file, str) and "/" not in file:
        _check_gguf_name(f"{where}.file", file, problems)
    else:
        problems.append(f"{where}.file: expected a file name without '/' (the name in the archive)")
    return file if isinstance(file, str) else ""


def _check_hugging_face_pin(where: str, raw: dict, problems: list[str]) -> str:
    repository, revision, file = raw.get("repository"), raw.get("revision"), raw.get("file")
    if not isinstance(repository, str) or not _REPOSITORY.fullmatch(repository):
        problems.append(f"{where}.repository: expected owner/name, e.g. bartowski/Qwen_Qwen3.5-4B-GGUF")
    if not isinstance(revision, str) or not _COMMIT.fullmatch(revision):
        # A branch or tag can move to other bytes; only a commit hash pins the file.
        problems.append(f"{where}.revision: expected a 40-character lowercase commit hash "
                        "(branch and tag names can move)")
    if not isinstance(file, str) or not file:
        problems.append(f"{where}.file: expected the path of the .gguf file inside the repository")
        return ""
    segments = file.split("/")
    if any(segment in ("", ".", "..") for segment in segments):
        problems.append(f"{where}.file: expected a relative path without empty, '.' or '..' segments")
    else:
        _check_gguf_name(f"{where}.file", segments[-1], problems)
    return file


def _check_gguf_name(where: str, name: str, problems: list[str], what: str = "the file name") -> None:
    if not name.endswith(".gguf") or name.startswith(".") or "\\" in name:
        problems.append(f"{where}: {what} must end in .gguf and not start with '.' (got {name!r})")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
