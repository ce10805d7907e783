"""The dry run (``"x_dry_run": true`` on both protocols, on ``/invocations`` too): what a request would do, decoding
nothing, with the figures the real run then reports.

On the real embedded model: a dry run, then the same request for real, then both again once everything is cached,
a new question over the cached state, and a state that grew (a cached prefix); debias on (prior jobs) and two
orderings, and labels of several tokens (readout tokens). The prompts' texts hash to the answers'
``prompt_sha256``. A request refused for its content is refused the same way in a dry run; admission's refusals
(busy, too large) are reported with the status and body the real request gets.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
import time
import uuid

import pytest

from adapter_fakes import FakeEngine, fake_model_dir
from decision_adapter.server.app import create_app

OPTIONS = [{"id": "billing", "description": "Payments, invoices and refunds."},
           {"id": "tech", "description": "Bugs, outages and integrations."},
           {"id": "sales", "description": "Questions before a purchase."}]
MANY = [{"id": f"o{i}", "description": f"Queue number {i}."} for i in range(30)]  # labels of two tokens


def state() -> str:
    """A state no earlier request sent: nothing of it is cached."""
    return f"Ticket {uuid.uuid4().hex[:8]}: the customer says the March invoice charged the annual plan twice."


def walkthrough(text: str, question: str = "Which team should handle this?") -> dict:
    return {"decisions": [
        {"id": "route", "state": text, "question": question, "options": OPTIONS, "permutations": 2,
         "debias": "empty"},
        {"id": "queue", "state": text, "question": "Which queue?", "options": MANY, "permutations": 2,
         "debias": "empty"}]}


def system_one(text: str, question: str = "Which team should handle this?") -> dict:
    return {"model": "jev-latest", "state": text, "x_permutations": 2, "x_debias": "empty", "questions": {
        "team": {"type": "choice", "instructions": question,
                 "criteria": {o["id"]: o["description"] for o in OPTIONS}},
        "refund": {"type": "noul", "instructions": "Does the customer want a refund?"},
        "queue": {"type": "choice", "instructions": "Which queue?",
                  "criteria": {o["id"]: o["description"] for o in MANY}}}}


def post(client, route: str, body, **headers):
    return client.post(route, data=json.dumps(body), content_type="application/json", headers=headers)


def dry(body: dict) -> dict:
    return {**body, "x_dry_run": True}


@pytest.fixture
def fresh(settings, engine):
    """An app over the session's engine whose cache starts empty (the resident head is primed again)."""
    app = create_app(settings, engine)
    return app.test_client()


def real_figures(protocol: str, body: dict) -> dict:
    """The figures a real answer reports, under the dry run's names."""
    if protocol == "decisions":
        timing = body["timing"]
        return {"cached_tokens": timing["cached_tokens"], "decode_tokens": timing["evaluated_tokens"],
                "prior_tokens": timing["prior_tokens"],
                "prompt_tokens": sum(r["input_tokens"] for r in body["results"])}
    return {"cached_tokens": body["x_cached_tokens"], "x_evaluated_tokens": body["x_evaluated_tokens"],
            "prior_tokens": body["x_prior_tokens"], "prompt_tokens": body["usage"]["input_tokens"]}


def dry_figures(protocol: str, report: dict) -> dict:
    out = {"cached_tokens": report["cached_tokens"], "prior_tokens": report["prior_tokens"],
           "prompt_tokens": report["prompt_tokens"]}
    if protocol == "decisions":
        return {**out, "decode_tokens": report["decode_tokens"]}
    return {**out, "x_evaluated_tokens": report["decode_tokens"]}


def questions(protocol: str, report: dict) -> dict[str, dict]:
    return {d["id"]: d for d in report["decisions"]} if protocol == "decisions" else report["questions"]


def answers(protocol: str, body: dict) -> dict[str, tuple[str, int]]:
    """Each question's (prompt_sha256, input_tokens) in a real answer."""
    if protocol == "decisions":
        return {r["id"]: (r["prompt_sha256"], r["input_tokens"]) for r in body["results"]}
    # System One reports input tokens for the whole request only
    return {qid: (a["x_prompt_sha256"], None) for qid, a in body["answers"].items()}


def check_prompts(protocol: str, report: dict, answer: dict) -> None:
    """The dry run's texts are the exact prompts the answer hashed, one per ordering, with their token counts."""
    for qid, question in questions(protocol, report).items():
        texts = [p["text"] for p in question["prompts"]]
        assert len(texts) == 2, "two orderings"
        assert hashlib.sha256("\0".join(texts).encode("utf-8")).hexdigest() == question["prompt_sha256"]
        sha, input_tokens = answers(protocol, answer)[qid]
        assert question["prompt_sha256"] == sha
        assert question["input_tokens"] == sum(p["tokens"] for p in question["prompts"])
        if input_tokens is not None:
            assert question["input_tokens"] == input_tokens
        for p in question["prompts"]:
            assert len(p["options"]) == len(set(p["options"])) >= 2


def run(client, route: str, protocol: str, body: dict) -> tuple[dict, dict]:
    """A dry run, then the same request for real: (the dry run's report, the real answer)."""
    dry_response = post(client, route, dry(body))
    assert dry_response.status_code == 200, dry_response.get_json()
    report = dry_response.get_json()["dry_run" if protocol == "decisions" else "x_dry_run"]
    assert report["admitted"] is True and report["status"] == 200 and "refusal" not in report
    real = post(client, route, body)
    assert real.status_code == 200, real.get_json()
    return report, real.get_json()


@pytest.mark.parametrize("route, protocol, make", [
    ("/invocations", "decisions", walkthrough),
    ("/v1/systemone", "systemone", system_one),
    ("/invocations", "systemone", system_one),  # SageMaker routes only /invocations
])
def test_a_dry_run_reports_what_the_real_run_then_does(fresh, route, protocol, make):
    text = state()
    body = make(text)
    # Fresh: nothing of the state, the answers or the priors is cached.
    report, answer = run(fresh, route, protocol, body)
    assert dry_figures(protocol, report) == real_figures(protocol, answer)
    assert report["cached_tokens"] == 0 and report["prior_tokens"] > 0 and report["readout_tokens"] > 0
    assert report["decode_tokens"] > report["prior_tokens"] + report["readout_tokens"]
    assert report["tokens_per_s"] > 0, "the start-up probe measured the speed"
    # The estimate is the cost model's (engine/cost.py), fitted to the jobs run so far: on the probe's jobs alone it
    # is close to the mean speed's reckoning, never an order of magnitude away.
    by_speed = (report["queued_tokens"] + report["decode_tokens"]) / report["tokens_per_s"]
    assert 0.2 * by_speed < report["estimate_s"] < 5 * by_speed
    check_prompts(protocol, report, answer)
    assert report["prompt_tokens"] == sum(q["input_tokens"] for q in questions(protocol, report).values())

    # The same request again: everything is cached, nothing would be decoded, and nothing is.
    again, repeat = run(fresh, route, protocol, body)
    assert dry_figures(protocol, again) == real_figures(protocol, repeat)
    assert again["decode_tokens"] == 0 and again["prior_tokens"] == 0 and again["estimate_s"] == 0
    assert again["cached_tokens"] == report["prompt_tokens"] - answer_head_tokens(fresh, report)
    check_prompts(protocol, again, repeat)

    # Another question over the cached state: the state is served, the question decoded, its prior too.
    other = make(text, "Which team should answer the customer first?")
    third, answer3 = run(fresh, route, protocol, other)
    assert dry_figures(protocol, third) == real_figures(protocol, answer3)
    assert third["cached_tokens"] > 0 and third["decode_tokens"] > third["prior_tokens"] > 0


@pytest.mark.parametrize("route, protocol", [("/invocations", "decisions"), ("/invocations", "systemone")])
def test_a_dry_run_over_a_state_that_grew_counts_the_prefix_the_cache_serves(fresh, route, protocol):
    """An agent's log that grew by a few lines: the dry run counts the cached prefix (up to one of the state's
    micro-batch boundaries) as the real run then does, and only the rest as decoded."""
    log = "\n".join(f"{i:03d} {uuid.uuid4().hex[:6]} the agent read the ticket and updated its notes." for i in range(60))
    make = walkthrough if protocol == "decisions" else system_one
    run(fresh, route, protocol, make(log))
    grown = make(log + "\n060 the customer replied that the charge is still there.")
    report, answer = run(fresh, route, protocol, grown)
    assert dry_figures(protocol, report) == real_figures(protocol, answer)
    assert report["cached_tokens"] >= 512, "the state's first micro-batch came from the cache"


def answer_head_tokens(client, report: dict) -> int:
    """The resident head's tokens in every prompt of the report (never counted as cached)."""
    engine = client.application.extensions["decision_adapter"].readiness.model.engine
    return engine.resident_tokens * sum(len(q["prompts"]) for q in
                                        (report.get("decisions") or list(report["questions"].values())))


def test_a_dry_run_decodes_nothing_and_caches_nothing(fresh):
    model = fresh.application.extensions["decision_adapter"].readiness.model
    body = walkthrough(state())
    speed = model.scheduler.tokens_per_s
    cache = model.engine.cache
    stats, held = dataclasses.replace(cache.stats), cache.bytes
    first = post(fresh, "/invocations", dry(body)).get_json()["dry_run"]
    second = post(fresh, "/invocations", dry(body)).get_json()["dry_run"]
    assert first["decode_tokens"] == second["decode_tokens"] > 0 and second["cached_tokens"] == 0
    assert model.scheduler.tokens_per_s == speed and model.scheduler.queued_tokens == 0
    assert cache.stats == stats and cache.bytes == held, "a dry run looks at the cache without using it"


@pytest.mark.parametrize("route, body, why", [
    ("/invocations", {"decision": {"id": "x", "state": "s", "question": "q", "options": [{"id": "a"}]}}, None),
    ("/invocations", {"decision": {"id": "x", "state": "s " * 600, "question": "q",
                                   "options": [{"id": "a"}, {"id": "b"}]}}, "over the limit of"),
    ("/invocations", {"decisions": [{"id": f"d{i}", "state": "s", "question": "Which one? " * 60,
                                     "options": [{"id": "a"}, {"id": "b"}]} for i in range(3)]},
     "over the request limit"),
    ("/invocations", {"model": "jev-latest", "state": "s", "questions": {}}, None),
    ("/v1/systemone", {"model": "jev-latest", "state": "s " * 600, "questions": {"n": {"type": "noul"}}},
     "value_error.prompt_too_long"),
    ("/v1/systemone", {"model": "jev-latest", "state": "s", "x_permutations": 2, "x_debias": "content-free",
                       "questions": {"n": {"type": "noul", "instructions": "Is it so? " * 20}}},
     "value_error.request_too_long"),
    ("/v1/systemone", {"model": "other", "state": "s", "questions": {"n": {"type": "noul"}}}, None),
])
def test_a_request_refused_for_its_content_is_refused_the_same_way_in_a_dry_run(tight_client, route, body, why):
    """Validation, a prompt over the limit, a request over its token budget: the same status and body."""
    real = post(tight_client, route, body)
    dry_response = post(tight_client, route, dry(body))
    assert real.status_code in (400, 422), real.get_json()
    assert (dry_response.status_code, dry_response.get_json()) == (real.status_code, real.get_json())
    if why is not None:
        assert why in json.dumps(real.get_json())


def test_x_dry_run_must_be_a_boolean(client):
    body = {"decision": {"id": "x", "state": "s", "question": "q", "options": [{"id": "a"}, {"id": "b"}]},
            "x_dry_run": "yes"}
    response = post(client, "/invocations", body)
    assert response.status_code == 400 and response.get_json()["error"].startswith("x_dry_run ")
    response = post(client, "/v1/systemone", {**system_one("s"), "x_dry_run": 1})
    assert response.status_code == 422 and response.get_json()["detail"][0]["loc"] == ["body", "x_dry_run"]


# ---- admission's refusals, on a fake engine ----------------------------------------------------------------------

BUSY = {"error": "model is busy; retry the request", "retryable": True}


def test_a_dry_run_says_a_busy_server_would_refuse_a_request_and_the_real_one_is(tmp_path, settings, example):
    """While a job runs, a request over ADAPTER_QUEUE_TOKENS would get the busy 503: the dry run says so (200),
    with the body the real request then gets; a smaller one would be admitted."""
    engine = FakeEngine(fake_model_dir(tmp_path) / "fake.gguf")
    app = create_app(dataclasses.replace(settings, queue_tokens=1000, max_request_tokens=1000), engine)
    release = threading.Event()
    engine.on_score = lambda: release.wait(30)
    engine.scoring.clear()
    out: dict = {}
    worker = threading.Thread(target=lambda: out.setdefault("r", post(app.test_client(), "/invocations", example)))
    worker.start()
    try:
        assert engine.scoring.wait(30)
        client = app.test_client()
        big = {"decision": {**example["decision"], "state": example["decision"]["state"] + " More." * 100}}
        report = post(client, "/invocations", dry(big)).get_json()["dry_run"]
        assert report["admitted"] is False and report["status"] == 503 and report["refusal"] == BUSY
        assert report["queued_tokens"] > 0 and report["decode_tokens"] > 0
        real = post(client, "/invocations", big)
        assert (real.status_code, real.get_json()) == (503, BUSY)
        s1 = {"model": "jev-latest", "state": big["decision"]["state"], "questions": {"n": {"type": "noul"}}}
        s1_report = post(client, "/v1/systemone", dry(s1)).get_json()
        assert s1_report["x_dry_run"]["status"] == 503
        assert s1_report["x_dry_run"]["refusal"] == {"detail": {"error_type": "overloaded_error",
                                                                "message": "model is busy; retry the request"},
                                                     "retryable": True}
        small = post(client, "/invocations", dry({"decision": {**example["decision"], "id": "small"}}))
        assert small.get_json()["dry_run"]["admitted"] is True
    finally:
        release.set()
        worker.join(30)
    assert out["r"].status_code == 200


class TimedEngine(FakeEngine):
    """A job takes its tokens at 2,000 tokens/s (what the probe measures, and admission then uses)."""

    def step(self, job) -> bool:
        time.sleep(job.tokens / 2000)
        return super().step(job)


def test_a_dry_run_of_a_request_too_large_for_any_deadline_reports_its_4xx(tmp_path, settings):
    """~12 questions of ~330 tokens need ~2 s at the measured speed; a request here may take 1 s: the real request
    gets a 400 (System One: 422) value_error.request_too_slow, and the dry run reports that very body."""
    engine = TimedEngine(fake_model_dir(tmp_path) / "fake.gguf")
    client = create_app(settings.replace(request_timeout_s=1.0), engine).test_client()
    text = "A customer writes about a late parcel."
    asks = [f"Question {i}: " + "does the message say so, in so many words? " * 7 for i in range(12)]
    walk = {"decisions": [{"id": f"d{i}", "state": text, "question": t, "options": [{"id": "a"}, {"id": "b"}]}
                          for i, t in enumerate(asks)]}
    s1 = {"model": "jev-latest", "state": text,
          "questions": {f"q{i}": {"type": "noul", "instructions": t} for i, t in enumerate(asks)}}
    for route, body, key in (("/invocations", walk, "dry_run"), ("/v1/systemone", s1, "x_dry_run"),
                             ("/invocations", s1, "x_dry_run")):
        report = post(client, route, dry(body)).get_json()[key]
        real = post(client, route, body)
        assert real.status_code in (400, 422)
        assert report["admitted"] is False and report["status"] == real.status_code
        assert report["refusal"] == real.get_json()
        assert report["estimate_s"] > 1.0 and report["tokens_per_s"] > 0
    assert "request_too_slow" in json.dumps(post(client, "/v1/systemone", s1).get_json())


def test_a_dry_run_record_in_a_batch_gets_its_line(client, example):
    lines = [json.dumps(dry(example)), json.dumps(example)]
    response = client.post("/invocations", data="\n".join(lines) + "\n", content_type="application/jsonlines")
    first, second = (json.loads(line) for line in response.get_data(as_text=True).splitlines())
    assert first["dry_run"]["decisions"][0]["id"] == example["decision"]["id"]
    assert first["dry_run"]["decisions"][0]["prompt_sha256"] == second["result"]["prompt_sha256"]


def test_x_dry_run_false_is_a_real_request(client, example):
    assert "result" in post(client, "/invocations", {**example, "x_dry_run": False}).get_json()
    assert "answers" in post(client, "/v1/systemone", {**system_one("s"), "x_dry_run": False}).get_json()


def test_a_dry_run_answers_within_sagemakers_response_limit(client):
    """Hundreds of orderings of one long state: their texts would make more than SageMaker's 6 MB real-time
    response (each prompt holds the whole state). The answer keeps 1 MiB of prompt details, in the request's order,
    and says how many prompts it left them out of; every prompt's tokens are still there."""
    sentence = "Ticket 4711: the customer says the March invoice charged the annual plan twice, and asks why. "
    long_state = sentence * 330
    options = [{"id": f"q{i}"} for i in range(16)]
    body = {"decisions": [{"id": f"d{n}", "state": long_state, "question": f"Which queue ({n})?", "options": options,
                           "permutations": 16} for n in range(14)], "x_dry_run": True}
    response = post(client, "/invocations", body)
    assert response.status_code == 200, response.get_json()
    report = response.get_json()["dry_run"]
    entries = [p for d in report["decisions"] for p in d["prompts"]]
    assert len(entries) * len(long_state) > 6_000_000, "the texts alone would not fit"
    assert len(response.data) < 2 * 1024 * 1024 < 6_000_000
    shown = [p for p in entries if p["text"] is not None]
    assert shown and report["prompts_omitted"] == len(entries) - len(shown) > 0
    assert entries[:len(shown)] == shown, "the details are the first prompts'"
    assert all(p["options"] is None for p in entries[len(shown):])
    first = report["decisions"][0]
    if all(p["text"] is not None for p in first["prompts"]):
        texts = [p["text"] for p in first["prompts"]]
        assert hashlib.sha256("\0".join(texts).encode("utf-8")).hexdigest() == first["prompt_sha256"]
    assert sum(p["tokens"] for p in entries) == report["prompt_tokens"]
