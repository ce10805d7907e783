"""The `python -m model_build` command line: argument parsing, the order of the steps, and exit codes.

Results go to stdout as `key=value` lines (easy to read from a build script); progress and errors go to
stderr. A `BuildError` is printed as one message without a traceback and exits with its code (see errors.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from datetime import datetime, UTC
from pathlib import Path, PurePosixPath
from collections.abc import Sequence

from model_build import __version__
from model_build.download import DEFAULT_ATTEMPTS, VerifiedFile, fetch
from model_build.errors import BuildError, ExitCode
from model_build.manifest import build_manifest, manifest_bytes
from model_build.pins import (HUGGING_FACE_ENDPOINT, SHIPPED_PINS_FILE, Pin, PinSet, check_download_base,
                              load_pins, normalize_prefix)

DEFAULT_WORK_DIR = Path(".work/model-build")
DEFAULT_PREFIX = "models/"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.command(args)
    except BuildError as error:
        print(f"model_build: error: {error}", file=sys.stderr)
        return int(error.exit_code)
    except KeyboardInterrupt:
        print("model_build: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


def _list_pins(args: argparse.Namespace) -> int:
    pin_set = load_pins(args.pins)
    for name, pin in sorted(pin_set.pins.items()):
        marker = " (default)" if name == pin_set.default else ""
        origin = f"{pin.repository}@{pin.revision}/{pin.file}" if pin.repository else pin.url
        print(f"{name}{marker}\n  source: {origin}\n  bytes:  {pin.size_bytes:,}\n  sha256: {pin.sha256}\n"
              f"  key:    {pin.archive_key(args.prefix)}")
        if pin.calibration is not None:
            print(f"  calibration: {pin.calibration.path} (prompt version {pin.calibration.prompt_version})")
    return ExitCode.OK


def _fetch(args: argparse.Namespace) -> int:
    pin, url = _chosen_pin(args)
    verified = _download(pin, url, args)
    _print_results(gguf=verified.path, gguf_sha256=verified.sha256)
    return ExitCode.OK


def _package(args: argparse.Namespace) -> int:
    pin, url = _chosen_pin(args)
    if args.no_upload and args.output is None:
        raise BuildError("--no-upload needs --output DIR, the folder that keeps the archive", ExitCode.BAD_INPUT)
    if not args.no_upload and not args.bucket:
        raise BuildError("--bucket is required (or pass --no-upload --output DIR for a local archive)",
                         ExitCode.BAD_INPUT)

    # The same relative layout locally and in S3: <pin>/<gguf sha256>/model.tar.gz.
    relative_key = pin.archive_key("")
    kept_archive = args.output / relative_key if args.output is not None else None
    if kept_archive is not None and kept_archive.exists():
        raise BuildError(f"{kept_archive} already exists; archives are never overwritten "
                         "(delete it or choose another --output)", ExitCode.OUTPUT_EXISTS)

    client = key = None
    if not args.no_upload:
        from model_build import upload  # boto3 takes a while to import; local-only runs do not need it

        key = pin.archive_key(args.prefix)
        client = upload.make_s3_client(args.s3_endpoint_url)
        upload.ensure_absent(client, args.bucket, key)

    verified = _download(pin, url, args)
    built_at = datetime.now(UTC)
    manifest = build_manifest(pin, verified.sha256, url, built_at)

    from model_build.archive import write_archive

    scratch = None
    if kept_archive is None:
        # Nobody asked to keep the archive: build it in a scratch folder that is removed afterwards.
        scratch = Path(tempfile.mkdtemp(prefix="archive-", dir=_work_subdir(args, "tmp")))
    try:
        archive = write_archive(kept_archive or scratch / PurePosixPath(relative_key).name, verified.path,
                                pin.gguf_name, manifest_bytes(manifest), built_at,
                                calibration=pin.calibration.data if pin.calibration else None)
        uri = None
        if client is not None:
            uri = upload.upload_archive(client, archive.path, args.bucket, key)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)

    _print_results(pin=pin.name, gguf_sha256=verified.sha256,
                   calibration_sha256=pin.calibration.sha256 if pin.calibration else None,
                   archive_sha256=archive.sha256, archive_bytes=archive.size_bytes, archive=kept_archive, s3_uri=uri)
    return ExitCode.OK


def _chosen_pin(args: argparse.Namespace) -> tuple[Pin, str]:
    pin_set: PinSet = load_pins(args.pins)
    pin = pin_set.get(args.pin)
    problems = check_download_base(args.hf_endpoint, "--hf-endpoint") if pin.repository else []
    if problems:
        raise BuildError(problems[0], ExitCode.BAD_INPUT)
    return pin, pin.download_url(args.hf_endpoint)


def _download(pin: Pin, url: str, args: argparse.Namespace) -> VerifiedFile:
    return fetch(pin, url, _work_subdir(args, "downloads"), attempts=args.attempts)


def _work_subdir(args: argparse.Namespace, name: str) -> Path:
    folder = args.work_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _print_results(**results: object) -> None:
    for name, value in results.items():
        if value is not None:
            print(f"{name}={value}")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("expected a whole number of at least 1")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m model_build",
        description="Package a pinned GGUF model as model.tar.gz for SageMaker.",
        epilog="exit codes: 0 done, 1 size or sha256 mismatch, 2 bad arguments or pins file, "
               "3 output already exists, 4 network or S3 failure (rerun resumes a download)",
    )
    parser.add_argument("--version", action="version", version=f"model_build {__version__}")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    pins_file = argparse.ArgumentParser(add_help=False)
    pins_file.add_argument("--pins", type=Path, default=SHIPPED_PINS_FILE, metavar="FILE",
                           help="pins file (default: model_build/pins.json)")

    source = argparse.ArgumentParser(add_help=False, parents=[pins_file])
    source.add_argument("--pin", metavar="NAME", help="pin to package (default: the pins file's default)")
    source.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR, metavar="DIR",
                        help=f"downloads and scratch space, kept between runs (default: {DEFAULT_WORK_DIR})")
    source.add_argument("--hf-endpoint", default=os.environ.get("HF_ENDPOINT", HUGGING_FACE_ENDPOINT),
                        metavar="URL", help="base URL for Hugging Face pins (default: $HF_ENDPOINT or "
                                            f"{HUGGING_FACE_ENDPOINT})")
    source.add_argument("--attempts", type=_positive_int, default=DEFAULT_ATTEMPTS, metavar="N",
                        help=f"download attempts before giving up, each resuming the last (default: "
                             f"{DEFAULT_ATTEMPTS})")

    listing = commands.add_parser("pins", parents=[pins_file], help="list the pins and their archive keys")
    listing.add_argument("--prefix", type=normalize_prefix, default=DEFAULT_PREFIX, help="S3 key prefix")
    listing.set_defaults(command=_list_pins)

    fetching = commands.add_parser("fetch", parents=[source], help="download and verify a pin's GGUF only")
    fetching.set_defaults(command=_fetch)

    packaging = commands.add_parser(
        "package", parents=[source],
        help="download, verify, write the manifest and model.tar.gz, upload to S3",
        description="Key layout, in S3 and under --output alike: <prefix><pin>/<gguf sha256>/model.tar.gz.")
    packaging.add_argument("--bucket", help="S3 bucket to upload to")
    packaging.add_argument("--prefix", type=normalize_prefix, default=DEFAULT_PREFIX,
                           help=f"S3 key prefix (default: {DEFAULT_PREFIX})")
    packaging.add_argument("--s3-endpoint-url", metavar="URL",
                           help="another S3 endpoint, e.g. a local test server (default: boto3's)")
    packaging.add_argument("--no-upload", action="store_true", help="build the archive locally only")
    packaging.add_argument("--output", type=Path, metavar="DIR",
                           help="keep the archive under DIR/<pin>/<gguf sha256>/model.tar.gz")
    packaging.set_defaults(command=_package)
    return parser
