"""Fuzzing the live server (`serve` on loopback, the real model): no 5xx, only strict JSON, still alive.

`make test` sends FUZZ_CASES (default 1,000) requests; `make fuzz` sends 10,000 and prints the counts
per status (docs/development.md, "Fuzzing"). The cases are described in fuzz.py.
"""

from __future__ import annotations

import os

import pytest

from adapter_server import live_server
from fuzz import FUZZ_ENV, fuzz

FUZZ_CASES = int(os.environ.get("FUZZ_CASES", "1000"))


@pytest.fixture(scope="module")
def server(settings):
    with live_server(settings.model_dir, **FUZZ_ENV) as running:
        yield running


def test_fuzzed_requests_get_no_5xx_only_strict_json_and_leave_the_server_alive(server):
    base, process = server
    tally = fuzz(base, process.pid, FUZZ_CASES)

    report = (f"{tally.sent} fuzzed requests in {tally.seconds:.0f} s, worker memory "
              f"{tally.memory_growth / 2**20:+.1f} MiB\n{tally.table()}")
    print(f"\n{report}")
    if path := os.environ.get("FUZZ_REPORT"):
        with open(path, "w") as out:
            out.write(report + "\n")
    assert tally.sent >= FUZZ_CASES
    assert not tally.failures, "\n".join(tally.failures[:20])
    assert process.poll() is None, "the server is still running"
    assert {200, 400, 404, 405, 413, 415, 422} <= set(tally.statuses), "every kind of answer was reached"
