"""The adapter's metric log lines (container/decision_adapter/metric_logs.py), loaded by file path.

The metric filters must match what the adapter really logs, so the stacks read the adapter's own definitions
instead of repeating them. The module is standard-library only; it is loaded from its file so that the CDK app
needs neither the adapter package nor its dependencies (llama.cpp) installed.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

METRIC_LOGS_FILE = Path(__file__).resolve().parent.parent / "container" / "decision_adapter" / "metric_logs.py"
_MODULE_NAME = "decision_adapter_metric_logs"


def load(path: Path = METRIC_LOGS_FILE) -> ModuleType:
    """The metric_logs module (once per process)."""
    loaded = sys.modules.get(_MODULE_NAME)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path):
        return loaded
    spec = importlib.util.spec_from_file_location(_MODULE_NAME, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up in sys.modules while the class is created.
    sys.modules[_MODULE_NAME] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[_MODULE_NAME]
        raise
    return module


metric_logs = load()
