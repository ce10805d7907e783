"""The whole session: llama-server, the benchmark harness's generation baseline, is built while the suite runs.

Building it takes about 9 CPU-minutes on 2 cores, and the suite leaves about half of two cores idle on average
(its CPU time over its wall time: 1.1 cores). So when the session holds tests of the benchmark harness and the
build is not cached yet, it starts at once, in the background, at the lowest priority (nice 19: a compiler that
gets a core only when no test wants it), instead of inside the first harness test or before the session. It stays
in the session's own scheduling group: a new session (setsid) would put it in an autogroup of its own, which Linux
weighs equally with the whole test session's whatever its nice value, and it took half the CPU (a 2-thread readout
test: 30 s alone, 61 s beside the build in its own session, 29 s beside it in the test session). The
harness asks benchmarks/build-llama-server.sh for the binary as it always does; the script holds a lock per build,
so that call waits for this build and then finds the binary. A session that ends first stops the build (a
partial build is discarded; the next session starts it again).
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path

from deploy import node

# jsii (started by the first aws_cdk import: tests/cdk, tests/deploy) and every node the tests spawn run on the
# Node.js LTS package.json pins, as the Makefile's PATH and npx give it to the CLI (deploy/node.py).
node.use_pinned_node()

BUILD = Path(__file__).resolve().parents[1] / "benchmarks" / "build-llama-server.sh"
_build: subprocess.Popen | None = None


def pytest_collection_finish(session) -> None:
    global _build
    harness = any(Path(str(item.fspath)).parent.name == "benchmarks" for item in session.items)
    if not harness or session.config.option.collectonly:
        return
    path = subprocess.run([str(BUILD), "--path"], capture_output=True, text=True, check=True).stdout.strip()
    if os.access(path, os.X_OK):
        return
    # The background build's output, for a person reading why it failed; the harness's own call then builds again
    # and fails with the script's error in the test that needed the binary.
    log = Path(tempfile.gettempdir()) / "llama-server-build.log"
    with log.open("w") as out:
        _build = subprocess.Popen(["nice", "-n", "19", str(BUILD)], stdout=out, stderr=subprocess.STDOUT,
                                  process_group=0)  # its own process group to stop, not its own session


def pytest_sessionfinish(session, exitstatus) -> None:
    if _build is not None and _build.poll() is None:
        os.killpg(_build.pid, signal.SIGTERM)
        _build.wait(60)
