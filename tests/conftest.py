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

Parallel where it is safe (``make test`` runs ``pytest -n 2``): every test that starts llama.cpp (in-process or as
a server) is in one xdist scope, so one worker runs them all, one after another; the other tests
(the CDK app, the deploy tooling, the clients, the packaging) run beside them on the other worker. Two llama.cpp
processes at once would slow each other about 30x (OpenMP's spinning wait; ``make test`` also sets
``OMP_WAIT_POLICY=passive`` so the one llama.cpp worker leaves the other core to the rest).
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from deploy import node

# jsii (started by the first aws_cdk import: tests/cdk, tests/deploy) and every node the tests spawn run on the
# Node.js LTS package.json pins, as the Makefile's PATH and npx give it to the CLI (deploy/node.py).
node.use_pinned_node()

BUILD = Path(__file__).resolve().parents[1] / "benchmarks" / "build-llama-server.sh"
_build: subprocess.Popen | None = None


# The tests that start llama.cpp: whole folders, and the files elsewhere that load the model.
LLAMA_FOLDERS = ("adapter", "benchmarks")
LLAMA_FILES = ("deploy/test_log_contract.py", "model_build/test_model_build_adapter.py")
TESTS = Path(__file__).resolve().parent


def starts_llama(path: Path) -> bool:
    if not path.resolve().is_relative_to(TESTS):
        return False
    relative = path.resolve().relative_to(TESTS)
    return relative.parts[0] in LLAMA_FOLDERS or relative.as_posix() in LLAMA_FILES


@pytest.hookimpl(optionalhook=True)  # xdist's hook: a run with -p no:xdist has no such hook
def pytest_xdist_make_scheduler(config, log):
    """xdist's own scopes (a module's tests together, in order), but one scope for every test that starts
    llama.cpp: one worker runs them all, one at a time, and the others share the rest module by module. (xdist's loadgroup marks do the same through the test ids,
    which pytest 9 no longer lets a plugin rename; the scheduler's hook is xdist's documented way.)"""
    from xdist.scheduler import LoadScopeScheduling

    class OneLlamaWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if starts_llama(TESTS.parent / nodeid.split("::", 1)[0]):
                return "llama.cpp"
            return super()._split_scope(nodeid)  # its module: moto's one state per process meets its tests in order

    return OneLlamaWorker(config, log)


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")


def pytest_sessionstart(session) -> None:
    """Under xdist the workers collect; the controller starts the build once, where the run holds the harness."""
    config = session.config
    if _is_worker(config) or getattr(config.option, "numprocesses", None) in (None, 0) or config.option.collectonly:
        return
    folders = [Path(a.split("::")[0]).resolve() for a in config.args] or [TESTS]
    harness = TESTS / "benchmarks"
    if any(harness == f or harness.is_relative_to(f) or f.is_relative_to(harness) for f in folders):
        _start_build()


def pytest_collection_finish(session) -> None:
    config = session.config
    if _is_worker(config) or getattr(config.option, "numprocesses", None) not in (None, 0):
        return  # under xdist the controller started it (pytest_sessionstart)
    harness = any(Path(str(item.fspath)).parent.name == "benchmarks" for item in session.items)
    if not harness or config.option.collectonly:
        return
    _start_build()


def _start_build() -> None:
    global _build
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
