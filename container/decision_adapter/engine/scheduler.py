"""The scheduler: one thread per model owns the llama.cpp context and runs every scoring job, first come, first
served, with admission by work and deadlines.

Every scoring goes through here: requests, the start-up probe and the benchmarks hand a job (``Engine.begin``)
to ``submit`` and wait on its future. The scheduler thread takes jobs in arrival order and runs each step by step; between two steps it checks the job's
deadline, so a job whose client has given up (``ADAPTER_REQUEST_TIMEOUT_S``) stops within one micro-batch and
frees its memory. Jobs run one after another: every job lays its memory out from empty cells, which is what keeps
an answer the same bit for bit whatever else is in flight (see ``plan``). On a CPU this costs nothing: a decode
already uses every core.

Admission is by work, not by count: a job is accepted while the tokens it decodes, added to those of the jobs
queued and running, stay within ``ADAPTER_QUEUE_TOKENS`` (a job alone is always accepted); otherwise ``Busy``.
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
from typing import Any, Protocol, runtime_checkable

from .errors import Busy, DeadlineExceeded, ScoringFailed
from .readout import PromptScore, ScoreStats

log = logging.getLogger(__name__)
# A caller waits this much past the deadline for the job to be dropped at its step boundary before it answers.
RESULT_GRACE_S = 0.5


class SchedulableJob(Protocol):
    """What the scheduler reads of a job: the tokens it decodes, which admission counts."""

    @property
    def tokens(self) -> int: ...


@runtime_checkable
class JobRunner(Protocol):
    """What the scheduler needs of an engine: a lock held while stepping, and a job's steps, end and results."""

    @property
    def lock(self) -> AbstractContextManager[Any]: ...

    def step(self, job: Any) -> bool: ...

    def abandon(self, job: Any) -> None: ...

    def finish(self, job: Any) -> tuple[list[PromptScore], ScoreStats]: ...


@dataclass
class Ticket:
    """One submitted job and what its caller waits on."""

    job: SchedulableJob
    deadline: float  # time.monotonic() after which the job is dropped (math.inf: never)
    tokens: int  # what the job was admitted for; its plan may change if a cached state must be decoded again
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
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # ---- callers -------------------------------------------------------------------------------

    def submit(self, job: SchedulableJob, timeout_s: float | None) -> Ticket:
        """Queue ``job`` with a deadline ``timeout_s`` from now (None: no deadline); raises Busy."""
        deadline = math.inf if timeout_s is None else time.monotonic() + timeout_s
        ticket = Ticket(job, deadline, job.tokens)
        with self._ready:
            if self._stopping:
                raise Busy("the server is shutting down")
            if self._queued_tokens and self._queued_tokens + job.tokens > self.queue_tokens:
                raise Busy(f"{self._queued_tokens} tokens are queued; this job adds {job.tokens}, over the "
                           f"budget of {self.queue_tokens}")
            self._queued_tokens += ticket.tokens
            self._queue.append(ticket)
            self._ready.notify()
        return ticket

    def result(self, ticket: Ticket) -> tuple[list[PromptScore], ScoreStats]:
        """The job's result; raises DeadlineExceeded or ScoringFailed."""
        remaining = ticket.deadline - time.monotonic()
        try:
            return ticket.future.result(
                timeout=None if math.isinf(remaining) else max(0.0, remaining) + RESULT_GRACE_S)
        except TimeoutError:
            raise DeadlineExceeded("no answer within the deadline") from None

    @property
    def queued_tokens(self) -> int:
        return self._queued_tokens

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
        if ticket.future.cancelled():
            return
        if ticket.started > ticket.deadline:
            ticket.future.set_exception(DeadlineExceeded("the job waited past its deadline"))
            return
        engine = self.engine
        try:
            with engine.lock:
                while engine.step(ticket.job):
                    if time.monotonic() > ticket.deadline:
                        engine.abandon(ticket.job)
                        ticket.future.set_exception(DeadlineExceeded("the job ran past its deadline"))
                        return
            ticket.future.set_result(engine.finish(ticket.job))
        except Exception as exc:  # noqa: BLE001 - one job's failure must not stop the scheduler
            log.exception("a job failed in the engine")
            ticket.future.set_exception(ScoringFailed(f"{type(exc).__name__}: {exc}"))
