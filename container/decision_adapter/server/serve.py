"""The ``serve`` entry point: SageMaker starts the container with ``serve``; gunicorn runs the app.

Before gunicorn starts, a pre-flight check refuses to start (exit 2, one clear line) when the
settings are invalid, the model folder is unusable, or GPU layers are asked of a build without a GPU
backend. Each worker then loads its own model in the background while /ping answers 503.
"""

from __future__ import annotations

import argparse
import signal
import sys

from gunicorn.app.base import BaseApplication

from ..decisions.model_files import ModelFilesError, find_gguf
from ..settings import Settings, SettingsError
from . import logs
from .worker import Worker


class PreflightError(RuntimeError):
    pass


def preflight(settings: Settings) -> None:
    try:
        find_gguf(settings.model_dir)
    except ModelFilesError as exc:
        raise PreflightError(str(exc)) from None
    try:
        from ..engine.llama_model import check_gpu_layers
        from ..engine.errors import BackendUnavailable, GpuUnavailable
    except (ImportError, OSError, RuntimeError) as exc:
        raise PreflightError(f"llama-cpp-python cannot load its native library: {exc}") from None
    try:
        check_gpu_layers(settings.gpu_layers, settings.cpu_variant)
    except GpuUnavailable as exc:
        raise PreflightError(str(exc)) from None
    except BackendUnavailable:
        pass  # the worker fails to load the same way and says why in /ping (503) and the log


class _Gunicorn(BaseApplication):
    def __init__(self, settings: Settings):
        self.settings = settings
        super().__init__()

    def load_config(self) -> None:
        s = self.settings
        for key, value in {
            "bind": f"{s.host}:{s.port}",
            "workers": 1,  # one model copy and one scheduler per process: more workers would split the CPUs
            # gthread's, stamping each request's arrival, with a deadline on its headers (worker)
            "worker_class": Worker.reading_headers_within(s.body_timeout_s),
            "threads": s.http_threads,
            # The gthread worker heartbeats from its main thread, so a long scoring call does not
            # trip this; it only catches a worker that stopped answering altogether.
            "timeout": 120,
            "graceful_timeout": s.graceful_timeout_s,
            "keepalive": 75,
            "accesslog": None,
            "errorlog": "-",
            "loglevel": "warning",
            "preload_app": False,  # llama.cpp state must not cross a fork
            "post_worker_init": _drain_on_sigterm,
        }.items():
            self.cfg.set(key, value)

    def load(self):
        from .app import create_app

        return create_app(self.settings)


def _drain_on_sigterm(worker) -> None:
    """On SIGTERM, turn new requests away (503, /ping 503) before gunicorn stops accepting: requests in flight
    finish within the graceful timeout."""
    stop = signal.getsignal(signal.SIGTERM)
    admission = worker.wsgi.extensions["decision_adapter"].admission

    def drain(signum, frame) -> None:
        admission.draining = True
        if callable(stop):
            stop(signum, frame)

    signal.signal(signal.SIGTERM, drain)


def run(settings: Settings) -> None:
    logs.configure(settings.log_level)
    preflight(settings)
    _Gunicorn(settings).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="serve", description="Serve the decision adapter (SageMaker /ping and /invocations).",
        epilog="Settings come from environment variables:\n" + "\n".join(
            f"  {row['env']} (default {row['default']!r}): {row['description']}" for row in Settings.describe()),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args(argv)
    try:
        run(Settings.from_env())
    except (SettingsError, PreflightError) as exc:
        print(f"serve: refusing to start: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
