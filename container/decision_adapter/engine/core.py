"""The engine: the one owner of llama.cpp for a model, composed of its parts, and the front of its cache.

The engine works in tokens. Given prompts that share a prefix (template head and state) and, for each prompt,
its answer labels as token sequences, it describes the job (``job_spec``: what the prompts share, where their
state and answers are cached) and plans it as if nothing were cached (``plan``: its peak memory is the most the
job can need); a request whose every answer is cached is answered without a job (``answer_from_cache``). The
parts: ``LlamaModel`` (model and context), ``Vocabulary`` (text and tokens), ``PrefixCache`` (states and
answers across requests) and ``Runner`` (everything that decodes: the resident head, jobs step by step for the
scheduler thread, the benchmarks' floor). The layout the plan chooses (see ``plan``) makes every answer the same
bit for bit alone, beside other questions, on a cache hit or on a miss.
"""

from __future__ import annotations

from typing import Sequence

from .cache import PrefixCache, answer_key, boundary_keys, tokens_key
from .llama_model import EngineOptions, LlamaModel, check_gpu_layers, init_backend, versions
from .memory_kind import MemoryKind
from .plan import JobSpec, Limits, Plan, kept_boundaries, plan_job
from .readout import LabelTrie, PromptScore, ScoreStats, common_prefix
from .runner import Runner, answer_keys
from .vocabulary import Vocabulary

__all__ = ["Engine", "EngineOptions"]


class Engine:
    """Loads a GGUF eagerly and scores prompts against declared labels (through a scheduler over ``runner``)."""

    def __init__(self, model_path: str, options: EngineOptions):
        self.model_path = model_path
        self.options = options
        self.cache = PrefixCache(options.state_cache_bytes)
        self.kernels = init_backend(options.cpu_variant)
        check_gpu_layers(options.gpu_layers, options.cpu_variant)
        self.model = LlamaModel(model_path, options)
        try:
            self.vocabulary = Vocabulary(self.model)
            memory = self.model.memory
            # The fused layout decodes the state's last micro-batch with a prompt: where the memory needs a
            # checkpoint at the state's end, it is laid out exactly (``layout`` says which ran).
            self.limits = Limits(batch_tokens=options.batch_tokens, cells=self.model.ctx_tokens,
                                 sequences=options.parallel_sequences, fork_by=self.model.fork_by,
                                 fused=options.layout == "fused" and not memory.checkpoints, memory=memory)
            self.runner = Runner(self.model, self.limits, self.cache)
            # Orderings share their stem where the split is exact here: always where it is part of every prompt's
            # layout (a recurrent state), elsewhere where a decode of a stem's rest gives the bits of the prompt
            # decoded whole on these kernels (a start-up probe: not on every GPU or attention kernel).
            self.stems = memory.splits_stems or self.runner.stems_exact()
        except BaseException:
            self.model.free()
            raise

    # ---- what the model says of itself ---------------------------------------------------------

    @property
    def ctx_tokens(self) -> int:
        return self.model.ctx_tokens

    @property
    def train_ctx_tokens(self) -> int:
        return self.model.train_ctx_tokens

    @property
    def chat_template(self) -> str | None:
        return self.model.chat_template

    @property
    def architecture(self) -> str:
        return self.model.architecture

    @property
    def layout(self) -> str:
        """How jobs are laid out in llama_decode calls (``EngineOptions.layout``, where the memory allows it): what
        every result reports."""
        return "fused" if self.limits.fused else "exact"

    @property
    def memory(self) -> MemoryKind:
        """What the model's memory is made of (``memory_kind``)."""
        return self.limits.memory

    @property
    def memory_info(self) -> dict[str, object]:
        """The model's memory kind and what each reuse does on it (``/ping``, the start-up log)."""
        return self.limits.memory.describe(stems=self.stems and not self.runner.cuts_refused)

    @property
    def versions(self) -> dict[str, str]:
        return versions()

    @property
    def kernel_info(self) -> dict[str, object]:
        """The CPU kernels this engine runs: ``cpu_variant`` and ``cpu_features`` (``backends.Kernels``)."""
        return self.kernels.info()

    # ---- the resident head ---------------------------------------------------------------------

    def keep_resident(self, tokens: Sequence[int]) -> None:
        """Evaluate the fixed head of every prompt once and keep it saved; every job starts from it. States
        cached under another head would never match again: the cache is emptied."""
        self.cache.clear()
        self.runner.keep_resident(tokens)

    @property
    def resident_tokens(self) -> int:
        return len(self.runner.head)

    # ---- jobs and the cache --------------------------------------------------------------------

    def job_spec(self, prompts: Sequence[Sequence[int]], tries: Sequence[LabelTrie],
                 state: tuple[int, int] | None = None, stems: Sequence[int] | None = None) -> JobSpec:
        """How a job's prompts relate to the head and to each other, before looking at the cache.

        ``state`` is the span of tokens that every prompt has whatever its question (the state, up to and
        including the question heading); its end is the cacheable prefix, saved under ``state_key``. Without
        it, prompts share what they have in common, minus at least one token of their own. ``stems``: where each
        prompt's stem ends (its tokens that do not depend on its options' order, ``plan``), shared by the prompts
        next to each other that have it; kept only where the model's memory can be cut back to it.
        """
        if not prompts or len(prompts) != len(tries):
            raise ValueError("one label trie per prompt is needed")
        prompts = tuple(tuple(p) for p in prompts)
        own_head = self.runner.head
        head = len(own_head) if own_head and common_prefix([own_head, *prompts]) == len(own_head) else 0
        common = min(common_prefix(prompts), min(len(p) for p in prompts) - 1)
        end = max(head, common if state is None else min(state[1], common))
        memory, reuse = self.limits.memory, not self.runner.cuts_refused
        # A state is cached only where the cache could keep it: with the cache off (ADAPTER_STATE_CACHE_MB=0) or
        # for a state as long as one that did not fit, nothing is saved, and admission counts on nothing.
        cached = end > head and self.runner.could_cache(end)
        state_key = tokens_key("state", prompts[0][:end]) if cached else None
        # The state's micro-batch boundaries (the fused layout's last one holds a prompt's tokens too, so it is not
        # one): where a cached prefix of it may end, and where a sliding window is laid out as a restore lays it
        # out, cached or not.
        last = end - 1 if self.limits.fused else end
        boundaries = boundary_keys(prompts[0], head, last, self.limits.batch_tokens) \
            if end > head and ((state_key and reuse) or memory.compacts) else ()
        # What the saved state serves as: every boundary, or where checkpoints are needed, those it keeps one at.
        kept = kept_boundaries(len(boundaries), self.options.checkpoints) if memory.checkpoints else None
        prefixes = tuple(digest for n, (_, digest) in enumerate(boundaries) if kept is None or n in kept) \
            if state_key and reuse else ()
        # A stem that does not reach past the state is no stem; none where the probe found a stem's rest inexact.
        own_stems = tuple(max(end, min(stem, len(p) - 1)) for stem, p in zip(stems, prompts)) \
            if stems and self.stems and reuse else ()
        own_stems = own_stems if any(s > end for s in own_stems) else ()
        keys = tuple(answer_key(p, t.sequences, end, own_stems[i] if own_stems else end)
                     for i, (p, t) in enumerate(zip(prompts, tries))) if self.cache.budget_bytes > 0 else ()
        return JobSpec(prompts, tuple(tries), head, end, state_key, answer_keys=keys, boundaries=boundaries,
                       prefixes=prefixes, stems=own_stems)

    def plan(self, spec: JobSpec) -> Plan:
        """The plan of a job as if nothing were cached: its peak memory is the most the job can need."""
        return plan_job(spec, self.limits)

    def answer_from_cache(self, spec: JobSpec, *, touch: bool = True) -> tuple[list[PromptScore], ScoreStats] | None:
        """Every prompt's answer when the cache holds them all (an identical repeat): nothing to decode, so the
        caller needs no place in the scheduler's queue. ``touch=False`` looks without using: the cache's order
        and stats stay as they are (a dry run). Any thread may call this."""
        scores = []
        look = self.cache.get if touch else self.cache.peek
        for key in answer_keys(spec):
            score = look(key)
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
        for key in answer_keys(spec) if answers else ():
            self.cache.discard(key)
        if state and spec.state_key is not None:
            self.cache.discard(spec.state_key)
            for key in self.cache.holders(spec.boundaries):
                self.cache.discard(key)

    # ---- lifetime ------------------------------------------------------------------------------

    def close(self) -> None:
        """Free the context and the model once no job is stepping: a decode in progress is aborted and its
        step finished under the runner's lock first (freeing the context under a running ``llama_decode`` would
        crash the process); a job begun or a text tokenized afterwards fails with ``ScoringFailed``."""
        self.runner.abort()
        with self.runner.lock:
            self.runner.close()
            self.model.free()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
