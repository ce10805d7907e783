"""The log lines that CloudWatch metrics are made from: the one definition of each.

A deployed endpoint counts requests, busy answers and failures with CloudWatch Logs metric filters on the
adapter's JSON log lines (``server/logs.JsonFormatter``: ``logger``, ``message``, then the line's own fields). A metric
filter matches a logger name, a message and field values as text, so renaming any of them silently stops the
metric, and the alarm on it can never fire again. Each such line is therefore defined here once: the adapter
logs it through :meth:`LogLine.log`, and the CDK app (``stacks/``) builds its filters from
:meth:`LogMetric.filter_pattern`, loading this file by its path.

This module imports only the standard library and nothing else of the package, so that the CDK app can load
it without the adapter or its dependencies installed. Do not rename a logger, a message or a field here
without deploying the stacks again.

may import from the package: nothing
never imports: flask, werkzeug, gunicorn, llama_cpp, pydantic
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Mapping

# Comparison operators of CloudWatch Logs JSON filter patterns: = and != for strings, all six for numbers.
STRING_OPERATORS = ("=", "!=")
NUMBER_OPERATORS = ("=", "!=", "<", ">", "<=", ">=")


@dataclass(frozen=True)
class FieldTest:
    """One comparison of a field of the line with a constant: ``$.<field> <operator> <value>``."""
    field: str
    operator: str
    value: str | int

    def __post_init__(self) -> None:
        allowed = STRING_OPERATORS if isinstance(self.value, str) else NUMBER_OPERATORS
        if self.operator not in allowed or isinstance(self.value, bool):
            raise ValueError(f"{self.field} {self.operator} {self.value!r}: not a JSON filter comparison")

    def render(self) -> str:
        value = json.dumps(self.value) if isinstance(self.value, str) else str(self.value)
        return f"$.{self.field} {self.operator} {value}"


@dataclass(frozen=True)
class LogLine:
    """A line the adapter writes: its logger, its level and its message. The fields vary per line."""
    logger: str
    level: int
    message: str

    def log(self, fields: Mapping[str, Any]) -> None:
        """Write the line; ``fields`` become top-level keys of its JSON object (server/logs.JsonFormatter)."""
        logging.getLogger(self.logger).log(self.level, self.message, extra={"fields": dict(fields)})

    def identity(self) -> tuple[FieldTest, ...]:
        return (FieldTest("logger", "=", self.logger), FieldTest("message", "=", self.message))


@dataclass(frozen=True)
class LogMetric:
    """A CloudWatch metric over the lines of ``line`` whose fields pass every test in ``where``: their count, or
    the sum of their numeric field ``value_field``."""
    metric_name: str
    line: LogLine
    where: tuple[FieldTest, ...] = ()
    value_field: str | None = None

    def filter_pattern(self) -> str:
        """The CloudWatch Logs JSON filter pattern of a metric filter that selects these lines."""
        return "{ " + " && ".join(test.render() for test in (*self.line.identity(), *self.where)) + " }"

    def metric_value(self) -> str:
        """The metric filter's MetricValue: 1 per line, or the line's ``value_field`` (``$.<field>``)."""
        return "1" if self.value_field is None else f"$.{self.value_field}"


# One line per request the adapter answers (not /ping), with its HTTP status (server/app.py, logs.log_request).
REQUEST = LogLine(logger="decision_adapter.requests", level=logging.INFO, message="request")
# A request whose scoring raised in the engine; it is answered with a 500 (server/calls.py). The logger is the
# request logger: these names are a contract with the stacks, not the module layout.
SCORING_FAILED = LogLine(logger="decision_adapter.requests", level=logging.ERROR, message="scoring failed")

# Counts every request line carries (0 when none; a batch's records add up, server/inflight.add_log_fields): of
# the request's objects (its body, or each record of a batch), those that ran into their deadline and those whose
# scoring failed in the engine. Always present, so that a filter can test them for 0.
DEADLINE_MISSES_FIELD = "deadline_misses"
SCORING_FAILURES_FIELD = "scoring_failures"
COUNT_FIELDS = (DEADLINE_MISSES_FIELD, SCORING_FAILURES_FIELD)

# The adapter answers 503 for two reasons, which the metrics keep apart. An admission refusal (a full queue, work
# that cannot be done before the deadline at the measured speed, a server not ready or draining: errors.busy
# without a deadline miss) is load: scaling reacts to it, an update never rolls back on it. A deadline miss (a job
# admitted at the measured speed that still ran into its deadline) is a fault of the release: the fault-rate
# alarm counts it (it is not subtracted as busy).
BUSY_STATUS = 503

REQUESTS = LogMetric("Requests", REQUEST)
BUSY_RESPONSES = LogMetric("BusyResponses", REQUEST, (FieldTest("status", "=", BUSY_STATUS),
                                                      FieldTest(DEADLINE_MISSES_FIELD, "=", 0)))
DEADLINE_MISSES = LogMetric("DeadlineMisses", REQUEST, (FieldTest(DEADLINE_MISSES_FIELD, ">=", 1),),
                            value_field=DEADLINE_MISSES_FIELD)
SCORING_FAILURES = LogMetric("ScoringFailures", SCORING_FAILED)
# Requests with at least one scoring failure, one per request however many of a batch's records failed: the
# rollback alarm's rate counts these, so that one bad request (or one bad batch) weighs one.
FAILED_REQUESTS = LogMetric("FailedRequests", REQUEST, (FieldTest(SCORING_FAILURES_FIELD, ">=", 1),))

# The release's own compute, measured on every job that ran, to its end or into its deadline: the seconds its
# scoring steps ran in the engine (``compute_s``: a finished job's prefill and readout, a stopped job's steps until
# its last finished one; its wait in the queue, ``queue_s``, is apart) and the tokens they evaluated
# (``evaluated_tokens``: not those taken from the state cache or the resident head). The engine runs one job at a
# time, so their ratio, the compute time per evaluated token, is what the release computes at, whatever the load
# (an admission refusal computes nothing and has neither field): the endpoint's slow-release alarm (stacks/)
# divides the per-minute sums. A line of fewer than MIN_TIMED_TOKENS evaluated tokens is left out, because a
# decode of a handful of tokens costs more per token (its fixed cost per call) in any release. A batch's records
# add up into one line (server/inflight.add_log_fields), so the ratio holds for batches too.
SUCCESS_STATUS = 200
MIN_TIMED_TOKENS = 64
COMPUTE_FIELD = "compute_s"
EVALUATED_TOKENS_FIELD = "evaluated_tokens"
_TIMED = (FieldTest(EVALUATED_TOKENS_FIELD, ">=", MIN_TIMED_TOKENS),)
COMPUTE_SECONDS = LogMetric("ComputeSeconds", REQUEST, _TIMED, value_field=COMPUTE_FIELD)
EVALUATED_TOKENS = LogMetric("EvaluatedTokens", REQUEST, _TIMED, value_field=EVALUATED_TOKENS_FIELD)

METRICS = (REQUESTS, BUSY_RESPONSES, DEADLINE_MISSES, SCORING_FAILURES, FAILED_REQUESTS, COMPUTE_SECONDS,
           EVALUATED_TOKENS)
