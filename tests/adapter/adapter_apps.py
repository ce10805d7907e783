"""Closing what a test builds, importable from any adapter test module (``conftest`` is not: with a conftest.py in
every test folder, ``from conftest import ...`` resolves to whichever folder's conftest was imported first)."""

from __future__ import annotations


def close_app(application) -> None:
    """Stop the app's decision model: its scheduler thread, and the engine where the model loaded its own."""
    application.extensions["decision_adapter"].close()
