"""The JSON filter-pattern evaluator the log-contract test relies on, against the examples of CloudWatch Logs'
"Using filter patterns to match terms in JSON log events" and the edge cases the stacks' patterns depend on."""

from __future__ import annotations

import json

import pytest

from filter_patterns import PatternError, matches

EVENT = json.dumps({
    "eventType": "UpdateTrail", "sourceIPAddress": "123.123.123.123", "arrayKey": ["value", "another value"],
    "objectList": [{"name": "a", "id": 1}, {"name": "b", "id": 2}],
    "SomeObject": None, "ThisFlag": True, "bandwidth": 75, "latency": 1000.5,
    "user": {"id": 1, "email": "John.Doe@example.com"},
    "users": [{"id": 2, "firstName": "John", "lastName": "Doe"}, {"id": 3, "firstName": "Jane"}],
})


@pytest.mark.parametrize("pattern, expected", [
    ('{ $.eventType = "UpdateTrail" }', True),
    ('{ $.eventType = "updatetrail" }', False),                     # case-sensitive
    ('{ $.eventType = UpdateTrail }', True),                         # bare string
    ('{ $.eventType = "Update*" }', True),
    ('{ $.eventType = "*Trail" }', True),
    ('{ $.eventType = "Trail" }', False),                            # exact, not a substring
    ('{ $.sourceIPAddress != 123.123.* }', False),
    ('{ $.sourceIPAddress != 123.124.* }', True),
    ('{ $.arrayKey[0] = "value" }', True),
    ('{ $.arrayKey[1] = "value" }', False),
    ('{ $.objectList[1].id = 2 }', True),
    ('{ $.objectList[5].id = 2 }', False),
    ('{ $.SomeObject IS NULL }', True),
    ('{ $.ThisFlag IS TRUE }', True),
    ('{ $.ThisFlag IS FALSE }', False),
    ('{ $.user.email NOT EXISTS }', False),
    ('{ $.user.phone NOT EXISTS }', True),
    ('{ $.user.email EXISTS }', True),
    ('{ $.bandwidth > 75 }', False),
    ('{ $.bandwidth >= 75 }', True),
    ('{ $.bandwidth = 75.0 }', True),
    ('{ $.latency < 1000 }', False),
    ('{ $.latency <= 1000.5 }', True),
    ('{ ($.user.id = 1) && ($.users[0].email = "John.Doe@example.com") }', False),
    ('{ ($.user.id = 1) && ($.users[0].lastName = "Doe") }', True),
    ('{ ($.user.id = 2 && $.users[0].lastName = "Doe") || $.users[1].firstName = "Jane" }', True),
    ('{ $.user.id = 2 && $.users[0].lastName = "Doe" || $.users[1].firstName = "John" }', False),
    ('{ $.user.id = 1 || $.user.id = 2 && $.users[1].firstName = "John" }', True),   # && binds tighter
])
def test_documented_examples(pattern, expected):
    assert matches(pattern, EVENT) is expected


@pytest.mark.parametrize("pattern, line, expected", [
    ('{ $.status != 503 }', '{"status": 200}', True),
    ('{ $.status != 503 }', '{"other": 1}', False),            # an absent field matches no comparison
    ('{ $.status = 503 }', '{"status": "503"}', False),        # a string is not the number
    ('{ $.status = "503" }', '{"status": 503}', False),        # nor the number the string
    ('{ $.status >= 500 }', '{"status": true}', False),        # booleans are not numbers
    ('{ $.logger = "a.b" }', 'not json at all', False),        # only JSON events match JSON patterns
    ('{ $.logger = "a.b" }', '["a.b"]', False),
    ('{ $.message = "say \\"hi\\"" }', '{"message": "say \\"hi\\""}', True),
])
def test_types_absence_and_non_json_lines(pattern, line, expected):
    assert matches(pattern, line) is expected


@pytest.mark.parametrize("pattern", ['$.a = 1', '{ $.a > "x" }', '{ $.a = }', '{ a = 1 }', '{ $.a = 1 $.b = 2 }'])
def test_malformed_patterns_are_errors_not_mismatches(pattern):
    with pytest.raises(PatternError):
        matches(pattern, '{"a": 1, "b": 2}')
