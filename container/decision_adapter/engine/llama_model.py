"""llama.cpp's process-wide backend, and one GGUF's model and context: loaded, described and freed.

``init_backend`` forwards llama.cpp's log to ours and loads its CPU kernels (``backends``) once per process.
``LlamaModel`` loads a model and creates its one context from ``EngineOptions``; it holds the native pointers the
other engine modules use (``Vocabulary``, ``Runner``) and reads what the model says of itself (chat template,
architecture, training context). Nothing here decodes.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from dataclasses import dataclass

import llama_cpp as llama

from . import backends
from .errors import EngineError, GpuUnavailable
from .memory_kind import MemoryKind

# The llama.cpp commit that each pinned llama-cpp-python release vendors (from its changelog); the
# library does not report it at run time.
VENDORED_LLAMA_CPP = {"0.3.36": "ggml-org/llama.cpp@0c1e57098"}
KV_CACHE_TYPES = {"f32": llama.GGML_TYPE_F32, "f16": llama.GGML_TYPE_F16}
FORK_BY = ("copy", "snapshot", "auto")
LAYOUTS = ("exact", "fused")
CHECKPOINTS = ("spaced", "last", "every")  # plan.kept_boundaries


@dataclass(frozen=True)
class EngineOptions:
    """How the engine loads its model: every value comes from its caller (the settings, or a benchmark's own
    options); none has a default here, so the engine never runs on a value nobody chose."""

    threads: int
    gpu_layers: int  # 0: CPU only; -1: every layer
    ctx_tokens: int
    batch_tokens: int
    parallel_sequences: int
    flash_attention: bool
    kv_cache_type: str  # a key of KV_CACHE_TYPES
    state_cache_bytes: int
    layout: str  # "exact", or "fused": the state's last micro-batch and the first question as one decode (plan)
    cpu_variant: str  # llama.cpp's CPU kernels: "auto" (the best for this CPU) or a variant's name (backends)
    fork_by: str = "auto"  # "copy" (share memory cells), "snapshot" (save/restore) or "auto": what the model allows
    # Which boundaries of a saved state keep a checkpoint where the memory needs one (plan.kept_boundaries): an
    # experiment of the benchmarks, not a setting.
    checkpoints: str = "spaced"

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be exact or fused, not {self.layout!r}")
        if self.checkpoints not in CHECKPOINTS:
            raise ValueError(f"checkpoints must be one of {', '.join(CHECKPOINTS)}, not {self.checkpoints!r}")
        if self.fork_by not in FORK_BY:
            raise ValueError(f"fork_by must be copy, snapshot or auto, not {self.fork_by!r}")
        if self.kv_cache_type not in KV_CACHE_TYPES:
            raise ValueError(f"kv_cache_type must be one of {', '.join(KV_CACHE_TYPES)}, not {self.kv_cache_type!r}")


class LlamaModel:
    """A GGUF loaded with its context. ``closed`` once ``free`` has run; the pointers are None then."""

    def __init__(self, path: str, options: EngineOptions):
        self.path = path
        self.model = self.ctx = None
        mparams = llama.llama_model_default_params()
        mparams.n_gpu_layers = options.gpu_layers if options.gpu_layers >= 0 else 2**31 - 1
        self.model = llama.llama_model_load_from_file(path.encode(), mparams)
        if not self.model:
            raise EngineError(f"llama.cpp could not load the model file {path}")
        self.vocab = llama.llama_model_get_vocab(self.model)
        self.n_vocab = llama.llama_vocab_n_tokens(self.vocab)
        # What its memory is made of (``memory_kind``): a sliding window, a recurrent state, attention cells.
        recurrent = bool(llama.llama_model_is_recurrent(self.model))
        self.memory = MemoryKind(window=max(0, int(llama.llama_model_n_swa(self.model))),
                                 recurrent=recurrent or bool(llama.llama_model_is_hybrid(self.model)),
                                 attention=not recurrent)
        # A fork of a recurrent state is a snapshot of the sequence, restored.
        self.fork_by = options.fork_by if options.fork_by != "auto" else \
            ("snapshot" if self.memory.recurrent else "copy")
        self.ctx = llama.llama_init_from_model(self.model, context_params(options))
        if not self.ctx:
            self.free()
            raise EngineError(f"llama.cpp could not create a context with {options.ctx_tokens} tokens and "
                              f"{options.parallel_sequences} sequences (out of memory?)")
        self.ctx_tokens = llama.llama_n_ctx(self.ctx)
        self.train_ctx_tokens = int(llama.llama_model_n_ctx_train(self.model))
        template = llama.llama_model_chat_template(self.model, None)
        self.chat_template = template.decode("utf-8") if template else None
        self.architecture = self.metadata("general.architecture") or "unknown"

    @property
    def closed(self) -> bool:
        return self.model is None

    def metadata(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = llama.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def free(self) -> None:
        if self.ctx:
            llama.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            llama.llama_model_free(self.model)
            self.model = None


def context_params(options: EngineOptions):
    cparams = llama.llama_context_default_params()
    cparams.n_ctx = options.ctx_tokens
    cparams.n_batch = options.batch_tokens
    cparams.n_ubatch = options.batch_tokens  # one llama_decode is one micro-batch: its shape is ours
    cparams.n_seq_max = options.parallel_sequences
    cparams.type_k = cparams.type_v = KV_CACHE_TYPES[options.kv_cache_type]
    cparams.n_threads = options.threads
    cparams.n_threads_batch = options.threads
    cparams.kv_unified = True  # forks share the prefix's memory cells instead of holding copies
    cparams.flash_attn_type = (llama.LLAMA_FLASH_ATTN_TYPE_ENABLED if options.flash_attention
                               else llama.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    cparams.no_perf = True
    return cparams


def versions() -> dict[str, str]:
    return {"llama_cpp_python": llama.__version__, "llama_cpp": VENDORED_LLAMA_CPP.get(llama.__version__, "unknown")}


_backend_ready = False
_backend_lock = threading.Lock()
_log_callback = None  # llama.cpp keeps the C pointer: the Python object must outlive every call


def init_backend(cpu_variant: str = "auto") -> backends.Kernels:
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
    init_backend(cpu_variant)
    return bool(llama.llama_supports_gpu_offload())


def check_gpu_layers(gpu_layers: int, cpu_variant: str = "auto") -> None:
    """Refuse GPU layers from a llama.cpp build without a GPU backend (at start-up, before loading anything)."""
    if gpu_layers != 0 and not gpu_backend_available(cpu_variant):
        raise GpuUnavailable(
            f"ADAPTER_GPU_LAYERS={gpu_layers} asks for GPU offload, but this llama-cpp-python build has no GPU "
            f"backend; set ADAPTER_GPU_LAYERS=0 or use the GPU image")
