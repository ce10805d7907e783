"""The adapter's `serve` entry point started for real on loopback, for end-to-end tests."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Iterator

import pytest
import requests


@contextlib.contextmanager
def live_server(model_dir: str, *, until: str = "ready", **env: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """`serve` (gunicorn) on a free loopback port with the given settings, once /ping says ready (or, with
    ``until="failed"``, once it says the start-up failed).

    Its output goes to a file (``process.read_log()``), not a pipe: one log line per request would fill
    a pipe nobody reads and stop the server."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    environ = {**os.environ, "SAGEMAKER_BIND_TO_PORT": str(port), "ADAPTER_HOST": "127.0.0.1",
               "ADAPTER_MODEL_DIR": model_dir, "ADAPTER_THREADS": "2",
               "ADAPTER_PERMUTATIONS": "1", "ADAPTER_DEBIAS": "off", **env}  # as the settings fixture
    output = tempfile.TemporaryFile(mode="w+")
    process = subprocess.Popen([sys.executable, "-m", "decision_adapter.server.serve"], env=environ,
                               stdout=output, stderr=subprocess.STDOUT, text=True)
    process.read_log = lambda: (output.seek(0), output.read())[1]
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                pytest.fail(f"serve exited with {process.returncode}: {process.read_log()}")
            try:
                ping = requests.get(f"{base}/ping", timeout=2)
                if ping.status_code == 200 or ping.json().get("status") == until:
                    assert ping.json().get("status") == until, ping.json()
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"serve did not become {until} within 120 s")
            time.sleep(0.2)
        yield base, process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(30)
        output.close()
