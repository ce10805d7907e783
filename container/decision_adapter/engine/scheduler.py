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

Admission is by work and by time. A job is charged what it will decode when it starts: its plan given what the
cache holds and what the jobs ahead of it will have left there (``outlook``: a state they decode is restored, an
answer they read is not read again). It is accepted while those tokens, added to those of the jobs queued and
running, stay within ``ADAPTER_QUEUE_TOKENS`` (a job alone is always accepted), and while that work can be done
before the job's deadline, in the seconds the cost model gives the work queued, what the running job has left and
the job's own (``cost``: by tokens, decode calls and the cells attended over, learnt from the jobs that ran);
otherwise ``Busy``, at once. A request whose own work takes longer than its deadline allows even on an idle
server (``allowed_s``) by a margin the model's error cannot explain (``CostModel.fastest``) gets ``TooLarge``: no
retry can pass. With nothing queued or running, a request that is not ``TooLarge`` is refused (``TooSlow``) only
when even that fastest estimate misses its deadline: a retry would meet the same estimate. When a job starts it is
charged again, for what the cache then holds, and a job that cannot finish before its deadline even at the fastest
estimate is refused then (``TooSlow``) rather than run into it. The model learns from
every job that ran, to its end or not: the work of the decodes it finished and the seconds they took. The mean
speed (``tokens_per_s``) is kept for sizing Batch Transform. Everything a job owns (its plan, its reads, its future) lives in the job. ``assess`` applies the same rules
to a request's jobs without queueing them (a dry run): what each would be charged, and what admission would say.
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
from typing import Any, Iterator, Protocol, Sequence, runtime_checkable

from .cost import NOTHING, CostModel, Work, done_work, plan_work
from .errors import Busy, DeadlineExceeded, DecodeAborted, ScoringFailed, TooLarge, TooSlow
from .outlook import leaves
from .plan import JobSpec, Plan
from .readout import PromptScore, ScoreStats

log = logging.getLogger(__name__)
# A caller waits this much past the deadline for the job to be dropped at its step boundary before it cancels it.
RESULT_GRACE_S = 0.5
# The mean speed (Batch Transform's sizing) is tokens over seconds summed over the recent jobs, each job weighing by
# its tokens, older jobs fading.
SPEED_MEMORY = 0.8  # the weight the sums keep at each new job


@runtime_checkable
class JobRunner(Protocol):
    """What the scheduler needs of an engine: a lock held while stepping, what a job will decode given the cache,
    a job's start, steps, end and results, and a way to stop the decode in progress from another thread. A job
    has ``plan`` (what it runs), ``tokens`` (what it decodes), ``decoded_tokens`` (what it has decoded so far,
    whole micro-batches of its plan in order) and ``compute_s`` (the seconds those decodes took)."""

    @property
    def lock(self) -> AbstractContextManager[Any]: ...

    def foresee(self, spec: JobSpec, plan: Plan, ahead: frozenset[bytes]) -> Plan: ...

    def begin(self, spec: JobSpec, plan: Plan | None = None) -> Any: ...

    def step(self, job: Any) -> bool: ...

    def abandon(self, job: Any) -> None: ...

    def abort(self) -> None: ...

    def reset_abort(self) -> None: ...

    def finish(self, job: Any) -> tuple[list[PromptScore], ScoreStats]: ...


@dataclass(eq=False)
class Ticket:
    """One submitted job and what its caller waits on. Compared by identity: a ticket is that one submission (its
    fields hold whole token tuples, which equality would compare under the scheduler's lock)."""

    spec: JobSpec
    plan: Plan  # as if nothing were cached
    deadline: float  # time.monotonic() after which the job is dropped (math.inf: never)
    tokens: int  # what the job is charged: what it will decode (foreseen at admission, known once it starts)
    work: Work = NOTHING  # the same by what its seconds depend on (``cost.Work``)
    submitted: float = field(default_factory=time.monotonic)
    started: float | None = None
    future: Future = field(default_factory=Future)

    @property
    def queue_s(self) -> float:
        return (self.started or time.monotonic()) - self.submitted


@dataclass(frozen=True)
class Admission:
    """What admission makes of a request's jobs now, without queueing them (``Scheduler.assess``)."""

    plans: tuple[Plan, ...]  # each job's plan as foreseen: its tokens are what the job is charged
    queued_tokens: int  # the tokens of the jobs queued and running ahead of it
    tokens_per_s: float | None  # the measured speed; None before the first job
    refusal: Busy | TooLarge | None  # what ``submit_all`` would raise now; None: admitted
    # Seconds until the jobs are done as admission reckons them: the work ahead and theirs, by the cost model (None
    # before the first job; 0 when there is no job to queue).
    estimate_s: float | None

    @property
    def tokens(self) -> int:
        """What the jobs are charged: the tokens they will decode."""
        return sum(plan.tokens for plan in self.plans)


class Scheduler:
    def __init__(self, engine: JobRunner, *, queue_tokens: int, name: str = "scheduler"):
        self.engine = engine
        self.queue_tokens = queue_tokens
        self._queue: collections.deque[Ticket] = collections.deque()
        self._ready = threading.Condition()
        self._queued_tokens = 0
        self._running: Ticket | None = None
        self._running_job: Any = None  # the running ticket's job once it has begun
        self._queued_work = NOTHING  # the work of the jobs queued and running, as charged
        self._cost = CostModel()
        self._stopping = False
        self._decoded = self._seconds = 0.0  # the decaying sums the speed is read from
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # ---- callers -------------------------------------------------------------------------------

    def submit(self, spec: JobSpec, plan: Plan, *, deadline: float | None = None,
               by_tokens: bool = True, allowed_s: float | None = None) -> Ticket:
        """Queue a job with its ``deadline`` (``time.monotonic()``; None: none); raises Busy (TooSlow, TooLarge).
        ``by_tokens=False`` skips the token budget (a Batch Transform mini-batch: it is alone); admission by time
        holds for every job with a deadline. ``allowed_s``: the most time a request may take on this server."""
        [ticket] = self.submit_all([(spec, plan)], deadline=deadline, by_tokens=by_tokens, allowed_s=allowed_s)
        return ticket

    def submit_all(self, jobs: Sequence[tuple[JobSpec, Plan]], *, deadline: float | None = None,
                   by_tokens: bool = True, allowed_s: float | None = None) -> list[Ticket]:
        """Queue the jobs of one request (its answer and its priors) one after another, admitted as one: all of
        them or none; the tickets in the order given. Each is charged what it will decode (see the module's
        text); raises ``TooLarge`` when that alone needs more than ``allowed_s`` at the measured speed, else
        ``Busy`` or ``TooSlow`` when it does not fit now."""
        end = math.inf if deadline is None else deadline
        tickets = [Ticket(spec, plan, end, foreseen.tokens, plan_work(foreseen))
                   for (spec, plan), foreseen in zip(jobs, self._foresee(jobs))]
        with self._ready:
            refusal = self._refusal(sum(t.tokens for t in tickets), _total(t.work for t in tickets), end, by_tokens,
                                    allowed_s)
            if refusal is not None:
                raise refusal
            if not self._thread.is_alive():  # no thread would ever take the jobs
                raise ScoringFailed("the scheduler thread died")
            for ticket in tickets:
                self._queued_tokens += ticket.tokens
                self._queued_work = self._queued_work + ticket.work
                self._queue.append(ticket)
            self._ready.notify()
        return tickets

    def assess(self, jobs: Sequence[tuple[JobSpec, Plan]], *, deadline: float | None = None,
               by_tokens: bool = True, allowed_s: float | None = None) -> "Admission":
        """What ``submit_all`` would make of the same jobs now, queueing nothing (a dry run): each job's plan as
        it is foreseen (its ``tokens`` are what the job is charged), the tokens queued ahead, the measured speed,
        and the exception ``submit_all`` would raise (None: admitted). No job at all is admitted at once."""
        end = math.inf if deadline is None else deadline
        plans = tuple(self._foresee(jobs))
        work = _total(plan_work(plan) for plan in plans)
        with self._ready:
            refusal = self._refusal(sum(p.tokens for p in plans), work, end, by_tokens, allowed_s) if jobs else None
            estimate = self._cost.seconds(self._ahead() + work) if jobs else 0.0
            return Admission(plans, self._queued_tokens if jobs else 0, self.tokens_per_s, refusal, estimate)

    def _foresee(self, jobs: Sequence[tuple[JobSpec, Plan]]) -> list[Plan]:
        """Each job's plan as it will run, given the cache and what the jobs queued and running, then the request's
        own jobs before it (they run one after another), leave there."""
        with self._ready:
            ahead = set(self._leaving())
        plans = []
        for spec, plan in jobs:  # outside the lock: planning a job takes a few milliseconds
            plans.append(self.engine.foresee(spec, plan, frozenset(ahead)))
            ahead.update(leaves(spec))
        return plans

    def _leaving(self) -> Iterator[bytes]:
        """The cache entries the jobs queued and running leave before a job queued now starts."""
        for ticket in (*self._queue, *((self._running,) if self._running is not None else ())):
            yield from leaves(ticket.spec)

    def _refusal(self, tokens: int, work: Work, deadline: float, by_tokens: bool,
                 allowed_s: float | None) -> Busy | TooLarge | None:
        """Why a request whose jobs decode ``tokens`` (``work``) is not admitted now (the rules of the module's
        text), or None; called with the lock held."""
        if self._stopping:
            return Busy("the server is shutting down")
        fastest = self._cost.fastest(work)
        if fastest is not None and allowed_s is not None and fastest > allowed_s:
            return TooLarge(tokens, self._cost.seconds(work), allowed_s)
        queued = self._queued_tokens
        if by_tokens and queued and queued + tokens > self.queue_tokens:
            return Busy(f"{queued} tokens are queued; this job adds {tokens}, over the budget of {self.queue_tokens}")
        # Behind other work, a retry can pass once it is done: the expected seconds decide. With nothing ahead a
        # retry meets the same estimate, so a request that could fit (not TooLarge) is refused only when even the
        # fastest the model allows misses its deadline; otherwise it runs, and its deadline stops it if need be.
        idle = not self._queue and self._running is None
        needed = fastest if idle else self._cost.seconds(self._ahead() + work)
        if needed is not None and not math.isinf(deadline):
            left = deadline - time.monotonic()
            if needed > left:
                return TooSlow(f"the {tokens} tokens of this job, after the {queued} queued, need "
                               f"{'at least' if idle else 'about'} "
                               f"{needed:.1f} s as this server's jobs have run; {max(0.0, left):.1f} s are "
                               f"left before its deadline")
        return None

    def _ahead(self) -> Work:
        """The work of the jobs queued and what the running one has left (called with the lock held)."""
        job = self._running_job
        if job is None:
            return self._queued_work
        return self._queued_work - done_work(job.plan, job.decoded_tokens)

    def result(self, ticket: Ticket) -> tuple[list[PromptScore], ScoreStats]:
        """The job's result; raises DeadlineExceeded (the job is cancelled) or ScoringFailed."""
        remaining = ticket.deadline - time.monotonic()
        try:
            return ticket.future.result(
                timeout=None if math.isinf(remaining) else max(0.0, remaining) + RESULT_GRACE_S)
        except TimeoutError:
            self.cancel(ticket)
        # A running job stops inside its decode at once and reports what it decoded until then (the release's
        # speed is measured on it); a queued one never ran.
        try:
            _, stats = ticket.future.result(timeout=RESULT_GRACE_S)
        except DeadlineExceeded as stopped:
            raise stopped from None
        except BaseException:  # noqa: BLE001 - cancelled in the queue, or not stopped in time: nothing measured
            raise DeadlineExceeded("no answer within the deadline") from None
        # It finished, too late for its caller: what it computed is still measured.
        raise DeadlineExceeded("the job finished after its deadline", decoded_tokens=stats.evaluated_tokens,
                               compute_s=stats.compute_s)

    def cancel(self, ticket: Ticket) -> None:
        """Give a job up: out of the queue with its tokens released, or stopped inside its decode."""
        with self._ready:
            if ticket in self._queue:
                self._queue.remove(ticket)
                self._queued_tokens -= ticket.tokens
                self._queued_work = self._queued_work - ticket.work
                ticket.future.cancel()
            elif self._running is ticket:
                self.engine.abort()

    @property
    def queued_tokens(self) -> int:
        return self._queued_tokens

    @property
    def cost(self) -> CostModel:
        """The cost model admission uses (read it under no lock only for reports)."""
        return self._cost

    @property
    def tokens_per_s(self) -> float | None:
        """Decode speed measured on the jobs run so far (tokens over seconds, recent jobs weighing most), None
        before the first."""
        return self._decoded / self._seconds if self._seconds > 0 else None

    @property
    def in_flight(self) -> int:
        with self._ready:
            return len(self._queue) + (self._running is not None)

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Refuse new jobs, let those queued run, and end the thread; past ``timeout_s`` the jobs still queued are
        refused (Busy) and the running one is stopped inside its decode. True once the thread has ended: only then
        may the engine be freed."""
        with self._ready:
            self._stopping = True
            self._ready.notify()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            with self._ready:
                for ticket in self._queue:
                    self._queued_tokens -= ticket.tokens
                    self._queued_work = self._queued_work - ticket.work
                    ticket.future.set_exception(Busy("the server is shutting down"))
                self._queue.clear()
                self.engine.abort()
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    # ---- the scheduler thread ------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """Whether the thread that runs the jobs is running (or stopped as asked): a scheduler whose thread died
        can score nothing, and ``/ping`` says so."""
        return self._thread.is_alive() or self._stopping

    def _loop(self) -> None:
        try:
            self._serve()
        except BaseException:
            # Nothing a job raises gets here (``_run`` keeps one job's failure to it); whatever did leaves the
            # jobs queued without a thread: they fail at once rather than wait for their deadlines.
            log.exception("the scheduler thread died")
            with self._ready:
                for ticket in self._queue:
                    self._queued_tokens -= ticket.tokens
                    self._queued_work = self._queued_work - ticket.work
                    if not ticket.future.done():
                        ticket.future.set_exception(ScoringFailed("the scheduler thread died"))
                self._queue.clear()
            raise

    def _serve(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._stopping:
                    self._ready.wait()
                if not self._queue:
                    return
                ticket = self._queue.popleft()
                # Before the job is the running one, which is when cancel() may abort it: an abort after this
                # point stops this job, however early it lands.
                self.engine.reset_abort()
                self._running = ticket
            try:
                self._run(ticket)
            except BaseException:
                if not ticket.future.done():
                    ticket.future.set_exception(ScoringFailed("the scheduler thread died"))
                raise
            finally:
                with self._ready:
                    self._running = self._running_job = None
                    self._queued_tokens -= ticket.tokens
                    self._queued_work = self._queued_work - ticket.work

    def _run(self, ticket: Ticket) -> None:
        ticket.started = time.monotonic()
        if not ticket.future.set_running_or_notify_cancel():
            return
        if ticket.started > ticket.deadline:
            ticket.future.set_exception(DeadlineExceeded("the job waited past its deadline"))
            return
        engine = self.engine
        job = None
        stepped = ticket.started  # when the last step ended
        try:
            with engine.lock:
                job = engine.begin(ticket.spec, ticket.plan)
                if late := self._recharge(ticket, job):
                    engine.abandon(job)
                    ticket.future.set_exception(late)
                    return
                while engine.step(job):
                    stepped = time.monotonic()
                    if stepped > ticket.deadline:
                        engine.abandon(job)
                        self._measure(job, stepped - ticket.started)
                        ticket.future.set_exception(DeadlineExceeded(
                            "the job ran past its deadline", decoded_tokens=job.decoded_tokens,
                            compute_s=job.compute_s))
                        return
                stepped = time.monotonic()
            result = engine.finish(job)
            self._measure(job, stepped - ticket.started)
        except DecodeAborted:  # the engine dropped the job already
            if job is not None:
                self._measure(job, stepped - ticket.started)
            decoded, compute = (job.decoded_tokens, job.compute_s) if job is not None else (0, 0.0)
            ticket.future.set_exception(DeadlineExceeded("the job was stopped at its deadline", decoded_tokens=decoded,
                                                         compute_s=compute))
            return
        except Exception as exc:  # noqa: BLE001 - one job's failure must not stop the scheduler
            log.exception("a job failed in the engine")
            ticket.future.set_exception(ScoringFailed(f"{type(exc).__name__}: {exc}"))
            return
        ticket.future.set_result(result)

    def _recharge(self, ticket: Ticket, job: Any) -> TooSlow | None:
        """Charge a starting job what it decodes as the cache now stands (more than foreseen where an entry it
        counted on is gone, less where one came); a TooSlow if that can no longer be done before its deadline."""
        tokens, work = job.tokens, plan_work(job.plan)
        with self._ready:
            self._queued_tokens += tokens - ticket.tokens
            self._queued_work = self._queued_work - ticket.work + work
            ticket.tokens, ticket.work = tokens, work
            self._running_job = job
            needed = self._cost.fastest(work)  # nothing is ahead of a job that starts (see _refusal)
        left = ticket.deadline - time.monotonic()
        if needed is not None and not math.isinf(left) and needed > left:
            return TooSlow(f"the {tokens} tokens of this job need at least {needed:.1f} s as this server's jobs have "
                           f"run; {max(0.0, left):.1f} s were left when it started")
        return None

    def _measure(self, job: Any, seconds: float) -> None:
        """Learn from a job that ran (to its end or not): the work of the decodes it finished, in ``seconds``."""
        tokens = job.decoded_tokens
        if tokens > 0 and seconds > 0:
            work = done_work(job.plan, tokens)
            with self._ready:
                self._cost.learn(work, seconds, self._cost.seconds(work))
            self._decoded = SPEED_MEMORY * self._decoded + tokens
            self._seconds = SPEED_MEMORY * self._seconds + seconds


def _total(works: Iterator[Work] | Sequence[Work]) -> Work:
    total = NOTHING
    for work in works:
        total = total + work
    return total
