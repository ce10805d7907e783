"""CloudWatch alarms as synthesized, evaluated on made-up minutes of metrics as CloudWatch evaluates them: what the
rollback alarm tests feed them.

Metric math, per timestamp (AWS's "Using metric math" page, the rules as written there):

- a metric with no datapoint in a period is missing there;
- arithmetic between two time series treats a value missing in one as 0 ("Missing values in a time series are
  treated as 0"), and gives nothing where both are missing; with a scalar, a missing value stays missing; a
  division by zero drops the datapoint;
- a comparison or a logical operator between two time series treats a value missing in one as 0 ("the function
  treats the missing value in the other time series as 0"); against a scalar, a missing value stays missing;
- ``IF(c, a, b)``: ``a`` where ``c`` is true (0 where ``a`` is a series with no value there), ``b`` where it is
  false (nothing where ``b`` is a series with no value there); where ``c`` is missing, nothing, but for a scalar
  ``b`` where ``a`` has a value (so AWS's tables of IF show it);
- ``MAX([...])`` of an array: the largest value present, nothing where none is;
- ``FILL(m, v)``: a value at every timestamp of the query's range, ``v`` where ``m`` has none: the newest minutes
  that are not published yet included (AWS: "the latest data point for the metric [is] always the FILL value").

Publication: a minute's datapoint of a namespace reaches CloudWatch up to its publishing delay after the minute
ended (``delays``: seconds per namespace family, stacks/endpoint_specs.PUBLISHING_DELAY_S); an evaluation before
that sees the minute missing in that namespace. The metrics of one namespace family are published together (the
log metrics of one log group come from the same log events; SageMaker's per minute); different families need not
be, which is where a comparison between them reads 0 for the one not yet there.

Alarm evaluation (AWS's "How alarm state is evaluated when data is missing"): every minute CloudWatch retrieves the
evaluation range, ``EvaluationPeriods`` plus a few more periods (``extra_periods``: 2 in AWS's example of 3 periods,
5 retrieved); it evaluates the ``EvaluationPeriods`` most recent datapoints that exist in the range and, where fewer
exist, fills the shortfall with the treatment of missing data (every alarm of the stacks: notBreaching); ALARM when
at least ``DatapointsToAlarm`` of them breach. (The "premature alarm" rule AWS describes applies to missing data
treated as missing or breaching, not to notBreaching.)
"""

from __future__ import annotations

import functools
import itertools
import operator
import re
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence

Value = float | None
# (namespace, metric name, {dimension: value}) -> the metric's statistic over one period, or None for no datapoint.
Series = Callable[[str, str, Mapping[str, str]], Value]

_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|([A-Za-z_][A-Za-z0-9_]*)|(>=|<=|==|!=|[-+*/()<>\[\],]))")
_COMPARE = {">": operator.gt, "<": operator.lt, ">=": operator.ge, "<=": operator.le, "==": operator.eq,
            "!=": operator.ne}
_COMPARISONS = {"GreaterThanThreshold": operator.gt, "GreaterThanOrEqualToThreshold": operator.ge,
                "LessThanThreshold": operator.lt, "LessThanOrEqualToThreshold": operator.le}
# CloudWatch's evaluation range beyond EvaluationPeriods, as AWS's example of a 3-period alarm shows it (5).
EXTRA_PERIODS = 2


class Point(NamedTuple):
    """One timestamp of a metric math value: the value (None: no datapoint) and whether it is a time series's
    (missing values of a series follow the series rules) or a scalar's."""
    value: float | None
    series: bool


@functools.lru_cache(maxsize=None)
def _tokens(expression: str) -> tuple[str, ...]:
    found, position = [], 0
    while position < len(expression.rstrip()):
        match = _TOKEN.match(expression, position)
        if not match:
            raise ValueError(f"cannot read {expression[position:]!r}")
        found.append(next(group for group in match.groups() if group is not None))
        position = match.end()
    return tuple(found)


def _binary(a: Point, b: Point, apply: Callable[[float, float], float | None]) -> Point:
    """An operator on two values, with the series rules for a missing one."""
    if a.series and b.series:
        if a.value is None and b.value is None:
            return Point(None, True)
        return Point(apply(0.0 if a.value is None else a.value, 0.0 if b.value is None else b.value), True)
    if a.value is None or b.value is None:
        return Point(None, a.series or b.series)
    return Point(apply(a.value, b.value), a.series or b.series)


def _arithmetic(op: str) -> Callable[[float, float], float | None]:
    return {"+": operator.add, "-": operator.sub, "*": operator.mul,
            "/": lambda x, y: None if y == 0 else x / y}[op]


class _Parser:
    def __init__(self, expression: str, values: Mapping[str, Value]):
        self.tokens, self.values, self.at = _tokens(expression), values, 0

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.tokens[self.at]
        if expected is not None and token != expected:
            raise ValueError(f"expected {expected!r}, found {token!r}")
        self.at += 1
        return token

    def parse(self) -> Point:
        value = self.logical()
        if self.peek() is not None:
            raise ValueError(f"unexpected {self.peek()!r}")
        return value

    def logical(self) -> Point:
        value = self.comparison()
        while self.peek() in ("AND", "OR"):
            combine = (lambda x, y: float(bool(x) and bool(y))) if self.take() == "AND" else \
                (lambda x, y: float(bool(x) or bool(y)))
            value = _binary(value, self.comparison(), combine)
        return value

    def comparison(self) -> Point:
        value = self.additive()
        if self.peek() in _COMPARE:
            compare = _COMPARE[self.take()]
            value = _binary(value, self.additive(), lambda x, y: float(compare(x, y)))
        return value

    def additive(self) -> Point:
        value = self.multiplicative()
        while self.peek() in ("+", "-"):
            op = self.take()
            value = _binary(value, self.multiplicative(), _arithmetic(op))
        return value

    def multiplicative(self) -> Point:
        value = self.unary()
        while self.peek() in ("*", "/"):
            op = self.take()
            value = _binary(value, self.unary(), _arithmetic(op))
        return value

    def unary(self) -> Point:
        if self.peek() == "-":
            self.take()
            value = self.unary()
            return Point(None if value.value is None else -value.value, value.series)
        return self.primary()

    def primary(self) -> Any:
        token = self.take()
        if token == "(":
            value = self.logical()
            self.take(")")
            return value
        if token == "[":
            return self.arguments("]")
        if re.fullmatch(r"\d+(?:\.\d+)?", token):
            return Point(float(token), False)
        if self.peek() == "(":
            self.take("(")
            return self.call(token, self.arguments(")"))
        if token not in self.values:
            raise KeyError(f"the expression reads {token!r}, which the alarm does not define")
        return Point(self.values[token], True)

    def arguments(self, closing: str) -> list[Any]:
        found = []
        while self.peek() != closing:
            found.append(self.logical())
            if self.peek() == ",":
                self.take(",")
        self.take(closing)
        return found

    @staticmethod
    def call(name: str, arguments: Sequence[Any]) -> Point:
        if name == "FILL":
            value, fill = arguments
            return Point(fill.value if value.value is None else value.value, True)
        if name == "IF":
            condition, then, otherwise = arguments
            if condition.value is None:
                # AWS's tables: dropped, but for a scalar ``b`` where ``a`` has a datapoint there (IF(TS, TS, S)).
                present = then.series and then.value is not None and not otherwise.series
                return Point(otherwise.value if present else None, True)
            if condition.value:
                return Point(0.0 if then.value is None and then.series else then.value, True)
            return Point(otherwise.value, True)
        if name == "MAX":
            (array,) = arguments
            present = [point.value for point in array if point.value is not None]
            return Point(max(present) if present else None, True)
        raise ValueError(f"{name}() is not implemented here")


def evaluate(expression: str, values: Mapping[str, Value]) -> Value:
    """One timestamp of a metric math expression, given each metric id's value there (None: no datapoint)."""
    return _Parser(expression, values).parse().value


def metric_queries(properties: Mapping[str, Any]) -> dict[str, tuple[str, str, dict[str, str]]]:
    """{id: (namespace, metric name, dimensions)} of what an alarm reads (a plain alarm's metric is id 'm')."""
    if "Metrics" not in properties:
        return {"m": (properties["Namespace"], properties["MetricName"],
                      {d["Name"]: d["Value"] for d in properties.get("Dimensions", [])})}
    return {q["Id"]: (q["MetricStat"]["Metric"]["Namespace"], q["MetricStat"]["Metric"]["MetricName"],
                      {d["Name"]: d["Value"] for d in q["MetricStat"]["Metric"].get("Dimensions", [])})
            for q in properties["Metrics"] if "MetricStat" in q}


def period_of(properties: Mapping[str, Any]) -> int:
    """The alarm's period (every metric of an alarm's math has the same one, as CloudWatch requires)."""
    if "Metrics" not in properties:
        return int(properties["Period"])
    (period,) = {int(q["MetricStat"]["Period"]) for q in properties["Metrics"] if "MetricStat" in q}
    return period


def family(namespace: str) -> str:
    """The publishing-delay key of a namespace (the adapter's are DecisionAdapter/<endpoint>)."""
    return namespace.split("/", 1)[0] if namespace.startswith("DecisionAdapter/") else namespace


def families(properties: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(sorted({family(namespace) for namespace, _, _ in metric_queries(properties).values()}))


def alarm_value(properties: Mapping[str, Any], values: Mapping[str, Value]) -> Value:
    """What the alarm's expression (or its one metric) gives at one timestamp, from each metric id's value there."""
    if "Metrics" not in properties:
        return values["m"]
    (returned,) = [q for q in properties["Metrics"] if q.get("ReturnData", True) and "Expression" in q]
    return evaluate(returned["Expression"], values)


def breaching(properties: Mapping[str, Any], value: Value) -> bool:
    """Whether one datapoint breaches (the stacks' alarms treat missing data as notBreaching)."""
    assert properties["TreatMissingData"] == "notBreaching"
    return value is not None and _COMPARISONS[properties["ComparisonOperator"]](value, properties["Threshold"])


def datapoints(properties: Mapping[str, Any], minutes: Sequence[Series], at_s: int,
               delays: Mapping[str, int], extra_periods: int = EXTRA_PERIODS) -> list[Value]:
    """The alarm's evaluation range as CloudWatch retrieves it ``at_s`` seconds after minute 0 of ``minutes``
    began, oldest first: each period that ended by then, each metric read only where its namespace family's
    ``delays`` has passed since the period ended (else missing). Periods before minute 0 have no data."""
    period = period_of(properties)
    assert period % 60 == 0
    per_period = period // 60
    queries = metric_queries(properties)
    newest = at_s // period - 1
    found = []
    for index in range(newest - properties["EvaluationPeriods"] - extra_periods + 1, newest + 1):
        values: dict[str, Value] = {}
        for query_id, (namespace, metric, dimensions) in queries.items():
            published = (index + 1) * period + delays[family(namespace)] <= at_s
            covered = [minutes[m] for m in range(index * per_period, (index + 1) * per_period) if 0 <= m < len(minutes)]
            values[query_id] = _statistic(properties, query_id, [minute(namespace, metric, dimensions)
                                                                 for minute in covered]) if published else None
        found.append(alarm_value(properties, values))
    return found


def _statistic(properties: Mapping[str, Any], query_id: str, per_minute: list[Value]) -> Value:
    """A period's statistic from its minutes' (a period of one minute: that minute's)."""
    present = [value for value in per_minute if value is not None]
    if not present:
        return None
    if len(per_minute) == 1:
        return present[0]
    statistic = properties["Statistic"] if "Metrics" not in properties else \
        next(q["MetricStat"]["Stat"] for q in properties["Metrics"] if q["Id"] == query_id)
    return {"Sum": sum, "Maximum": max, "Average": lambda v: sum(v) / len(v)}[statistic](present)


def in_alarm(properties: Mapping[str, Any], retrieved: Sequence[Value]) -> bool:
    """The state an evaluation sets from the datapoints of its evaluation range (oldest first, None: missing):
    the EvaluationPeriods newest that exist, the shortfall filled as not breaching; ALARM when DatapointsToAlarm
    of them breach."""
    real = [value for value in retrieved if value is not None]
    needed = properties["EvaluationPeriods"]
    evaluated = real[-needed:] if len(real) >= needed else real
    return sum(breaching(properties, value) for value in evaluated) >= properties["DatapointsToAlarm"]


def state_at(properties: Mapping[str, Any], minutes: Sequence[Series], at_s: int, delays: Mapping[str, int],
             extra_periods: int = EXTRA_PERIODS) -> bool:
    """Whether the alarm is in ALARM after its evaluation ``at_s`` seconds after minute 0 began."""
    return in_alarm(properties, datapoints(properties, minutes, at_s, delays, extra_periods))


def first_alarm(properties: Mapping[str, Any], minutes: Sequence[Series], delays: Mapping[str, int],
                extra_periods: int = EXTRA_PERIODS) -> int | None:
    """Seconds after minute 0 began at which an evaluation first finds the alarm in ALARM (CloudWatch evaluates
    every minute), or None if none does while ``minutes`` last."""
    for at_s in range(60, len(minutes) * 60 + 1, 60):
        if state_at(properties, minutes, at_s, delays, extra_periods):
            return at_s
    return None


def delay_choices(properties: Mapping[str, Any], most: Mapping[str, int]) -> Iterator[dict[str, int]]:
    """Every assignment of publishing delays, in whole minutes from 0 to ``most`` of each namespace family the alarm
    reads: the delays are bounds, not constants, and families need not lag alike."""
    names = families(properties)
    for chosen in itertools.product(*(range(0, most[name] + 1, 60) for name in names)):
        yield dict(zip(names, chosen))
