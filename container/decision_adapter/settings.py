"""The adapter's settings: every knob, read once from the environment, typed, bounded and described.

Nothing else in the adapter reads ``os.environ``. ``Settings.from_env()`` is called by the ``serve``
entry point and by ``create_app()`` when no settings are injected; tests build ``Settings(...)``
directly or with ``dataclasses.replace``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from .prompt import DEFAULT_STYLE, STYLES


# Cells a prompt's label paths may need beyond the prompt itself: 26 first letters of two-token labels.
LABEL_PATH_CELLS = 26


class SettingsError(ValueError):
    """A setting has a value outside its type or bounds; the message names the variable."""


def _setting(env: str, default: Any, description: str, *, low: float | None = None,
             high: float | None = None, choices: tuple[str, ...] | None = None) -> Any:
    return field(default=default, metadata={
        "env": env, "description": description, "low": low, "high": high, "choices": choices})


def _default_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


@dataclass(frozen=True)
class Settings:
    # Serving
    port: int = _setting("SAGEMAKER_BIND_TO_PORT", 8080, "TCP port to listen on (SageMaker sets it).",
                         low=1, high=65535)
    host: str = _setting("ADAPTER_HOST", "0.0.0.0", "Address to bind; `make run` uses 127.0.0.1.")
    graceful_timeout_s: int = _setting("ADAPTER_GRACEFUL_TIMEOUT_S", 60,
                                       "Seconds in-flight requests get to finish after SIGTERM.", low=1, high=3600)
    log_level: str = _setting("ADAPTER_LOG_LEVEL", "info", "Log level of the adapter's own logger.",
                              choices=("debug", "info", "warning", "error"))

    # Model and llama.cpp
    model_dir: str = _setting("ADAPTER_MODEL_DIR", "/opt/ml/model",
                              "Folder holding exactly one .gguf and optionally model-manifest.json.")
    model_id: str = _setting("ADAPTER_MODEL_ID", "",
                             "Name the model is served under; defaults to the GGUF file name without .gguf.")
    threads: int = dataclasses.field(default_factory=_default_threads, metadata={
        "env": "ADAPTER_THREADS", "description": "CPU threads for llama.cpp (default: the CPUs this process may use).",
        "low": 1, "high": 512, "choices": None})
    gpu_layers: int = _setting("ADAPTER_GPU_LAYERS", 0,
                               "Layers to offload to the GPU: 0 = CPU only, -1 = all. Needs a GPU build.",
                               low=-1, high=100_000)
    ctx_tokens: int = _setting("ADAPTER_CTX_TOKENS", 16384,
                               "Tokens of KV memory shared by the resident prefix and all forks of a request.",
                               low=512, high=1_048_576)
    batch_tokens: int = _setting("ADAPTER_BATCH_TOKENS", 512,
                                 "Tokens per micro-batch (one llama_decode): a state, and each question, is "
                                 "decoded in micro-batches of this size from its own first token.",
                                 low=16, high=65536)
    parallel_sequences: int = _setting("ADAPTER_PARALLEL_SEQUENCES", 32,
                                       "llama.cpp sequences: the state, the question being read, and forks "
                                       "for the label paths past 26 options (up to 26 side by side).",
                                       low=4, high=256)
    prompt_style: str = _setting("ADAPTER_PROMPT_STYLE", DEFAULT_STYLE,
                                 "Wording of the decision prompt (decision_adapter/prompt.py); the default measured "
                                 "best on the benchmark model. A calibration is bound to one style.",
                                 choices=tuple(STYLES))
    permutations: int = _setting("ADAPTER_PERMUTATIONS", 1,
                                 "Orderings of the options each decision is scored in and averaged over, unless the "
                                 "request says (permutations, x_permutations): 1 is the request's order; 2 or more "
                                 "make the answer independent of it.", low=1, high=16)
    state_cache_mb: int = _setting("ADAPTER_STATE_CACHE_MB", 1024,
                                   "Host memory for states and answers kept across requests (least recently "
                                   "used first out); 0 turns the cache off.", low=0, high=1_048_576)
    flash_attention: str = _setting("ADAPTER_FLASH_ATTENTION", "off",
                                    "llama.cpp's flash attention. Its CPU kernels accumulate in 16-bit floats and "
                                    "switch kernels with the micro-batch shape (up to 0.01 in a probability); off "
                                    "computes attention in 32-bit floats. On suits GPUs.", choices=("off", "on"))
    kv_cache_type: str = _setting("ADAPTER_KV_CACHE_TYPE", "f32",
                                  "Type of the keys and values kept in memory: f32 (exact attention on the CPU) "
                                  "or f16 (half the memory; flash attention converts to it anyway).",
                                  choices=("f32", "f16"))

    # Request limits
    max_body_bytes: int = _setting("ADAPTER_MAX_BODY_BYTES", 1_048_576, "Largest request body accepted (413 above).",
                                   low=1024, high=104_857_600)
    max_decisions: int = _setting("ADAPTER_MAX_DECISIONS", 64,
                                  "Most decisions (or System One questions) in one request object.", low=1, high=4096)
    max_lines: int = _setting("ADAPTER_MAX_LINES", 1000, "Most lines in one application/jsonlines body.",
                              low=1, high=100_000)
    max_prompt_tokens: int = _setting("ADAPTER_MAX_PROMPT_TOKENS", 8192,
                                      "Most tokens in one rendered decision prompt (255 described options "
                                      "take about 5,000).", low=64, high=1_048_576)
    max_request_tokens: int = _setting("ADAPTER_MAX_REQUEST_TOKENS", 32768,
                                       "Most tokens one request may make the model evaluate (shared state once "
                                       "plus each question's own tokens).", low=64, high=16_777_216)

    # Admission and deadlines
    queue_depth: int = _setting("ADAPTER_QUEUE_DEPTH", 16,
                                "Requests that may be read and wait for the model at once; more get 503 before "
                                "their body is read.", low=1, high=1024)
    queue_tokens: int = _setting("ADAPTER_QUEUE_TOKENS", 32768,
                                 "Tokens of work (to decode) that may be queued and running; a request that would "
                                 "pass it gets 503 (a request alone is always accepted).", low=64, high=16_777_216)
    request_timeout_s: float = _setting("ADAPTER_REQUEST_TIMEOUT_S", 55.0,
                                        "Deadline of a request, below SageMaker's 60 s: past it the request gets "
                                        "503 and its work is dropped at the next micro-batch.", low=0.1, high=3600.0)
    retry_after_s: int = _setting("ADAPTER_RETRY_AFTER_S", 1, "Retry-After seconds sent with a busy 503.",
                                  low=0, high=3600)

    # System One
    api_key: str = _setting("ADAPTER_API_KEY", "",
                            "Bearer key required on /v1/* when set; empty means no key is required.")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            _check(f, getattr(self, f.name))
        if self.queue_tokens < self.max_request_tokens:
            raise SettingsError(
                f"ADAPTER_QUEUE_TOKENS={self.queue_tokens} is smaller than ADAPTER_MAX_REQUEST_TOKENS="
                f"{self.max_request_tokens}: a request within the limits could never be queued beside another")
        if self.ctx_tokens < self.max_prompt_tokens + LABEL_PATH_CELLS:
            raise SettingsError(
                f"ADAPTER_CTX_TOKENS={self.ctx_tokens} is smaller than ADAPTER_MAX_PROMPT_TOKENS="
                f"{self.max_prompt_tokens} plus {LABEL_PATH_CELLS} cells for label paths: an admitted prompt "
                f"would not fit the model's memory")

    @property
    def http_threads(self) -> int:
        """Threads of the one worker process: the requests admitted, and spares that answer /ping and 503s."""
        return self.queue_depth + 2

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = environ.get(f.metadata["env"])
            if raw is None or raw.strip() == "":
                continue
            values[f.name] = _parse(f, raw.strip())
        return cls(**values)

    @classmethod
    def describe(cls) -> list[dict[str, Any]]:
        """One row per setting: variable, default and description (for docs and `serve --help`)."""
        rows = []
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f"{f.default_factory()} (this machine)"
            rows.append({"env": f.metadata["env"], "default": default, "description": f.metadata["description"]})
        return rows


def _parse(f: dataclasses.Field, raw: str) -> Any:
    env = f.metadata["env"]
    kind = f.type if isinstance(f.type, type) else {"int": int, "float": float, "str": str}[f.type]
    if kind is str:
        return raw
    try:
        return kind(raw)
    except ValueError:
        raise SettingsError(f"{env}={raw!r} is not {'an integer' if kind is int else 'a number'}") from None


def _check(f: dataclasses.Field, value: Any) -> None:
    env, low, high, choices = (f.metadata[k] for k in ("env", "low", "high", "choices"))
    if choices is not None and value not in choices:
        raise SettingsError(f"{env}={value!r} must be one of {', '.join(choices)}")
    if low is not None and value < low:
        raise SettingsError(f"{env}={value} is below its minimum {low}")
    if high is not None and value > high:
        raise SettingsError(f"{env}={value} is above its maximum {high}")
