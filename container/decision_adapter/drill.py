"""The rollback drill's faults (``ADAPTER_DRILL``): a release that starts, passes its health check and then fails or
computes slowly, so that a drill shows SageMaker rolling an update back on the alarms, not on the health check.

``DrillRunner`` stands between the scheduler and the engine's job runner (the ``JobRunner`` the scheduler
drives). Until ``arm()`` it passes everything through, so start-up's probe scores as any release does and ``/ping``
turns 200; the composition root (``startup``) arms it once the probe passed. Armed:

- ``fail``: every job fails as it begins, before anything is decoded; the scheduler reports it as the engine's
  failure (``ScoringFailed``), which the server answers 500 'scoring failed' and logs as one (the ScoringFailures
  and Invocation5xxRate alarms count it);
- ``slow``: after each decode step the runner waits as long as the step took, and the job's compute time
  (``prefill_s`` and ``readout_s`` of its stats) counts the wait: the job takes twice its time on the model's
  thread, as a release computing at half the speed would, and its log line says so (the SlowCompute alarm).

Only jobs that reach the engine are affected: an answer the cache holds costs no job (the drill sends requests
that differ).

may import from the package: engine
never imports: flask, werkzeug, gunicorn, llama_cpp
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from .engine.errors import ScoringFailed

FAULTS = ("fail", "slow")


class DrillRunner:
    """A job runner (the engine's, ``runner``) with the drill's ``fault`` once armed; everything else delegated."""

    def __init__(self, runner: Any, fault: str, *, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep):
        if fault not in FAULTS:
            raise ValueError(f"not a drill fault: {fault!r} (one of {', '.join(FAULTS)})")
        self.runner, self.fault, self.clock, self.sleep = runner, fault, clock, sleep
        self.armed = False
        self._stalled: dict[int, float] = {}     # id(job) -> seconds waited for it so far

    def arm(self) -> None:
        self.armed = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)

    def begin(self, spec: Any, plan: Any = None) -> Any:
        if self.armed and self.fault == "fail":
            raise ScoringFailed("ADAPTER_DRILL=fail: this release fails every job (a rollback drill)")
        return self.runner.begin(spec, plan)

    def step(self, job: Any) -> bool:
        if not (self.armed and self.fault == "slow"):
            return self.runner.step(job)
        started = self.clock()
        more = self.runner.step(job)
        took = self.clock() - started
        self.sleep(took)
        self._stalled[id(job)] = self._stalled.get(id(job), 0.0) + took
        return more

    def abandon(self, job: Any) -> None:
        self._stalled.pop(id(job), None)
        self.runner.abandon(job)

    def finish(self, job: Any) -> Any:
        scores, stats = self.runner.finish(job)
        stalled = self._stalled.pop(id(job), 0.0)
        if stalled and stats.prefill_s + stats.readout_s > 0:
            # The wait counts as compute, shared between prefill and readout as their own time is.
            share = stats.prefill_s / (stats.prefill_s + stats.readout_s)
            stats = dataclasses.replace(stats, prefill_s=stats.prefill_s + stalled * share,
                                        readout_s=stats.readout_s + stalled * (1 - share))
        return scores, stats
