"""CloudWatch alarms as synthesized, evaluated on made-up metric values: what the rollback alarm tests feed them.

Only what the stacks' expressions use is implemented (numbers, metric ids, + - * /, comparisons, AND, OR, IF, FILL
and MAX over an array), with CloudWatch's treatment of missing data: a metric with no datapoint in a period is
missing, arithmetic on a missing value is missing, FILL replaces it, MAX ignores it, and a missing value never
breaches (the stacks' alarms treat missing data as notBreaching).
"""

from __future__ import annotations

import operator
import re
from typing import Any, Callable, Mapping, Sequence

Value = float | None
# (namespace, metric name, {dimension: value}) -> the metric's statistic over one period, or None for no datapoint.
Series = Callable[[str, str, Mapping[str, str]], Value]

_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|([A-Za-z_][A-Za-z0-9_]*)|(>=|<=|==|!=|[-+*/()<>\[\],]))")
_COMPARE = {">": operator.gt, "<": operator.lt, ">=": operator.ge, "<=": operator.le, "==": operator.eq,
            "!=": operator.ne}
_COMPARISONS = {"GreaterThanThreshold": operator.gt, "GreaterThanOrEqualToThreshold": operator.ge,
                "LessThanThreshold": operator.lt, "LessThanOrEqualToThreshold": operator.le}


def _tokens(expression: str) -> list[str]:
    found, position = [], 0
    while position < len(expression.rstrip()):
        match = _TOKEN.match(expression, position)
        if not match:
            raise ValueError(f"cannot read {expression[position:]!r}")
        found.append(next(group for group in match.groups() if group is not None))
        position = match.end()
    return found


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

    def parse(self) -> Any:
        value = self.logical()
        if self.peek() is not None:
            raise ValueError(f"unexpected {self.peek()!r}")
        return value

    def logical(self) -> Any:
        value = self.comparison()
        while self.peek() in ("AND", "OR"):
            combine = (lambda a, b: a and b) if self.take() == "AND" else (lambda a, b: a or b)
            other = self.comparison()
            value = None if value is None or other is None else float(combine(bool(value), bool(other)))
        return value

    def comparison(self) -> Any:
        value = self.additive()
        if self.peek() in _COMPARE:
            compare = _COMPARE[self.take()]
            other = self.additive()
            value = None if value is None or other is None else float(compare(value, other))
        return value

    def additive(self) -> Any:
        value = self.multiplicative()
        while self.peek() in ("+", "-"):
            op, other = self.take(), self.multiplicative()
            value = None if value is None or other is None else (value + other if op == "+" else value - other)
        return value

    def multiplicative(self) -> Any:
        value = self.unary()
        while self.peek() in ("*", "/"):
            op, other = self.take(), self.unary()
            if value is None or other is None or (op == "/" and other == 0):
                value = None
            else:
                value = value * other if op == "*" else value / other
        return value

    def unary(self) -> Any:
        if self.peek() == "-":
            self.take()
            value = self.unary()
            return None if value is None else -value
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
            return float(token)
        if self.peek() == "(":
            self.take("(")
            return self.call(token, self.arguments(")"))
        if token not in self.values:
            raise KeyError(f"the expression reads {token!r}, which the alarm does not define")
        return self.values[token]

    def arguments(self, closing: str) -> list[Any]:
        found = []
        while self.peek() != closing:
            found.append(self.logical())
            if self.peek() == ",":
                self.take(",")
        self.take(closing)
        return found

    @staticmethod
    def call(name: str, arguments: Sequence[Any]) -> Any:
        if name == "FILL":
            value, fill = arguments
            return fill if value is None else value
        if name == "IF":
            condition, then, otherwise = arguments
            return None if condition is None else (then if condition else otherwise)
        if name == "MAX":
            (array,) = arguments
            present = [v for v in array if v is not None]
            return max(present) if present else None
        raise ValueError(f"{name}() is not implemented here")


def evaluate(expression: str, values: Mapping[str, Value]) -> Value:
    """One period of a metric math expression, given each id's value."""
    return _Parser(expression, values).parse()


def metric_queries(properties: Mapping[str, Any]) -> dict[str, tuple[str, str, dict[str, str]]]:
    """{id: (namespace, metric name, dimensions)} of what an alarm reads (a plain alarm's metric is id 'm')."""
    if "Metrics" not in properties:
        return {"m": (properties["Namespace"], properties["MetricName"],
                      {d["Name"]: d["Value"] for d in properties.get("Dimensions", [])})}
    return {q["Id"]: (q["MetricStat"]["Metric"]["Namespace"], q["MetricStat"]["Metric"]["MetricName"],
                      {d["Name"]: d["Value"] for d in q["MetricStat"]["Metric"].get("Dimensions", [])})
            for q in properties["Metrics"] if "MetricStat" in q}


def alarm_value(properties: Mapping[str, Any], series: Series) -> Value:
    """What the alarm sees for one period."""
    values = {query_id: series(*query) for query_id, query in metric_queries(properties).items()}
    if "Metrics" not in properties:
        return values["m"]
    (returned,) = [q for q in properties["Metrics"] if q.get("ReturnData", True) and "Expression" in q]
    return evaluate(returned["Expression"], values)


def breaching(properties: Mapping[str, Any], value: Value) -> bool:
    """Whether one period's value breaches (missing data is notBreaching in every alarm of the stacks)."""
    assert properties["TreatMissingData"] == "notBreaching"
    return value is not None and _COMPARISONS[properties["ComparisonOperator"]](value, properties["Threshold"])


def first_alarm(properties: Mapping[str, Any], minutes: Sequence[Series]) -> int | None:
    """The number of periods after which the alarm is in ALARM (M of N breaching), or None if it never is."""
    flags = [breaching(properties, alarm_value(properties, series)) for series in minutes]
    evaluated, needed = properties["EvaluationPeriods"], properties["DatapointsToAlarm"]
    for end in range(1, len(flags) + 1):
        if sum(flags[max(0, end - evaluated):end]) >= needed:
            return end
    return None
