"""Fixtures for the adapter tests, chained settings -> engine -> app -> client.

The engine is the real llama.cpp on the embedded SmolLM2-135M model, loaded once per session; each
app builds its own decision model over it (which re-primes the resident prefix). What a test builds is closed
after it (``close_what_the_test_built``): each app's scheduler thread stopped, each engine it loaded freed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from decision_adapter.server.app import create_app
from decision_adapter.engine.core import Engine
from decision_adapter.decisions.model_files import embedded_model_dir
from decision_adapter.decisions.model_files import find_gguf
from decision_adapter.settings import Settings
from decision_adapter.startup import engine_options

from adapter_apps import close_app

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "support-route.json"


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return embedded_model_dir()


@pytest.fixture(scope="session")
def settings(model_dir: Path) -> Settings:
    # No prior: tests about something else score one prompt per decision (the default, the empty-state prior, is
    # tested in test_adapter_debias.py).
    return Settings(model_dir=str(model_dir), threads=2, permutations=1, debias="off")


@pytest.fixture(scope="session")
def engine(settings: Settings):
    with Engine(str(find_gguf(settings.model_dir)), engine_options(settings)) as real:
        yield real


@pytest.fixture(autouse=True)
def close_what_the_test_built(request, monkeypatch):
    """Apps (``create_app``) and decision models (``load_decision_model``) a test builds through its module's
    names are closed when it ends, so that a run does not pile up scheduler threads and loaded models."""
    import decision_adapter.server.app as app_module
    import decision_adapter.startup as startup_module

    built: list = []
    closers = {app_module.create_app: close_app, startup_module.load_decision_model: lambda model: model.close()}

    def recording(factory):
        def build(*args, **kwargs):
            thing = factory(*args, **kwargs)
            built.append((closers[factory], thing))
            return thing
        return build

    for name, value in list(vars(request.module).items()):
        if any(value is factory for factory in closers):
            monkeypatch.setattr(request.module, name, recording(value))
    before = schedulers()
    yield
    for close, thing in reversed(built):
        close(thing)
    left = schedulers() - before
    assert not left, f"the test left {len(left)} scheduler thread(s) running: close what it opens"


def schedulers() -> set:
    """The scheduler threads alive in this process (one per decision model)."""
    import threading

    return {t for t in threading.enumerate() if t.name == "scheduler" and t.is_alive()}


@pytest.fixture(scope="session")
def app(settings: Settings, engine):
    application = create_app(settings, engine)
    assert application.extensions["decision_adapter"].readiness.state == "ready"
    yield application
    close_app(application)


@pytest.fixture
def client(app):
    """A client of the session's app."""
    return app.test_client()


@pytest.fixture
def fresh_model(settings: Settings):
    """Scores one walkthrough-schema decision as a server started for it alone would: a new engine each time."""
    from decision_adapter.protocols import decision_schema
    from decision_adapter.protocols.fields import RequestContext
    from decision_adapter.startup import load_decision_model

    def score(decision: dict):
        model = load_decision_model(dataclasses.replace(settings, state_cache_mb=0))
        try:
            [parsed], _ = decision_schema.parse({"decision": decision}, RequestContext.of(model, max_decisions=1))
            [result] = model.score(model.prepare([parsed.question])).results
            return result
        finally:
            model.close()

    return score


@pytest.fixture(scope="session")
def tight_settings(settings: Settings) -> Settings:
    """Small limits, so that every limit can be crossed cheaply."""
    return dataclasses.replace(settings, max_body_bytes=65536, max_decisions=3, max_prompt_tokens=400,
                               max_request_tokens=500, max_lines=3)


@pytest.fixture(scope="session")
def tight_app(tight_settings: Settings, engine):
    application = create_app(tight_settings, engine)
    yield application
    close_app(application)


@pytest.fixture
def tight_client(tight_app):
    return tight_app.test_client()


@pytest.fixture
def example() -> dict:
    import json

    return json.loads(EXAMPLE.read_text())
