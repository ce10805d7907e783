"""The acceptance report: what ``acceptance`` proved, for ``promote`` to trust (issue 33, "build once, promote by
digest").

``acceptance -c env=NAME`` writes one JSON document per run to the environment's artifact bucket, under
``acceptance/<environment>/<UTC timestamp>.json`` and ``acceptance/<environment>/latest.json`` (and, with
``--report PATH``, to a local file); ``promote --from NAME`` reads ``latest.json``. A run whose checks failed writes
its report too (``passed: false``), so the latest report is always the latest run's. Its keys:

- ``environment``, ``name_prefix``, ``region``, ``emulator`` (``moto`` in the rehearsal, else null), ``started_at``
  and ``finished_at`` (UTC, ISO 8601);
- ``endpoints``: per endpoint kind, what it served while the checks ran (DescribeEndpoint -> EndpointConfig -> the
  variant's Model -> PrimaryContainer): ``endpoint_name``, ``endpoint_config_name``, ``model_name``, ``image``
  (``<repository URI>@sha256:...``) and ``model_data_url`` (``s3://bucket/key``);
- ``passed``: no check failed (``unprovable`` checks of an emulator run do not fail it; ``unprovable`` lists them);
- ``checks``: every check's ``state``, ``check``, ``subject`` and ``detail``, as printed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping, Sequence

from botocore.exceptions import ClientError

from endpoint_client.deployment import Served, error_code
from stacks.config import ACCEPTANCE_PREFIX, EnvironmentConfig


def latest_key(environment: str) -> str:
    return f"{ACCEPTANCE_PREFIX}{environment}/latest.json"


def run_key(environment: str, finished_at: datetime) -> str:
    return f"{ACCEPTANCE_PREFIX}{environment}/{finished_at.strftime('%Y%m%dT%H%M%SZ')}.json"


def build(config: EnvironmentConfig, *, region: str | None, emulator: str | None, started_at: datetime,
          finished_at: datetime, served: Mapping[str, Served], results: Sequence[Any]) -> dict[str, Any]:
    """The report of one run: ``results`` are acceptance's Results (state, check, subject, detail)."""
    checks = [asdict(result) for result in results]
    return {
        "environment": config.name, "name_prefix": config.name_prefix, "region": region, "emulator": emulator,
        "started_at": started_at.isoformat(), "finished_at": finished_at.isoformat(),
        "passed": bool(checks) and not any(check["state"] == "failed" for check in checks),
        "endpoints": {kind: found.artifacts() for kind, found in served.items()},
        "unprovable": [f"{check['check']} {check['subject']}" for check in checks if check["state"] == "unprovable"],
        "checks": checks,
    }


def write(s3: Any, bucket: str, report: Mapping[str, Any], finished_at: datetime) -> list[str]:
    """The report under its run's key and as latest.json; returns the s3:// URLs written."""
    body = json.dumps(report, indent=2).encode()
    written = []
    for key in (run_key(report["environment"], finished_at), latest_key(report["environment"])):
        s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/json")
        written.append(f"s3://{bucket}/{key}")
    return written


def write_local(path: Path, report: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(report, indent=2) + "\n")


def read_latest(s3: Any, bucket: str, environment: str) -> dict[str, Any] | None:
    """The environment's latest report, or None when acceptance never wrote one there."""
    found = read_latest_bytes(s3, bucket, environment)
    return None if found is None else json.loads(found)


def read_latest_bytes(s3: Any, bucket: str, environment: str) -> bytes | None:
    try:
        return s3.get_object(Bucket=bucket, Key=latest_key(environment))["Body"].read()
    except ClientError as error:
        if error_code(error) in ("NoSuchKey", "404"):
            return None
        raise


@dataclass(frozen=True)
class Recorded:
    """One run's report object as promote records it in the target's pins (stacks/config.py, AcceptancePin): its
    key, the S3 version that holds these bytes and their sha256. The bucket is versioned, so that version's bytes
    never change; a report written again is a new version."""
    bucket: str
    key: str
    version_id: str
    sha256: str

    def pin(self) -> dict[str, str]:
        return {"bucket": self.bucket, "key": self.key, "version_id": self.version_id, "sha256": self.sha256}


def record(s3: Any, bucket: str, latest: bytes) -> Recorded:
    """The run object the latest report is a copy of (its key from its finished_at), by version; ValueError when it
    is missing, differs from latest.json, or has no version (the bucket must be versioned)."""
    report = json.loads(latest)
    key = run_key(report["environment"], datetime.fromisoformat(report["finished_at"]))
    try:
        found = s3.get_object(Bucket=bucket, Key=key)
    except ClientError as error:
        raise ValueError(f"s3://{bucket}/{key}, the run latest.json copies, cannot be read: {error_code(error)}")
    body, version = found["Body"].read(), found.get("VersionId")
    if body != latest:
        raise ValueError(f"s3://{bucket}/{key} is not what latest.json says (rewritten since?)")
    if not version or version == "null":
        raise ValueError(f"s3://{bucket}/{key} has no S3 version: the artifact bucket must be versioned (the "
                         f"artifacts stack makes it so), or the report could be rewritten unseen")
    return Recorded(bucket, key, version, hashlib.sha256(body).hexdigest())


def read_recorded(s3: Any, pin: Any) -> dict[str, Any]:
    """The report a target's pins recorded (``pin``: stacks.config.AcceptancePin), exactly that version; ValueError
    when its bytes are not the recorded ones."""
    body = s3.get_object(Bucket=pin.bucket, Key=pin.key, VersionId=pin.version_id)["Body"].read()
    digest = hashlib.sha256(body).hexdigest()
    if digest != pin.sha256:
        raise ValueError(f"s3://{pin.bucket}/{pin.key} version {pin.version_id} has sha256 {digest}, not the "
                         f"{pin.sha256} promote recorded")
    return json.loads(body)
