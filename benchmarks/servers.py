"""Servers the harness starts itself on loopback: the decision adapter (`serve`) and llama-server."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import requests

from .provenance import Provenance

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _serving(what: str, command: list[str], port: int, health_path: str, log: Path,
             env: dict[str, str] | None = None, timeout_s: float = 300.0) -> Iterator[str]:
    """Start ``command``, yield its base URL once ``health_path`` answers 200, stop it with SIGTERM."""
    base = f"http://127.0.0.1:{port}"
    with log.open("w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"{what} exited with {process.returncode}; see {log}")
                try:
                    if requests.get(base + health_path, timeout=2).status_code == 200:
                        break
                except requests.ConnectionError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{what} was not ready after {timeout_s:.0f} s; see {log}")
                time.sleep(0.2)
            yield base
        finally:
            process.terminate()
            process.wait(60)


def _adapter_environ(port: int, model_dir: str, threads: int, gpu_layers: int,
                     env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment `serve` is started with here: this one, the server's own, and ``env`` on top."""
    return {**os.environ, "SAGEMAKER_BIND_TO_PORT": str(port), "ADAPTER_HOST": "127.0.0.1",
            "ADAPTER_MODEL_DIR": model_dir, "ADAPTER_THREADS": str(threads), "ADAPTER_GPU_LAYERS": str(gpu_layers),
            "ADAPTER_LOG_LEVEL": "warning", **(env or {})}


def ping(base: str) -> dict:
    """The adapter's /ping body (once ready, it names the CPU kernels the model runs on)."""
    return requests.get(base + "/ping", timeout=30).json()


@contextlib.contextmanager
def adapter(model_dir: str, threads: int, gpu_layers: int, log: Path,
            provenance: Provenance | None = None) -> Iterator[str]:
    """The decision adapter on loopback; yields its base URL. Other ADAPTER_* settings come from the
    environment (ADAPTER_BATCH_TOKENS=256 suits a GPU, for example). ``provenance`` learns the settings it was
    started with and the kernels it runs."""
    port = free_port()
    env = _adapter_environ(port, model_dir, threads, gpu_layers)
    with _serving("the decision adapter", [sys.executable, "-m", "decision_adapter.server.serve"], port, "/ping",
                  log, env) as base:
        if provenance is not None:
            provenance.served(env, ping(base))
        yield base


@contextlib.contextmanager
def adapter_process(model_dir: str, threads: int, gpu_layers: int, log: Path,
                    env: dict[str, str] | None = None,
                    provenance: Provenance | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    """The decision adapter on loopback with ``env`` on top of the environment; yields its base URL and its
    process (gunicorn's master: the worker is its one child). A server that does not stop within 10 s of SIGTERM
    (a worker stuck in a body) is killed, worker first. ``provenance``: as for ``adapter``."""
    port = free_port()
    environ = _adapter_environ(port, model_dir, threads, gpu_layers, env)
    base = f"http://127.0.0.1:{port}"
    with log.open("a") as out:
        process = subprocess.Popen([sys.executable, "-m", "decision_adapter.server.serve"], env=environ, stdout=out,
                                   stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 300
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"the decision adapter exited with {process.returncode}; see {log}")
                try:
                    if requests.get(base + "/ping", timeout=2).status_code == 200:
                        break
                except requests.ConnectionError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the decision adapter was not ready after 300 s; see {log}")
                time.sleep(0.2)
            if provenance is not None:
                provenance.served(environ, ping(base))
            yield base, process
        finally:
            workers = _children(process.pid)
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                for pid in workers:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, 9)
                process.kill()
                process.wait(30)


def _children(pid: int) -> list[int]:
    out = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _build_llama_server(*args: str) -> str:
    done = subprocess.run([str(REPO / "benchmarks" / "build-llama-server.sh"), *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable})
    if done.returncode != 0:
        raise RuntimeError(f"building llama-server failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


def llama_server_binary() -> str:
    """Build llama-server once (cached) from the pinned llama-cpp-python's vendored llama.cpp."""
    return _build_llama_server()


def llama_server_flags() -> str:
    """The CMake flags llama-server is built with here (``-DGGML_NATIVE=ON``, or LLAMA_SERVER_CMAKE_ARGS)."""
    return _build_llama_server("--flags")


def llama_server(gguf: str, threads: int, gpu_layers: int, log: Path, ctx_tokens: int = 8192,
                 parallel: int = 1, provenance: Provenance | None = None) -> contextlib.AbstractContextManager[str]:
    """llama-server with the same GGUF and ``parallel`` slots (continuous batching across them), otherwise its
    defaults, prompt cache included (as users run it); yields its base URL. ``ctx_tokens`` is shared by the slots.
    ``provenance`` learns the flags it was built with."""
    if provenance is not None:
        provenance.built("llama-server", llama_server_flags())
    port = free_port()
    command = [llama_server_binary(), "--model", gguf, "--host", "127.0.0.1", "--port", str(port),
               "--threads", str(threads), "--ctx-size", str(ctx_tokens), "--parallel", str(parallel), "--no-webui",
               "--n-gpu-layers", str(gpu_layers) if gpu_layers >= 0 else "all"]
    return _serving("llama-server", command, port, "/health", log)
