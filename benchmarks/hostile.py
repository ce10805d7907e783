"""`python -m benchmarks.hostile`: bodies crafted to make a parser work hard, sent to a live `serve`.

Each family is a JSON value (or the start of one) built to be expensive for a body's checks: strings that never
close, long backslash runs, ``\\u`` escapes and a lone surrogate, numbers of millions of digits, ``NaN`` and
numbers that overflow to infinity at the end of a long array, arrays of millions of small items, objects of
hundreds of thousands of keys (in the state, and as unknown fields of the request object), and nesting just under
and just over the depth limit. Each is sent as the state of a decision (``application/json``), of a JSON-lines
record (``application/jsonlines``) and of a System One body (``/v1/systemone``), raw, gzip- and zstd-compressed,
decoded to about 64 KiB and to about 6 MiB (the body limit). Every body also holds a string of brackets, so that a
depth check that only looks hard past 64 brackets does look.

For each body: the status (a 5xx or no answer is a failure), the seconds to the answer, MB/s of the decoded body,
the worker's peak RSS growth while it was answered (``/proc/<pid>/clear_refs`` resets the high-water mark, then
``VmHWM`` minus the RSS before), and the worst latency of ``/ping``, polled every 50 ms while it was answered. Each
family starts on a fresh server, so that memory an earlier family's bodies left to the allocator does not hide
what its own take; a body not answered within ``--timeout``, or a worker that died, restarts the server too (the
figure says so). The table gives, per family and size, the slowest of its nine variants and the largest growth
and ping latency among them; ``hostile.json`` holds every variant.

``--lines`` measures bodies of lines instead (``LINE_BODIES``: issue 35's million broken lines after a first value
that does not parse, the same under the line cap with or without a record at its end, 6 MiB of two-byte lines,
records up to the cap, long records, records then blank lines): each split in-process as ``/invocations`` splits
it, every record read (the seconds, best of three, and tracemalloc's peak over what was allocated before), then
sent to a live ``serve`` (status, seconds, ``/ping``'s worst latency); ``lines.json`` and ``lines.md``.

``--concurrent N`` sends N copies of each family's 6 MiB body at once (issue 35: sixteen, the admission capacity),
per format, uncompressed, to one server, with ``/ping`` polled every 50 ms: the statuses, the slowest answer and
``/ping``'s worst latency while they were answered; ``concurrent.json`` and ``concurrent.md``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import requests
import zstandard

from .provenance import Provenance

MIB = 1024 * 1024
SIZES = {"64KiB": 64 * 1024, "6MiB": 6 * MIB}
MAX_DEPTH = 64
FORMATS = ("json", "lines", "systemone")
ENCODINGS = ("identity", "gzip", "zstd")
BAIT = "[" * 100  # brackets inside a string: more than 64 in the body, none of them nesting
OPTIONS = '[{"id": "a", "description": "Yes."}, {"id": "b", "description": "No."}]'


@dataclass(frozen=True)
class Envelope:
    """Where a family's value goes: the request object's text before it and after it, and how deep the value
    starts (its own brackets are one level below ``depth``)."""

    before: str
    after: str
    depth: int  # levels the envelope opens around the value
    fields_before: str  # where unknown fields of the request object go: before this text
    path: str
    content_type: str


ENVELOPES = {
    "json": Envelope('{"decision": {"id": "' + BAIT + '", "question": "Which?", "options": ' + OPTIONS + ', "state": ',
                     "}}", 2, '"question"', "/invocations", "application/json"),
    "lines": Envelope('{"decision": {"id": "' + BAIT + '", "question": "Which?", "options": ' + OPTIONS + ', "state": ',
                      "}}\n", 2, '"question"', "/invocations", "application/jsonlines"),
    "systemone": Envelope('{"model": "jev-latest", "questions": {"' + BAIT + '": {"type": "noul"}}, "state": ', "}", 1,
                          '"questions"', "/v1/systemone", "application/json"),
}


def _repeat(unit: str, room: int) -> str:
    return unit * max(1, room // len(unit))


def unterminated_escapes(n: int, room: int) -> tuple[str, str]:
    return '"' + _repeat('\\"', n - 1), ""  # a string of escaped quotes that never closes


def backslash_runs(n: int, room: int) -> tuple[str, str]:
    return '"' + _repeat("\\\\" * 500 + '\\"', n - 2) + '"', ""  # long even runs, each before an escaped quote


def unicode_escapes(n: int, room: int) -> tuple[str, str]:
    return '"' + _repeat("\\u00e9\\ud83d\\ude00", n - 8) + '\\ud800"', ""  # pairs, then one lone surrogate


def long_numbers(n: int, room: int) -> tuple[str, str]:
    third = max(1, (n - 12) // 3)
    return f"[1.{'0' * third}1, 1e-{'0' * third}1, 1{'0' * third}]", ""  # a fraction, an exponent, an integer


def nan_infinity(n: int, room: int) -> tuple[str, str]:
    return "[" + _repeat("0.5, ", n - 30) + "-Infinity, NaN, Infinity]", ""


def overflow_infinity(n: int, room: int) -> tuple[str, str]:
    return "[" + _repeat("0.5, ", n - 10) + "1e999]", ""  # finite until the last, which parses to infinity


def small_items(n: int, room: int) -> tuple[str, str]:
    return "[" + _repeat('0,"",[],{},true,null,0.5,', n - 3) + "0]", ""


def many_keys(n: int, room: int) -> tuple[str, str]:
    keys, size, i = [], 2, 0
    while size < n:
        item = f'"k{i}":0'
        keys.append(item)
        size += len(item) + 1
        i += 1
    return "{" + ",".join(keys) + "}", ""


def many_fields(n: int, room: int) -> tuple[str, str]:
    """Hundreds of thousands of unknown fields in the request object itself (the decision, or System One's body);
    the state is small."""
    fields, size, i = [], 0, 0
    while size < n - 20:
        item = f'"x{i}": 0, '
        fields.append(item)
        size += len(item)
        i += 1
    return '"A short state."', "".join(fields)


def nesting(levels: int) -> Callable[[int, int], tuple[str, str]]:
    """Arrays nested ``levels`` past the envelope (``MAX_DEPTH`` in all is the limit), side by side; the deepest
    one is last, so that a check must read the whole body to find it."""

    def build(n: int, room: int) -> tuple[str, str]:
        inner = levels - 1  # the outer array is one level
        unit = "[" * (room - 1) + "0" + "]" * (room - 1) + ","
        last = "[" * inner + "0" + "]" * inner
        return "[" + _repeat(unit, n - len(last) - 2) + last + "]", ""

    return build


FAMILIES: dict[str, Callable[[int, int], tuple[str, str]]] = {
    "unterminated-escapes": unterminated_escapes,
    "backslash-runs": backslash_runs,
    "unicode-escapes-surrogate": unicode_escapes,
    "numbers-of-millions-of-digits": long_numbers,
    "nan-infinity": nan_infinity,
    "overflow-to-infinity": overflow_infinity,
    "millions-of-small-items": small_items,
    "object-of-many-keys": many_keys,
    "request-of-many-fields": many_fields,
    "nesting-at-the-limit": nesting(0),  # levels filled in per envelope (see body())
    "nesting-over-the-limit": nesting(1),
}


def body(family: str, fmt: str, size: int) -> bytes:
    """The decoded body of ``family`` in ``fmt``, about ``size`` bytes (never more)."""
    envelope = ENVELOPES[fmt]
    room = MAX_DEPTH - envelope.depth  # levels the value may open
    fixed = len(envelope.before) + len(envelope.after)
    if family.startswith("nesting-"):
        levels = room + (1 if family.endswith("over-the-limit") else 0)
        value, fields = nesting(levels)(size - fixed, room)
    else:
        value, fields = FAMILIES[family](size - fixed - 16, room)
    before = envelope.before
    if fields:
        at = before.index(envelope.fields_before)
        before = before[:at] + fields + before[at:]
    unterminated = family == "unterminated-escapes"
    text = before + value + ("" if unterminated else envelope.after)
    data = text.encode()
    assert len(data) <= size, (family, fmt, len(data), size)
    return data


def encode(data: bytes, encoding: str) -> bytes:
    if encoding == "gzip":
        return gzip.compress(data, 6)
    if encoding == "zstd":
        return zstandard.ZstdCompressor(level=3).compress(data)
    return data


# ---- bodies of lines: the splitters, in-process and on a live server -----------------------------------------------

LINE_RECORD = b'{"decision": {"id": "r", "state": "s", "options": []}}\n'  # a request object (its options invalid)


LINE_BODIES: dict[str, tuple[Callable[[int], bytes], str]] = {
    # issue 35, item 4: a first value that does not parse, then a million lines that do not either (3 MB)
    "broken-lines": (lambda cap: b"x\n" + b"{]\n" * 999_000, "application/json"),
    # the same under the line cap, each line spelling a request key, so that none can be passed over unread
    "broken-lines-under-the-cap": (lambda cap: b"x\n" + b'{"decision": ]\n' * (cap - 1), "application/json"),
    # the same with one record at the end: every line before it is looked at
    "broken-lines-then-a-record": (lambda cap: b"x\n" + b'{"decision": ]\n' * (cap - 2) + LINE_RECORD,
                                   "application/json"),
    # 6 MiB of two-byte lines: 2 million lines, over the cap
    "6MiB-of-short-lines": (lambda cap: b"ab\n" * (2 * MIB), "application/jsonlines"),
    # records up to the cap (what a mini-batch of small records is), split and read one by one
    "records-at-the-cap": (lambda cap: LINE_RECORD * cap, "application/jsonlines"),
    # six records of 1 MiB
    "long-records": (lambda cap: (b'{"decision": {"state": "' + b"s" * (MIB - 30) + b'"}}\n') * 6,
                     "application/jsonlines"),
    # records, then blank lines to the end
    "records-then-blank-lines": (lambda cap: LINE_RECORD * 100 + b"\n" * (6 * MIB - 100 * len(LINE_RECORD)),
                                 "application/jsonlines"),
}


def split_lines(data: bytes, content_type: str, max_lines: int) -> str:
    """What ``/invocations`` does with ``data`` before any record is answered: the body to its records (each read,
    as ``batch.answer_lines`` reads them), or its refusal."""
    from decision_adapter.errors import ApiError, InputError
    from decision_adapter.server import bodies

    try:
        parsed = bodies.parse_invocation(data, lines=content_type == "application/jsonlines", max_lines=max_lines)
    except (ApiError, InputError) as exc:
        return f"400 {exc}"[:120]
    if parsed.records is None:
        return "one value"
    count = sum(1 for _ in parsed.records)
    return f"{count} records"


@dataclass
class LineOutcome:
    body: str
    content_type: str
    bytes: int
    result: str
    seconds: float  # in-process, best of three
    peak_mib: float  # in-process, tracemalloc's peak over what was allocated before
    peak_per_body: float
    live_status: int = 0
    live_seconds: float = 0.0
    live_ping_worst_s: float = 0.0


def measure_lines(max_lines: int, names: list[str]) -> list[LineOutcome]:
    """Each line body split in-process: the seconds (best of three) and tracemalloc's peak."""
    import gc
    import tracemalloc

    out = []
    for name in names:
        build, content_type = LINE_BODIES[name]
        data = build(max_lines)
        best = float("inf")
        for _ in range(3):
            gc.collect()
            started = time.perf_counter()
            result = split_lines(data, content_type, max_lines)
            best = min(best, time.perf_counter() - started)
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        split_lines(data, content_type, max_lines)
        peak = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
        out.append(LineOutcome(name, content_type, len(data), result, round(best, 4), round(peak / MIB, 2),
                               round(peak / len(data), 2)))
    return out


def live_lines(base: str, watch: "PingWatch", outcomes: list[LineOutcome], max_lines: int, timeout_s: float) -> None:
    """Each line body sent to ``/invocations`` of a live server: status, seconds, ``/ping``'s worst latency."""
    for outcome in outcomes:
        build, content_type = LINE_BODIES[outcome.body]
        data = build(max_lines)
        watch.reset()
        started = time.monotonic()
        try:
            status = requests.post(base + "/invocations", data=data, headers={"Content-Type": content_type},
                                   timeout=timeout_s).status_code
        except requests.RequestException:
            status = 0
        outcome.live_status, outcome.live_seconds = status, round(time.monotonic() - started, 3)
        outcome.live_ping_worst_s = round(watch.worst()[0], 3)


def lines_markdown(outcomes: list[LineOutcome], command: str, note: str = "") -> str:
    lines = [f"Reproduce: `{command}`{note}", "",
             "| body | bytes | what it is | in-process s | peak MiB (tracemalloc) | peak / body | live status | "
             "live s | /ping worst (s) |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for o in outcomes:
        live = (f"{o.live_status} | {o.live_seconds:.2f} | {o.live_ping_worst_s:.2f}" if o.live_status
                else "- | - | -")
        lines.append(f"| {o.body} | {o.bytes:,} | {o.result} | {o.seconds:.3f} | {o.peak_mib:.1f} | "
                     f"{o.peak_per_body:.2f} | {live} |")
    return "\n".join(lines) + "\n"


# ---- measuring a live server --------------------------------------------------------------------------------------

def worker_pid(master: int) -> int:
    """The one gunicorn worker of ``serve`` (its master's child)."""
    children = []
    for task in Path(f"/proc/{master}/task").iterdir():
        children += [int(c) for c in (task / "children").read_text().split()]
    if len(children) != 1:
        raise RuntimeError(f"serve {master} has {len(children)} workers, not one")
    return children[0]


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} for {pid}")


def reset_peak(pid: int) -> int:
    """Reset the high-water mark of ``pid``'s RSS to its current RSS; that RSS, in KiB."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return _status_kib(pid, "VmRSS")


def peak_kib(pid: int) -> int:
    return _status_kib(pid, "VmHWM")


class PingWatch:
    """Polls ``/ping`` every 50 ms in a thread; ``worst()`` is the slowest answer since ``reset()`` (a ping still
    waiting counts for as long as it has waited)."""

    def __init__(self, base: str):
        self.base = base
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._worst = 0.0
        self._failures = 0
        self._pending: float | None = None
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        session = requests.Session()
        while not self._stop.is_set():
            started = time.monotonic()
            with self._lock:
                self._pending = started
            try:
                ok = session.get(self.base + "/ping", timeout=30).status_code == 200
            except requests.RequestException:
                ok = False
            took = time.monotonic() - started
            with self._lock:
                self._pending = None
                self._worst = max(self._worst, took)
                self._failures += not ok
            self._stop.wait(0.05)

    def reset(self) -> None:
        with self._lock:
            self._worst, self._failures = 0.0, 0

    def worst(self) -> tuple[float, int]:
        with self._lock:
            waiting = time.monotonic() - self._pending if self._pending is not None else 0.0
            return max(self._worst, waiting), self._failures

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(35)


@dataclass
class Outcome:
    family: str
    size: str
    format: str
    encoding: str
    decoded_bytes: int
    sent_bytes: int
    status: int  # 0: no answer within the timeout
    seconds: float
    mb_per_s: float
    peak_rss_growth_mib: float
    ping_worst_s: float
    ping_failures: int
    worker_survived: bool
    message: str


def send_one(base: str, worker: int, watch: PingWatch, family: str, size_name: str, fmt: str, encoding: str,
             decoded: bytes, timeout_s: float) -> Outcome:
    envelope = ENVELOPES[fmt]
    data = encode(decoded, encoding)
    headers = {"Content-Type": envelope.content_type}
    if encoding != "identity":
        headers["Content-Encoding"] = encoding
    before = reset_peak(worker)
    watch.reset()
    started = time.monotonic()
    status, message = 0, "no answer within the timeout"
    try:
        response = requests.post(base + envelope.path, data=data, headers=headers, timeout=timeout_s)
        status, message = response.status_code, response.text[:200]
    except requests.RequestException as exc:
        message = f"{type(exc).__name__}: {exc}"[:200]
    seconds = time.monotonic() - started
    ping_worst, ping_failures = watch.worst()
    alive = Path(f"/proc/{worker}").exists()
    growth = (peak_kib(worker) - before) / 1024 if alive else float("nan")
    return Outcome(family, size_name, fmt, encoding, len(decoded), len(data), status, round(seconds, 3),
                   round(len(decoded) / MIB / seconds, 2) if seconds > 0 else 0.0, round(growth, 1),
                   round(ping_worst, 3), ping_failures, alive, message)


def run(start: Callable[[], tuple[str, int, Callable[[], None]]], *, families: list[str], sizes: list[str],
        formats: list[str] = list(FORMATS), encodings: list[str] = list(ENCODINGS), timeout_s: float = 60.0,
        report: Callable[[Outcome], None] = lambda o: None, fresh: bool = True) -> list[Outcome]:
    """Every variant against the server ``start()`` starts (its base URL, its master pid, how to stop it): a new
    one for each family when ``fresh``, and after a variant that got no answer or killed the worker."""
    base, master, stop = start()
    watch = PingWatch(base)
    outcomes = []
    try:
        for number, family in enumerate(families):
            if fresh and number:
                watch.stop()
                stop()
                base, master, stop = start()
                watch = PingWatch(base)
            for size_name in sizes:
                for fmt in formats:
                    decoded = body(family, fmt, SIZES[size_name])
                    for encoding in encodings:
                        worker = worker_pid(master)
                        outcome = send_one(base, worker, watch, family, size_name, fmt, encoding, decoded, timeout_s)
                        outcomes.append(outcome)
                        report(outcome)
                        if outcome.status == 0 or not outcome.worker_survived or not _answers(base):
                            watch.stop()
                            stop()
                            base, master, stop = start()
                            watch = PingWatch(base)
    finally:
        watch.stop()
        stop()
    return outcomes


def _answers(base: str) -> bool:
    try:
        return requests.get(base + "/ping", timeout=10).status_code == 200
    except requests.RequestException:
        return False


def summary(outcomes: list[Outcome]) -> list[dict]:
    """Per family and size: the slowest variant, the largest growth and ping latency, the statuses seen."""
    rows = []
    keys = dict.fromkeys((o.family, o.size) for o in outcomes)
    for family, size in keys:
        mine = [o for o in outcomes if (o.family, o.size) == (family, size)]
        slowest = max(mine, key=lambda o: (o.status == 0, o.seconds))
        rows.append({"family": family, "size": size, "variants": len(mine),
                     "slowest_s": slowest.seconds, "slowest": f"{slowest.format}/{slowest.encoding}",
                     "answered": all(o.status for o in mine),
                     "mb_per_s_of_slowest": slowest.mb_per_s,
                     "peak_rss_growth_mib": max(o.peak_rss_growth_mib for o in mine),
                     "ping_worst_s": max(o.ping_worst_s for o in mine),
                     "statuses": sorted({o.status for o in mine}),
                     "workers_killed": sum(not o.worker_survived for o in mine)})
    return rows


def markdown(rows: list[dict], command: str, note: str = "") -> str:
    lines = [f"Reproduce: `{command}`{note}", "",
             "| family | size | slowest of 9 variants | s | MB/s | peak RSS growth (MiB) | /ping worst (s) | statuses |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        seconds = f"{r['slowest_s']:.2f}" if r["answered"] else f"> {r['slowest_s']:.0f} (no answer)"
        killed = f", {r['workers_killed']} worker(s) lost" if r["workers_killed"] else ""
        lines.append(f"| {r['family']} | {r['size']} | {r['slowest']} | {seconds} | {r['mb_per_s_of_slowest']:.1f} | "
                     f"{r['peak_rss_growth_mib']:.0f} | {r['ping_worst_s']:.2f} | "
                     f"{', '.join(str(s or 'none') for s in r['statuses'])}{killed} |")
    return "\n".join(lines) + "\n"


# ---- many large bodies at once ---------------------------------------------------------------------------------------

@dataclass
class ConcurrentOutcome:
    family: str
    format: str
    copies: int
    statuses: list[int]  # sorted, distinct (0: no answer within the timeout)
    slowest_s: float
    ping_worst_s: float
    ping_failures: int


def send_concurrently(base: str, path: str, content_type: str, data: bytes, copies: int,
                      timeout_s: float) -> tuple[list[int], float]:
    """``copies`` posts of ``data`` started together: their statuses and the slowest one's seconds."""
    statuses, seconds = [0] * copies, [0.0] * copies
    start = threading.Barrier(copies)

    def post(i: int) -> None:
        start.wait()
        began = time.monotonic()
        try:
            statuses[i] = requests.post(base + path, data=data, headers={"Content-Type": content_type},
                                        timeout=timeout_s).status_code
        except requests.RequestException:
            statuses[i] = 0
        seconds[i] = time.monotonic() - began

    threads = [threading.Thread(target=post, args=(i,)) for i in range(copies)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return statuses, max(seconds)


def run_concurrent(base: str, watch: PingWatch, *, families: list[str], formats: list[str], copies: int,
                   timeout_s: float, report: Callable[[ConcurrentOutcome], None] = lambda o: None
                   ) -> list[ConcurrentOutcome]:
    outcomes = []
    for family in families:
        for fmt in formats:
            envelope = ENVELOPES[fmt]
            data = body(family, fmt, SIZES["6MiB"])
            watch.reset()
            statuses, slowest = send_concurrently(base, envelope.path, envelope.content_type, data, copies, timeout_s)
            ping_worst, failures = watch.worst()
            outcome = ConcurrentOutcome(family, fmt, copies, sorted(set(statuses)), round(slowest, 2),
                                        round(ping_worst, 3), failures)
            outcomes.append(outcome)
            report(outcome)
    return outcomes


def concurrent_markdown(outcomes: list[ConcurrentOutcome], command: str, note: str = "") -> str:
    copies = outcomes[0].copies if outcomes else 0
    lines = [f"`{command}`{note}", "",
             f"| family | format | statuses of {copies} at once | slowest (s) | /ping worst (s) | /ping failures |",
             "|---|---|---|---:|---:|---:|"]
    for o in outcomes:
        lines.append(f"| {o.family} | {o.format} | {', '.join(map(str, o.statuses))} | {o.slowest_s:.2f} | "
                     f"{o.ping_worst_s:.2f} | {o.ping_failures} |")
    worst = max(outcomes, key=lambda o: o.ping_worst_s)
    lines += ["", f"Worst `/ping`: {worst.ping_worst_s:.2f} s ({worst.family}, {worst.format})."]
    return "\n".join(lines) + "\n"


def main_concurrent(args: argparse.Namespace, argv: list[str] | None) -> int:
    from decision_adapter.decisions.model_files import embedded_model_dir

    from .servers import adapter_process

    args.out.mkdir(parents=True, exist_ok=True)
    provenance = Provenance("benchmarks.hostile", argv)

    def report(o: ConcurrentOutcome) -> None:
        print(f"{o.family:32} {o.format:9} {o.statuses} {o.slowest_s:6.2f} s ping {o.ping_worst_s:5.2f} s",
              file=sys.stderr, flush=True)

    with provenance:
        log = args.out / "hostile-adapter.log"
        with adapter_process(args.model_dir or str(embedded_model_dir()), args.threads, 0, log,
                             {"ADAPTER_DEBIAS": "off"}, provenance=provenance) as (base, _):
            watch = PingWatch(base)
            try:
                outcomes = run_concurrent(base, watch, families=args.families, formats=args.formats,
                                          copies=args.concurrent, timeout_s=args.timeout, report=report)
            finally:
                watch.stop()
    command = provenance.command
    (args.out / "concurrent.json").write_text(json.dumps({"command": command, "label": args.label,
                                                         "outcomes": [asdict(o) for o in outcomes],
                                                         "provenance": provenance.record()}, indent=1) + "\n")
    table = concurrent_markdown(outcomes, command, f" ({args.label})" if args.label else "")
    (args.out / "concurrent.md").write_text(table)
    print(table)
    return 1 if any(s == 0 or s >= 500 for o in outcomes for s in o.statuses) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hostile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", help="the model folder (default: the embedded model)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    parser.add_argument("--encodings", nargs="+", default=list(ENCODINGS), choices=list(ENCODINGS))
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a body may take before it counts as "
                                                                     "unanswered and the server is restarted")
    parser.add_argument("--label", default="", help="a note for the table (e.g. the commit measured)")
    parser.add_argument("--one-server", action="store_true", help="one server for every family (faster; memory "
                                                                   "earlier bodies left can hide a family's growth)")
    parser.add_argument("--out", type=Path, default=Path("benchmark-results"))
    parser.add_argument("--lines", nargs="*", choices=list(LINE_BODIES), metavar="BODY",
                        help="instead of the families: bodies of lines (all, or those named), split in-process "
                             "(seconds, tracemalloc's peak) and sent to a live server; writes lines.json, lines.md")
    parser.add_argument("--in-process", action="store_true", help="with --lines: no live server")
    parser.add_argument("--concurrent", type=int, metavar="N",
                        help="instead: N copies of each family's 6 MiB body at once, per format, to one server, "
                             "with /ping's worst latency; writes concurrent.json, concurrent.md")
    args = parser.parse_args(argv)
    if args.lines is not None:
        return main_lines(args, argv)
    if args.concurrent:
        return main_concurrent(args, argv)

    from decision_adapter.decisions.model_files import embedded_model_dir

    from .servers import adapter_process

    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = args.model_dir or str(embedded_model_dir())
    log = args.out / "hostile-adapter.log"
    provenance = Provenance("benchmarks.hostile", argv)

    def start() -> tuple[str, int, Callable[[], None]]:
        # The settings the tests use; no prior, so a body that is answered costs one prompt.
        context = adapter_process(model_dir, args.threads, 0, log, {"ADAPTER_DEBIAS": "off"}, provenance=provenance)
        base, process = context.__enter__()
        return base, process.pid, lambda: context.__exit__(None, None, None)

    def report(o: Outcome) -> None:
        print(f"{o.family:32} {o.size:6} {o.format:9} {o.encoding:8} {o.status:3} {o.seconds:7.2f} s "
              f"+{o.peak_rss_growth_mib:6.1f} MiB ping {o.ping_worst_s:5.2f} s", file=sys.stderr, flush=True)

    with provenance:
        outcomes = run(start, families=args.families, sizes=args.sizes, formats=args.formats,
                       encodings=args.encodings, timeout_s=args.timeout, report=report, fresh=not args.one_server)
    rows = summary(outcomes)
    command = provenance.command
    (args.out / "hostile.json").write_text(json.dumps({"command": command, "label": args.label, "summary": rows,
                                                      "outcomes": [asdict(o) for o in outcomes],
                                                      "provenance": provenance.record()}, indent=1) + "\n")
    table = markdown(rows, command, f" ({args.label})" if args.label else "")
    (args.out / "hostile.md").write_text(table)
    print(table)
    bad = [o for o in outcomes if not 200 <= o.status < 500 or not o.worker_survived]
    return 1 if bad else 0


def main_lines(args: argparse.Namespace, argv: list[str] | None) -> int:
    from decision_adapter.decisions.model_files import embedded_model_dir
    from decision_adapter.settings import Settings

    from .servers import adapter_process

    args.out.mkdir(parents=True, exist_ok=True)
    max_lines = Settings().max_lines
    provenance = Provenance("benchmarks.hostile", argv)
    with provenance:
        outcomes = measure_lines(max_lines, args.lines or list(LINE_BODIES))
        for o in outcomes:
            print(f"{o.body:28} {o.seconds:8.3f} s {o.peak_mib:7.1f} MiB  {o.result}", file=sys.stderr, flush=True)
        if not args.in_process:
            log = args.out / "hostile-adapter.log"
            with adapter_process(args.model_dir or str(embedded_model_dir()), args.threads, 0, log,
                                 {"ADAPTER_DEBIAS": "off"}, provenance=provenance) as (base, _):
                watch = PingWatch(base)
                try:
                    live_lines(base, watch, outcomes, max_lines, args.timeout)
                finally:
                    watch.stop()
    command = provenance.command
    (args.out / "lines.json").write_text(json.dumps({"command": command, "label": args.label, "max_lines": max_lines,
                                                    "outcomes": [asdict(o) for o in outcomes],
                                                    "provenance": provenance.record()}, indent=1) + "\n")
    table = lines_markdown(outcomes, command, f" ({args.label})" if args.label else "")
    (args.out / "lines.md").write_text(table)
    print(table)
    return 1 if any(o.live_status >= 500 for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
