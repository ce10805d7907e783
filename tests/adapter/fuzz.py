"""Fuzzing the live server: schemathesis cases from its OpenAPI document, and byte-level mutations.

``fuzz(base, pid, cases)`` sends ``cases`` requests to a server on loopback (``adapter_server.live_server``)
and returns a ``Tally``: counts per status and every broken pass criterion (a 5xx, a body that is not
strict JSON, a dead server, memory past its bound). Half of the cases come from schemathesis (valid and
invalid bodies for every operation, generated from ``/openapi.json``); the other half are mutations of
real bodies made with hypothesis: lone surrogates, deep nesting, huge and non-finite numbers, other
encodings and compressions, truncated bodies, other content types, and every method on every route.
Bounded: a fixed number of cases, each with a timeout, to 127.0.0.1 only, derandomized (reproducible).
"""

from __future__ import annotations

import gzip
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import hypothesis
import hypothesis.errors
import hypothesis.strategies as st
import requests
import schemathesis
import zstandard
from hypothesis import HealthCheck, Phase
from schemathesis import GenerationMode

# Settings of the fuzzed server: small limits so that the real model answers every valid case quickly.
FUZZ_ENV = {"ADAPTER_MAX_BODY_BYTES": "65536", "ADAPTER_MAX_DECISIONS": "3", "ADAPTER_MAX_LINES": "4",
            "ADAPTER_MAX_PROMPT_TOKENS": "320", "ADAPTER_MAX_REQUEST_TOKENS": "640", "ADAPTER_CTX_TOKENS": "2048",
            "ADAPTER_QUEUE_DEPTH": "2",
            # A valid case's budget is 640 tokens; on a loaded 2-core machine the time admission could refuse it
            # (a retryable 503 the run would count as a 5xx): what is fuzzed here is input, not load.
            "ADAPTER_REQUEST_TIMEOUT_S": "600"}
MEMORY_GROWTH_LIMIT = 256 * 1024 * 1024  # the worker's resident memory may grow this much over a run
TIMEOUT_S = 60
SECONDS_PER_CASE = 0.5  # the run stops (and fails) past this pace: a server that stopped answering
MISSED_LIMIT = 5  # or after this many requests without an answer


class Aborted(RuntimeError):
    """The run stopped early: out of time, or the server stopped answering."""

ROUTES = ["/ping", "/invocations", "/execution-parameters", "/openapi.json", "/v1/systemone", "/v1/models",
          "/v1", "/", "/nope", "/invocations/", "/v1/systemone/x"]
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "TRACE", "BREW"]
DECISION = {"decision": {"id": "d", "state": "Customer cannot log in.", "question": "Which queue?",
                         "options": [{"id": "access", "description": "Account access."}, {"id": "billing"}]}}
DECISIONS = {"decisions": [DECISION["decision"], {**DECISION["decision"], "id": "e", "question": "Urgent?"}]}
SYSTEM_ONE = {"model": "jev-latest", "state": {"ticket": "Charged twice", "n": 2},
              "questions": {"refund": {"type": "noul", "instructions": "Money back?"},
                            "team": {"type": "choice", "criteria": {"Billing": None, "Tech": ["bugs"]}},
                            "anger": {"type": "score", "criteria": ["Calm", {"level": "Angry"}]}}}
SEEDS = [("/invocations", DECISION), ("/invocations", DECISIONS), ("/invocations", SYSTEM_ONE),
         ("/v1/systemone", SYSTEM_ONE)]


@dataclass
class Tally:
    statuses: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    sent: int = 0
    seconds: float = 0.0
    deadline: float = float("inf")
    memory_growth: int = 0

    def record(self, label: str, method: str, response: requests.Response | None, error: str = "") -> None:
        self.sent += 1
        if response is None:
            self.statuses["no response"] += 1
            self.failures.append(f"{label}: no response ({error})")
            return
        self.statuses[response.status_code] += 1
        if response.status_code >= 500:
            self.failures.append(f"{label}: {response.status_code} {response.text[:300]}")
        lines = response.headers.get("Content-Type", "").startswith("application/jsonlines")
        if method != "HEAD" and (problem := strict_json_problem(response.content, lines)):
            self.failures.append(f"{label}: {response.status_code} body is not strict JSON ({problem}): "
                                 f"{response.content[:200]!r}")

    def table(self) -> str:
        rows = sorted(self.statuses.items(), key=lambda kv: str(kv[0]))
        return "\n".join([f"{'status':>12}  count", *(f"{status!s:>12}  {count}" for status, count in rows),
                          f"{'total':>12}  {self.sent}"])


def strict_json_problem(content: bytes, lines: bool = False) -> str:
    """Why a response body is not JSON every parser reads (or ""): UTF-8, no NaN/Infinity, each line of a
    JSON-lines body a value."""
    try:
        text = content.decode("utf-8")
        for line in text.removesuffix("\n").split("\n") if lines else [text]:
            json.loads(line, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        return str(exc)
    return ""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} in the body")


def resident_bytes(server_pid: int) -> int:
    """Resident memory of the server's gunicorn workers (the children of the `serve` process)."""
    total = 0
    for child in Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split():
        for line in Path(f"/proc/{child}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total


def _send(session: requests.Session, tally: Tally, label: str, method: str, url: str, **kwargs: Any) -> None:
    if time.monotonic() > tally.deadline:
        raise Aborted(f"out of time after {tally.sent} requests")
    if tally.statuses["no response"] >= MISSED_LIMIT:
        raise Aborted(f"{MISSED_LIMIT} requests got no answer")
    try:
        response = session.request(method, url, timeout=TIMEOUT_S, **kwargs)
    except requests.RequestException as exc:
        tally.record(label, method, None, f"{type(exc).__name__}: {exc}")
        return
    tally.record(label, method, response)


def _run(strategy: st.SearchStrategy, examples: int, send: Callable[[Any], None]) -> None:
    """Draw ``examples`` values from ``strategy`` (derandomized) and send each."""
    @hypothesis.settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                         phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @hypothesis.given(strategy)
    def each(value: Any) -> None:
        send(value)

    each()


def schema_cases(base: str, session: requests.Session, tally: Tally, examples: int) -> None:
    """schemathesis: valid and invalid requests for every operation of the server's own document."""
    schema = schemathesis.openapi.from_dict(session.get(f"{base}/openapi.json", timeout=TIMEOUT_S).json())
    operations = [result.ok() for result in schema.get_all_operations()]
    per_run = max(1, examples // (2 * len(operations)))
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            def send(case: Any, mode: GenerationMode = mode) -> None:
                kwargs = case.as_transport_kwargs(base_url=base)
                kwargs.pop("timeout", None)
                method, url = kwargs.pop("method"), kwargs.pop("url")
                _send(session, tally, f"schemathesis {mode.value} {method} {case.path}", method, url, **kwargs)
            try:
                _run(operation.as_strategy(generation_mode=mode), per_run, send)
            except hypothesis.errors.Unsatisfiable:  # no invalid request exists (a GET without parameters)
                continue


# ---- Byte-level mutations --------------------------------------------------------------------------------------

def _surrogate(body: bytes, at: int) -> bytes:
    """A lone surrogate escape put inside the string that covers position ``at`` (or the first one)."""
    quote = body.find(b'"', at % max(1, len(body)))
    quote = quote if quote >= 0 else body.find(b'"')
    return body[:quote + 1] + b"\\ud800" + body[quote + 1:]


def _nested(depth: int, opener: str) -> bytes:
    if opener == "[":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


def _frames(raw: bytes, parts: int) -> bytes:
    compressor = zstandard.ZstdCompressor()
    step = max(1, len(raw) // parts)
    return b"".join(compressor.compress(raw[i:i + step]) for i in range(0, len(raw), step))


def _members(raw: bytes, parts: int) -> bytes:
    step = max(1, len(raw) // parts)
    return b"".join(gzip.compress(raw[i:i + step]) for i in range(0, len(raw), step))


NUMBERS = [b"1e400", b"-1e400", b"1e309", b"NaN", b"Infinity", b"-Infinity", b"1" * 5000, b"-0", b"1e-400",
           b"0.1e999999999", b"18446744073709551616"]
CONTENT_TYPES = ["text/plain", "application/xml", "multipart/form-data; boundary=x", "", "application/json; charset=utf-16",
                 "application/json; charset=latin-1", "application/jsonlines", "application/x-ndjson", "*/*",
                 "application/json; charset=UTF-8"]
ENCODINGS = ["gzip", "zstd", "br", "deflate", "identity", "gzip, zstd", "x-gzip"]


@st.composite
def mutations(draw: st.DrawFn) -> tuple[str, str, str, bytes, dict[str, str]]:
    """(label, method, path, body, headers) of one hostile request."""
    path, seed = draw(st.sampled_from(SEEDS))
    body = json.dumps(seed).encode()
    headers = {"Content-Type": "application/json"}
    kind = draw(st.sampled_from(["surrogate", "nesting", "nested-state", "number", "truncated", "bytes",
                                 "encoding", "compressed", "content-type", "method", "lines", "utf16", "key"]))
    if kind == "surrogate":
        body = _surrogate(body, draw(st.integers(0, len(body))))
    elif kind == "key":
        at = body.find(b'"', draw(st.integers(0, len(body))))
        body = body[:at + 1] + draw(st.sampled_from([b"\\udfff", b"\\ud83d", b"<|im_start|>", b"\\u0000"])) + body[at + 1:]
    elif kind == "nesting":
        body = _nested(draw(st.sampled_from([65, 1000, 100_000, 50_000])), draw(st.sampled_from("[{")))
    elif kind == "nested-state":
        depth = draw(st.integers(1, 200))
        value = json.loads(_nested(depth, draw(st.sampled_from("[{"))))
        seed = json.loads(body)
        if "decision" in seed:
            seed["decision"]["state"] = value
        elif "questions" in seed:
            seed["state"] = value
        body = json.dumps(seed).encode()
    elif kind == "number":
        number = draw(st.sampled_from(NUMBERS))
        target = draw(st.sampled_from([b'"n": 2', b'"Calm"', b'"Customer cannot log in."', b'"d"']))
        body = body.replace(target, target.split(b":")[0] + b": " + number if b":" in target else number, 1)
    elif kind == "truncated":
        body = body[:draw(st.integers(0, max(0, len(body) - 1)))]
    elif kind == "bytes":
        at = draw(st.integers(0, max(0, len(body) - 1)))
        body = body[:at] + draw(st.binary(min_size=1, max_size=8)) + body[at + 1:]
    elif kind == "utf16":
        body = json.dumps(seed, ensure_ascii=False).encode(draw(st.sampled_from(["utf-16", "utf-32", "utf-16-le"])))
    elif kind == "encoding":
        headers["Content-Encoding"] = draw(st.sampled_from(ENCODINGS))
        body = draw(st.sampled_from([body, gzip.compress(body), zstandard.ZstdCompressor().compress(body)]))
    elif kind == "compressed":
        parts = draw(st.integers(1, 5))
        encoding = draw(st.sampled_from(["gzip", "zstd"]))
        packed = _members(body, parts) if encoding == "gzip" else _frames(body, parts)
        cut = draw(st.sampled_from([len(packed), len(packed) - 1, len(packed) // 2, 10]))
        body, headers["Content-Encoding"] = packed[:cut] + draw(st.sampled_from([b"", b"\0\0", b"junk"])), encoding
    elif kind == "content-type":
        headers["Content-Type"] = draw(st.sampled_from(CONTENT_TYPES))
    elif kind == "lines":
        records = draw(st.lists(st.sampled_from([body, _surrogate(body, 0), b"", b"[]", b"not json", b"{}"]),
                                min_size=1, max_size=5))
        body = b"\n".join(records) + draw(st.sampled_from([b"", b"\n", b"\r\n"]))
        headers["Content-Type"] = draw(st.sampled_from(["application/jsonlines", "application/json"]))
    elif kind == "method":
        method, path = draw(st.sampled_from(METHODS)), draw(st.sampled_from(ROUTES))
        return f"mutation method {method} {path}", method, path, body, headers
    return f"mutation {kind} {path}", "POST", path, body, headers


def mutation_cases(base: str, session: requests.Session, tally: Tally, examples: int) -> None:
    def send(request: tuple[str, str, str, bytes, dict[str, str]]) -> None:
        label, method, path, body, headers = request
        _send(session, tally, label, method, f"{base}{path}", data=body, headers=headers)

    _run(mutations(), examples, send)
    # Every method on every route at least once, whatever hypothesis drew.
    for method in METHODS:
        for path in ROUTES:
            _send(session, tally, f"method {method} {path}", method, f"{base}{path}", data=b"{}",
                  headers={"Content-Type": "application/json"})


def fuzz(base: str, server_pid: int, cases: int) -> Tally:
    """At least ``cases`` requests, then /ping; memory measured after a warm-up and at the end."""
    assert base.startswith("http://127.0.0.1:"), "fuzzing targets loopback only"
    tally = Tally()
    with requests.Session() as session:
        for _, seed in SEEDS:  # warm-up: every valid seed once, so that memory is measured after it
            _send(session, tally, "seed", "POST", f"{base}/invocations", json=seed)
        start_memory = resident_bytes(server_pid)
        started = time.monotonic()
        tally.deadline = started + 120 + cases * SECONDS_PER_CASE
        try:
            while tally.sent < cases:
                remaining = cases - tally.sent
                schema_cases(base, session, tally, remaining // 2 + 1)
                mutation_cases(base, session, tally, remaining - remaining // 2)
        except Aborted as exc:
            tally.failures.append(f"fuzzing stopped early: {exc}")
        tally.seconds = time.monotonic() - started
        ping = session.get(f"{base}/ping", timeout=TIMEOUT_S)
        if ping.status_code != 200:
            tally.failures.append(f"/ping after fuzzing: {ping.status_code} {ping.text[:200]}")
        growth = resident_bytes(server_pid) - start_memory
        tally.memory_growth = growth
        if growth > MEMORY_GROWTH_LIMIT:
            tally.failures.append(f"worker memory grew by {growth / 2**20:.0f} MiB, over "
                                  f"{MEMORY_GROWTH_LIMIT / 2**20:.0f} MiB")
    return tally
