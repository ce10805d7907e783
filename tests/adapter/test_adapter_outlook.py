"""Admission that counts what the cache serves: a job is charged what it will decode given the cache and the jobs
ahead of it, charged again when it starts, refused for good when it can never fit, and the speed is learnt from
every job that ran. The scheduler's logic on a runner with a cache of its own; the end-to-end cases on the real
model."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from adapter_fakes import FakeEngine, fake_model_dir
from decision_adapter.decisions.model import DecisionModel, Question
from decision_adapter.engine.errors import Busy, DeadlineExceeded, DecodeAborted, TooLarge, TooSlow
from decision_adapter.engine.outlook import foreseen_plan, leaves
from decision_adapter.engine.plan import JobSpec, Limits, Plan, plan_job
from decision_adapter.engine.readout import LabelTrie, ScoreStats
from decision_adapter.engine.scheduler import JobRunner, Scheduler
from decision_adapter.server.app import create_app

LIMITS = Limits(batch_tokens=512, cells=100_000, sequences=32)
TRIE = LabelTrie.build([(1,), (2,)])


@dataclasses.dataclass
class CountingJob:
    spec: JobSpec
    tokens: int
    plan: Plan
    decoded_tokens: int = 0
    compute_s: float = 0.0


class CachingRunner:
    """A JobRunner whose jobs decode at ``speed`` tokens/s, ``step_tokens`` a step, and leave their state and
    answers in its cache when they end, as the engine's do; ``abort`` stops the step running."""

    lock = threading.Lock()

    def __init__(self, speed: float = 2000.0, step_tokens: int = 100):
        self.speed, self.step_tokens = speed, step_tokens
        self.cache: set[bytes] = set()
        self.stop = threading.Event()
        self.begun: list[int] = []

    def foresee(self, spec, plan, ahead):
        return foreseen_plan(spec, plan, LIMITS, lambda key: key in ahead or key in self.cache)

    def begin(self, spec, plan=None):
        plan = foreseen_plan(spec, plan or plan_job(spec, LIMITS), LIMITS, self.cache.__contains__)
        self.begun.append(plan.tokens)
        self.current = CountingJob(spec, plan.tokens, plan)
        return self.current

    def step(self, job) -> bool:
        n = min(self.step_tokens, job.tokens - job.decoded_tokens)
        if self.stop.wait(n / self.speed):
            raise DecodeAborted("stopped")
        job.decoded_tokens += n
        job.compute_s += n / self.speed
        if job.decoded_tokens < job.tokens:
            return True
        self.cache.update(leaves(job.spec))
        return False

    def abandon(self, job) -> None:
        pass

    def abort(self) -> None:
        self.stop.set()

    def reset_abort(self) -> None:
        self.stop.clear()

    def finish(self, job):
        return [], ScoreStats(0, 0, 0, (), 0, 0.0, 0.0)


def job(state: int, question: int, name: str):
    """A job of ``state`` tokens of state (cached under ``name``) and ``question`` tokens of its own."""
    prompt = tuple(range(1000, 1000 + state)) + tuple(range(question))
    spec = JobSpec((prompt,), (TRIE,), 0, state, f"state-{name}".encode(), answer_keys=(f"answer-{name}-{question}".encode(),))
    return spec, plan_job(spec, LIMITS)


@pytest.fixture
def measured():
    """A scheduler over a CachingRunner at 2,000 tokens/s, its speed measured on one job."""
    runner = CachingRunner()
    scheduler = Scheduler(runner, queue_tokens=1_000_000)
    scheduler.result(scheduler.submit(*job(200, 10, "warm-up")))
    yield runner, scheduler
    runner.stop.set()
    scheduler.stop(5)


def test_the_runner_is_a_job_runner():
    assert isinstance(CachingRunner(), JobRunner)


def test_three_questions_over_one_new_state_are_charged_the_state_once(measured):
    runner, scheduler = measured
    speed = scheduler.tokens_per_s
    assert 1000 < speed < 2100
    jobs = [job(1800, 50, "shared") for _ in range(1)] + [job(1800, 50 + i, "shared") for i in (1, 2)]
    uncached = sum(plan.tokens for _, plan in jobs)
    deadline_s = 1.5 * (1800 + 50 + 51 + 52) / speed
    assert uncached / speed > deadline_s, "charged as if nothing were cached, the third would be refused"
    deadline = time.monotonic() + deadline_s
    tickets = [scheduler.submit(spec, plan, deadline=deadline) for spec, plan in jobs]
    assert [t.tokens for t in tickets] == [1850, 51, 52], "the second and third restore what the first saves"
    for ticket in tickets:
        scheduler.result(ticket)
    assert runner.begun[-3:] == [1850, 51, 52]


def test_a_request_s_own_jobs_count_on_each_other(measured):
    """The answer's job and its prior's share nothing, but two jobs of one request over one state do."""
    _, scheduler = measured
    tickets = scheduler.submit_all([job(900, 20, "mine"), job(900, 30, "mine")])
    assert [t.tokens for t in tickets] == [920, 30]
    for ticket in tickets:
        scheduler.result(ticket)


def test_a_cached_answer_costs_nothing_and_a_cached_state_only_the_question(measured):
    runner, scheduler = measured
    spec, plan = job(700, 40, "known")
    runner.cache.add(spec.state_key)
    assert scheduler.submit(spec, plan).tokens == 40
    runner.cache.update(spec.answer_keys)
    assert runner.foresee(spec, plan, frozenset()).tokens == 0


def test_a_job_whose_state_left_the_cache_is_charged_again_and_refused_when_it_starts(measured):
    """Admitted for its question alone (its state was cached), then the state is evicted while it waits: when it
    starts it needs the state too, which no longer fits its deadline. It is refused then (retryable), not run into
    its deadline, and the tokens it was charged are given back."""
    runner, scheduler = measured
    blocker = scheduler.submit(*job(600, 10, "blocker"))  # 0.3 s
    spec, plan = job(2000, 20, "evicted")
    runner.cache.add(spec.state_key)
    ticket = scheduler.submit(spec, plan, deadline=time.monotonic() + 0.3 + 0.4)
    assert ticket.tokens == 20
    runner.cache.discard(spec.state_key)
    scheduler.result(blocker)
    with pytest.raises(TooSlow, match="were left when it started"):
        scheduler.result(ticket)
    assert runner.begun[-1] == 2020 and scheduler.queued_tokens == 0


def test_the_running_job_is_charged_what_it_has_left(measured):
    """A 4,000-token job (2 s) three quarters done leaves 0.5 s of work: a 400-token job (0.2 s) due in 1 s is
    admitted. Charged the running job's whole work (2.2 s in all), it was refused."""
    runner, scheduler = measured
    running = scheduler.submit(*job(3990, 10, "long"))
    deadline = time.monotonic() + 30
    while getattr(runner, "current", None) is None or runner.current.spec is not running.spec or \
            runner.current.decoded_tokens < 3000:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    ticket = scheduler.submit(*job(390, 10, "short"), deadline=time.monotonic() + 1.0)
    scheduler.result(running)
    scheduler.result(ticket)


def test_work_that_can_never_fit_is_too_large_not_busy(measured):
    """Twice what is allowed, or more, and the record of the estimates (exact here) explains no such error: too
    large, the non-retryable refusal. Less than twice is tried: the estimate may be that far off."""
    _, scheduler = measured
    speed = scheduler.tokens_per_s
    with pytest.raises(TooLarge) as refused:
        scheduler.submit(*job(5000, 100, "huge"), deadline=time.monotonic() + 60, allowed_s=1.0)
    assert not isinstance(refused.value, Busy), "no retry can pass: it is not the retryable refusal"
    assert refused.value.tokens == 5100 and refused.value.allowed_s == 1.0
    assert refused.value.allowed_tokens == pytest.approx(speed, rel=0.1)
    assert scheduler.queued_tokens == 0
    scheduler.result(scheduler.submit(*job(2500, 10, "over-but-within-the-margin"), deadline=time.monotonic() + 60,
                                      allowed_s=1.0))


@pytest.mark.parametrize("how", ["deadline between steps", "abort inside a step"])
def test_the_speed_is_learnt_from_a_job_that_did_not_finish(how):
    """A job stopped at its deadline still measured the speed: before, only finished jobs did, so after a
    slowdown admission stayed optimistic."""
    runner = CachingRunner(speed=1000.0, step_tokens=100)
    scheduler = Scheduler(runner, queue_tokens=1_000_000)
    try:
        assert scheduler.tokens_per_s is None
        deadline = time.monotonic() + (0.35 if how == "deadline between steps" else 60)
        ticket = scheduler.submit(*job(5000, 10, "long"), deadline=deadline)
        if how == "abort inside a step":
            threading.Timer(0.35, scheduler.cancel, [ticket]).start()
        with pytest.raises(DeadlineExceeded):
            scheduler.result(ticket)
        assert scheduler.tokens_per_s is not None and 500 < scheduler.tokens_per_s < 1100
    finally:
        scheduler.stop(5)


def test_stop_ends_a_running_job_before_it_says_the_engine_may_be_freed():
    runner = CachingRunner(speed=1000.0)
    scheduler = Scheduler(runner, queue_tokens=10_000_000)
    running = scheduler.submit(*job(90_000, 10, "endless"))  # 90 s
    queued = scheduler.submit(*job(100, 10, "queued"))
    time.sleep(0.1)
    assert scheduler.stop(timeout_s=0.3) is True, "past the timeout the decode is stopped and the thread ends"
    with pytest.raises(DeadlineExceeded):
        scheduler.result(running)
    with pytest.raises(Busy, match="shutting down"):
        scheduler.result(queued)


def test_close_keeps_the_engine_while_the_scheduler_thread_lives(tmp_path):
    engine = FakeEngine(fake_model_dir(tmp_path) / "fake.gguf")

    class Stuck:
        def stop(self, timeout_s: float = 30.0) -> bool:
            return False  # a decode that will not stop

    model = DecisionModel.__new__(DecisionModel)
    model.engine, model.scheduler = engine, Stuck()
    model.close()
    assert not getattr(engine, "closed", False), "freed under a running decode"


# ---- on the real model -------------------------------------------------------------------------------------------

def question(state: str, text: str, loc=("decision",)) -> Question:
    options = ("yes", "no")
    return Question(loc, state, text, options, tuple(loc + ("options", i) for i in range(2)), loc + ("state",),
                    loc + ("question",))


LONG_STATE = " ".join(f"Line {i}: order {1000 + i} is late and the customer asks why." for i in range(110))


def test_three_concurrent_questions_over_one_new_state_are_all_admitted_real_model(settings, engine):
    """The issue's case on the real model: charged as if nothing were cached, the third would be refused (its
    deadline is 2.5 times what the three need with the state decoded once); each is charged what it decodes, all
    three are admitted and answered, and one of them decodes the state."""
    app = create_app(dataclasses.replace(settings, state_cache_mb=1024), engine)
    model = app.extensions["decision_adapter"].readiness.model
    speed = model.scheduler.tokens_per_s
    state = LONG_STATE + f" Asked at {time.time_ns()}."  # new to the cache
    prepared = [model.prepare([question(state, f"Question {i}: is it urgent?")]) for i in range(3)]
    shared = prepared[0].plan.shared_tokens
    own = [p.plan.tokens - shared for p in prepared]
    assert shared > 1000 and all(0 < o < 100 for o in own)
    allowed_s = 2.5 * (shared + sum(own)) / speed
    assert sum(p.plan.tokens for p in prepared) / speed > allowed_s, "the old charge refuses the third"
    deadline = time.monotonic() + allowed_s
    tickets = [model.scheduler.submit(p.spec, p.plan, deadline=deadline, allowed_s=allowed_s) for p in prepared]
    assert [t.tokens for t in tickets] == [shared + own[0], own[1], own[2]]
    stats = [model.scheduler.result(t)[1] for t in tickets]
    assert [s.shared_tokens for s in stats] == [shared, 0, 0]
    assert [s.cached_tokens for s in stats] == [0, shared, shared]


def test_an_abort_that_lands_before_the_first_step_stops_the_job(settings, engine):
    """A caller that gives up just as its job becomes the running one (here: right after the job began, before
    its first decode) stops it; the flag was cleared at the first step, so the job ran to its end."""
    app = create_app(dataclasses.replace(settings, state_cache_mb=0), engine)
    model = app.extensions["decision_adapter"].readiness.model
    prepared = model.prepare([question(LONG_STATE, "Is it urgent?")])
    runner = engine.runner
    begin = runner.begin

    def begin_then_abort(spec, plan=None):
        job = begin(spec, plan)
        runner.abort()
        return job

    runner.begin = begin_then_abort
    try:
        with pytest.raises(DeadlineExceeded, match="stopped at its deadline"):
            model.scheduler.result(model.scheduler.submit(prepared.spec, prepared.plan))
    finally:
        runner.begin = begin
    assert model.score(model.prepare([question("Short.", "Is it urgent?")])).results[0].probabilities


# ---- over HTTP: the non-retryable refusal ------------------------------------------------------------------------

class TimedEngine(FakeEngine):
    """A job takes its tokens at 2,000 tokens/s (what the probes measure, and admission then uses)."""

    def step(self, job) -> bool:
        time.sleep(job.tokens / 2000)
        return super().step(job)


def many_questions(n: int, *, system_one: bool) -> dict:
    state = "A customer writes about a late parcel."
    texts = [f"Question {i}: " + "does the message say so, in so many words? " * 7 for i in range(n)]
    if system_one:
        return {"model": "jev-latest", "state": state,
                "questions": {f"q{i}": {"type": "noul", "instructions": t} for i, t in enumerate(texts)}}
    return {"decisions": [{"id": f"d{i}", "state": state, "question": t, "options": [{"id": "a"}, {"id": "b"}]}
                          for i, t in enumerate(texts)]}


def test_a_request_that_can_never_fit_its_deadline_gets_a_4xx_saying_what_it_needs(tmp_path, settings):
    """12 questions of ~330 tokens need ~2 s here; an endpoint allows 1 s. A retryable 503 would be retried
    forever: the answer is a 400 (System One: 422, a JSON-lines record: its 400 line) with the numbers, so that
    the client splits the request. Within a deadline that fits, the same request is answered."""
    engine = TimedEngine(fake_model_dir(tmp_path) / "fake.gguf")
    app = create_app(settings.replace(request_timeout_s=1.0), engine)
    client = app.test_client()

    response = client.post("/invocations", json=many_questions(12, system_one=False))
    assert response.status_code == 400, response.get_json()
    body = response.get_json()
    assert "retryable" not in body
    assert body["error"].startswith("decisions needs ") and "a request here may take 1 s (about " in body["error"]
    assert body["error"].endswith("split it into smaller requests")

    response = client.post("/v1/systemone", json=many_questions(12, system_one=True))
    assert response.status_code == 422, response.get_json()
    [detail] = response.get_json()["detail"]
    assert detail["loc"] == ["body", "questions"] and detail["type"] == "value_error.request_too_slow"

    import json

    lines = json.dumps(many_questions(12, system_one=False)) + "\n" + json.dumps(many_questions(1, system_one=False))
    response = client.post("/invocations", data=lines, content_type="application/jsonlines")
    first, second = (json.loads(line) for line in response.get_data(as_text=True).splitlines())
    assert first["status"] == 400 and "split it" in first["error"] and "retryable" not in first
    assert len(second["results"]) == 1

    roomy = create_app(settings.replace(request_timeout_s=20.0), TimedEngine(engine.model_path))
    assert roomy.test_client().post("/invocations", json=many_questions(12, system_one=False)).status_code == 200


class _Died(BaseException):
    """What no job raises: something that ends the scheduler thread itself."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_scheduler_thread_turns_ping_to_503_and_fails_its_queue_at_once(settings, engine, monkeypatch):
    """A scheduler thread that died can score nothing: /ping says so (SageMaker replaces the instance), scoring
    routes get the not-ready 503 at once, and a request already waiting fails instead of waiting out its deadline."""
    from decision_adapter.server.app import create_app
    from adapter_apps import close_app

    app = create_app(settings, engine)
    try:
        client = app.test_client()
        model = app.extensions["decision_adapter"].readiness.model
        assert client.get("/ping").status_code == 200

        def die(ticket):
            raise _Died()

        monkeypatch.setattr(model.scheduler, "_run", die)
        body = {"decision": {"id": "d", "state": "A ticket arrived.", "question": "Who handles it?",
                             "options": [{"id": "billing"}, {"id": "tech"}]}}
        started = time.monotonic()
        first = client.post("/invocations", json=body)
        assert first.status_code == 500 and first.get_json() == {"error": "scoring failed"}
        assert time.monotonic() - started < 10, "failed at once, not at its deadline"
        model.scheduler._thread.join(5)
        ping = client.get("/ping")
        assert ping.status_code == 503 and ping.get_json()["status"] == "failed"
        assert "scheduler thread died" in ping.get_json()["detail"]
        again = client.post("/invocations", json=body)
        assert again.status_code == 503 and "scheduler thread died" in again.get_json()["error"]
    finally:
        close_app(app)


def test_a_readout_that_is_not_finite_is_not_cached(settings, engine, monkeypatch):
    """A NaN logit row fails its request once (500 scoring failed); nothing of it is cached (its answer, nor the
    state it saved), so the same request is decoded again and answered."""
    import math as _math

    from decision_adapter.engine import executor
    from decision_adapter.engine.readout import NodeRead
    from decision_adapter.server.app import create_app
    from adapter_apps import close_app

    app = create_app(settings, engine)
    try:
        client = app.test_client()
        body = {"decision": {"id": "d", "state": "An invoice was paid twice. " * 30, "question": "Who handles it?",
                             "options": [{"id": "billing"}, {"id": "tech"}]}}
        real = executor.node_read
        monkeypatch.setattr(executor, "node_read", lambda row, tokens: NodeRead(
            tuple(_math.nan for _ in tokens), _math.nan, 0))
        failed = client.post("/invocations", json=body)
        assert failed.status_code == 500 and failed.get_json() == {"error": "scoring failed"}
        monkeypatch.setattr(executor, "node_read", real)
        answered = client.post("/invocations", json=body)
        assert answered.status_code == 200, answered.get_data(as_text=True)
        result = answered.get_json()["result"]
        assert all(_math.isfinite(p) for p in result["probabilities"])
        assert result["timing"]["cached_tokens"] == 0, "the state the failed job saved was dropped"
    finally:
        close_app(app)
