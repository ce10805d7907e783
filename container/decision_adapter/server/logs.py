"""Structured logs: one JSON object per line, so CloudWatch Logs Insights can query every field; the request's
log line and the scoring-failure line, each defined in ``metric_logs``."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from ..metric_logs import REQUEST, SCORING_FAILED

REQUEST_LOGGER = REQUEST.logger


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(getattr(record, "fields", {}))
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("decision_adapter").setLevel(level.upper())
    logging.getLogger("llama_cpp").setLevel(logging.WARNING)


def log_request(fields: dict[str, Any]) -> None:
    # A metric filter counts these lines: logger, message and status are defined in metric_logs.
    REQUEST.log(fields)


def log_scoring_failed(fields: dict[str, Any]) -> None:
    """A request's scoring raised inside the engine: its cause (the traceback is logged by the scheduler). The
    ScoringFailures metric counts this line (metric_logs); an update rolls back on its alarm."""
    SCORING_FAILED.log(fields)

