"""docs/settings.md's table is generated from container/decision_adapter/settings.py (`make settings-doc`): it fails
here while the page is stale, and it renders the same on every machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from decision_adapter import settings as settings_module
from decision_adapter.settings import (SETTINGS_DOC_BEGIN, SETTINGS_DOC_END, Settings, render_settings_table,
                                       write_settings_doc)

PAGE = Path(__file__).resolve().parents[1] / "docs" / "settings.md"


def generated_part(text: str) -> str:
    assert text.count(SETTINGS_DOC_BEGIN) == 1 and text.count(SETTINGS_DOC_END) == 1, \
        f"{PAGE} must hold the markers {SETTINGS_DOC_BEGIN} and {SETTINGS_DOC_END} once each"
    return text.split(SETTINGS_DOC_BEGIN, 1)[1].split(SETTINGS_DOC_END, 1)[0]


def test_docs_settings_md_is_the_rendered_table():
    assert generated_part(PAGE.read_text(encoding="utf-8")).strip() == render_settings_table().strip(), (
        "docs/settings.md's settings table is stale: run `make settings-doc` and commit docs/settings.md")


def test_every_setting_has_one_row():
    table = render_settings_table()
    for row in Settings.describe():
        assert table.count(f"| `{row['env']}` |") == 1, row["env"]
    assert len(table.strip().splitlines()) == len(Settings.describe()) + 2


@pytest.mark.parametrize("cpus", [{0}, set(range(64))])
def test_the_table_is_the_same_on_every_machine(monkeypatch, cpus):
    """A default computed where the server starts (the threads) is named by its rule, never this machine's value."""
    expected = render_settings_table()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(cpus), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: len(cpus))
    assert render_settings_table() == expected
    assert "(this machine)" not in expected
    threads = next(line for line in expected.splitlines() if line.startswith("| `ADAPTER_THREADS` |"))
    assert threads.startswith(f"| `ADAPTER_THREADS` | {settings_module.MACHINE_DEFAULTS['ADAPTER_THREADS']} |")


def test_make_settings_doc_rewrites_only_the_part_between_the_markers(tmp_path):
    page = tmp_path / "settings.md"
    page.write_text(f"# Settings\n\nby hand\n\n{SETTINGS_DOC_BEGIN}\n| old | table |\n{SETTINGS_DOC_END}\n\nafter\n")
    assert write_settings_doc(page) is True
    text = page.read_text()
    assert text.startswith("# Settings\n\nby hand\n\n") and text.endswith(f"{SETTINGS_DOC_END}\n\nafter\n")
    assert generated_part(text).strip() == render_settings_table().strip() and "| old |" not in text
    assert write_settings_doc(page) is False


def test_python_m_prints_the_table():
    done = subprocess.run([sys.executable, "-m", "decision_adapter.settings"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == render_settings_table()
