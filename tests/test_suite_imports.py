"""The suite imports its helpers by their own module names, never through ``conftest``.

Every test folder has a conftest.py and pytest puts each folder on sys.path, so ``from conftest import x`` binds to
whichever folder's conftest was imported first: it passes when one folder runs alone and fails when the whole
suite runs (it broke CI twice). Helpers shared by tests live in modules of their own (adapter_apps.py, ...).
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_no_test_module_imports_a_conftest():
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
                     [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            if any(name == "conftest" or name.endswith(".conftest") for name in names):
                offenders.append(f"{path.relative_to(TESTS)}:{node.lineno}")
    assert not offenders, "import helpers from a module of their own, not from conftest: " + ", ".join(offenders)
