"""`model-manifest.json`: which file the archive holds, where it came from, and how the archive was built.

The adapter reads this file next to the GGUF in /opt/ml/model: it checks the GGUF against `sha256` and
reports `source` and `revision`. Those key names, and `file` and `bytes`, are an interface; keep them.
`calibration` names the archive's calibration.json, or is null when the pin has none.
"""

from __future__ import annotations

import json
import platform
from datetime import datetime, UTC
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from model_build import __version__
from model_build.calibration import ARCHIVE_NAME as CALIBRATION_NAME
from model_build.pins import Pin

MANIFEST_NAME = "model-manifest.json"
# Bumped when a key changes meaning or disappears, so readers can refuse what they do not understand.
MANIFEST_VERSION = 1
_REPORTED_PACKAGES = ("boto3", "botocore", "requests", "tqdm")


def build_manifest(pin: Pin, gguf_sha256: str, download_url: str, built_at: datetime) -> dict[str, Any]:
    return {
        "manifest_version": MANIFEST_VERSION,
        "pin": pin.name,
        # The repository for a Hugging Face pin, the URL for a URL pin.
        "source": pin.source,
        # The commit for a Hugging Face pin; a URL pin has none.
        "revision": pin.revision,
        # The GGUF's name at the root of the archive.
        "file": pin.gguf_name,
        "bytes": pin.size_bytes,
        "sha256": gguf_sha256,
        "download_url": download_url,
        "built_at": utc_timestamp(built_at),
        "tool_versions": tool_versions(),
        # Added without a version bump: no existing key changed meaning, and readers ignore unknown keys.
        "calibration": calibration_entry(pin),
    }


def calibration_entry(pin: Pin) -> dict[str, str] | None:
    """What the manifest says about the archive's calibration.json: its hash and the prompt it was fitted for."""
    if pin.calibration is None:
        return None
    return {"file": CALIBRATION_NAME, "sha256": pin.calibration.sha256,
            "prompt_version": pin.calibration.prompt_version}


def manifest_bytes(manifest: dict[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=2) + "\n").encode("utf-8")


def utc_timestamp(moment: datetime) -> str:
    """ISO 8601 in UTC with a `Z`, to the second: `2025-01-31T12:00:00Z`."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def tool_versions() -> dict[str, str]:
    versions = {"python": platform.python_version(), "model_build": __version__}
    for package in _REPORTED_PACKAGES:
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = "not installed"
    return versions
