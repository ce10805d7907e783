"""The one owner of llama.cpp: model, context and vocabulary, and the scoring of prompts against labels.

The engine works in tokens. Given prompts that share a prefix (template head and state) and, for each prompt,
its answer labels as token sequences, it returns each label's full-vocabulary log-probability read at the
first answer position (the chain rule over the label's tokens where a label spans several), the diagnostics
of that position, and what it cost; no token is generated.

``begin`` looks the prefix up in the state cache and asks ``plan.plan_job`` for the steps; the scheduler thread
then has ``step`` run them one by one (the ``Executor`` against the ``Memory``: the plan decides, the executor
decodes, the memory holds) and ``finish`` read the results out. The layout the plan chooses (see ``plan``) makes
every answer the same bit for bit alone, beside other questions, on a cache hit or on a miss. Not for
concurrent use: whoever steps jobs holds the engine's lock.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Sequence

import llama_cpp as llama

from . import backends
from .cache import PrefixCache, tokens_key
from .errors import EngineError, GpuUnavailable, RestoreFailed, ScoringFailed
from .executor import Executor, Outcome
from .memory import Blob, Memory
from .outlook import foreseen_plan
from .plan import HEAD_BLOB, STATE_SEQ, Decode, JobSpec, Limits, Plan, Save, chunked, plan_job
from .readout import LabelTrie, PromptScore, ScoreStats, common_prefix, prompt_score

log = logging.getLogger(__name__)

# The llama.cpp commit that each pinned llama-cpp-python release vendors (from its changelog); the
# library does not report it at run time.
VENDORED_LLAMA_CPP = {"0.3.36": "ggml-org/llama.cpp@0c1e57098"}
KV_CACHE_TYPES = {"f32": llama.GGML_TYPE_F32, "f16": llama.GGML_TYPE_F16}



@dataclass
class Job:
    """Everything one scoring job owns: its plan, the saved sequences it restores, what it has read so far.
    Nothing of a job is kept on the engine, so jobs never see each other's state."""

    spec: JobSpec
    plan: Plan
    blobs: dict[str | bytes, Blob]
    answered: dict[int, PromptScore]  # prompts answered from the cache
    answer_keys: tuple[bytes, ...]
    outcome: Outcome = field(default_factory=Outcome)
    next: int = 0  # index of the next step
    restarts: int = 0
    held: tuple[bytes, ...] = ()  # cache entries this job holds (released when it ends)
    decoded_tokens: int = 0  # tokens of the decode steps run so far (what the speed is measured on)

    @property
    def done(self) -> bool:
        return self.next >= len(self.plan.steps)

    @property
    def tokens(self) -> int:
        """Tokens the job decodes: what it costs the model."""
        return self.plan.tokens

    def restart(self, plan: Plan) -> None:
        self.plan, self.outcome, self.next = plan, Outcome(), 0
        self.spec = replace(self.spec, state_cached=False)
        self.restarts += 1


@dataclass(frozen=True)
class EngineOptions:
    threads: int
    gpu_layers: int = 0
    ctx_tokens: int = 8192
    batch_tokens: int = 512
    parallel_sequences: int = 32
    flash_attention: bool = False
    kv_cache_type: str = "f32"
    state_cache_bytes: int = 1 << 30
    fork_by: str = "auto"  # "copy" (share memory cells), "snapshot" (save/restore state) or "auto"
    layout: str = "exact"  # "exact", or "fused": the state's last micro-batch and the first question as one decode
    cpu_variant: str = "auto"  # llama.cpp's CPU kernels: the best for this CPU, or a variant's name (backends.py)


class Engine:
    """Loads a GGUF eagerly and scores prompts against declared labels."""

    def __init__(self, model_path: str, options: EngineOptions):
        self.model_path = model_path
        self.options = options
        self._lock = threading.Lock()
        self._model = None
        self._ctx = None
        self._executor: Executor | None = None
        self._head: tuple[int, ...] = ()
        self._head_blob: Blob | None = None
        self.cache = PrefixCache(options.state_cache_bytes)
        self.kernels = _init_backend(options.cpu_variant)
        check_gpu_layers(options.gpu_layers, options.cpu_variant)
        try:
            self._load()
        except BaseException:
            self.close()
            raise

    # ---- loading -------------------------------------------------------------------------------

    def _load(self) -> None:
        opts = self.options
        mparams = llama.llama_model_default_params()
        mparams.n_gpu_layers = opts.gpu_layers if opts.gpu_layers >= 0 else 2**31 - 1
        self._model = llama.llama_model_load_from_file(self.model_path.encode(), mparams)
        if not self._model:
            raise EngineError(f"llama.cpp could not load the model file {self.model_path}")
        self._vocab = llama.llama_model_get_vocab(self._model)
        self.non_truncatable = bool(llama.llama_model_is_recurrent(self._model)
                                    or llama.llama_model_is_hybrid(self._model))
        fork_by = opts.fork_by if opts.fork_by != "auto" else ("snapshot" if self.non_truncatable else "copy")
        if fork_by not in ("copy", "snapshot"):
            raise ValueError(f"fork_by must be copy, snapshot or auto, not {opts.fork_by!r}")
        self.fork_by = fork_by

        cparams = llama.llama_context_default_params()
        cparams.n_ctx = opts.ctx_tokens
        cparams.n_batch = opts.batch_tokens
        cparams.n_ubatch = opts.batch_tokens  # one llama_decode is one micro-batch: its shape is ours
        cparams.n_seq_max = opts.parallel_sequences
        cparams.type_k = cparams.type_v = KV_CACHE_TYPES[opts.kv_cache_type]
        cparams.n_threads = opts.threads
        cparams.n_threads_batch = opts.threads
        cparams.kv_unified = True  # forks share the prefix's memory cells instead of holding copies
        cparams.flash_attn_type = (llama.LLAMA_FLASH_ATTN_TYPE_ENABLED if opts.flash_attention
                                   else llama.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        cparams.no_perf = True
        self._ctx = llama.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            raise EngineError(
                f"llama.cpp could not create a context with {opts.ctx_tokens} tokens and "
                f"{opts.parallel_sequences} sequences (out of memory?)")
        self.ctx_tokens = llama.llama_n_ctx(self._ctx)
        self.batch_tokens = opts.batch_tokens
        self.n_vocab = llama.llama_vocab_n_tokens(self._vocab)
        self._memory = Memory(self._ctx, fork_by)
        self._executor = Executor(self._ctx, self.n_vocab, opts.batch_tokens)
        if opts.layout not in ("exact", "fused"):
            raise ValueError(f"layout must be exact or fused, not {opts.layout!r}")
        self.limits = Limits(batch_tokens=opts.batch_tokens, cells=self.ctx_tokens,
                             sequences=opts.parallel_sequences, fork_by=fork_by, fused=opts.layout == "fused")
        self.add_bos = bool(llama.llama_vocab_get_add_bos(self._vocab))
        self.bos_text = self._special_text(llama.llama_vocab_bos(self._vocab))
        self.eos_text = self._special_text(llama.llama_vocab_eos(self._vocab))
        template = llama.llama_model_chat_template(self._model, None)
        self.chat_template = template.decode("utf-8") if template else None
        self.control_texts, self.max_piece_bytes = self._read_vocabulary()
        self.train_ctx_tokens = int(llama.llama_model_n_ctx_train(self._model))
        self.architecture = self.metadata("general.architecture") or "unknown"

    def _special_text(self, token: int) -> str:
        return self.piece(token).decode("utf-8", "replace") if token >= 0 else ""

    def _read_vocabulary(self) -> tuple[tuple[str, ...], int]:
        """The texts of the vocabulary's special tokens (control and unknown: in a template they are parsed as
        such; in user text they are refused), and the most bytes one token spells (what bounds how few tokens
        a text can be: at least its bytes over this)."""
        texts = set()
        special_ids = {llama.llama_vocab_bos(self._vocab), llama.llama_vocab_eos(self._vocab),
                       llama.llama_vocab_eot(self._vocab)}
        special = llama.LLAMA_TOKEN_ATTR_CONTROL | llama.LLAMA_TOKEN_ATTR_UNKNOWN
        longest = 1
        for token in range(self.n_vocab):
            piece = self.piece(token)
            if token in special_ids or llama.llama_vocab_get_attr(self._vocab, token) & special:
                text = piece.decode("utf-8", "replace")
                if text.strip():
                    texts.add(text)
            else:
                longest = max(longest, len(piece))
        return tuple(sorted(texts, key=lambda t: (-len(t), t))), longest

    def metadata(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = llama.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    @property
    def versions(self) -> dict[str, str]:
        return {"llama_cpp_python": llama.__version__,
                "llama_cpp": VENDORED_LLAMA_CPP.get(llama.__version__, "unknown")}

    @property
    def kernel_info(self) -> dict[str, object]:
        """The CPU kernels this engine runs: ``cpu_variant`` and ``cpu_features`` (``backends.Kernels``)."""
        return self.kernels.info()

    # ---- vocabulary ----------------------------------------------------------------------------

    def tokenize(self, text: str, *, special: bool = False, bos: bool = False) -> list[int]:
        """Tokens of ``text``. ``special``: the texts of special tokens are parsed as those tokens (for the
        template's own text; user text is tokenized as text). ``bos``: the start of a whole prompt, which gets
        BOS where the model asks for it (unless the text starts with it)."""
        self._require_open()
        data = text.encode("utf-8")
        add_bos = bos and self.add_bos and not (special and self.bos_text and text.startswith(self.bos_text))
        capacity = len(data) + 8
        while True:
            out = (llama.llama_token * capacity)()
            n = llama.llama_tokenize(self._vocab, data, len(data), out, capacity, add_bos, special)
            if n >= 0:
                return list(out[:n])
            capacity = -n

    def piece(self, token: int) -> bytes:
        self._require_open()
        buf = ctypes.create_string_buffer(64)
        n = llama.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
        return buf.raw[:n]  # the buffer is padded; only the first n bytes are the piece

    # ---- resident head -------------------------------------------------------------------------

    def keep_resident(self, tokens: Sequence[int]) -> None:
        """Evaluate the fixed head of every prompt once and keep it saved; every job starts from it."""
        with self._lock:
            self._head, self._head_blob = (), None
            self.cache.clear()  # states cached under another head would never match again
            if tokens:
                self._memory.reset()
                self._executor.abort.clear()  # no job runs while the lock is held: a stop left over is stale
                for step in chunked(STATE_SEQ, tokens, 0, self.batch_tokens, None):
                    self._executor.decode(step, {})
                self._head_blob = self._memory.save(STATE_SEQ)
                self._memory.reset()
            self._head = tuple(tokens)

    @property
    def resident_tokens(self) -> int:
        return len(self._head)

    # ---- scoring -------------------------------------------------------------------------------

    def job_spec(self, prompts: Sequence[Sequence[int]], tries: Sequence[LabelTrie],
                 state: tuple[int, int] | None = None) -> JobSpec:
        """How a job's prompts relate to the head and to each other, before looking at the cache.

        ``state`` is the span of tokens that every prompt has whatever its question (the state, up to and
        including the question heading); its end is the cacheable prefix, saved under ``state_key``. Without
        it, prompts share what they have in common, minus at least one token of their own.
        """
        if not prompts or len(prompts) != len(tries):
            raise ValueError("one label trie per prompt is needed")
        prompts = tuple(tuple(p) for p in prompts)
        head = len(self._head) if self._head and common_prefix([self._head, *prompts]) == len(self._head) else 0
        common = min(common_prefix(prompts), min(len(p) for p in prompts) - 1)
        end = max(head, common if state is None else min(state[1], common))
        state_key = tokens_key("state", prompts[0][:end]) if end > head else None
        answer_keys = tuple(tokens_key("answer", p, t.sequences) for p, t in zip(prompts, tries))
        return JobSpec(prompts, tuple(tries), head, end, state_key, answer_keys=answer_keys)

    def plan(self, spec: JobSpec) -> Plan:
        """The plan of a job as if nothing were cached: its peak memory is the most the job can need."""
        return plan_job(spec, self.limits)

    def foresee(self, spec: JobSpec, plan: Plan, ahead: frozenset[bytes]) -> Plan:
        """The plan ``spec`` will run when it starts, given what the cache holds now and the entries the jobs
        ahead of it (``ahead``) will leave there (``outlook``)."""
        return foreseen_plan(spec, plan, self.limits, lambda key: key in ahead or key in self.cache)

    @property
    def lock(self) -> threading.Lock:
        """Held by whoever uses the context: the scheduler thread while it steps jobs, ``prefill`` otherwise."""
        return self._lock

    def answer_from_cache(self, spec: JobSpec) -> tuple[list[PromptScore], ScoreStats] | None:
        """Every prompt's answer when the cache holds them all (an identical repeat): nothing to decode, so the
        caller needs no place in the scheduler's queue. Any thread may call this."""
        scores = []
        for key in self._answer_keys(spec):
            score = self.cache.get(key)
            if score is None:
                return None
            scores.append(score)
        stats = ScoreStats(resident_tokens=spec.head, shared_tokens=0,
                           cached_tokens=sum(len(p) - spec.head for p in spec.prompts),
                           own_tokens=(0,) * len(spec.prompts), readout_tokens=0, prefill_s=0.0, readout_s=0.0)
        return scores, stats

    def forget(self, spec: JobSpec, *, answers: bool = True, state: bool = True) -> None:
        """Drop what the cache holds for ``spec``: its prompts' answers and/or its state, leaving everything else
        (the benchmarks time a request on a warm state, or a warm prior, this way)."""
        for key in self._answer_keys(spec) if answers else ():
            self.cache.discard(key)
        if state and spec.state_key is not None:
            self.cache.discard(spec.state_key)

    def _answer_keys(self, spec: JobSpec) -> tuple[bytes, ...]:
        return spec.answer_keys or tuple(tokens_key("answer", p, t.sequences) for p, t in zip(spec.prompts, spec.tries))

    def begin(self, spec: JobSpec, plan: Plan | None = None) -> Job:
        """A job for ``spec``, as the cache stands when it starts: the answers and the state it already holds,
        and its plan (``plan``, the uncached plan of ``spec``, is used as it is when the cache holds nothing
        for the job). The scheduler thread calls this as the job starts, so that requests queued over one new
        state decode it once. The state it restores is held in the cache until the job ends."""
        self._require_open()
        keys = self._answer_keys(spec)
        answered = {i: a for i, key in enumerate(keys) if (a := self.cache.get(key)) is not None}
        blobs: dict[str | bytes, Blob] = {HEAD_BLOB: self._head_blob} if self._head_blob is not None else {}
        held: tuple[bytes, ...] = ()
        cached_state = None
        if spec.state_key is not None and len(answered) < len(spec.prompts):
            cached_state = self.cache.acquire(spec.state_key)
        if cached_state is not None:
            blobs[spec.state_key] = cached_state
            held = (spec.state_key,)
        if answered or cached_state is not None or plan is None:
            spec = replace(spec, state_cached=cached_state is not None, answered=frozenset(answered))
            plan = plan_job(spec, self.limits)
        return Job(spec, plan, blobs, answered, keys, held=held)

    def step(self, job: Job) -> bool:
        """Run the job's next step; False once every step has run. Only the thread that owns the engine calls
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
                self.cache.put(step.key, job.outcome.saved.pop(step.key))
            elif isinstance(step, Decode):
                job.decoded_tokens += step.tokens
            job.next += 1
        if job.next == len(job.plan.steps):
            self._memory.reset()
            return False
        return True

    def _restore_failed(self, job: Job, step) -> None:
        """A cached state that llama.cpp refuses is dropped and the job decoded again from the head, once; the
        head itself, or a second refusal, fails the job (a plan that restarts forever would never end)."""
        if step.blob == HEAD_BLOB or job.restarts:
            self.abandon(job)
            raise EngineError("llama.cpp refused the saved head" if step.blob == HEAD_BLOB
                              else "llama.cpp refused a saved sequence twice")
        log.warning("a cached state could not be restored; decoding it again")
        self._release(job)
        self.cache.discard(job.spec.state_key)
        job.blobs.pop(job.spec.state_key, None)
        job.restart(plan_job(replace(job.spec, state_cached=False), self.limits))

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
        scores = []
        for i, trie in enumerate(spec.tries):
            if i in job.answered:
                scores.append(job.answered[i])
                continue
            score = prompt_score(trie, {node: read for (p, node), read in outcome.reads.items() if p == i})
            self.cache.put(job.answer_keys[i], score)
            scores.append(score)
        cached = plan.cached_tokens + sum(len(spec.prompts[i]) - spec.head for i in job.answered)
        stats = ScoreStats(resident_tokens=spec.head, shared_tokens=plan.shared_tokens, cached_tokens=cached,
                           own_tokens=plan.own_tokens, readout_tokens=plan.readout_tokens,
                           prefill_s=outcome.prefill_s, readout_s=outcome.readout_s)
        return scores, stats

    def prefill(self, tokens: Sequence[int], *, reuse_resident: bool = False) -> tuple[float, int]:
        """Seconds to llama_decode ``tokens`` in the fastest layout (one micro-batch per ``batch_tokens``
        tokens, no readout) and the tokens decoded: from empty memory, or after the saved head (for the
        benchmarks' floor)."""
        with self._lock:
            start = len(self._head) if reuse_resident and self._head_blob is not None \
                and common_prefix([self._head, tokens]) == len(self._head) else 0
            self._memory.reset()
            self._executor.abort.clear()
            try:
                if start:
                    self._memory.load(STATE_SEQ, self._head_blob)
                started = time.perf_counter()
                for step in chunked(STATE_SEQ, tokens[start:], start, self.batch_tokens, None):
                    self._executor.decode(step, {})
                return time.perf_counter() - started, len(tokens) - start
            finally:
                self._memory.reset()

    # ---- lifetime ------------------------------------------------------------------------------

    def close(self) -> None:
        """Free the context and the model once no job is stepping: a decode in progress is aborted and its
        step finished under the engine's lock first (freeing the context under a running ``llama_decode`` would
        crash the process); a job begun afterwards fails with ``ScoringFailed``."""
        if self._executor is not None:
            self._executor.abort.set()
        with self._lock:
            self._free()

    def _require_open(self) -> None:
        if self._model is None:
            raise ScoringFailed("the engine is closed")

    def _free(self) -> None:
        if self._executor is not None:
            self._executor.close()
            self._executor = None
        if self._ctx:
            llama.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            llama.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_backend_ready = False
_backend_lock = threading.Lock()
_log_callback = None  # llama.cpp keeps the C pointer: the Python object must outlive every call


def _init_backend(cpu_variant: str = "auto") -> backends.Kernels:
    """llama.cpp's log forwarded to ours, its CPU kernels loaded (``backends.load``), then its backend initialised;
    once per process. Raises ``BackendUnavailable`` (an ``EngineError``) where the kernels cannot be loaded."""
    global _backend_ready, _log_callback
    with _backend_lock:
        if _backend_ready:
            return backends.load(cpu_variant)
        llama_log = logging.getLogger("llama_cpp")

        def forward(level: int, text: bytes, _user_data) -> None:
            message = text.decode("utf-8", "replace").rstrip()
            if message:
                llama_log.log({3: logging.WARNING, 4: logging.ERROR}.get(level, logging.DEBUG), message)

        _log_callback = llama.llama_log_callback(forward)
        llama.llama_log_set(_log_callback, ctypes.c_void_p(0))
        kernels = backends.load(cpu_variant)  # before llama_backend_init, which would
        llama.llama_backend_init()  # look for backends beside the Python executable and find none
        _backend_ready = True
        return kernels


def gpu_backend_available(cpu_variant: str = "auto") -> bool:
    _init_backend(cpu_variant)
    return bool(llama.llama_supports_gpu_offload())


def check_gpu_layers(gpu_layers: int, cpu_variant: str = "auto") -> None:
    """Refuse GPU layers from a llama.cpp build without a GPU backend (at start-up, before loading anything)."""
    if gpu_layers != 0 and not gpu_backend_available(cpu_variant):
        raise GpuUnavailable(
            f"ADAPTER_GPU_LAYERS={gpu_layers} asks for GPU offload, but this llama-cpp-python build has no GPU "
            f"backend; set ADAPTER_GPU_LAYERS=0 or use the GPU image")
