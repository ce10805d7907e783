"""Upload of a finished archive to S3, in parts for large files, and never over an existing object.

Two guards keep an existing archive safe: `ensure_absent` runs before the download starts (so an existing
key costs no 3 GB download), and the upload itself is a conditional write (`If-None-Match: *` on PutObject
and CompleteMultipartUpload), so a key created in between is still not replaced.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import boto3
from boto3.s3.transfer import TransferConfig, create_transfer_manager
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from s3transfer.subscribers import BaseSubscriber

from model_build.errors import BuildError, ExitCode
from model_build.progress import Progress

_MEBIBYTE = 1024 * 1024
# 64 MiB parts: a 3 GB archive is about 45 parts, far below S3's limit of 10,000, and a failed part costs
# little to send again.
DEFAULT_TRANSFER_CONFIG = TransferConfig(multipart_threshold=64 * _MEBIBYTE, multipart_chunksize=64 * _MEBIBYTE,
                                         max_concurrency=4)
_WRITES_THAT_CREATE_THE_OBJECT = ("PutObject", "CompleteMultipartUpload")
# S3 answers 412 when the key exists and 409 when a concurrent conditional write won the race.
_KEY_EXISTS_CODES = ("PreconditionFailed", "ConditionalRequestConflict")


def s3_uri(bucket: str, key: str) -> str:
    return f"s3://{bucket}/{key}"


def make_s3_client(endpoint_url: str | None = None) -> Any:
    """An S3 client; `endpoint_url` points it at another S3 implementation (a moto server in the tests).

    Without one, boto3's usual configuration applies, including the AWS_ENDPOINT_URL_S3 variable.
    """
    # Virtual-host addressing needs DNS names per bucket, which a loopback endpoint does not have.
    addressing = {"addressing_style": "path"} if endpoint_url else {}
    config = Config(retries={"mode": "standard", "max_attempts": 5}, s3=addressing)
    return boto3.client("s3", endpoint_url=endpoint_url, config=config)


def ensure_absent(client: Any, bucket: str, key: str) -> None:
    """Fail with OUTPUT_EXISTS when the key exists. Without permission to look, warn and carry on."""
    try:
        client.head_object(Bucket=bucket, Key=key)
    except ClientError as error:
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status == 404:
            return
        if status == 403:
            # S3 answers 403 instead of 404 for a missing key when s3:ListBucket is not granted.
            _log(f"cannot check whether {s3_uri(bucket, key)} exists (HeadObject: 403 access denied); "
                 "the conditional upload will still refuse to replace it")
            return
        raise BuildError(f"checking {s3_uri(bucket, key)}: {_describe(error)}", ExitCode.TRANSFER_FAILED) from None
    except BotoCoreError as error:
        raise BuildError(f"checking {s3_uri(bucket, key)}: {error}", ExitCode.TRANSFER_FAILED) from None
    raise BuildError(f"{s3_uri(bucket, key)} already exists; archives are never overwritten",
                     ExitCode.OUTPUT_EXISTS)


def upload_archive(client: Any, archive_path: Path, bucket: str, key: str,
                   transfer_config: TransferConfig = DEFAULT_TRANSFER_CONFIG) -> str:
    """Upload `archive_path` to a key that must not exist yet; return its S3 URI."""
    uri = s3_uri(bucket, key)
    size = archive_path.stat().st_size
    events = client.meta.events
    for operation in _WRITES_THAT_CREATE_THE_OBJECT:
        events.register(f"before-parameter-build.s3.{operation}", _only_if_absent,
                        unique_id=f"model-build-if-none-match-{operation}")
    _log(f"uploading {archive_path} ({size:,} bytes) to {uri}")
    try:
        with Progress(f"uploading {archive_path.name}", size) as progress, \
                create_transfer_manager(client, transfer_config) as manager:
            future = manager.upload(str(archive_path), bucket, key, subscribers=[_ProgressSubscriber(progress)])
            future.result()
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in _KEY_EXISTS_CODES:
            raise BuildError(f"{uri} already exists; archives are never overwritten",
                             ExitCode.OUTPUT_EXISTS) from None
        raise BuildError(f"uploading to {uri}: {_describe(error)}", ExitCode.TRANSFER_FAILED) from None
    except BotoCoreError as error:
        raise BuildError(f"uploading to {uri}: {error}", ExitCode.TRANSFER_FAILED) from None
    finally:
        for operation in _WRITES_THAT_CREATE_THE_OBJECT:
            events.unregister(f"before-parameter-build.s3.{operation}",
                              unique_id=f"model-build-if-none-match-{operation}")
    return uri


def _only_if_absent(params: dict[str, Any], **_: Any) -> None:
    params["IfNoneMatch"] = "*"


class _ProgressSubscriber(BaseSubscriber):
    def __init__(self, progress: Progress):
        super().__init__()
        self._progress = progress

    def on_progress(self, future: Any, bytes_transferred: int, **kwargs: Any) -> None:
        self._progress.advance(bytes_transferred)


def _describe(error: ClientError) -> str:
    details = error.response.get("Error", {})
    return f"{details.get('Code', 'error')}: {details.get('Message', str(error))}"


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
