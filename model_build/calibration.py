"""`calibration.json`: the per-question-type temperatures a pin may ship beside its GGUF.

The adapter (container/decision_adapter/decisions/calibration.py) reads `calibration.json` from the model folder and
refuses to turn ready when the file is unreadable or names another GGUF sha256 or prompt version. This module
owns the pin's side of that: it reads the file a pin names and checks the keys the adapter relies on, at
pin-load time, so that a file the adapter would refuse for this GGUF never reaches an archive. The prompt
version is only recorded: which version the deployed adapter renders is not known here.

It deliberately does not import the adapter: model_build runs without it (see requirements.txt).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

# The adapter's decision_adapter.calibration.FILE_NAME: where it looks, beside the GGUF.
ARCHIVE_NAME = "calibration.json"
# The adapter's decision_adapter.calibration.TYPES: it refuses a temperature for any other question type.
QUESTION_TYPES = ("noul", "choice", "score")
REQUIRED_KEYS = ("gguf_sha256", "prompt_version", "temperatures")
# Lowercase only: the adapter compares the file's value with its own lowercase hex digest, character for
# character, so an uppercase hash would be refused at start-up.
_LOWERCASE_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class PinnedCalibration:
    """A pin's calibration file as read and checked at pin-load time; `data` is what the archive holds."""

    path: Path
    data: bytes = field(repr=False)  # kilobytes of JSON; a pin's repr need not show them
    sha256: str
    prompt_version: str


def read_calibration(where: str, value: Any, pins_folder: Path, gguf_sha256: str | None,
                     problems: list[str]) -> PinnedCalibration | None:
    """Read and check the file a pin's `calibration` key names, relative to the pins file's folder.

    Appends each problem under `where` (the key path, e.g. `pins.qwen3.5-4b.calibration`) and returns None
    if there was any. `gguf_sha256` is the pin's own sha256, or None when that key is itself invalid.
    """
    if not isinstance(value, str) or not value:
        problems.append(f"{where}: expected the path of a calibration JSON file, relative to the pins file's "
                        "folder")
        return None
    relative = PurePosixPath(value)
    if relative.is_absolute() or "\\" in value or any(part in ("", ".", "..") for part in value.split("/")):
        # CodeBuild receives the pins file's folder (model_build/) and nothing around it.
        problems.append(f"{where}: expected a relative path inside the pins file's folder, without empty, "
                        f"'.' or '..' segments (got {value!r})")
        return None

    path = pins_folder / relative
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        problems.append(f"{where}: {path} not found")
        return None
    except OSError as error:
        problems.append(f"{where}: cannot read {path}: {error.strerror or error}")
        return None
    try:
        document = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        problems.append(f"{where}: {path} is not UTF-8 text")
        return None
    except json.JSONDecodeError as error:
        problems.append(f"{where}: {path} is not valid JSON (line {error.lineno} column {error.colno}: "
                        f"{error.msg})")
        return None
    if not isinstance(document, dict):
        problems.append(f"{where}: {path} must hold a JSON object with keys {', '.join(REQUIRED_KEYS)} "
                        "(as written by python -m decision_adapter.calibrate)")
        return None

    found_before = len(problems)
    missing = [key for key in REQUIRED_KEYS if key not in document]
    if missing:
        problems.append(f"{where}: {path}: missing {', '.join(missing)} (a calibration file has "
                        f"{', '.join(REQUIRED_KEYS)}; write one with python -m decision_adapter.calibrate)")
    fitted_for = document.get("gguf_sha256")
    if "gguf_sha256" in document and (not isinstance(fitted_for, str)
                                      or not _LOWERCASE_SHA256.fullmatch(fitted_for)):
        problems.append(f"{where}: {path}: gguf_sha256: expected 64 lowercase hex characters")
    elif isinstance(fitted_for, str) and gguf_sha256 is not None and fitted_for != gguf_sha256:
        problems.append(f"{where}: {path} was fitted for the GGUF with sha256 {fitted_for}, not this pin's "
                        f"({gguf_sha256}); fit one for this GGUF with python -m decision_adapter.calibrate")
    prompt_version = document.get("prompt_version")
    if "prompt_version" in document and (not isinstance(prompt_version, str) or not prompt_version.strip()):
        problems.append(f"{where}: {path}: prompt_version: expected a non-empty string")
    if "temperatures" in document:
        _check_temperatures(f"{where}: {path}: temperatures", document["temperatures"], problems)
    permutations = document.get("permutations", 1)
    # Optional; the adapter reads it as a whole number when present.
    if not isinstance(permutations, int) or isinstance(permutations, bool) or permutations < 1:
        problems.append(f"{where}: {path}: permutations: expected a whole number of at least 1")

    if len(problems) > found_before:
        return None
    return PinnedCalibration(path=path, data=data, sha256=hashlib.sha256(data).hexdigest(),
                             prompt_version=prompt_version)


def _check_temperatures(where: str, temperatures: Any, problems: list[str]) -> None:
    if not isinstance(temperatures, dict):
        problems.append(f"{where}: expected an object from question type ({', '.join(QUESTION_TYPES)}) "
                        "to temperature")
        return
    unknown = [kind for kind in temperatures if kind not in QUESTION_TYPES]
    if unknown:
        problems.append(f"{where}: unknown question types {', '.join(map(repr, unknown))} "
                        f"(expected {', '.join(QUESTION_TYPES)})")
    # bool is an int subclass, and JSON allows NaN and Infinity: neither is a temperature.
    invalid = [kind for kind, value in temperatures.items()
               if not isinstance(value, (int, float)) or isinstance(value, bool)
               or not math.isfinite(value) or value <= 0]
    if invalid:
        problems.append(f"{where}: expected a positive finite number for {', '.join(map(repr, invalid))}")
