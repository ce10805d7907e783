"""Concurrent serving on the real model: isolation, deadlines, faults, a load test and SIGTERM under load.

The servers are `serve` (gunicorn) on loopback with the embedded model; every comparison is with the same
request sent alone to a server started for it, and answers must agree bit for bit.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import random
import signal
import threading
import time

import pytest
import requests

from adapter_server import live_server
from decision_adapter.server.app import create_app

TICKETS = [
    "Charged twice for invoice 4471; the refund promised last week has not arrived.",
    "The app crashes when I upload a photo larger than 10 MB, since the update on Monday.",
    "Could you tell me whether the Pro plan includes single sign-on for 40 seats?",
]
TEAMS = {"Billing": "Payments, invoices, refunds", "Technical": "Bugs, outages, integrations", "Sales": None}


def decision(i: int, state: str, n_options: int = 3) -> dict:
    options = [{"id": f"o{j}", "description": f"Queue {j} for this kind of request."} for j in range(n_options)]
    return {"id": f"d{i}", "state": state, "question": f"Which queue, variant {i}?", "options": options}


def mixed_requests(rng: random.Random, n: int) -> list[tuple[str, dict]]:
    """Single decisions, shared-state requests, 30 options (two-token labels) and System One bodies, over a
    few states, so that later requests hit the cache of earlier ones."""
    out = []
    for i in range(n):
        state = f"{rng.choice(TICKETS)} Case {rng.randrange(3)}."
        kind = rng.choice(["single", "shared", "many", "systemone"])
        if kind == "single":
            out.append(("/invocations", {"decision": decision(i, state)}))
        elif kind == "shared":
            out.append(("/invocations", {"decisions": [decision(10 * i + k, state) for k in range(3)]}))
        elif kind == "many":
            out.append(("/invocations", {"decision": decision(i, state, n_options=30)}))
        else:
            out.append(("/v1/systemone", {"model": "jev-latest", "state": state, "questions": {
                "team": {"type": "choice", "instructions": "Which team?", "criteria": TEAMS},
                "refund": {"type": "noul", "instructions": "Is a refund asked for?"}}}))
    return out


def answers(body: dict) -> object:
    """What must not change: the probabilities and the option logits, nothing about timing or the cache."""
    if "result" in body:
        return body["result"]["probabilities"], body["result"]["option_logits"]
    if "results" in body:
        return [(r["probabilities"], r["option_logits"]) for r in body["results"]]
    return body["answers"]


@pytest.fixture(scope="module")
def servers(settings):
    with live_server(settings.model_dir, ADAPTER_REQUEST_TIMEOUT_S="600") as busy, \
            live_server(settings.model_dir, ADAPTER_STATE_CACHE_MB="0") as alone:
        yield busy[0], alone[0]


def test_answers_under_concurrent_mixes_equal_each_request_alone_on_a_fresh_server(servers):
    busy, alone = servers
    rng = random.Random(20261201)
    requests_ = mixed_requests(rng, 16)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        loaded = list(pool.map(lambda r: requests.post(busy + r[0], json=r[1], timeout=120), requests_))
    for (path, body), response in zip(requests_, loaded):
        assert response.status_code == 200, response.text
        reference = requests.post(alone + path, json=body, timeout=120)
        assert reference.status_code == 200
        assert answers(response.json()) == answers(reference.json()), (path, body)
    cached = [r.json().get("x_cached_tokens", r.json().get("timing", {}).get("cached_tokens")) for r in loaded]
    cached += [r.json().get("result", {}).get("timing", {}).get("cached_tokens") for r in loaded]
    assert any(c for c in cached if c), "some requests were served from the state cache"


def test_a_request_that_can_never_fit_its_deadline_gets_a_400_at_once_and_the_model_goes_on(settings, example):
    """Eight decisions over a ~3,000-token state: tens of seconds of decoding on two cores, against a deadline of
    2 s. A 503 would say "retry", and every retry would fail the same way: the answer is a 400 at once, with what
    the request needs and what the endpoint allows, and the model is free for the next request. (A job that runs
    into its deadline is stopped inside llama_decode: test_adapter_limits.py, test_adapter_outlook.py.)"""
    state = " ".join(f"Line {i}: the customer reports problem number {i}." for i in range(240))
    long = {"decisions": [decision(i, state) for i in range(8)]}
    with live_server(settings.model_dir, ADAPTER_REQUEST_TIMEOUT_S="2", ADAPTER_BATCH_TOKENS="64") as (base, _):
        started = time.monotonic()
        response = requests.post(f"{base}/invocations", json=long, timeout=60)
        answered = time.monotonic()
        assert response.status_code == 400 and "retryable" not in response.json(), response.text
        assert response.json()["error"].startswith("decisions needs ") and "a request here may take 2 s" in \
            response.json()["error"]
        assert answered - started < 6, "answered at once, not at the deadline or when the work would end"
        after = requests.post(f"{base}/invocations", json=example, timeout=60)
        assert after.status_code == 200, "the model is free"
        full = requests.post(f"{base}/invocations", json={"decision": long["decisions"][0]}, timeout=60)
        assert full.status_code == 400, "a single decision over the same state does not fit the deadline either"
        assert full.json()["error"].startswith("decision needs ")


def test_a_job_that_fails_in_the_executor_fails_only_its_own_request(settings, engine, example):
    app = create_app(dataclasses.replace(settings, state_cache_mb=0), engine)
    model = app.extensions["decision_adapter"].readiness.model
    poison = engine.vocabulary.tokenize("POISONED")
    run_step = engine.runner._executor.run_step

    def failing(step, memory, blobs, outcome):
        tokens = [t for c in getattr(step, "chunks", ()) for t in c.tokens]
        if any(tokens[i:i + len(poison)] == poison for i in range(len(tokens))):
            raise RuntimeError("injected failure")
        return run_step(step, memory, blobs, outcome)

    engine.runner._executor.run_step = failing
    try:
        bodies = [example, {"decision": {**example["decision"], "state": "POISONED state"}}, example]
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            responses = list(pool.map(lambda b: app.test_client().post("/invocations", json=b), bodies))
        assert [r.status_code for r in responses] == [200, 500, 200]
        assert responses[1].get_json() == {"error": "scoring failed"}
        assert responses[0].get_json()["result"]["probabilities"] == responses[2].get_json()["result"]["probabilities"]
        assert app.test_client().post("/invocations", json=example).status_code == 200
    finally:
        engine.runner._executor.run_step = run_step
    assert model.scheduler.in_flight == 0


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def test_32_clients_for_30_seconds_get_only_right_answers_and_retryable_503s(settings):
    rng = random.Random(7)
    bodies = [{"decision": decision(i, f"{rng.choice(TICKETS)} Ticket {i}.")} for i in range(12)]
    with live_server(settings.model_dir, ADAPTER_STATE_CACHE_MB="0") as (base, process):
        expected = [answers(requests.post(f"{base}/invocations", json=b, timeout=60).json()) for b in bodies]
        statuses: dict[int, int] = {}
        wrong, missing_retry_after = [], []
        rss: list[tuple[float, int]] = []
        # 30 s: three times the 10 s windows the memory check compares, hundreds of requests on two cores
        stop = time.monotonic() + 30
        lock = threading.Lock()

        def client(seed: int) -> None:
            local = random.Random(seed)
            session = requests.Session()
            while time.monotonic() < stop:
                i = local.randrange(len(bodies))
                response = session.post(f"{base}/invocations", json=bodies[i], timeout=60)
                with lock:
                    statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                    if response.status_code == 200 and answers(response.json()) != expected[i]:
                        wrong.append(i)
                    if response.status_code == 503 and not response.headers.get("Retry-After"):
                        missing_retry_after.append(response.text)
                if response.status_code == 503:
                    time.sleep(float(response.headers.get("Retry-After", 1)) * local.random())

        threads = [threading.Thread(target=client, args=(seed,)) for seed in range(32)]
        for thread in threads:
            thread.start()
        while time.monotonic() < stop:
            rss.append((time.monotonic(), rss_kib(process.pid)))
            time.sleep(1)
        for thread in threads:
            thread.join(90)

    # Throughput is a benchmark (benchmarks.concurrency); here the model must only keep answering.
    assert set(statuses) <= {200, 503} and statuses.get(200, 0) >= 3, statuses
    assert not wrong and not missing_retry_after
    first = max(kib for t, kib in rss if t < rss[0][0] + 10)
    last = max(kib for t, kib in rss if t > rss[-1][0] - 10)
    assert last <= first * 1.05, f"resident memory grew from {first} to {last} KiB"


def test_sigterm_under_load_finishes_the_requests_in_flight_and_exits_0(settings):
    """SIGTERM while eight requests are in flight (the server's own count, /ping's admitted, says so: no guess at
    how long a busy machine takes to get them there): those eight are answered, later ones are refused or get a
    retryable 503, and the worker exits 0 within its graceful timeout."""
    in_flight = 8
    bodies = [{"decision": decision(i, f"{TICKETS[i % 3]} Shutdown case {i}.")} for i in range(40)]
    with live_server(settings.model_dir, ADAPTER_GRACEFUL_TIMEOUT_S="120", ADAPTER_REQUEST_TIMEOUT_S="300") \
            as (base, process):
        results: list[tuple[bool, object]] = []
        signalled = threading.Event()

        def call(body):
            before = not signalled.is_set()
            try:
                response = requests.post(f"{base}/invocations", json=body, timeout=300)
                results.append((before, (response.status_code, response.headers.get("Retry-After"))))
            except requests.ConnectionError:
                results.append((before, "refused"))

        with concurrent.futures.ThreadPoolExecutor(in_flight) as pool:
            futures = [pool.submit(call, body) for body in bodies[:in_flight]]
            waited = time.monotonic() + 120
            while requests.get(f"{base}/ping", timeout=30).json().get("admitted", 0) < in_flight:
                assert time.monotonic() < waited, "the requests were never all admitted"
                time.sleep(0.02)
            signalled.set()
            process.send_signal(signal.SIGTERM)
            futures += [pool.submit(call, body) for body in bodies[in_flight:]]
            concurrent.futures.wait(futures, timeout=300)
        exit_code = process.wait(150)

    assert exit_code == 0
    answered = [outcome for _, outcome in results if outcome != "refused"]
    assert all(status == 200 or (status == 503 and retry_after) for status, retry_after in answered), results
    admitted_before = [outcome for before, outcome in results if before]
    assert len(admitted_before) == in_flight and all(o == (200, None) for o in admitted_before), \
        f"every request in flight at the signal is answered: {admitted_before}"
