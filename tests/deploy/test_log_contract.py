"""The log contract between the adapter and the stacks' metric filters, checked end to end.

The real adapter (llama.cpp on the embedded model, the logging that ``serve`` configures) answers a request, a
busy 503 (an admission refusal), a request whose scoring fails and one that runs into its deadline (a 503 too, but
a fault of the release); the JSON lines it really writes to stderr (what SageMaker ships to
CloudWatch Logs) are captured, and every metric filter the synthesized endpoint stacks contain is evaluated on
them with CloudWatch's JSON pattern semantics (filter_patterns.py). Each metric must count exactly its lines:
a renamed logger, message or field fails here, not silently in production.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from pathlib import Path

import pytest

import app as cdk_app
from decision_adapter import metric_logs
from decision_adapter.decisions.model_files import embedded_model_dir, find_gguf
from decision_adapter.engine.core import Engine
from decision_adapter.server import logs
from decision_adapter.server.app import create_app
from decision_adapter.settings import Settings
from decision_adapter.startup import engine_options
from deploy.pins import pinned_context
from filter_patterns import matches

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = json.loads((ROOT / "examples" / "support-route.json").read_text())
ADAPTER_STACKS = ("endpoint-cpu", "endpoint-gpu")
# The deadline of the late request, and how long its first decode is held up: longer than the deadline, and
# ending within the scheduler's grace after it, so the job reports what it computed.
DEADLINE_S = 1.5
SLOWED_STEP_S = 1.8


@pytest.fixture(scope="module")
def synthesized_filters(tmp_path_factory) -> dict[str, dict[str, tuple[str, str]]]:
    """{stack: {metric name: (filter pattern, metric value)}} of dev's adapter endpoint stacks, synthesized as app.py does."""
    outdir = tmp_path_factory.mktemp("cdk-dev")
    context = pinned_context(json.loads((ROOT / "cdk.json").read_text())["context"])
    cdk_app.build_app(context={**context, "env": "dev"}, outdir=str(outdir), cli_environment={}).synth()
    prefix = context["environments"]["dev"]["name_prefix"]
    found = {}
    for stack in ADAPTER_STACKS:
        template = json.loads((outdir / f"{prefix}-{stack}.template.json").read_text())
        found[stack] = {r["Properties"]["MetricTransformations"][0]["MetricName"]:
                        (r["Properties"]["FilterPattern"], r["Properties"]["MetricTransformations"][0]["MetricValue"])
                        for r in template["Resources"].values() if r["Type"] == "AWS::Logs::MetricFilter"}
    return found


@pytest.fixture(scope="module")
def engine():
    settings = Settings(model_dir=str(embedded_model_dir()), threads=2)
    with Engine(str(find_gguf(settings.model_dir)), engine_options(settings)) as real:
        yield settings, real


@contextlib.contextmanager
def adapter_logging():
    """The adapter's own logging configuration, as serve sets it up (JSON lines on stderr), undone afterwards for
    the other tests. Entered inside the test, so that its stderr is the one capfd captures."""
    root, adapter, llama = logging.getLogger(), logging.getLogger("decision_adapter"), logging.getLogger("llama_cpp")
    saved = root.handlers[:], root.level, adapter.level, llama.level
    logs.configure("info")
    try:
        yield
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        adapter.setLevel(saved[2])
        llama.setLevel(saved[3])


def test_each_metric_counts_exactly_the_lines_the_adapter_writes_for_its_event(synthesized_filters, engine, capfd):
    with adapter_logging():
        lines = _cause_each_event(*engine, capfd)
    events = [json.loads(line) for line in lines if line.startswith("{")]
    requests = {e["request_id"]: e for e in events
                if (e.get("logger"), e.get("message")) == (metric_logs.REQUEST.logger, metric_logs.REQUEST.message)}
    assert {rid: e["status"] for rid, e in requests.items()} == {"ok": 200, "busy": 503, "failed": 500, "late": 503}
    # Every request line carries the counts, so that a filter can test them for 0.
    assert all(e[field] == 0 for rid, e in requests.items() for field in metric_logs.COUNT_FIELDS
               if (rid, field) not in {("late", metric_logs.DEADLINE_MISSES_FIELD),
                                       ("failed", metric_logs.SCORING_FAILURES_FIELD)})
    assert requests["failed"][metric_logs.SCORING_FAILURES_FIELD] == 1
    # The successful request's own compute, and the late one's until it was stopped: the slow-release metrics sum
    # both, so a release too slow for its deadlines is measured on the jobs that ran into them.
    ok, late = requests["ok"], requests["late"]
    assert ok["evaluated_tokens"] >= metric_logs.MIN_TIMED_TOKENS and ok["compute_s"] > 0
    assert ok["compute_s"] == pytest.approx(ok["prefill_s"] + ok["readout_s"], abs=2e-6)
    assert late[metric_logs.DEADLINE_MISSES_FIELD] == 1
    assert late["evaluated_tokens"] >= metric_logs.MIN_TIMED_TOKENS and late["compute_s"] >= SLOWED_STEP_S
    timed = {json.dumps(ok), json.dumps(late)}
    by_line = {
        "Requests": {json.dumps(requests[rid]) for rid in ("ok", "busy", "failed", "late")},
        "BusyResponses": {json.dumps(requests["busy"])},
        "DeadlineMisses": {json.dumps(late)},
        "ScoringFailures": {json.dumps(e) for e in events if e.get("message") == "scoring failed"},
        "FailedRequests": {json.dumps(requests["failed"])},
        "ComputeSeconds": timed, "EvaluatedTokens": timed,
    }
    (failure,) = [e for e in events if e.get("message") == "scoring failed"]
    assert failure["request_id"] == "failed" and failure["level"] == "error"

    for stack, filters in synthesized_filters.items():
        assert set(filters) == set(by_line) == {m.metric_name for m in metric_logs.METRICS}, stack
        for metric, (pattern, value) in filters.items():
            counted = [line for line in lines if matches(pattern, line)]
            if value != "1":    # a sum of the lines' field: it must be a number in every line counted
                assert all(isinstance(json.loads(line)[value.removeprefix("$.")], (int, float)) for line in counted)
            assert {json.dumps(json.loads(line)) for line in counted} == by_line[metric], (stack, metric, pattern)
            assert len(counted) == len(by_line[metric])


def _cause_each_event(settings, real_engine, capfd) -> list[str]:
    """A request, a busy 503 and a scoring failure on the real adapter; the lines it wrote to stderr."""
    app = create_app(dataclasses.replace(settings, state_cache_mb=0), real_engine)
    client = app.test_client()
    capfd.readouterr()

    # 1. A request answered 200, its state long enough to evaluate more tokens than the slow-release metrics' least.
    long_state = {"decision": {**EXAMPLE["decision"], "state": " ".join([EXAMPLE["decision"]["state"]] * 6)}}
    assert client.post("/invocations", json=long_state, headers={"X-Request-Id": "ok"}).status_code == 200
    # 2. The busy 503: every admission place is taken, so the next request is turned away at once.
    admission = app.extensions["decision_adapter"].admission
    taken = 0
    while admission.try_enter():
        taken += 1
    try:
        busy = client.post("/invocations", json=EXAMPLE, headers={"X-Request-Id": "busy"})
    finally:
        for _ in range(taken):
            admission.leave()
    assert busy.status_code == 503 and busy.json["retryable"] is True
    # 3. A failure inside scoring: the engine's executor raises while this request is scored.
    run_step = real_engine.runner._executor.run_step

    def failing(step, memory, blobs, outcome):
        raise RuntimeError("injected failure")

    real_engine.runner._executor.run_step = failing
    try:
        poisoned = {"decision": {**EXAMPLE["decision"], "state": "A state no cache has seen."}}
        failed = client.post("/invocations", json=poisoned, headers={"X-Request-Id": "failed"})
    finally:
        real_engine.runner._executor.run_step = run_step
    assert failed.status_code == 500 and failed.json == {"error": "scoring failed"}
    app.extensions["decision_adapter"].close()  # its scheduler; the engine is the module's

    # 4. A deadline miss: a release slower than the speed admission measured at start-up. The request is admitted
    # (its tokens fit its deadline at that speed), then its first decode takes longer than the whole deadline.
    late_app = create_app(dataclasses.replace(settings, state_cache_mb=0, request_timeout_s=DEADLINE_S), real_engine)
    slowed = {"steps": 0}
    executor = real_engine.runner._executor
    decode = executor.decode

    def slow(step, reads):  # the decode itself is slow: compute is timed around the decodes alone
        decode(step, reads)
        slowed["steps"] += 1
        if slowed["steps"] == 1:
            time.sleep(SLOWED_STEP_S)

    executor.decode = slow
    try:
        unseen = {"decision": {**long_state["decision"], "state": "Another state. " + long_state["decision"]["state"]}}
        late = late_app.test_client().post("/invocations", json=unseen, headers={"X-Request-Id": "late"})
    finally:
        del executor.decode  # the class's own again
    assert late.status_code == 503 and late.json["retryable"] is True
    late_app.extensions["decision_adapter"].close()

    return [line for line in capfd.readouterr().err.splitlines() if line.strip()]


def test_the_filters_are_the_adapters_definitions(synthesized_filters):
    """The stacks do not spell a pattern themselves: each is rendered from metric_logs."""
    expected = {metric.metric_name: (metric.filter_pattern(), metric.metric_value()) for metric in metric_logs.METRICS}
    for filters in synthesized_filters.values():
        assert filters == expected
