"""The scheduler: one thread per model owns the llama.cpp context and runs every scoring job, first come, first
served, with admission by work and time, and deadlines.

Every scoring goes through here: requests, the start-up probe and the benchmarks ``submit`` a job's spec and
uncached plan and wait on its future. The scheduler thread takes jobs in arrival order; as a job starts, the
engine looks the cache up for it (``Engine.begin``), so that jobs queued over one new state decode it once; then
it runs the job step by step. A job's deadline counts from its request's arrival: between two steps the thread
checks it, and a caller that stops waiting at its deadline cancels its job: a queued job leaves the queue (its
tokens are released), a running one is stopped inside ``llama_decode`` through the abort flag. Either way its
memory is freed, and a state it saved stays cached for the retry. Jobs run one after another: every job lays its
memory out from empty cells, which is what keeps an answer the same bit for bit whatever else is in flight (see
``plan``). On a CPU this costs nothing: a decode already uses every core.

Admission is by work and by time: a job is accepted while the tokens it decodes, added to those of the jobs
queued and running, stay within ``ADAPTER_QUEUE_TOKENS`` (a job alone is always accepted), and while that work,
at the speed measured on the jobs run so far, can be done before the job's deadline; otherwise ``Busy``, at once.
Everything a job owns (its plan, its reads, its future) lives in the job.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable

from .errors import Busy, DeadlineExceeded, DecodeAborted, ScoringFailed, TooSlow
from .plan import JobSpec, Plan
from .readout import PromptScore, ScoreStats

log = logging.getLogger(__name__)
# A caller waits this much past the deadline for the job to be dropped at its step boundary before it cancels it.
RESULT_GRACE_S = 0.5
# The speed is tokens over seconds summed over the recent jobs, each job weighing by its tokens (a large job's
# rate is what admission needs to foresee, and small jobs' fixed costs would understate it), older jobs fading.
SPEED_MEMORY = 0.8  # the weight the sums keep at each new job


@runtime_checkable
class JobRunner(Protocol):
    """What the scheduler needs of an engine: a lock held while stepping, and a job's start, steps, end and
    results, and a way to stop the decode in progress from another thread."""

    @property
    def lock(self) -> AbstractContextManager[Any]: ...

    def begin(self, spec: JobSpec, plan: Plan | None = None) -> Any: ...

    def step(self, job: Any) -> bool: ...

    def abandon(self, job: Any) -> None: ...

    def abort(self) -> None: ...

    def finish(self, job: Any) -> tuple[list[PromptScore], ScoreStats]: ...


@dataclass
class Ticket:
    """One submitted job and what its caller waits on."""

    spec: JobSpec
    plan: Plan  # as if nothing were cached: what the job is admitted for
    deadline: float  # time.monotonic() after which the job is dropped (math.inf: never)
    tokens: int  # what the job was admitted for (its uncached plan's tokens)
    submitted: float = field(default_factory=time.monotonic)
    started: float | None = None
    future: Future = field(default_factory=Future)

    @property
    def queue_s(self) -> float:
        return (self.started or time.monotonic()) - self.submitted


class Scheduler:
    def __init__(self, engine: JobRunner, *, queue_tokens: int, name: str = "scheduler"):
        self.engine = engine
        self.queue_tokens = queue_tokens
        self._queue: collections.deque[Ticket] = collections.deque()
        self._ready = threading.Condition()
        self._queued_tokens = 0
        self._running: Ticket | None = None
        self._stopping = False
        self._decoded = self._seconds = 0.0  # the decaying sums the speed is read from
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # ---- callers -------------------------------------------------------------------------------

    def submit(self, spec: JobSpec, plan: Plan, *, deadline: float | None = None,
               by_tokens: bool = True) -> Ticket:
        """Queue a job with its ``deadline`` (``time.monotonic()``; None: none); raises Busy. ``by_tokens=False``
        skips the token budget (a record of a batch: the batch was admitted as a whole); admission by time holds
        for every job with a deadline."""
        [ticket] = self.submit_all([(spec, plan)], deadline=deadline, by_tokens=by_tokens)
        return ticket

    def submit_all(self, jobs: Sequence[tuple[JobSpec, Plan]], *, deadline: float | None = None,
                   by_tokens: bool = True) -> list[Ticket]:
        """Queue the jobs of one request (its answer and its priors) one after another, admitted as one: all of
        them or none (Busy); the tickets in the order given."""
        end = math.inf if deadline is None else deadline
        tickets = [Ticket(spec, plan, end, plan.tokens) for spec, plan in jobs]
        with self._ready:
            if self._stopping:
                raise Busy("the server is shutting down")
            self._admit(sum(t.tokens for t in tickets), end, by_tokens)
            for ticket in tickets:
                self._queued_tokens += ticket.tokens
                self._queue.append(ticket)
            self._ready.notify()
        return tickets

    def _admit(self, tokens: int, deadline: float, by_tokens: bool) -> None:
        queued = self._queued_tokens
        if by_tokens and queued and queued + tokens > self.queue_tokens:
            raise Busy(f"{queued} tokens are queued; this job adds {tokens}, over the budget of {self.queue_tokens}")
        speed = self.tokens_per_s
        if speed and not math.isinf(deadline):
            needed = (queued + tokens) / speed
            left = deadline - time.monotonic()
            if needed > left:
                raise TooSlow(f"the {tokens} tokens of this job, after the {queued} queued, need about {needed:.1f} s "
                           f"at the measured {speed:.0f} tokens/s; {max(0.0, left):.1f} s are left before its "
                           f"deadline")

    def result(self, ticket: Ticket) -> tuple[list[PromptScore], ScoreStats]:
        """The job's result; raises DeadlineExceeded (the job is cancelled) or ScoringFailed."""
        remaining = ticket.deadline - time.monotonic()
        try:
            return ticket.future.result(
                timeout=None if math.isinf(remaining) else max(0.0, remaining) + RESULT_GRACE_S)
        except TimeoutError:
            self.cancel(ticket)
            raise DeadlineExceeded("no answer within the deadline") from None

    def cancel(self, ticket: Ticket) -> None:
        """Give a job up: out of the queue with its tokens released, or stopped inside its decode."""
        with self._ready:
            if ticket in self._queue:
                self._queue.remove(ticket)
                self._queued_tokens -= ticket.tokens
                ticket.future.cancel()
            elif self._running is ticket:
                self.engine.abort()

    @property
    def queued_tokens(self) -> int:
        return self._queued_tokens

    @property
    def tokens_per_s(self) -> float | None:
        """Decode speed measured on the jobs run so far (tokens over seconds, recent jobs weighing most), None
        before the first."""
        return self._decoded / self._seconds if self._seconds > 0 else None

    @property
    def in_flight(self) -> int:
        with self._ready:
            return len(self._queue) + (self._running is not None)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Refuse new jobs, let those queued run, and end the thread."""
        with self._ready:
            self._stopping = True
            self._ready.notify()
        self._thread.join(timeout_s)

    # ---- the scheduler thread ------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._stopping:
                    self._ready.wait()
                if not self._queue:
                    return
                ticket = self._queue.popleft()
                self._running = ticket
            try:
                self._run(ticket)
            finally:
                with self._ready:
                    self._running = None
                    self._queued_tokens -= ticket.tokens

    def _run(self, ticket: Ticket) -> None:
        ticket.started = time.monotonic()
        if not ticket.future.set_running_or_notify_cancel():
            return
        if ticket.started > ticket.deadline:
            ticket.future.set_exception(DeadlineExceeded("the job waited past its deadline"))
            return
        engine = self.engine
        try:
            with engine.lock:
                job = engine.begin(ticket.spec, ticket.plan)
                while engine.step(job):
                    if time.monotonic() > ticket.deadline:
                        engine.abandon(job)
                        ticket.future.set_exception(DeadlineExceeded("the job ran past its deadline"))
                        return
            result = engine.finish(job)
            self._measure(job.tokens, time.monotonic() - ticket.started)
        except DecodeAborted:  # the engine dropped the job already
            ticket.future.set_exception(DeadlineExceeded("the job was stopped at its deadline"))
            return
        except Exception as exc:  # noqa: BLE001 - one job's failure must not stop the scheduler
            log.exception("a job failed in the engine")
            ticket.future.set_exception(ScoringFailed(f"{type(exc).__name__}: {exc}"))
            return
        ticket.future.set_result(result)

    def _measure(self, tokens: int, seconds: float) -> None:
        if tokens > 0 and seconds > 0:
            self._decoded = SPEED_MEMORY * self._decoded + tokens
            self._seconds = SPEED_MEMORY * self._seconds + seconds
