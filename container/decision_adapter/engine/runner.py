"""The runner: everything that decodes on the one llama.cpp context, under its lock.

It keeps the fixed head of every prompt resident (decoded once, saved, restored at the start of each job), runs a
scoring job as the scheduler thread asks (``begin`` looks the cache up and plans, ``step`` runs one step through
the ``Executor`` against the ``Memory``, ``finish`` reads the scores out and caches them), stops a decode in
progress from any thread (``abort``), and times a bare prefill for the benchmarks' floor. It is the scheduler's
``JobRunner``. Whoever steps jobs holds ``lock``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Sequence

from .cache import PrefixCache, SavedState, answer_key
from .errors import EngineError, RestoreFailed, ScoringFailed
from .executor import Executor, Outcome
from .llama_model import LlamaModel
from .memory import Blob, Memory
from .outlook import foreseen_plan
from .plan import (HEAD_BLOB, STATE_SEQ, BlobKey, Cut, Decode, JobSpec, Limits, Plan, Read, Save,
                   aligned, checkpoint_key, chunked, plan_job)
from .readout import PromptScore, ScoreStats, common_prefix, prompt_score

log = logging.getLogger(__name__)


@dataclass
class Job:
    """Everything one scoring job owns: its plan, the saved sequences it restores, what it has read so far.
    Nothing of a job is kept on the runner, so jobs never see each other's state."""

    spec: JobSpec
    plan: Plan
    blobs: dict[BlobKey, Blob]
    answered: dict[int, PromptScore]  # prompts answered from the cache
    answer_keys: tuple[bytes, ...]
    outcome: Outcome = field(default_factory=Outcome)
    next: int = 0  # index of the next step
    restarts: int = 0
    held: tuple[bytes, ...] = ()  # cache entries this job holds (released when it ends)
    decoded_tokens: int = 0  # tokens of the decode steps run so far (what the speed is measured on)
    source: tuple[bytes, SavedState | Blob] | None = None  # the saved state a prefix was restored from (key, value)

    @property
    def done(self) -> bool:
        return self.next >= len(self.plan.steps)

    @property
    def tokens(self) -> int:
        """Tokens the job decodes: what it costs the model."""
        return self.plan.tokens

    @property
    def compute_s(self) -> float:
        """The seconds its decodes have taken so far (its memory steps apart)."""
        return self.outcome.prefill_s + self.outcome.readout_s

    def restart(self, plan: Plan) -> None:
        self.plan, self.outcome, self.next = plan, Outcome(), 0
        self.spec = replace(self.spec, state_cached=False, prefix=0)
        self.source = None
        self.restarts += 1


def sequence(saved: SavedState | Blob) -> Blob:
    """The saved sequence of a cached state (with or without checkpoints)."""
    return saved.blob if isinstance(saved, SavedState) else saved


def answer_keys(spec: JobSpec) -> tuple[bytes, ...]:
    """Where each prompt's answer is cached: the spec's own keys, or the digests of its prompts and labels."""
    return spec.answer_keys or tuple(answer_key(p, t.sequences, spec.state_end, spec.stem(i))
                                     for i, (p, t) in enumerate(zip(spec.prompts, spec.tries)))


class Runner:
    def __init__(self, model: LlamaModel, limits: Limits, cache: PrefixCache):
        self.lock = threading.Lock()
        self.limits = limits
        self.cache = cache
        self._memory = Memory(model.ctx, model.fork_by)
        self._executor: Executor | None = Executor(model.ctx, model.n_vocab, limits.batch_tokens)
        self.head: tuple[int, ...] = ()
        self._head_blob: Blob | None = None
        # Set once llama.cpp refuses a cut the model's memory kind allows: no prefixes or stems from then on.
        self.cuts_refused = False
        self._too_large = 2**62  # the fewest tokens of a state that was larger than the whole cache

    # ---- the resident head ---------------------------------------------------------------------

    def keep_resident(self, tokens: Sequence[int]) -> None:
        """Evaluate the fixed head of every prompt once and keep it saved; every job starts from it."""
        with self.lock:
            self.head, self._head_blob = (), None
            if tokens:
                self._memory.reset()
                self._executor.abort.clear()  # no job runs while the lock is held: a stop left over is stale
                for step in chunked(STATE_SEQ, tokens, 0, self.limits.batch_tokens, None):
                    self._executor.decode(step, {})
                self._head_blob = self._memory.save(STATE_SEQ)
                self._memory.reset()
            self.head = tuple(tokens)

    # ---- what the engine may reuse -------------------------------------------------------------

    def stems_exact(self) -> bool:
        """Whether a stem's rest, decoded after a cut of another prompt with the same stem, gives the logits of the
        prompt decoded whole, bit for bit, on these kernels (``plan``'s split at a row-group edge holds on the CPU
        kernels it was measured on; a GPU or another attention kernel may group rows otherwise). Two prompts of 61
        tokens sharing 24 and 8, decoded from empty memory; run once at start-up."""
        with self.lock:
            try:
                for length, stem in ((61, 24), (37, 8)):
                    first = tuple(range(100, 100 + length))
                    second = first[:stem] + tuple(range(300, 300 + length - stem))
                    read = Read(0, (), (0,))
                    whole: dict = {}
                    size = self.limits.batch_tokens  # micro-batches as a request's plan lays them out
                    self._memory.reset()
                    for step in aligned(STATE_SEQ, second, 0, length, 0, size, read):
                        self._executor.decode(step, whole)
                    rest: dict = {}
                    self._memory.reset()
                    for step in aligned(STATE_SEQ, first, 0, length, 0, size, None):
                        self._executor.decode(step, rest)
                    self._memory.cut(STATE_SEQ, stem)
                    for step in aligned(STATE_SEQ, second, stem, length, 0, size, read):
                        self._executor.decode(step, rest)
                    if whole[0, ()] != rest[0, ()]:
                        log.info("a stem's rest does not give the bits of the prompt decoded whole on these kernels: "
                                 "orderings do not share their stem")
                        return False
                return True
            finally:
                self._memory.reset()

    def could_cache(self, tokens: int) -> bool:
        """Whether a state of ``tokens`` tokens could be kept: the cache is on, and no state as long has been too
        large for it."""
        return self.cache.budget_bytes > 0 and tokens < self._too_large

    # ---- jobs (the scheduler's JobRunner) ------------------------------------------------------

    def foresee(self, spec: JobSpec, plan: Plan, ahead: frozenset[bytes]) -> Plan:
        """The plan ``spec`` will run when it starts, given what the cache holds now and the entries the jobs
        ahead of it (``ahead``) will leave there (``outlook``)."""
        return foreseen_plan(spec, plan, self.limits, lambda key: key in ahead or key in self.cache)

    def begin(self, spec: JobSpec, plan: Plan | None = None) -> Job:
        """A job for ``spec``, as the cache stands when it starts: the answers and the state it already holds (the
        whole state, or else the longest prefix of it that ends on one of its micro-batch boundaries), and its plan
        (``plan``, the uncached plan of ``spec``, is used as it is when the cache holds nothing for the job). The
        scheduler thread calls this as the job starts, so that requests queued over one new state decode it once.
        The saved state it restores is held in the cache until the job ends."""
        if self._executor is None:
            raise ScoringFailed("the engine is closed")
        keys = answer_keys(spec)
        answered = {i: a for i, key in enumerate(keys) if (a := self.cache.get(key)) is not None}
        blobs: dict[BlobKey, Blob] = {HEAD_BLOB: self._head_blob} if self._head_blob is not None else {}
        held: tuple[bytes, ...] = ()
        cached_state = source = None
        prefix = 0
        if spec.state_key is not None and len(answered) < len(spec.prompts):
            cached_state = self.cache.acquire(spec.state_key)
            if cached_state is not None:
                blobs[spec.state_key] = sequence(cached_state)
                held = (spec.state_key,)
            elif not self.cuts_refused:
                for end, digest in reversed(spec.boundaries):  # the longest first: one look-up a boundary
                    if (found := self.cache.acquire_prefix(digest)) is not None:
                        held, source = (found[0],), found
                        blobs[digest] = sequence(found[1])
                        if isinstance(found[1], SavedState):
                            blobs[checkpoint_key(digest)] = found[1].checkpoints[digest]
                        prefix = end
                        break
        if answered or held or plan is None:
            spec = replace(spec, state_cached=cached_state is not None, prefix=prefix, answered=frozenset(answered))
            plan = plan_job(spec, self.limits)
        return Job(spec, plan, blobs, answered, keys, held=held, source=source)

    def step(self, job: Job) -> bool:
        """Run the job's next step; False once every step has run. Only the thread that owns the context calls
        this: a job starts from empty memory and leaves it empty, so jobs run one after another. A state the job
        saves goes into the cache at once, so that it outlives the job if the job is dropped later."""
        if job.next == 0:
            self._memory.reset()
        if job.next < len(job.plan.steps):
            step = job.plan.steps[job.next]
            try:
                self._executor.run_step(step, self._memory, job.blobs, job.outcome)
            except RestoreFailed:
                self._restore_failed(job, step)
                return True
            except BaseException:
                self.abandon(job)
                raise
            if isinstance(step, Save):
                self._keep(job, step)
            elif isinstance(step, Decode):
                job.decoded_tokens += step.tokens
            job.next += 1
        if job.next == len(job.plan.steps):
            self._memory.reset()
            return False
        return True

    def _keep(self, job: Job, step: Save) -> None:
        """The state the job saved, into the cache: on a memory that needs checkpoints with the checkpoints it keeps
        (taken by this job, or, below the prefix it restored, the ones the saved state it grew from had), serving
        as a prefix at those boundaries only. A state grown from a saved state takes its place (``PrefixCache.put``:
        where it restored one of that one's last two prefixes)."""
        blob = job.outcome.saved.pop(step.key)
        value: SavedState | Blob = blob
        prefixes = step.prefixes
        if self.limits.memory.checkpoints:
            inherited = job.source[1].checkpoints if job.source and isinstance(job.source[1], SavedState) else {}
            taken = job.outcome.checkpoints
            checkpoints = {digest: found for digest in step.prefixes
                           if (found := taken.get(checkpoint_key(digest), inherited.get(digest))) is not None}
            value, prefixes = SavedState(blob, checkpoints), tuple(checkpoints)
        grown_from = (job.source[0], job.spec.prefix_key) if job.source and job.spec.prefix_key else None
        if not self.cache.put(step.key, value, prefixes=prefixes, grown_from=grown_from) \
                and not self.cache.fits(value, step.key, prefixes):
            self._too_large = min(self._too_large, step.tokens)

    def _restore_failed(self, job: Job, step) -> None:
        """A cached state, a prefix's saved state or checkpoint, or a cut after it, that llama.cpp refuses: the
        saved state is dropped and the job decoded again from the head, once; the head itself, or a second refusal,
        fails the job (a plan that restarts forever would never end). A refused cut means the model's memory is not
        what its kind says: prefixes and stems are turned off for good (a stem's cut is the job's own)."""
        if getattr(step, "blob", None) == HEAD_BLOB or job.restarts:
            self.abandon(job)
            raise EngineError("llama.cpp refused the saved head" if getattr(step, "blob", None) == HEAD_BLOB
                              else "llama.cpp refused a saved sequence twice")
        spec = replace(job.spec, state_cached=False, prefix=0)
        if isinstance(step, Cut):
            log.warning("llama.cpp refused to cut a sequence back: prefixes and stems are off from now on")
            self.cuts_refused = True
            spec = replace(spec, stems=())
        else:
            log.warning("a cached state could not be restored; decoding it again")
        refused = job.held if not isinstance(step, Cut) or step.seq == STATE_SEQ else ()
        self._release(job)
        for key in refused:
            self.cache.discard(key)
        job.restart(plan_job(spec, self.limits))

    def abort(self) -> None:
        """Stop the ``llama_decode`` running now, or the next one (any thread): the job's deadline passed."""
        if self._executor is not None:
            self._executor.abort.set()

    def reset_abort(self) -> None:
        """Clear a stop left over from an earlier job. The scheduler calls this before it makes a job the running
        one, so that an abort aimed at that job, however early it lands, is never cleared."""
        if self._executor is not None:
            self._executor.abort.clear()

    def abandon(self, job: Job) -> None:
        """Drop a job part way (a deadline, a failure): its memory is freed for the next one; the state it saved
        stays cached."""
        job.next = len(job.plan.steps)
        self._release(job)
        self._memory.reset()

    def _release(self, job: Job) -> None:
        for key in job.held:
            self.cache.release(key)
        job.held = ()

    def finish(self, job: Job) -> tuple[list[PromptScore], ScoreStats]:
        """The job's scores and stats once every step has run; its answers go into the cache."""
        self._release(job)
        spec, plan, outcome = job.spec, job.plan, job.outcome
        fresh = {i: prompt_score(trie, {node: read for (p, node), read in outcome.reads.items() if p == i})
                 for i, trie in enumerate(spec.tries) if i not in job.answered}
        if not all(math.isfinite(x) for score in fresh.values()
                   for x in (*score.label_logprobs, *score.first_token_logits, score.label_mass)):
            # Cached, such a readout would fail every identical request; the state this job saved may hold the
            # cause (its keys and values), so it goes too, and the next request decodes everything again.
            if spec.state_key is not None:
                self.cache.discard(spec.state_key)
            raise ScoringFailed("llama.cpp returned logits that are not finite")
        scores = []
        for i in range(len(spec.tries)):
            if i in job.answered:
                scores.append(job.answered[i])
                continue
            self.cache.put(job.answer_keys[i], fresh[i])
            scores.append(fresh[i])
        cached = plan.cached_tokens + sum(len(spec.prompts[i]) - spec.head for i in job.answered)
        stats = ScoreStats(resident_tokens=spec.head, shared_tokens=plan.shared_tokens, cached_tokens=cached,
                           own_tokens=plan.own_tokens, readout_tokens=plan.readout_tokens,
                           prefill_s=outcome.prefill_s, readout_s=outcome.readout_s, memory_s=outcome.memory_s)
        return scores, stats

    # ---- the benchmarks' floor -----------------------------------------------------------------

    def prefill(self, tokens: Sequence[int], *, reuse_resident: bool = False) -> tuple[float, int]:
        """Seconds to llama_decode ``tokens`` in the fastest layout (one micro-batch per ``batch_tokens``
        tokens, no readout) and the tokens decoded: from empty memory, or after the saved head."""
        with self.lock:
            start = len(self.head) if reuse_resident and self._head_blob is not None \
                and common_prefix([self.head, tokens]) == len(self.head) else 0
            self._memory.reset()
            self._executor.abort.clear()
            try:
                if start:
                    self._memory.load(STATE_SEQ, self._head_blob)
                started = time.perf_counter()
                for step in chunked(STATE_SEQ, tokens[start:], start, self.limits.batch_tokens, None):
                    self._executor.decode(step, {})
                return time.perf_counter() - started, len(tokens) - start
            finally:
                self._memory.reset()

    def close(self) -> None:
        """Free the executor's batch; the caller holds ``lock`` (no step runs) and frees the context after."""
        if self._executor is not None:
            self._executor.close()
            self._executor = None
