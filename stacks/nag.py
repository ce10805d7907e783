"""cdk-nag acknowledgments: the only way a finding is accepted here, always with its reason.

cdk-nag 3 reads CDK's native ``Validations.of(construct).acknowledge(...)``; a finding is acknowledged on the
construct that raises it or on one of its ancestors, by its exact id (``AwsSolutions-IAM5[Resource::*]``).
"""

from __future__ import annotations

import aws_cdk as cdk
from constructs import IConstruct


def acknowledge(scope: IConstruct, rule_id: str, reason: str) -> None:
    if not reason.strip():
        raise ValueError(f"acknowledging {rule_id} needs a reason")
    cdk.Validations.of(scope).acknowledge(cdk.Acknowledgment(id=rule_id, reason=reason))


def wildcard_resource(pattern: str) -> str:
    """The IAM5 finding id for a resource with a wildcard, as cdk-nag flattens it (see ArtifactsStack)."""
    return f"AwsSolutions-IAM5[Resource::{pattern}]"
