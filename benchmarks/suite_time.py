"""The test suite's time, per folder and per file, on the machine it ran on (issue 49): the budget the next change
is checked against (docs/benchmarks.md, "The test suite's time").

    python -m benchmarks.suite_time --out docs/benchmarks/suite              # runs `make test`'s pytest command
    python -m benchmarks.suite_time --junit report.xml --out docs/benchmarks/suite   # reads a run's JUnit report

A run here is `make test`'s own pytest command (xdist workers, the llama.cpp tests in one group) with a JUnit
report; the wall time is the run's, the per-folder and per-file figures are the sums of their tests' own times
(setup, call and teardown as JUnit records them), so on 2 workers the sums exceed the wall time. Writes suite.json
(every file's time and count, the slowest tests, the run's provenance: commit, CPU, load) and suite.md (the tables).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path
from typing import Any

from .provenance import REPO, Provenance

SLOWEST = 25


def cases(report: Path) -> list[dict[str, Any]]:
    """Every test case of a JUnit report: its file (from the class name), name, seconds and outcome."""
    found = []
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "")
        parts = module.split(".")
        # pytest's classname is the dotted module path, then the class if any: the file is the longest prefix that
        # names a test file.
        path = next((("/".join(parts[:n]) + ".py") for n in range(len(parts), 0, -1)
                     if (REPO / ("/".join(parts[:n]) + ".py")).is_file()), module.replace(".", "/") + ".py")
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed" if child.tag == "failure" else "error"
            elif child.tag == "skipped":
                outcome = "skipped"
        found.append({"file": path, "name": case.get("name", ""), "seconds": float(case.get("time", 0.0)),
                      "outcome": outcome})
    return found


def summary(tests: list[dict[str, Any]]) -> dict[str, Any]:
    """Seconds and counts per folder (under tests/) and per file, and the slowest tests."""
    folders: dict[str, list[float]] = defaultdict(list)
    files: dict[str, list[float]] = defaultdict(list)
    for t in tests:
        parts = Path(t["file"]).parts
        folder = "/".join(parts[:2])  # tests/<folder>, or a file at the top of tests/
        folders[folder].append(t["seconds"])
        files[t["file"]].append(t["seconds"])

    def table(groups: dict[str, list[float]]) -> list[dict[str, Any]]:
        return sorted(({"path": k, "tests": len(v), "seconds": round(sum(v), 1)} for k, v in groups.items()),
                      key=lambda row: -row["seconds"])

    outcomes: dict[str, int] = defaultdict(int)
    for t in tests:
        outcomes[t["outcome"]] += 1
    slowest = sorted(tests, key=lambda t: -t["seconds"])[:SLOWEST]
    return {"tests": len(tests), "outcomes": dict(outcomes), "test_seconds": round(sum(t["seconds"] for t in tests), 1),
            "folders": table(folders), "files": table(files),
            "slowest": [{"test": f"{t['file']}::{t['name']}", "seconds": round(t["seconds"], 1)} for t in slowest]}


def markdown(result: dict[str, Any]) -> str:
    s = result["summary"]
    lines = [f"`{result['command']}`", "",
             f"{s['tests']} tests ({', '.join(f'{n} {k}' for k, n in sorted(s['outcomes'].items()))}); wall time "
             + (f"{result['wall_s']:.0f} s" if result.get("wall_s") is not None else "not measured (a report read)")
             + f"; the tests' own times sum to {s['test_seconds']:.0f} s.", "",
             "| folder | tests | seconds |", "|---|---:|---:|"]
    lines += [f"| {r['path']} | {r['tests']} | {r['seconds']:.0f} |" for r in s["folders"]]
    lines += ["", "| file | tests | seconds |", "|---|---:|---:|"]
    lines += [f"| {r['path']} | {r['tests']} | {r['seconds']:.0f} |" for r in s["files"][:30]]
    lines += ["", f"The {len(s['slowest'])} slowest tests:", "", "| test | seconds |", "|---|---:|"]
    lines += [f"| `{r['test']}` | {r['seconds']:.1f} |" for r in s["slowest"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.suite_time", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--junit", type=Path, help="a JUnit report to read instead of running the suite")
    parser.add_argument("--workers", default=os.environ.get("TEST_WORKERS", "2"), help="xdist workers (make test's)")
    parser.add_argument("--out", type=Path, default=Path("benchmark-results/suite"))
    args = parser.parse_args(argv)
    with Provenance("benchmarks.suite_time", argv) as provenance:
        wall_s = None
        status = 0
        if args.junit is not None:
            report = args.junit
        else:
            report = Path(tempfile.mkdtemp()) / "suite.xml"
            command = [sys.executable, "-m", "pytest", "-q", "-n", str(args.workers),
                       f"--junitxml={report}", "tests"]
            started = time.monotonic()
            status = subprocess.run(command, cwd=REPO, env={**os.environ, "OMP_WAIT_POLICY": "passive"}).returncode
            wall_s = time.monotonic() - started
        result = {"command": provenance.command, "wall_s": wall_s, "exit_status": status,
                  "summary": summary(cases(report))}
        result["provenance"] = provenance.record()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "suite.json").write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result)
    (args.out / "suite.md").write_text(text)
    print(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
