"""The one owner of llama.cpp: model, context, vocabulary and the resident prompt prefix.

The engine works in tokens. Given prompts that may share a prefix, and for each prompt the answer
labels as token sequences, it returns each label's probability restricted to the declared labels,
read from the logits at the first answer position; no token is generated. Where a label spans several
tokens, its probability is the chain rule over the label trie, each inner node scored on a forked copy
of the prompt.

Memory layout, with the model's memory shared by all sequences (``kv_unified``):

* sequence 0 holds the resident prefix (template head and system instruction), decoded once at load;
* sequence 1 holds the shared part of a request's prompts (the state), decoded once per request;
  the state is decoded in large prefill micro-batches laid out the same way whatever else the request
  holds, the rest (questions, label paths) in small micro-batches where every query is computed alone,
  so that an answer does not depend on the other questions of its request;
* sequences 2.. are forks: one per prompt, then one per inner label-trie node, decoded side by side.

Attention-only models fork by ``llama_memory_seq_cp``, which shares cells instead of copying them.
Models whose memory cannot be truncated to a prefix (recurrent or hybrid) fork by saving the source
sequence with ``llama_state_seq_get_data`` and restoring it into each fork.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from dataclasses import dataclass
from typing import Iterable, Sequence

import llama_cpp as llama

from .readout import LabelTrie, PromptScore, ScoreStats, common_prefix

log = logging.getLogger(__name__)

# The llama.cpp commit that each pinned llama-cpp-python release vendors (from its changelog); the
# library does not report it at run time.
VENDORED_LLAMA_CPP = {"0.3.36": "ggml-org/llama.cpp@0c1e57098"}

RESIDENT_SEQ = 0
SHARED_SEQ = 1
FIRST_FORK_SEQ = 2


class EngineError(RuntimeError):
    """llama.cpp could not load or evaluate; the message says which step failed."""


class GpuUnavailable(EngineError):
    """GPU layers were requested from a llama.cpp build without a GPU backend."""


@dataclass(frozen=True)
class EngineOptions:
    threads: int
    gpu_layers: int = 0
    ctx_tokens: int = 8192
    batch_tokens: int = 32
    prefill_batch_tokens: int = 512
    parallel_sequences: int = 8
    flash_attention: bool = False
    fork_by: str = "auto"  # "copy" (share memory cells), "snapshot" (save/restore state) or "auto"


@dataclass(frozen=True)
class _Base:
    """Where forks start: the resident prefix (seq None) or the shared sequence, and its length."""

    seq: int | None
    end: int
    snapshot: bytes | None = None


@dataclass
class _Segment:
    seq: int
    tokens: Sequence[int]
    pos0: int
    read: Sequence[int] | None  # token ids whose logits to keep after the last token, if any
    logits: list[float] | None = None


class Engine:
    """Loads a GGUF eagerly and scores prompts against declared labels. Not for concurrent use."""

    def __init__(self, model_path: str, options: EngineOptions):
        self.model_path = model_path
        self.options = options
        self._lock = threading.Lock()
        self._model = None
        self._ctx = None
        self._batch = None
        self._resident: list[int] = []
        self._resident_snapshot: bytes | None = None
        _init_backend()
        if options.gpu_layers != 0 and not llama.llama_supports_gpu_offload():
            raise GpuUnavailable(
                f"ADAPTER_GPU_LAYERS={options.gpu_layers} asks for GPU offload, but this llama-cpp-python "
                f"build has no GPU backend; set ADAPTER_GPU_LAYERS=0 or use the GPU image")
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
        largest = max(opts.batch_tokens, opts.prefill_batch_tokens)
        cparams.n_batch = largest
        cparams.n_ubatch = largest  # one llama_decode is one micro-batch: its shape is ours
        cparams.n_seq_max = opts.parallel_sequences
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
        self._memory = llama.llama_get_memory(self._ctx)
        self.ctx_tokens = llama.llama_n_ctx(self._ctx)
        self.batch_tokens = opts.batch_tokens
        self.prefill_batch_tokens = opts.prefill_batch_tokens
        self._batch = llama.llama_batch_init(largest + 1, 0, 1)  # +1 for the scratch pad
        self.scratch_seq = opts.parallel_sequences - 1
        self.n_vocab = llama.llama_vocab_n_tokens(self._vocab)
        self.add_bos = bool(llama.llama_vocab_get_add_bos(self._vocab))
        self.bos_text = self._special_text(llama.llama_vocab_bos(self._vocab))
        self.eos_text = self._special_text(llama.llama_vocab_eos(self._vocab))
        template = llama.llama_model_chat_template(self._model, None)
        self.chat_template = template.decode("utf-8") if template else None
        self.control_texts = self._control_texts()
        self.architecture = self.metadata("general.architecture") or "unknown"
        desc = ctypes.create_string_buffer(256)
        llama.llama_model_desc(self._model, desc, len(desc))
        self.description = desc.value.decode("utf-8", "replace")
        self.n_params = int(llama.llama_model_n_params(self._model))
        self.gpu_offload = bool(llama.llama_supports_gpu_offload()) and opts.gpu_layers != 0

    def _special_text(self, token: int) -> str:
        return self.piece(token).decode("utf-8", "replace") if token >= 0 else ""

    def _control_texts(self) -> tuple[str, ...]:
        """Texts of the vocabulary's control tokens; in a prompt they would be parsed as control tokens."""
        texts = set()
        special_ids = {llama.llama_vocab_bos(self._vocab), llama.llama_vocab_eos(self._vocab),
                       llama.llama_vocab_eot(self._vocab)}
        for token in range(self.n_vocab):
            if token in special_ids or llama.llama_vocab_get_attr(self._vocab, token) & llama.LLAMA_TOKEN_ATTR_CONTROL:
                text = self.piece(token).decode("utf-8", "replace")
                if text.strip():
                    texts.add(text)
        return tuple(sorted(texts, key=lambda t: (-len(t), t)))

    def metadata(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = llama.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    @property
    def versions(self) -> dict[str, str]:
        return {"llama_cpp_python": llama.__version__,
                "llama_cpp": VENDORED_LLAMA_CPP.get(llama.__version__, "unknown")}

    # ---- vocabulary ----------------------------------------------------------------------------

    def tokenize(self, text: str, *, whole_prompt: bool = True) -> list[int]:
        """Tokens of ``text`` with control-token texts parsed; a whole prompt gets BOS as the model asks."""
        data = text.encode("utf-8")
        add_bos = whole_prompt and self.add_bos and not (self.bos_text and text.startswith(self.bos_text))
        capacity = len(data) + 8
        while True:
            out = (llama.llama_token * capacity)()
            n = llama.llama_tokenize(self._vocab, data, len(data), out, capacity, add_bos, True)
            if n >= 0:
                return list(out[:n])
            capacity = -n

    def piece(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
        return buf.raw[:n]  # the buffer is padded; only the first n bytes are the piece

    # ---- resident prefix -----------------------------------------------------------------------

    def keep_resident(self, tokens: Sequence[int]) -> None:
        """Evaluate the fixed head of every prompt once; every later prompt forks from it."""
        with self._lock:
            self._clear(range(self.options.parallel_sequences))
            self._resident = []
            self._resident_snapshot = None
            if tokens:
                self._run([_Segment(RESIDENT_SEQ, list(tokens), 0, None)])
                if self.fork_by == "snapshot":
                    self._resident_snapshot = self._save(RESIDENT_SEQ)
            self._resident = list(tokens)

    @property
    def resident_tokens(self) -> int:
        return len(self._resident)

    # ---- scoring -------------------------------------------------------------------------------

    def score(self, prompts: Sequence[Sequence[int]], tries: Sequence[LabelTrie], *,
              state: tuple[int, int] | None = None) -> tuple[list[PromptScore], ScoreStats]:
        """Score each prompt against its label trie; prompts sharing a prefix evaluate it once.

        ``state`` is the span of tokens that every prompt has whatever its question (the state): they are
        decoded in prefill micro-batches starting at its first token, the rest in small ones, so the
        layout, and with it every logit, depends on the prompt alone: not on the resident prefix, the other
        prompts of the call, or their order. Without it, the whole prompt is decoded in small micro-batches.
        """
        if not prompts or len(prompts) != len(tries):
            raise ValueError("one label trie per prompt is needed")
        with self._lock:
            try:
                return self._score(prompts, tries, state)
            finally:
                self._clear(range(SHARED_SEQ, self.options.parallel_sequences))

    def _score(self, prompts, tries, state):
        t0 = time.perf_counter()
        copy = self.fork_by == "copy"
        resident = common_prefix([self._resident, *prompts])
        if not copy and resident < len(self._resident):
            resident = 0  # a saved state cannot be cut back to a shorter prefix: start from nothing
        # Every prompt keeps at least its last token of its own: its logits are the readout.
        common = min(common_prefix(prompts), min(len(p) for p in prompts) - 1)
        state_start, state_end = state or (common, common)
        state_start = min(max(state_start, resident), common)
        state_end = min(max(state_end, state_start), common)
        shared_end = common if len(prompts) > 1 else state_end
        base = _Base(None, resident)
        if shared_end > resident:
            prompt = prompts[0]
            self._fork_from_resident(SHARED_SEQ, resident)
            self._run([_Segment(SHARED_SEQ, prompt[resident:state_start], resident, None)])
            self._run([_Segment(SHARED_SEQ, prompt[state_start:state_end], state_start, None)],
                      self.prefill_batch_tokens)
            self._run([_Segment(SHARED_SEQ, prompt[state_end:shared_end], state_end, None)])
            base = _Base(SHARED_SEQ, shared_end, None if copy else self._save(SHARED_SEQ))

        fork_seqs = list(range(FIRST_FORK_SEQ, self.scratch_seq))
        multi_token = any(t.inner_nodes for t in tries)
        # Label paths are forked from a prompt while its whole group is still held, so that their
        # memory cells come after the group's: attention then visits every prompt's cells in order.
        group_size = max(1, len(fork_seqs) // 2) if multi_token else len(fork_seqs)
        if group_size < 1 or (multi_token and len(fork_seqs) < 2):
            raise EngineError("ADAPTER_PARALLEL_SEQUENCES is too small to fork prompts and label paths")

        results: list[PromptScore | None] = [None] * len(prompts)
        prefill_s, readout_s, readout_tokens = time.perf_counter() - t0, 0.0, 0
        for start in range(0, len(prompts), group_size):
            group = list(range(start, min(start + group_size, len(prompts))))
            g0 = time.perf_counter()
            segments = []
            for seq, i in zip(fork_seqs, group):
                self._fork(seq, base, resident)
                segments.append(_Segment(seq, prompts[i][base.end:], base.end, tries[i].children[()]))
            self._run(segments)
            g1 = time.perf_counter()
            spare = fork_seqs[len(group):]
            for seq, i, segment in zip(fork_seqs, group, segments):
                results[i], n = self._read_labels(seq, len(prompts[i]), tries[i], segment.logits, spare)
                readout_tokens += n
            self._clear(fork_seqs)
            prefill_s += g1 - g0
            readout_s += time.perf_counter() - g1
        stats = ScoreStats(
            resident_tokens=resident,
            shared_tokens=base.end - resident if base.seq is not None else 0,
            own_tokens=tuple(len(p) - base.end for p in prompts),
            readout_tokens=readout_tokens, prefill_s=prefill_s, readout_s=readout_s)
        return results, stats

    def _read_labels(self, seq: int, n_prompt: int, trie: LabelTrie, root_logits: list[float],
                     spare: list[int]) -> tuple[PromptScore, int]:
        """Chain-rule label probabilities; inner trie nodes are scored on forks of the prompt's sequence."""
        node_logits = {(): root_logits}
        evaluated = 0
        inner = trie.inner_nodes
        if inner:
            snapshot = None if self.fork_by == "copy" else self._save(seq)
            for start in range(0, len(inner), len(spare)):
                paths = inner[start:start + len(spare)]
                segments = []
                for s, path in zip(spare, paths):
                    if snapshot is None:
                        llama.llama_memory_seq_cp(self._memory, seq, s, -1, -1)
                    else:
                        self._restore(snapshot, s)
                    segments.append(_Segment(s, path, n_prompt, trie.children[path]))
                self._run(segments)
                for path, segment in zip(paths, segments):
                    node_logits[path] = segment.logits
                    evaluated += len(path)
                self._clear(spare)
        logprobs = trie.logprobs(node_logits)
        root_children = trie.children[()]
        first = tuple(root_logits[root_children.index(label[0])] for label in trie.sequences)
        return PromptScore(logprobs, first), evaluated

    def prefill(self, tokens: Sequence[int], *, reuse_resident: bool = False) -> tuple[float, int]:
        """Seconds to llama_decode ``tokens`` in prefill micro-batches with no readout, and the tokens
        decoded: from empty memory, or forked from the resident prefix as scoring does (for benchmarks)."""
        with self._lock:
            resident = common_prefix([self._resident, tokens]) if reuse_resident else 0
            if self.fork_by == "snapshot" and resident < len(self._resident):
                resident = 0
            self._clear([FIRST_FORK_SEQ])
            try:
                self._fork_from_resident(FIRST_FORK_SEQ, resident)
                started = time.perf_counter()
                self._run([_Segment(FIRST_FORK_SEQ, list(tokens[resident:]), resident, None)],
                          self.prefill_batch_tokens)
                return time.perf_counter() - started, len(tokens) - resident
            finally:
                self._clear([FIRST_FORK_SEQ])

    # ---- memory --------------------------------------------------------------------------------

    def _fork_from_resident(self, dst: int, length: int) -> None:
        if length == 0:
            return
        if self.fork_by == "snapshot":
            self._restore(self._resident_snapshot, dst)
        else:
            llama.llama_memory_seq_cp(self._memory, RESIDENT_SEQ, dst, 0, length)

    def _fork(self, dst: int, base: "_Base", resident: int) -> None:
        if base.seq is None:
            self._fork_from_resident(dst, resident)
        elif base.snapshot is not None:
            self._restore(base.snapshot, dst)
        else:
            llama.llama_memory_seq_cp(self._memory, base.seq, dst, -1, -1)

    def _save(self, seq: int) -> bytes:
        size = llama.llama_state_seq_get_size(self._ctx, seq)
        buf = (ctypes.c_uint8 * size)()
        written = llama.llama_state_seq_get_data(self._ctx, buf, size, seq)
        if written != size:
            raise EngineError(f"llama_state_seq_get_data wrote {written} of {size} bytes")
        return bytes(buf)

    def _restore(self, snapshot: bytes, seq: int) -> None:
        buf = (ctypes.c_uint8 * len(snapshot)).from_buffer_copy(snapshot)
        if llama.llama_state_seq_set_data(self._ctx, buf, len(snapshot), seq) == 0:
            raise EngineError("llama_state_seq_set_data could not restore a saved sequence")

    def _is_empty(self, seq: int) -> bool:
        return llama.llama_memory_seq_pos_max(self._memory, seq) < 0

    def _clear(self, seqs: Iterable[int]) -> None:
        if self._memory is None:
            return
        for seq in seqs:
            llama.llama_memory_seq_rm(self._memory, seq, -1, -1)

    def _run(self, segments: list[_Segment], size: int | None = None) -> None:
        """Decode segments of several sequences, one llama_decode per micro-batch of ``size`` tokens
        (default: ``batch_tokens``).

        Micro-batches never hold a single token: llama.cpp's CPU attention takes another code path
        for one query, so a lone token is decoded beside a throw-away copy in the scratch sequence.
        """
        stream = [(seg, j) for seg in segments for j in range(len(seg.tokens))]
        size = size or self.batch_tokens
        chunks = [stream[i:i + size] for i in range(0, len(stream), size)]
        if len(chunks) > 1 and len(chunks[-1]) == 1:
            chunks[-1].insert(0, chunks[-2].pop())
        for chunk in chunks:
            self._decode(chunk, pad=len(chunk) == 1)

    def _decode(self, chunk: list[tuple[_Segment, int]], *, pad: bool) -> None:
        batch = self._batch
        wanted: list[tuple[int, _Segment]] = []
        for n, (seg, j) in enumerate(chunk):
            batch.token[n] = seg.tokens[j]
            batch.pos[n] = seg.pos0 + j
            batch.n_seq_id[n] = 1
            batch.seq_id[n][0] = seg.seq
            wants = seg.read is not None and j == len(seg.tokens) - 1
            batch.logits[n] = wants
            if wants:
                wanted.append((n, seg))
        n = len(chunk)
        if pad:
            batch.token[n] = batch.token[0]
            batch.pos[n] = 0
            batch.n_seq_id[n] = 1
            batch.seq_id[n][0] = self.scratch_seq
            batch.logits[n] = False
            n += 1
        batch.n_tokens = n
        try:
            rc = llama.llama_decode(self._ctx, batch)
        finally:
            if pad:
                self._clear([self.scratch_seq])
        if rc != 0:
            reason = {1: "no free memory cells for the batch", 2: "aborted", -1: "invalid batch"}.get(rc, "fatal error")
            raise EngineError(f"llama_decode failed with {rc} ({reason})")
        for index, seg in wanted:
            row = llama.llama_get_logits_ith(self._ctx, index)
            seg.logits = [float(row[token]) for token in seg.read]

    # ---- lifetime ------------------------------------------------------------------------------

    def close(self) -> None:
        if self._batch is not None:
            llama.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            llama.llama_free(self._ctx)
            self._ctx = None
        self._memory = None
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


def _init_backend() -> None:
    global _backend_ready, _log_callback
    with _backend_lock:
        if _backend_ready:
            return
        llama_log = logging.getLogger("llama_cpp")

        def forward(level: int, text: bytes, _user_data) -> None:
            message = text.decode("utf-8", "replace").rstrip()
            if message:
                llama_log.log({3: logging.WARNING, 4: logging.ERROR}.get(level, logging.DEBUG), message)

        _log_callback = llama.llama_log_callback(forward)
        llama.llama_log_set(_log_callback, ctypes.c_void_p(0))
        llama.llama_backend_init()
        _backend_ready = True


def gpu_backend_available() -> bool:
    _init_backend()
    return bool(llama.llama_supports_gpu_offload())
