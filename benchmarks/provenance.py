"""What names a benchmark run: every result file says which code, command, time, load, CPU, settings, kernels and
comparison builds produced it (its top-level ``provenance``), so that a figure can be traced to its run and two
runs compared for what they differ in.

One definition for every benchmark (``python -m benchmarks`` and each ``python -m benchmarks.<name>``)::

    with Provenance("benchmarks.prefill", argv) as run:
        ...                                  # the benchmark; what it starts tells ``run`` what it ran with:
        run.ran_with(settings)               #   a decision_adapter Settings it built (or a mapping of its fields),
        run.ran_with(environ=env)            #   or the environment it gave a `serve` subprocess,
        run.kernels_of(model.model_info)     #   the kernels that answered (/ping, a result's model, kernel_info),
        run.built("llama-server", flags)     #   a comparison build and its flags
        record["provenance"] = run.record()  # stops the load sampler and stamps ``finished``

The record: ``commit`` and ``dirty`` (``git rev-parse HEAD``, ``git status --porcelain`` at the start), ``command``
(``python -m benchmarks...`` with the arguments, shell-quoted), ``started`` and ``finished`` (ISO-8601 UTC with
milliseconds: they compare as strings) and ``seconds``, ``load_average_1m`` (the 1-minute load average sampled at
the start, every ``interval_s`` by a daemon thread, and at the finish: samples, min, median, max), ``cpu`` (model
name, CPUs this process may use, the flags as ``cpu_variants.cpu_flags()`` reads them, sorted, and the best llama.cpp
variant for them), ``settings`` (every adapter setting but ``api_key`` and the port, typed as the adapter read
them; a setting that differed between the models or servers of the run is the list of its values, in the order
first seen, and is named in ``varied``), ``kernels`` (``cpu_variant`` and ``cpu_features``, merged alike) and
``builds`` (comparison build name: its flags).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import platform
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Mapping

REPO = Path(__file__).resolve().parents[1]
LOAD_INTERVAL_S = 5.0
KERNEL_KEYS = ("cpu_variant", "cpu_features")  # what /ping and a result's model say of the kernels
SECRET = frozenset({"api_key"})  # never written anywhere
PER_START = frozenset({"port"})
EXPERIMENT = ("layout", "prompt_style", "thread_wait")  # what a run sets that no adapter setting holds (ran_with)  # a free port each server start: says nothing of how it scored


def command_line(module: str, argv: list[str] | None = None) -> str:
    """``python -m <module> <args>`` as one could type it again (``argv``: default sys.argv[1:])."""
    args = sys.argv[1:] if argv is None else list(argv)
    return " ".join(["python", "-m", module, *map(shlex.quote, args)])


def utc_now() -> str:
    """ISO-8601 UTC with milliseconds, always the same width: such times order as strings do."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def git_state(repo: Path = REPO) -> dict[str, Any]:
    """The commit checked out and whether the work tree differs from it (untracked files count); None where git
    or the repository is missing (a copy of the folder)."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None

    head, status = git("rev-parse", "HEAD"), git("status", "--porcelain")
    return {"commit": head.strip() if head else None, "dirty": None if status is None else bool(status.strip())}


def cpu() -> dict[str, Any]:
    """This machine's CPU: model name, CPUs this process may use, flags (sorted) and the best llama.cpp variant."""
    from decision_adapter.engine import cpu_variants

    flags = cpu_variants.cpu_flags()
    try:
        best = cpu_variants.best(flags) if flags is not None else None
    except LookupError:  # not an x86-64 CPU
        best = None
    return {"model": _cpu_model(), "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count(), "flags": sorted(flags) if flags is not None else None, "best_variant": best}


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or None


def settings_fields(settings: Any) -> dict[str, Any]:
    """A decision_adapter ``Settings`` (or a mapping of its fields) as a plain dict, without the secret and the
    port."""
    if dataclasses.is_dataclass(settings) and not isinstance(settings, type):
        values = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)}
    else:
        values = dict(settings)
    return {k: v for k, v in values.items() if k not in SECRET | PER_START}


def wait_policy(environ: Mapping[str, str]) -> str:
    """How llama.cpp's OpenMP threads wait, as libgomp reads it from the environment: ``openmp`` (its default: spin
    a while, then sleep), ``passive`` or ``active``."""
    return (environ.get("OMP_WAIT_POLICY") or "openmp").strip().lower()


def merged(records: list[dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """One dict for several: a key's value where all agree, else the list of its values in the order first seen;
    and the keys that varied."""
    out: dict[str, Any] = {}
    varied = []
    for key in dict.fromkeys(k for r in records for k in r):
        values: list[Any] = []
        for r in records:
            if r.get(key) not in values:
                values.append(r.get(key))
        if len(values) == 1:
            out[key] = values[0]
        else:
            out[key] = values
            varied.append(key)
    return out, varied


class Provenance:
    """A benchmark run's provenance, gathered while it runs (see the module's text); a context manager."""

    def __init__(self, module: str, argv: list[str] | None = None, *, interval_s: float = LOAD_INTERVAL_S):
        self.command = command_line(module, argv)
        self.interval_s = interval_s
        self.started: str | None = None
        self.finished: str | None = None
        self.builds: dict[str, str] = {}
        self._settings: list[dict[str, Any]] = []
        self._kernels: list[dict[str, Any]] = []
        self._loads: list[float] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._git: dict[str, Any] = {}
        self._cpu: dict[str, Any] = {}
        self._t0 = self._seconds = 0.0

    def __enter__(self) -> "Provenance":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self._finish()

    def start(self) -> "Provenance":
        self._git, self._cpu = git_state(), cpu()
        self.started, self._t0 = utc_now(), time.monotonic()
        self._sample()
        self._thread = threading.Thread(target=self._sampler, name="provenance-load", daemon=True)
        self._thread.start()
        return self

    # ---- what the benchmark ran with -----------------------------------------------------------

    def ran_with(self, settings: Any = None, *, environ: Mapping[str, str] | None = None,
                 experiment: Any = None) -> None:
        """The adapter settings a model or server of this run got: a ``Settings`` (or a mapping of its fields), or
        the environment given to a `serve` subprocess, read as `serve` reads it (``Settings.from_env``: typed, and
        the adapter's defaults for what it does not set); with what no setting holds: the benchmark's
        ``experiment`` (``startup.Experiment``: layout and prompt style; a server runs the defaults) and how
        OpenMP's threads wait (``OMP_WAIT_POLICY`` in the environment the model loaded with; ``openmp`` when
        unset)."""
        from decision_adapter.startup import Experiment

        if environ is not None:
            from decision_adapter.settings import Settings

            settings = Settings.from_env(environ)
        fields = settings_fields(settings)
        experiment = experiment or Experiment()
        fields.setdefault("layout", experiment.layout)
        fields.setdefault("prompt_style", experiment.prompt_style)
        fields.setdefault("thread_wait", wait_policy(os.environ if environ is None else environ))
        with self._lock:
            if fields not in self._settings:
                self._settings.append(fields)

    def ran_elsewhere(self, endpoint: str) -> None:
        """The decision endpoint was not started by this run (a URL, a SageMaker endpoint): its settings are not
        known here, and are recorded as None beside its name, never as the adapter's defaults."""
        from decision_adapter.settings import Settings

        unknown = {name: None for name in (*Settings.fields(), *EXPERIMENT) if name not in SECRET | PER_START}
        with self._lock:
            self._settings.append({"endpoint": endpoint, **unknown})

    def kernels_of(self, info: Mapping[str, Any]) -> None:
        """The CPU kernels that answered, from what the served model reports (``/ping``, a result's ``model``,
        ``Engine.kernel_info``)."""
        kernels = {key: info[key] for key in KERNEL_KEYS if info.get(key)}
        with self._lock:
            if kernels and kernels not in self._kernels:
                self._kernels.append(kernels)

    def served(self, environ: Mapping[str, str], ping: Mapping[str, Any]) -> None:
        """A `serve` subprocess started with ``environ`` answered ``/ping`` with ``ping``."""
        self.ran_with(environ=environ)
        self.kernels_of(ping)

    def built(self, name: str, flags: str) -> None:
        """A comparison build this run measured against, and the flags it was compiled with."""
        with self._lock:
            self.builds[name] = flags

    # ---- the record ------------------------------------------------------------------------------

    def record(self) -> dict[str, Any]:
        """The provenance as JSON-ready data; the first call stops the load sampler and stamps ``finished``."""
        self._finish()
        with self._lock:
            loads = list(self._loads)
            settings, varied = merged(self._settings)
            kernels, _ = merged(self._kernels)
            builds = dict(self.builds)
        out = {**self._git, "command": self.command, "started": self.started, "finished": self.finished,
               "seconds": round(self._seconds, 3),
               "load_average_1m": {"samples": len(loads), "interval_s": self.interval_s,
                                   "min": min(loads, default=None),
                                   "median": statistics.median(loads) if loads else None,
                                   "max": max(loads, default=None)},
               "cpu": self._cpu, "python": platform.python_version(), "settings": settings}
        if varied:
            out["varied"] = varied
        if kernels:
            out["kernels"] = kernels
        out["builds"] = builds
        return out

    def _finish(self) -> None:
        if self.started is None:
            self.start()
        if self.finished is not None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        self.finished, self._seconds = utc_now(), time.monotonic() - self._t0

    def _sample(self) -> None:
        with contextlib.suppress(OSError, AttributeError):  # no load average on this system
            load = os.getloadavg()[0]
            with self._lock:
                self._loads.append(load)

    def _sampler(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()
