"""Helpers for the IAM roles the stacks create."""

from __future__ import annotations

from aws_cdk import aws_iam as iam
from constructs import Construct


def policy_of(role: iam.IRole) -> Construct:
    """The default policy that statements and grants add to a role.

    Resources that the service validates against the role's rights at creation (CodeBuild projects,
    SageMaker models) depend on it; the role itself is already a dependency through its GetAtt Arn.
    """
    policy = role.node.try_find_child("DefaultPolicy")
    if policy is None:
        raise ValueError(f"{role.node.path} has no policy yet")
    return policy
