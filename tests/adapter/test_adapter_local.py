"""`make run` (``python -m decision_adapter.server.local``): the settings it serves the embedded model with, and the
first answer a newcomer sees (issue 35, item 7): the walkthrough's example, at the local run's order averaging, is
answered ``account_access``; a user's own ADAPTER_PERMUTATIONS wins; the call it prints names a file that exists."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest
import requests

from decision_adapter.decisions.model_files import embedded_model_dir
from decision_adapter.server.local import EMBEDDED_PERMUTATIONS, EXAMPLE, ROOT, local_environ
from decision_adapter.settings import Settings


def test_the_embedded_model_is_served_with_order_averaging_unless_the_user_sets_it():
    default = Settings.from_env(local_environ({"PORT": "9000"}))
    assert default.permutations == EMBEDDED_PERMUTATIONS > 1
    assert default.model_dir == str(embedded_model_dir())
    assert (default.host, default.port) == ("127.0.0.1", 9000)
    assert Settings.from_env(local_environ({"ADAPTER_PERMUTATIONS": "1"})).permutations == 1
    assert Settings.from_env(local_environ({"ADAPTER_PERMUTATIONS": "2"})).permutations == 2
    # blanks are unset, as Settings.from_env reads them
    assert Settings.from_env(local_environ({"ADAPTER_PERMUTATIONS": " "})).permutations == EMBEDDED_PERMUTATIONS


def test_a_model_of_the_users_own_keeps_the_images_default(tmp_path):
    # The local default is chosen for the embedded model's cost and bias; another model is the user's to measure.
    environ = local_environ({"ADAPTER_MODEL_DIR": str(tmp_path)})
    assert "ADAPTER_PERMUTATIONS" not in environ
    assert Settings.from_env(environ).permutations == Settings.from_env({}).permutations == 1


@contextlib.contextmanager
def make_run(**env: str) -> Iterator[tuple[str, str]]:
    """`python -m decision_adapter.server.local` as `make run` starts it (in the repository's root, PORT set), with
    the test session's ADAPTER_ variables left out; (base URL, what it printed) once it says it is ready."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("ADAPTER_", "SAGEMAKER_"))}
    environ.update({"PORT": str(port), "ADAPTER_THREADS": "2", **env})
    output = tempfile.TemporaryFile(mode="w+")
    process = subprocess.Popen([sys.executable, "-m", "decision_adapter.server.local"], cwd=ROOT, env=environ,
                               stdout=output, stderr=subprocess.STDOUT, text=True)

    def printed() -> str:
        output.seek(0)
        return output.read()

    try:
        deadline = time.monotonic() + 180
        while "The adapter is ready" not in printed():
            if process.poll() is not None:
                pytest.fail(f"make run exited with {process.returncode}: {printed()}")
            if time.monotonic() > deadline:
                pytest.fail(f"make run did not say it was ready within 180 s: {printed()}")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}", printed()
    finally:
        if process.poll() is None:
            process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)
        output.close()


def the_printed_call(printed: str) -> Path:
    call = re.search(r"curl -s (\S+)/invocations -H 'Content-Type: application/json' -d @(\S+)", printed)
    assert call, printed
    return Path(call.group(2))


def test_make_run_answers_its_own_sample_call_account_access():
    with make_run() as (base, printed):
        path = the_printed_call(printed)
        assert not path.is_absolute() and (ROOT / path).is_file(), path
        assert (ROOT / path).resolve() == EXAMPLE
        response = requests.post(f"{base}/invocations", data=(ROOT / path).read_bytes(),
                                 headers={"Content-Type": "application/json"}, timeout=120)
    assert response.status_code == 200, response.text
    result = response.json()["result"]
    top = max(range(len(result["option_ids"])), key=result["probabilities"].__getitem__)
    assert result["option_ids"][top] == "account_access", result
    # every cyclic shift of the three options: the answer is the option set's, not the second position's
    assert "averaged in log space over 3 orderings" in result["readout"], result["readout"]


def test_make_run_keeps_the_users_permutations():
    with make_run(ADAPTER_PERMUTATIONS="1") as (base, _):
        response = requests.post(f"{base}/invocations", json=json.loads(EXAMPLE.read_text()), timeout=120)
    assert response.status_code == 200, response.text
    assert "orderings" not in response.json()["result"]["readout"]


def test_readme_shows_the_call_make_run_prints():
    readme = (ROOT / "README.md").read_text()
    path = the_printed_call(readme)
    assert (ROOT / path).resolve() == EXAMPLE
