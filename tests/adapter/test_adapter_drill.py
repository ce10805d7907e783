"""The rollback drill's faulty release (ADAPTER_DRILL, container/decision_adapter/drill.py): it starts as any release
does (the start-up probe passes, /ping answers 200), then fails every job (500 'scoring failed', logged as the
scoring failure the alarms count) or computes at half speed (each step takes twice its time, and the job's compute
says so)."""

from __future__ import annotations

import logging

import pytest

from adapter_fakes import FakeEngine, fake_model_dir
from decision_adapter import metric_logs
from decision_adapter.drill import DrillRunner
from decision_adapter.engine.errors import ScoringFailed
from decision_adapter.engine.readout import ScoreStats
from decision_adapter.server.app import create_app
from decision_adapter.settings import Settings, SettingsError


class SteppedRunner:
    """A job runner whose steps each take ``step_s`` on a fake clock, and whose stats say how long they took."""

    def __init__(self, clock, steps=3, step_s=0.25):
        self.clock, self.steps, self.step_s = clock, steps, step_s
        self.lock = object()

    def begin(self, spec, plan=None):
        return {"left": self.steps}

    def step(self, job):
        self.clock.now += self.step_s
        job["left"] -= 1
        return job["left"] > 0

    def finish(self, job):
        return ["scores"], ScoreStats(0, 0, 0, (10,), 2, prefill_s=0.5, readout_s=0.25)

    def abandon(self, job):
        pass


class Clock:
    def __init__(self):
        self.now, self.slept = 0.0, []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


def run(runner) -> tuple[list, ScoreStats]:
    job = runner.begin("spec")
    while runner.step(job):
        pass
    return runner.finish(job)


def test_unarmed_the_drill_runner_is_the_engines_runner():
    """Start-up's probe runs before the drill is armed: it scores as any release does."""
    for fault in ("fail", "slow"):
        clock = Clock()
        inner = SteppedRunner(clock)
        drill = DrillRunner(inner, fault, clock=clock, sleep=clock.sleep)
        assert run(drill) == inner.finish(None) and clock.slept == [] and clock.now == 0.75
        assert drill.lock is inner.lock


def test_armed_fail_fails_every_job_before_it_decodes():
    clock = Clock()
    drill = DrillRunner(SteppedRunner(clock), "fail", clock=clock, sleep=clock.sleep)
    drill.arm()
    with pytest.raises(ScoringFailed, match="ADAPTER_DRILL=fail"):
        drill.begin("spec")
    assert clock.now == 0.0


def test_armed_slow_takes_each_step_twice_and_counts_it_as_compute():
    clock = Clock()
    drill = DrillRunner(SteppedRunner(clock), "slow", clock=clock, sleep=clock.sleep)
    drill.arm()
    _, stats = run(drill)
    assert clock.slept == [0.25, 0.25, 0.25] and clock.now == 1.5, "each step as long again"
    # The job's compute (prefill 0.5 s, readout 0.25 s) with the 0.75 s waited, shared as their own times are.
    assert (stats.prefill_s, stats.readout_s) == pytest.approx((1.0, 0.5))
    assert stats.evaluated_tokens == 12, "the same tokens: the compute per token doubles"


def test_the_setting_is_checked():
    assert Settings.from_env({}).drill == "off"
    assert Settings.from_env({"ADAPTER_DRILL": "slow"}).drill == "slow"
    with pytest.raises(SettingsError, match="ADAPTER_DRILL"):
        Settings.from_env({"ADAPTER_DRILL": "crash"})


def test_a_drill_release_passes_its_health_check_then_fails_every_request(tmp_path, settings, example, caplog):
    """What SageMaker sees of the drill: /ping 200 (the update's health check passes and traffic shifts), then a 500
    'scoring failed' for each request, each logged as a scoring failure (the ScoringFailures and Invocation5xxRate
    rollback alarms count these lines: tests/deploy/test_log_contract.py)."""
    app = create_app(settings.replace(drill="fail"), FakeEngine(fake_model_dir(tmp_path) / "fake.gguf"))
    client = app.test_client()
    assert client.get("/ping").status_code == 200
    with caplog.at_level(logging.INFO, logger="decision_adapter"):
        for n in range(3):
            state = f"{example['decision']['state']} ({n})"
            answer = client.post("/invocations", json={"decision": {**example["decision"], "state": state}})
            assert (answer.status_code, answer.get_json()) == (500, {"error": "scoring failed"})
    lines = [r for r in caplog.records if r.name == metric_logs.REQUEST.logger]
    requests = [r.fields for r in lines if r.getMessage() == metric_logs.REQUEST.message]
    failures = [r for r in lines if r.getMessage() == metric_logs.SCORING_FAILED.message]
    assert [line["status"] for line in requests] == [500] * 3 and len(failures) == 3
    assert all(line[metric_logs.SCORING_FAILURES_FIELD] == 1 for line in requests)
    app.extensions["decision_adapter"].close()
