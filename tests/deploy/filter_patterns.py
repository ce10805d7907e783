"""CloudWatch Logs JSON filter patterns, evaluated as CloudWatch evaluates them, for the operators the stacks use.

``matches(pattern, line)`` reads ``line`` as JSON and evaluates ``{ <expression> }``: selectors ``$.a.b`` and
``$.a[0]``; comparisons ``=`` and ``!=`` with a string (quoted, or bare with ``*`` wildcards) or a number, and
``<``, ``>``, ``<=``, ``>=`` with a number; ``&&`` binding tighter than ``||``; parentheses; ``EXISTS``,
``NOT EXISTS``, ``IS NULL``, ``IS TRUE``, ``IS FALSE``. As in CloudWatch (Filter and pattern syntax, "Using
filter patterns to match terms in JSON log events"): a line that is not a JSON object matches no JSON pattern; a
comparison on a field that is absent, or of the other type (a number against a string value, a string against a
number), is false, ``!=`` included; a string comparison is exact and case-sensitive except where ``*`` stands
for any run of characters. No moto or library evaluates JSON patterns (moto's FilterLogEvents leaves them
unsupported), hence this one; tests/deploy/test_filter_patterns.py checks it against the documented examples.
"""

from __future__ import annotations

import json
import re
from typing import Any

_TOKEN = re.compile(r"""\s*(?:
    (?P<string>"(?:[^"\\]|\\.)*")
  | (?P<op>&&|\|\||!=|<=|>=|=|<|>|\(|\)|\{|\})
  | (?P<selector>\$(?:\.[A-Za-z_][\w-]*|\[\d+\])*)
  | (?P<word>[^\s()&|=!<>{}"]+)
)""", re.VERBOSE)
_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?$")
_MISSING = object()


class PatternError(ValueError):
    pass


def _tokens(pattern: str) -> list[tuple[str, str]]:
    out, position = [], 0
    while position < len(pattern):
        if pattern[position:].strip() == "":
            break
        match = _TOKEN.match(pattern, position)
        if match is None or match.end() == position:
            raise PatternError(f"cannot read {pattern[position:]!r}")
        kind = match.lastgroup
        out.append((kind, match.group(kind)))
        position = match.end()
    return out


def _select(document: Any, selector: str) -> Any:
    value = document
    for name, index in re.findall(r"\.([A-Za-z_][\w-]*)|\[(\d+)\]", selector[1:]):
        if name and isinstance(value, dict) and name in value:
            value = value[name]
        elif index and isinstance(value, list) and int(index) < len(value):
            value = value[int(index)]
        else:
            return _MISSING
    return value


def _compare(field: Any, operator: str, kind: str, text: str) -> bool:
    if field is _MISSING:
        return False
    if kind == "string" or (kind == "word" and not _NUMBER.match(text)):
        if operator not in ("=", "!="):
            raise PatternError(f"{operator} compares numbers only, not {text}")
        if not isinstance(field, str):
            return False
        value = json.loads(text) if kind == "string" else text
        equal = re.fullmatch(".*".join(map(re.escape, value.split("*"))), field, re.DOTALL) is not None
        return equal if operator == "=" else not equal
    if isinstance(field, bool) or not isinstance(field, (int, float)):
        return False
    number = float(text)
    return {"=": field == number, "!=": field != number, "<": field < number, ">": field > number,
            "<=": field <= number, ">=": field >= number}[operator]


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]], document: Any):
        self.tokens, self.position, self.document = tokens, 0, document

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self, expected: str | None = None) -> tuple[str, str]:
        token = self.peek()
        if token is None or (expected is not None and token[1] != expected):
            raise PatternError(f"expected {expected or 'more'}, found {token and token[1]!r}")
        self.position += 1
        return token

    def expression(self) -> bool:
        result = self.conjunction()
        while self.peek() == ("op", "||"):
            self.take()
            result = self.conjunction() or result
        return result

    def conjunction(self) -> bool:
        result = self.term()
        while self.peek() == ("op", "&&"):
            self.take()
            result = self.term() and result
        return result

    def term(self) -> bool:
        if self.peek() == ("op", "("):
            self.take()
            result = self.expression()
            self.take(")")
            return result
        kind, selector = self.take()
        if kind != "selector":
            raise PatternError(f"expected a selector such as $.field, found {selector!r}")
        field = _select(self.document, selector)
        kind, word = self.take()
        if kind == "word" and word in ("EXISTS", "NOT", "IS"):
            if word == "EXISTS":
                return field is not _MISSING
            if word == "NOT":
                self.take("EXISTS")
                return field is _MISSING
            _, what = self.take()
            if what not in ("NULL", "TRUE", "FALSE"):
                raise PatternError(f"IS {what}: expected NULL, TRUE or FALSE")
            return field is not _MISSING and field is {"NULL": None, "TRUE": True, "FALSE": False}[what]
        if kind != "op" or word not in ("=", "!=", "<", ">", "<=", ">="):
            raise PatternError(f"expected a comparison after {selector}, found {word!r}")
        value_kind, value = self.take()
        if value_kind not in ("string", "word"):
            raise PatternError(f"expected a value after {selector} {word}, found {value!r}")
        return _compare(field, word, value_kind, value)


def matches(pattern: str, line: str) -> bool:
    """Whether a CloudWatch Logs JSON filter pattern ``{ ... }`` selects the log event ``line``."""
    tokens = _tokens(pattern)
    if len(tokens) < 3 or tokens[0] != ("op", "{") or tokens[-1] != ("op", "}"):
        raise PatternError(f"not a JSON filter pattern: {pattern!r}")
    try:
        document = json.loads(line)
    except ValueError:
        return False
    if not isinstance(document, dict):
        return False
    parser = _Parser(tokens[1:-1], document)
    result = parser.expression()
    if parser.peek() is not None:
        raise PatternError(f"unexpected {parser.peek()[1]!r} in {pattern!r}")
    return result
