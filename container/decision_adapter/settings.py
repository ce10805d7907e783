"""The adapter's settings: every knob, read once from the environment, typed, bounded and described.

Nothing else in the adapter reads ``os.environ``. ``Settings.from_env()`` is called by the ``serve``
entry point and by ``create_app()`` when no settings are injected; tests build ``Settings(...)``
directly or with ``dataclasses.replace``. A setting is one line: ``setting(env, default, description,
ge=..., le=...)``; pydantic checks types and bounds, and every error names the variable.

``Settings`` is a pydantic dataclass rather than pydantic-settings' ``BaseSettings``: the latter reads
``os.environ`` whenever one is constructed (tests build them freely) and is no dataclass, which
``dataclasses.replace`` (tests, benchmarks) needs; reading the variables is the few lines of ``from_env``.

may import from the package: decisions, errors
never imports: flask, werkzeug, gunicorn, llama_cpp
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import Field, ValidationError, model_validator
from pydantic.dataclasses import dataclass

from .decisions.debias import DEFAULT_FLOOR, DEFAULT_MODE, DEFAULT_STRENGTH, MODES

MIB = 1024 * 1024
# Cells a prompt's label paths may need beyond the prompt itself: 26 first letters of two-token labels.
LABEL_PATH_CELLS = 26
# SageMaker sets it to true in every Batch Transform container (with the job's MaxPayloadInMB and BatchStrategy).
SAGEMAKER_BATCH = "SAGEMAKER_BATCH"
DebiasModeName = Literal[tuple(MODES)]  # type: ignore[valid-type]


class SettingsError(ValueError):
    """A setting has a value outside its type or bounds; the message names the variable."""


def setting(env: str, default: Any, description: str, **bounds: Any) -> Any:
    """One setting: its environment variable, default, description and bounds (``ge``, ``le``)."""
    factory = {"default_factory": default} if callable(default) else {"default": default}
    return Field(**factory, description=description, json_schema_extra={"env": env}, **bounds)


def physical_cores(cpus: set[int] | None = None, sysfs: Path = Path("/sys/devices/system/cpu")) -> int:
    """Physical cores among the CPUs this process may use: the hyperthreads of one core (same package and core id
    in sysfs) count once. A CPU whose topology cannot be read counts as a core of its own."""
    if cpus is None:
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        topology = sysfs / f"cpu{cpu}" / "topology"
        try:
            cores.add(((topology / "physical_package_id").read_text().strip(),
                       (topology / "core_id").read_text().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))
    return max(1, len(cores))


def _default_threads() -> int:
    return physical_cores()


@dataclass(frozen=True)
class Settings:
    # Serving
    port: int = setting("SAGEMAKER_BIND_TO_PORT", 8080, "TCP port to listen on (SageMaker sets it).", ge=1, le=65535)
    host: str = setting("ADAPTER_HOST", "0.0.0.0", "Address to bind; `make run` uses 127.0.0.1.")
    graceful_timeout_s: int = setting("ADAPTER_GRACEFUL_TIMEOUT_S", 60,
                                      "Seconds in-flight requests get to finish after SIGTERM.", ge=1, le=3600)
    log_level: Literal["debug", "info", "warning", "error"] = setting(
        "ADAPTER_LOG_LEVEL", "info", "Log level of the adapter's own logger.")

    # Model and llama.cpp
    model_dir: str = setting("ADAPTER_MODEL_DIR", "/opt/ml/model",
                             "Folder holding exactly one .gguf and optionally model-manifest.json.")
    model_id: str = setting("ADAPTER_MODEL_ID", "",
                            "Name the model is served under; defaults to the GGUF file name without .gguf.")
    threads: int = setting("ADAPTER_THREADS", _default_threads,
                           "CPU threads for llama.cpp (default: one per physical core among the CPUs this process may "
                           "use; hyperthreads of a core count once).", ge=1, le=512)
    cpu_variant: str = setting("ADAPTER_CPU_VARIANT", "auto",
                               "llama.cpp's CPU kernels: auto loads the best variant for the CPU the server starts on; "
                               "a variant's name (x64, haswell, skylakex, icelake, zen4, sapphirerapids, ...) loads "
                               "that one, the same answers bit for bit on every instance type that can run it.",
                               pattern=r"^[a-z0-9_.]+$", max_length=64)
    gpu_layers: int = setting("ADAPTER_GPU_LAYERS", 0,
                              "Layers to offload to the GPU: 0 = CPU only, -1 = all. Needs a GPU build.",
                              ge=-1, le=100_000)
    ctx_tokens: int = setting("ADAPTER_CTX_TOKENS", 16384,
                              "Tokens of KV memory shared by the resident prefix and all forks of a request.",
                              ge=512, le=1_048_576)
    batch_tokens: int = setting("ADAPTER_BATCH_TOKENS", 512,
                                "Tokens per micro-batch (one llama_decode): a state, and each question, is decoded "
                                "in micro-batches of this size from its own first token.", ge=16, le=65536)
    flash_attention: Literal["off", "on"] = setting(
        "ADAPTER_FLASH_ATTENTION", "off", "llama.cpp's flash attention. Its CPU kernels accumulate in 16-bit floats "
        "and switch kernels with the micro-batch shape (up to 0.01 in a probability); off computes attention in "
        "32-bit floats. On suits GPUs.")
    kv_cache_type: Literal["f32", "f16"] = setting(
        "ADAPTER_KV_CACHE_TYPE", "f32", "Type of the keys and values kept in memory: f32 (exact attention on the "
        "CPU) or f16 (half the memory; flash attention converts to it anyway).")
    permutations: int = setting("ADAPTER_PERMUTATIONS", 1,
                                "Orderings of the options each decision is scored in and averaged over, unless the "
                                "request says (permutations, x_permutations): 1 is the request's order; 2 or more "
                                "make the answer independent of it, for the question once and its options block K "
                                "times, on every memory kind (a hybrid or recurrent model decodes the stem on its "
                                "own and restores its checkpoint; docs/adapter.md; docs/accuracy.md says which K to "
                                "choose). `make run` uses 16 (every ordering, capped at the number of options) with "
                                "the embedded model unless this is set.",
                                ge=1, le=16)
    debias: DebiasModeName = setting(
        "ADAPTER_DEBIAS", DEFAULT_MODE, "Content-free calibration of each decision unless the request says (debias, "
        "x_debias): off; a state prior (empty, content-free: the question and options scored with the state "
        "replaced by content-free input) or a label prior (label: the state and the question replaced, the options "
        "kept), divided out of the answer (decisions/debias.py). A calibration is bound to one mode.")
    debias_strength: float = setting(
        "ADAPTER_DEBIAS_STRENGTH", DEFAULT_STRENGTH, "The strength (alpha) the prior is raised to before it is "
        "divided out: 0 leaves the answer as the model gives it, 1 divides the whole prior out. A calibration.json "
        "fitted for the mode brings its own strength per question type.", ge=0.0, le=1.0)
    debias_floor: float = setting(
        "ADAPTER_DEBIAS_FLOOR", DEFAULT_FLOOR, "The uniform's share mixed into the prior before it is divided out "
        "(0 to 1): a floor keeps a confident prior from flipping a confident answer on its own.", ge=0.0, le=1.0)
    state_cache_mb: int = setting("ADAPTER_STATE_CACHE_MB", 1024,
                                  "Host memory for states and answers kept across requests (least recently used "
                                  "first out), a saved state's checkpoints counted with it (a sliding window's or a "
                                  "recurrent state's, at the boundaries it serves as a prefix); 0 turns the cache "
                                  "off.", ge=0, le=1_048_576)

    # Request limits. The body limit is SageMaker's real-time payload (6 MB), which is also what Batch
    # Transform sends by default; the line limit lets 6 MiB of the smallest records (~85 bytes) through.
    max_body_bytes: int = setting("ADAPTER_MAX_BODY_BYTES", 6 * MIB,
                                  "Largest request body accepted, sent or decoded (413 above); MaxPayloadInMB "
                                  "for Batch Transform is this in MiB (a whole number of them in a transform).",
                                  ge=1024, le=100 * MIB)
    max_decisions: int = setting("ADAPTER_MAX_DECISIONS", 64,
                                 "Most decisions (or System One questions) in one request object.", ge=1, le=4096)
    max_lines: int = setting("ADAPTER_MAX_LINES", 100_000, "Most lines (records) in one JSON-lines body.",
                             ge=1, le=1_000_000)
    max_prompt_tokens: int = setting("ADAPTER_MAX_PROMPT_TOKENS", 8192,
                                     "Most tokens in one rendered decision prompt (255 described options "
                                     "take about 5,000).", ge=64, le=1_048_576)
    max_request_tokens: int = setting("ADAPTER_MAX_REQUEST_TOKENS", 32768,
                                      "Most tokens one request may make the model evaluate (shared state once "
                                      "plus each question's own tokens).", ge=64, le=16_777_216)

    # Admission and deadlines
    deployment: Literal["realtime", "transform", "async"] = setting(
        "ADAPTER_DEPLOYMENT", "realtime", "How the container is deployed, which sets every request's deadline and "
        "budget: realtime (an endpoint: ADAPTER_REQUEST_TIMEOUT_S and the token budget for every request, JSON lines "
        "included), transform (a Batch Transform job: every request is a mini-batch answered within 90% of "
        "ADAPTER_BATCH_TIMEOUT_S, without the token budget) or async (an asynchronous endpoint: every request has 90% "
        "of ADAPTER_ASYNC_TIMEOUT_S and the token budget; SageMaker queues the rest). SAGEMAKER_BATCH=true, which "
        "SageMaker sets in every Batch Transform container, makes it transform whatever this says; nothing a request "
        "sends changes it.")
    queue_depth: int = setting("ADAPTER_QUEUE_DEPTH", 16,
                               "Requests that may be read and wait for the model at once; more get 503 before "
                               "their body is read.", ge=1, le=1024)
    queue_tokens: int = setting("ADAPTER_QUEUE_TOKENS", 32768,
                                "Tokens of work (to decode, given what the cache holds and what the jobs ahead "
                                "leave there) that may be queued and running; a request that would pass it gets 503 "
                                "(a request alone is always accepted).", ge=64, le=16_777_216)
    request_timeout_s: float = setting("ADAPTER_REQUEST_TIMEOUT_S", 55.0,
                                       "Deadline of a request from its arrival on an endpoint (ADAPTER_DEPLOYMENT="
                                       "realtime), below SageMaker's 60 s: a request that cannot be answered by then "
                                       "at the measured speed gets 503 at once (400 when its own work alone can never "
                                       "fit), and one still running at it is stopped inside llama_decode.",
                                       ge=0.1, le=3600.0)
    body_timeout_s: float = setting("ADAPTER_BODY_TIMEOUT_S", 20.0,
                                    "Seconds a request's body may take to arrive once the server starts reading it "
                                    "(sent whole, not per read): a client still sending then gets 408 naming the "
                                    "body, and its place in admission and its thread are given back. A request's "
                                    "headers get as long, from when a thread takes them: a client still sending "
                                    "them is disconnected, its thread given back.",
                                    ge=0.1, le=3600.0)
    batch_timeout_s: int = setting("ADAPTER_BATCH_TIMEOUT_S", 3600,
                                   "The InvocationsTimeoutInSeconds Batch Transform gives one mini-batch (what "
                                   "`python -m endpoint_client transform` sends; SageMaker allows 1 to 3600). With "
                                   "ADAPTER_DEPLOYMENT=transform every request is one unit of work answered within "
                                   "90% of it; /execution-parameters says MULTI_RECORD where a mini-batch of the body "
                                   "limit fills half of that at the measured speed.", ge=1, le=3600)

    async_timeout_s: int = setting("ADAPTER_ASYNC_TIMEOUT_S", 900,
                                   "Seconds an asynchronous endpoint gives each invocation (its AsyncInferenceConfig's "
                                   "InvocationTimeoutSeconds: SageMaker's default 900, at most 3600): with "
                                   "ADAPTER_DEPLOYMENT=async every request is answered within 90% of it.",
                                   ge=1, le=3600)

    # Rollback drill (python -m endpoint_client acceptance --rollback-drill; docs/deploy.md)
    drill: Literal["off", "fail", "slow"] = setting(
        "ADAPTER_DRILL", "off", "Makes this container a faulty release for a rollback drill, once start-up is done (the "
        "start-up probe passes, so /ping answers 200 and SageMaker shifts traffic to it): fail (every job that "
        "reaches the engine fails, answered 500 'scoring failed' and logged as a scoring failure) or slow (every "
        "decode step takes twice its time, and a job's compute time says so). off in any real deployment.")

    # Release
    image_digest: str = setting("ADAPTER_IMAGE_DIGEST", "",
                                "The digest (sha256:...) of the image this container runs, as the endpoint stacks pin "
                                "it (they set it on the Model); every answer's x_request names it beside the model's "
                                "sha256, so that a captured record says which release answered. Empty: not known "
                                "(make run, tests), and x_request leaves it out.",
                                pattern=r"^(sha256:[0-9a-f]{64})?$")

    # Access
    api_key: str = setting("ADAPTER_API_KEY", "",
                           "Bearer key required on /invocations and /v1/* when set; empty means no key is "
                           "required (on SageMaker, IAM guards /invocations).")

    @model_validator(mode="after")
    def _fits_memory(self) -> "Settings":
        if self.ctx_tokens < self.max_prompt_tokens + LABEL_PATH_CELLS:
            raise ValueError(f"ADAPTER_CTX_TOKENS={self.ctx_tokens} is smaller than ADAPTER_MAX_PROMPT_TOKENS="
                             f"{self.max_prompt_tokens} plus {LABEL_PATH_CELLS} cells for label paths: an admitted "
                             f"prompt would not fit the model's memory")
        if self.deployment == "transform" and self.max_body_bytes % MIB:
            raise ValueError(f"ADAPTER_MAX_BODY_BYTES={self.max_body_bytes} must be a whole number of MiB in a transform "
                             f"(ADAPTER_DEPLOYMENT=transform): MaxPayloadInMB counts in them, and a record it "
                             f"rounds away would fail the job")
        if self.queue_tokens < self.max_request_tokens:
            raise ValueError(f"ADAPTER_QUEUE_TOKENS={self.queue_tokens} is smaller than ADAPTER_MAX_REQUEST_TOKENS="
                             f"{self.max_request_tokens}: a request within the limits could never be queued beside "
                             f"another")
        return self

    @property
    def http_threads(self) -> int:
        """Threads of the one worker process: the requests admitted, and spares that answer /ping and 503s."""
        return self.queue_depth + 2

    @property
    def batch_budget_s(self) -> float:
        """Seconds a Batch Transform mini-batch may take from its arrival: 90% of ADAPTER_BATCH_TIMEOUT_S, the rest
        left for reading the body and writing the answer before SageMaker's invocation timeout."""
        return 0.9 * self.batch_timeout_s

    @property
    def async_budget_s(self) -> float:
        """Seconds an asynchronous invocation may take from its arrival: 90% of ADAPTER_ASYNC_TIMEOUT_S, the rest
        left for reading the body and writing the answer before SageMaker gives the invocation up."""
        return 0.9 * self.async_timeout_s

    @property
    def request_budget_s(self) -> float:
        """Seconds any request may take from its arrival, as the container is deployed: a transform's mini-batch
        budget, an asynchronous invocation's, or a real-time endpoint's ADAPTER_REQUEST_TIMEOUT_S."""
        return {"transform": self.batch_budget_s, "async": self.async_budget_s}.get(self.deployment,
                                                                                     self.request_timeout_s)

    @classmethod
    def fields(cls) -> dict[str, Any]:
        return cls.__pydantic_fields__  # type: ignore[attr-defined]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name, info in cls.fields().items():
            raw = environ.get(info.json_schema_extra["env"])
            if raw is not None and raw.strip():
                values[name] = raw.strip()
        if environ.get(SAGEMAKER_BATCH, "").strip().lower() == "true":
            values["deployment"] = "transform"  # SageMaker says so: the model's own setting may be an endpoint's
        try:
            return cls(**values)
        except ValidationError as exc:
            raise SettingsError(_message(cls, exc, values)) from None

    @classmethod
    def describe(cls) -> list[dict[str, Any]]:
        """One row per setting: variable, default and description (for docs and `serve --help`)."""
        rows = []
        for info in cls.fields().values():
            default = (f"{info.default_factory()} (this machine)" if info.default_factory is not None
                       else info.default)
            rows.append({"env": info.json_schema_extra["env"], "default": default, "description": info.description})
        return rows

    def replace(self, **changes: Any) -> "Settings":
        return dataclasses.replace(self, **changes)


def _message(cls: type[Settings], exc: ValidationError, values: dict[str, Any]) -> str:
    """The first problem in the environment's words: ``ADAPTER_THREADS='two' is not an integer``."""
    error = exc.errors(include_url=False)[0]
    if not error["loc"]:
        return str(error["ctx"]["error"]) if "error" in error.get("ctx", {}) else error["msg"]
    name = error["loc"][0]
    env = cls.fields()[name].json_schema_extra["env"]
    raw, ctx, kind = values.get(name, error["input"]), error.get("ctx", {}), error["type"]
    if kind == "int_parsing" or kind == "int_from_float":
        return f"{env}={raw!r} is not an integer"
    if kind == "float_parsing":
        return f"{env}={raw!r} is not a number"
    if kind == "literal_error":
        return f"{env}={raw!r} must be one of {ctx['expected'].replace(chr(39), '').replace(' or ', ', ')}"
    if kind in ("greater_than_equal", "greater_than"):
        return f"{env}={raw} is below its minimum {ctx.get('ge', ctx.get('gt'))}"
    if kind in ("less_than_equal", "less_than"):
        return f"{env}={raw} is above its maximum {ctx.get('le', ctx.get('lt'))}"
    return f"{env}={raw!r}: {error['msg']}"


# --- docs/settings.md's table, generated from the settings above: `python -m decision_adapter.settings` prints it,
# `make settings-doc` writes it between the page's markers, and tests/test_settings_doc.py fails while it is stale.

SETTINGS_DOC_BEGIN = "<!-- settings:begin -->"
SETTINGS_DOC_END = "<!-- settings:end -->"
# Defaults computed where the server starts, named by their rule so that the table is the same on every machine.
MACHINE_DEFAULTS = {"ADAPTER_THREADS": "one per physical core"}


def render_settings_table(rows: list[dict[str, Any]] | None = None) -> str:
    """The markdown table of every setting: variable, default, description (``Settings.describe()``'s rows)."""
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for row in Settings.describe() if rows is None else rows:
        default = row["default"]
        if row["env"] in MACHINE_DEFAULTS and str(default).endswith("(this machine)"):
            shown = MACHINE_DEFAULTS[row["env"]]
        elif str(default).endswith("(this machine)"):
            shown = "computed at start-up"
        elif default == "":
            shown = "(empty)"
        else:
            shown = f"`{default}`"
        description = " ".join(str(row["description"]).split()).replace("|", "\\|").replace("*", "\\*")
        lines.append(f"| `{row['env']}` | {shown} | {description} |")
    return "\n".join(lines) + "\n"


def write_settings_doc(path: Path) -> bool:
    """Rewrites the table between the markers of ``path``; True when the file changed."""
    text = path.read_text(encoding="utf-8")
    head, found, rest = text.partition(SETTINGS_DOC_BEGIN)
    _, found_end, tail = rest.partition(SETTINGS_DOC_END)
    if not found or not found_end:
        raise ValueError(f"{path} lacks the markers {SETTINGS_DOC_BEGIN} and {SETTINGS_DOC_END}")
    new = f"{head}{SETTINGS_DOC_BEGIN}\n\n{render_settings_table()}\n{SETTINGS_DOC_END}{tail}"
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--write"] and len(sys.argv) == 3:
        print(f"{sys.argv[2]}: {'rewritten' if write_settings_doc(Path(sys.argv[2])) else 'up to date'}")
    elif len(sys.argv) == 1:
        print(render_settings_table(), end="")
    else:
        raise SystemExit("usage: python -m decision_adapter.settings [--write docs/settings.md]")
