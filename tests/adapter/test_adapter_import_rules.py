"""The adapter's layers keep their import rules, and no import circle exists.

Each layer's ``__init__`` docstring, and each module's at the top of the package (``settings``, ``startup``,
``errors``, ...: a layer of one module each), ends with two lines::

    may import from the package: engine, errors
    never imports: flask, werkzeug, gunicorn, llama_cpp

This test reads them, walks every module's imports with ``ast`` (imports inside functions included: a lazy
import is an import), and fails on an import the importing layer's lines do not allow, on a module at the top
without lines of its own, or on any import circle between the package's modules.
"""

from __future__ import annotations

import ast
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

import decision_adapter

PACKAGE_DIR = Path(decision_adapter.__file__).parent
PACKAGE = "decision_adapter"
LAYERS = ("engine", "decisions", "protocols", "server")
TOP = "top"


@dataclass(frozen=True)
class Rules:
    may_import: frozenset[str]  # layers and top-level modules of the package
    never_imports: frozenset[str]  # first components of outside modules


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # the imported module, dotted and absolute
    line: int


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str:
    """A layer's name (engine, ...), a top-level module's own name (settings, ...), or ``top`` for the package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else TOP


def rules_of(docstring: str) -> Rules:
    may: frozenset[str] | None = None
    never: frozenset[str] | None = None
    for line in docstring.splitlines():
        key, _, value = line.strip().partition(":")
        names = frozenset(n.strip() for n in value.split(",") if n.strip())
        if key == "may import from the package":
            may = frozenset() if value.strip().startswith("nothing") else names
        elif key == "never imports":
            never = names
    assert may is not None and never is not None, f"no rule lines in: {docstring[:80]!r}"
    return Rules(may, never)


def read_rules(root: Path) -> dict[str, Rules]:
    """The rules of the package's own ``__init__`` (``top``), of each layer, and of each module at the top."""
    def docstring(path: Path) -> str:
        return ast.get_docstring(ast.parse(path.read_text())) or ""

    rules = {TOP: rules_of(docstring(root / "__init__.py"))}
    for layer in LAYERS:
        rules[layer] = rules_of(docstring(root / layer / "__init__.py"))
    for path in sorted(root.glob("*.py")):
        if path.name != "__init__.py":
            rules[path.stem] = rules_of(docstring(path))
    return rules


def imports_of(path: Path, root: Path) -> list[Import]:
    module = module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    modules = {module_name(p, root) for p in root.rglob("*.py")}
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [Import(module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from . import x` imports the module x when there is one
            submodules = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules]
            found += [Import(module, t, node.lineno) for t in submodules or [target]]
    return found


def violations(root: Path) -> list[str]:
    rules = read_rules(root)
    problems = []
    for path in sorted(root.rglob("*.py")):
        for imp in imports_of(path, root):
            layer = layer_of(imp.module)
            rule = rules[layer]
            where = f"{imp.module} (line {imp.line}) imports {imp.target}"
            if imp.target == PACKAGE or imp.target.startswith(PACKAGE + "."):
                name = layer_of(imp.target)
                if name == layer:
                    continue
                if name not in rule.may_import:
                    problems.append(f"{where}: the {layer} layer may import only {sorted(rule.may_import)}")
            elif imp.target.split(".")[0] in rule.never_imports:
                problems.append(f"{where}: the {layer} layer never imports {imp.target.split('.')[0]}")
    return problems


def circles(root: Path) -> list[list[str]]:
    """Every strongly connected group of more than one module (or a module importing itself), by Tarjan."""
    graph: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        edges = graph.setdefault(module_name(path, root), set())
        edges |= {i.target for i in imports_of(path, root) if i.target.startswith(PACKAGE + ".")}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1 or node in graph.get(node, ()):
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_every_layer_keeps_its_import_rules():
    assert violations(PACKAGE_DIR) == []


def test_no_import_circle():
    assert circles(PACKAGE_DIR) == []


def test_the_rules_say_what_readme_says():
    """engine/ is the only code that imports llama_cpp; server/ the only code that imports flask, werkzeug or
    gunicorn; the engine imports nothing from the rest of the package."""
    rules = read_rules(PACKAGE_DIR)
    assert all("llama_cpp" in rules[layer].never_imports for layer in rules if layer != "engine")
    assert all({"flask", "werkzeug", "gunicorn"} <= rules[layer].never_imports for layer in rules if layer != "server")
    assert rules["engine"].may_import == frozenset()
    assert "engine" not in rules["protocols"].may_import
    # below everything: the errors and the log lines import nothing of the package (metric_logs is loaded by
    # path by the CDK app); nothing but the server and the entry points import the composition root
    assert rules["errors"].may_import == rules["metric_logs"].may_import == frozenset()
    assert {"settings", "startup", "errors", "metric_logs", "calibrate"} <= set(rules)
    assert all("server" not in rules[name].may_import for name in rules if name != TOP)
    assert all("startup" not in rules[layer].may_import for layer in ("engine", "decisions", "protocols"))


def _copy_with(tmp_path: Path, relative: str, source: str) -> Path:
    root = tmp_path / PACKAGE
    shutil.copytree(PACKAGE_DIR, root, ignore=shutil.ignore_patterns("__pycache__"))
    (root / relative).write_text(source)
    return root


@pytest.mark.parametrize("relative, source, expected", [
    ("engine/extra.py", "from ..decisions import prompt\n", "the engine layer may import only []"),
    ("decisions/extra.py", "def f():\n    import flask\n", "the decisions layer never imports flask"),
    ("protocols/extra.py", "from ..engine.readout import softmax\n", "the protocols layer may import only"),
    ("protocols/extra.py", "import llama_cpp\n", "the protocols layer never imports llama_cpp"),
    ("settings.py", None, "the settings layer may import only ['decisions', 'errors']"),
    ("errors.py", None, "the errors layer may import only []"),
])
def test_a_forbidden_import_is_found(tmp_path, relative, source, expected):
    """A new module with the import, or (``source`` None) an import of the server added to a top-level module."""
    original = (PACKAGE_DIR / relative).read_text() if source is None else ""
    assert violations(_copy_with(tmp_path, relative, original)) == []
    broken = original + "\nfrom .server import app\n" if source is None else source
    found = violations(_copy_with(tmp_path / "broken", relative, broken))
    assert len(found) == 1 and expected in found[0], found


def test_a_module_at_the_top_without_rule_lines_is_refused(tmp_path):
    with pytest.raises(AssertionError, match="no rule lines"):
        read_rules(_copy_with(tmp_path, "helpers.py", '"""Some helpers."""\n'))


def test_an_import_circle_is_found(tmp_path):
    root = _copy_with(tmp_path, "engine/extra.py", "from . import core\n")
    (root / "engine" / "readout.py").write_text((root / "engine" / "readout.py").read_text() + "\nfrom . import extra\n")
    [circle] = circles(root)
    assert {"decision_adapter.engine.core", "decision_adapter.engine.extra", "decision_adapter.engine.readout"} \
        <= set(circle), "readout -> extra -> core -> ... -> readout"
