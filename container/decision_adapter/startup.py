"""Start-up, the composition root: find and verify the model, load the engine, start its scheduler, build the
decision model and score a probe through it; and the readiness it reaches.

``/ping`` reads ``Readiness`` only; it never loads anything itself.

may import from the package: engine, decisions, settings, errors, drill
never imports: flask, werkzeug, gunicorn, llama_cpp
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .decisions.calibration import CalibrationError
from .decisions.calibration import load as load_calibration
from .decisions.combine import Scored
from .decisions.labels import SINGLE
from .decisions.decision_file import read_decision_file
from .decisions.model import (DecisionModel, Limits, ModelIncompatible, Question, QuestionSource, ScoringEngine,
                              prompt_layout)
from .decisions.model_files import ModelFilesError, find_gguf, verify
from .decisions.prompt import DEFAULT_STYLE, STYLES, state_segment
from .drill import DrillRunner
from .engine.scheduler import Scheduler
from .errors import InputError
from .settings import Settings

log = logging.getLogger(__name__)

# llama.cpp sequences a context has: the state, the question being read, and forks for the label paths past 26
# options (up to 26 side by side, engine.plan).
PARALLEL_SEQUENCES = 32
PROBE_STATE = "Customer asks to reset a forgotten password and says the reset email never arrived."
PROBE_QUESTION = "Which queue should handle this request?"
PROBE_OPTIONS = ("Account access and authentication support.", "Billing and payment support.",
                 "Sales and product evaluation.")


class Readiness:
    """Loading, ready or failed; set once by the loader, read by every request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._state = "loading"
        self._reason = "loading the model"
        self.model: DecisionModel | None = None

    @property
    def state(self) -> str:
        """loading, ready or failed; a ready model whose scheduler thread died has failed (nothing can score)."""
        if self._state == "ready" and self.model is not None and not self.model.scheduler.alive:
            return "failed"
        return self._state

    @property
    def reason(self) -> str:
        if self._state == "ready" and self.model is not None and not self.model.scheduler.alive:
            return "the scheduler thread died (its traceback is in the log): no request can be scored; restart"
        return self._reason

    def ready(self, model: DecisionModel) -> None:
        with self._lock:
            self.model, self._state, self._reason = model, "ready", "model loaded, verified and probed"
        self._done.set()

    def failed(self, reason: str) -> None:
        with self._lock:
            self._state, self._reason = "failed", reason
        self._done.set()

    def wait(self, timeout_s: float) -> bool:
        return self._done.wait(timeout_s)


@dataclass(frozen=True)
class Experiment:
    """What the benchmarks vary and no deployment sets: how a job's tokens are grouped into ``llama_decode`` calls
    (``engine.plan``: exact, or fused), the wording of the prompt (``decisions.prompt.STYLES``) and which boundaries
    of a saved state keep a checkpoint where the memory needs one (``engine.plan.kept_boundaries``). The server
    runs the defaults, chosen by measurement (docs/benchmarks.md)."""

    layout: str = "exact"
    prompt_style: str = DEFAULT_STYLE
    checkpoints: str = "spaced"


def engine_options(settings: Settings, experiment: Experiment = Experiment()):
    from .engine.core import EngineOptions  # llama.cpp is loaded only where a real engine is made

    return EngineOptions(threads=settings.threads, gpu_layers=settings.gpu_layers, ctx_tokens=settings.ctx_tokens,
                         batch_tokens=settings.batch_tokens, parallel_sequences=PARALLEL_SEQUENCES,
                         flash_attention=settings.flash_attention == "on", kv_cache_type=settings.kv_cache_type,
                         state_cache_bytes=settings.state_cache_mb << 20, layout=experiment.layout,
                         cpu_variant=settings.cpu_variant, checkpoints=experiment.checkpoints)


def load_decision_model(settings: Settings, engine: ScoringEngine | None = None, *, calibrated: bool = True,
                        experiment: Experiment = Experiment()) -> DecisionModel:
    """Verify the GGUF against its manifest (and a calibration.json against both), load it (unless an engine is
    given), start its scheduler and score the probe; ``calibrated=False`` ignores a calibration file (to fit a
    new one); ``experiment``: a benchmark's layout and prompt style. ``DecisionModel.close()`` stops the scheduler,
    and frees the engine where it loaded it here."""
    started = time.perf_counter()
    gguf = find_gguf(settings.model_dir) if engine is None else Path(engine.model_path)
    identity = verify(gguf)
    # The model kind, chosen once from the file: a decision GGUF's type (its rules answer it; a type this runtime
    # cannot run is refused here, before llama.cpp is asked to load tensors it does not know), or None: a plain chat
    # model, answered by this adapter's own readout.
    decision = read_decision_file(gguf)
    owns_engine = engine is None
    if engine is None:
        from .engine.core import Engine

        engine = Engine(str(gguf), engine_options(settings, experiment))
    scheduler = None
    try:
        layout = prompt_layout(engine, STYLES[experiment.prompt_style]) if decision is None else None
        calibration = load_calibration(gguf.parent, gguf_sha256=identity.sha256, prompt_version=layout.version,
                                       permutations=settings.permutations, debias=settings.debias) \
            if calibrated and layout is not None else None  # a decision GGUF's temperatures are the file's
        runtime = {**engine.versions, **engine.kernel_info, "architecture": engine.architecture,
                   "threads": settings.threads, "gpu_layers": settings.gpu_layers,
                   "flash_attention": settings.flash_attention, "kv_cache_type": settings.kv_cache_type,
                   "layout": engine.layout, **engine.memory_info}
        # A rollback drill's faulty release (ADAPTER_DRILL) is armed once the probe passed: it starts as any does.
        drill = DrillRunner(engine.runner, settings.drill) if settings.drill != "off" else None
        scheduler = Scheduler(drill or engine.runner, queue_tokens=settings.queue_tokens)
        model = DecisionModel(engine, scheduler, identity,
                              Limits(settings.max_prompt_tokens, settings.max_request_tokens), runtime,
                              served_id=settings.model_id.strip(), layout=layout, calibration=calibration,
                              default_permutations=settings.permutations, default_debias=settings.debias,
                              default_strength=settings.debias_strength, default_floor=settings.debias_floor,
                              owns_engine=owns_engine, decision=decision)
        probe(model)
        if drill is not None:
            drill.arm()
            log.warning("ADAPTER_DRILL=%s: this container is a faulty release for a rollback drill", settings.drill)
    except BaseException:
        if scheduler is not None:
            scheduler.stop()
        if owns_engine:
            engine.close()  # a failed start-up keeps nothing loaded
        raise
    if calibration is not None and calibration.debias != settings.debias:  # a file from before strengths: loaded
        log.warning("calibration.json was fitted with debias %r before strengths were fitted; ADAPTER_DEBIAS is %r: "
                    "answers in that mode are not calibrated (their readout says why); fit it again with "
                    "python -m decision_adapter.calibrate --debias %s", calibration.debias, settings.debias,
                    settings.debias)
    log.info("model ready", extra={"fields": {"file": identity.file, "sha256": identity.sha256,
                                              "manifest": identity.manifest, **engine.memory_info,
                                              "calibration": dict(calibration.temperatures) if calibration else None,
                                              "load_s": round(time.perf_counter() - started, 3)}})
    return model


def probe(model: DecisionModel) -> Scored:
    """Score a fixed decision through the one scoring path; start-up is not complete until it gives a proper
    distribution. A second one over a state of about a micro-batch gives the scheduler its first measure of the
    decode speed at the size that matters for admission (the first decision alone is mostly fixed costs); and the
    request text per evaluated token is measured for Batch Transform's sizing (``model.text_bytes_per_token``)."""
    source = QuestionSource("probe", "choice", PROBE_QUESTION, PROBE_STATE,
                            tuple((f"option_{i}", text) for i, text in enumerate(PROBE_OPTIONS)))
    question = Question(("probe",), PROBE_STATE, PROBE_QUESTION, PROBE_OPTIONS,
                        tuple(("probe", "options", i) for i in range(3)), ("probe", "state"),
                        ("probe", "question"), debias="off", source=source)  # the answer's own cost, no prior's
    [result] = model.score(model.prepare([question])).results
    room = min(512, model.prompt_ceiling // 2, model.limits.max_request_tokens // 2)
    long_state = " ".join(f"({i}) {PROBE_STATE}" for i in range(1, max(2, room // 25)))
    try:
        model.score(model.prepare([replace(question, state=long_state,
                                           source=replace(source, state=long_state))]))
    except InputError:
        pass  # limits too tight for it: the speed is measured on requests instead
    # The probe's state and question text over what the plan decodes for them under the server's default debias
    # mode, the first prior's tokens counted (a record of a question not seen before pays it; a JSON record adds
    # ids and keys: more bytes per token).
    if model.layout is not None:
        text = state_segment(PROBE_STATE) + model.layout.question_segment(PROBE_QUESTION, SINGLE[:3], PROBE_OPTIONS)
    else:  # a decision GGUF's template: the request's own text
        text = PROBE_STATE + PROBE_QUESTION + "".join(PROBE_OPTIONS)
    charged = model.prepare([replace(question, debias=None)]).request_tokens
    model.text_bytes_per_token = len(text.encode("utf-8")) / charged
    p = result.probabilities
    if len(p) != 3 or not all(math.isfinite(x) and 0.0 <= x <= 1.0 for x in p) or abs(sum(p) - 1.0) > 1e-6:
        raise ModelIncompatible(f"the probe decision gave no proper distribution: {p}")
    return result


def load_into(readiness: Readiness, settings: Settings, engine: Any = None) -> None:
    try:
        readiness.ready(load_decision_model(settings, engine))
    except (ModelFilesError, ModelIncompatible, CalibrationError) as exc:
        log.error("model not usable: %s", exc)
        readiness.failed(str(exc))
    except Exception as exc:  # noqa: BLE001 - any start-up failure must keep /ping at 503, with the cause logged
        log.exception("start-up failed")
        readiness.failed(f"start-up failed: {type(exc).__name__}: {exc}")
