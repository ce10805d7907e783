"""cdk-nag acknowledgments: the only way a finding is accepted here, always with its reason.

cdk-nag 3 reads CDK's native ``Validations.of(construct).acknowledge(...)``; a finding is acknowledged on the
construct that raises it or on one of its ancestors, by its exact id (``AwsSolutions-IAM5[Resource::*]``).

A finding's id holds the resource as cdk-nag flattens it from the synthesized template, so it depends on how the
stack's environment is resolved: the CLI always passes a region (the caller's, else us-east-1), which then appears
as a literal (``arn:aws:logs:eu-west-1:<AWS::AccountId>:...``), while an app synthesized without one has
``<AWS::Region>``. :func:`wildcard_resource_of` therefore renders the id from the resource as the stack resolves it,
never from a hand-written pattern.
"""

from __future__ import annotations

import json
from typing import Any

import aws_cdk as cdk
from constructs import IConstruct


def acknowledge(scope: IConstruct, rule_id: str, reason: str) -> None:
    if not reason.strip():
        raise ValueError(f"acknowledging {rule_id} needs a reason")
    cdk.Validations.of(scope).acknowledge(cdk.Acknowledgment(id=rule_id, reason=reason))


def wildcard_resource(pattern: str) -> str:
    """The IAM5 finding id for a resource with a wildcard, as cdk-nag flattens it (see ArtifactsStack)."""
    return f"AwsSolutions-IAM5[Resource::{pattern}]"


def wildcard_resource_of(scope: IConstruct, resource: str) -> str:
    """The IAM5 finding id that ``resource`` (a string with tokens) raises in ``scope``'s stack as synthesized."""
    return wildcard_resource(flatten(cdk.Stack.of(scope).resolve(resource)))


def flatten(value: Any) -> str:
    """A resolved CloudFormation value as cdk-nag's flattenCfnReference writes it into a finding id."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value.replace("${", "<").replace("}", ">")
    if isinstance(value, dict) and "Fn::Join" in value:
        delimiter, items = value["Fn::Join"]
        return delimiter.join(flatten(item) for item in items)
    if isinstance(value, dict) and "Fn::Sub" in value:
        return flatten(value["Fn::Sub"])
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        resource, attribute = value["Fn::GetAtt"]
        return f"<{flatten(resource)}.{flatten(attribute)}>"
    if isinstance(value, dict) and "Fn::ImportValue" in value:
        return flatten(value["Fn::ImportValue"])
    if isinstance(value, dict) and "Ref" in value:
        return f"<{flatten(value['Ref'])}>"
    return json.dumps(value, separators=(",", ":"))
