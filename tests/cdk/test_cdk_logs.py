"""The environment's log groups: each encrypted with the environment's logs key (checkov CKV_AWS_158), whose policy
lets CloudWatch Logs use it for this account's log groups only; SageMaker's transform-job group owned by the
artifacts stack, with a retention; prod's log groups (and the key) retained, dev's destroyed with their stacks."""

from __future__ import annotations

import pytest

import cdk_testkit
from stacks.config import TRANSFORM_LOG_GROUP


def log_groups(synth):
    return [(kind, logical_id, resource) for kind, template in synth.templates()
            for logical_id, resource in template["Resources"].items() if resource["Type"] == "AWS::Logs::LogGroup"]


def test_every_log_group_is_encrypted_with_the_logs_key(pinned):
    groups = log_groups(pinned)
    # The four builds' (where the environment builds), one per endpoint, the transform jobs'.
    assert len(groups) == (4 if cdk_testkit.builds(pinned.env) else 0) + len(cdk_testkit.ENDPOINT_STACKS) + 1
    key_export = f"{pinned.prefix}-artifacts:LogsKeyArn"
    for kind, logical_id, resource in groups:
        key = resource["Properties"].get("KmsKeyId")
        assert key is not None, f"{kind}/{logical_id} has no KmsKeyId"
        if kind == "artifacts":
            assert key == {"Fn::GetAtt": [logs_key_id(pinned), "Arn"]}
        else:
            assert key == {"Fn::ImportValue": key_export}, (kind, logical_id, key)


def logs_key_id(synth):
    (logical_id,) = [lid for lid in synth.resources("artifacts", "AWS::KMS::Key") if lid.startswith("LogsKey")]
    return logical_id


def test_the_logs_key_lets_cloudwatch_logs_use_it_for_this_accounts_log_groups_only(pinned):
    key = pinned.resources("artifacts", "AWS::KMS::Key")[logs_key_id(pinned)]
    assert key["Properties"]["EnableKeyRotation"] is True
    statements = key["Properties"]["KeyPolicy"]["Statement"]
    for_logs = [s for s in statements if "Service" in s["Principal"]]
    assert len(for_logs) == 1
    (statement,) = for_logs
    region = cdk_testkit.EXAMPLE_REGION if pinned.env == "prod" else "<AWS::Region>"
    account = cdk_testkit.EXAMPLE_ACCOUNT if pinned.env == "prod" else "<AWS::AccountId>"
    assert cdk_testkit.flatten(statement["Principal"]["Service"]) == f"logs.{region}.amazonaws.com"
    assert set(statement["Action"]) == {"kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*",
                                        "kms:Describe*"}
    assert statement["Effect"] == "Allow"
    assert list(statement["Condition"]) == ["ArnLike"]
    (context,) = statement["Condition"]["ArnLike"].items()
    assert context[0] == "kms:EncryptionContext:aws:logs:arn"
    partition = "aws" if pinned.env == "prod" else "<AWS::Partition>"
    assert cdk_testkit.flatten(context[1]) == f"arn:{partition}:logs:{region}:{account}:log-group:*"
    # Nothing else but the account's administration of its own key (CDK's default root statement).
    assert [s for s in statements if s is not statement] == [
        s for s in statements if s.get("Principal", {}).get("AWS") is not None]


def test_the_artifacts_stack_owns_the_transform_log_group_with_a_retention(pinned):
    (group,) = [r for kind, _, r in log_groups(pinned) if r["Properties"].get("LogGroupName") == TRANSFORM_LOG_GROUP]
    expected = cdk_testkit.cdk_json_context()["environments"][pinned.env]["endpoint_log_retention_days"]
    assert group["Properties"]["RetentionInDays"] == expected
    assert pinned.resource("artifacts", "AWS::Logs::LogGroup", "TransformJobLogs") == group


def test_an_environment_that_leaves_the_transform_log_group_to_another_creates_none():
    synth = cdk_testkit.synthesized_with("dev", lambda e: e.__setitem__("create_transform_log_group", False))
    assert synth.resources("artifacts", "AWS::Logs::LogGroup") == {}


@pytest.mark.parametrize("env, policy", [("prod", "Retain"), ("dev", "Delete")])
def test_prod_retains_its_log_groups_and_their_key_dev_destroys_them(env, policy):
    synth = cdk_testkit.synthesized(env)
    for kind, logical_id, resource in log_groups(synth):
        assert resource.get("DeletionPolicy") == policy, (kind, logical_id)
        assert resource.get("UpdateReplacePolicy") == policy, (kind, logical_id)
    key = synth.resources("artifacts", "AWS::KMS::Key")[logs_key_id(synth)]
    assert key["DeletionPolicy"] == policy
