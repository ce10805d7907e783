"""cfn-lint on every synthesized template (pinned and fresh-clone, dev and prod): no errors, no warnings but one
that is CDK's own."""

from __future__ import annotations

import json

import pytest
from cfnlint.api import ManualArgs, lint

import cdk_testkit

# Regions whose resource schemas the templates are checked against (instance types differ per region).
REGIONS = ["us-east-1", "us-west-2", "eu-west-1", "eu-central-1", "ap-northeast-1"]
# CDK's own auto-delete-objects provider (dev) depends explicitly on its role; cfn-lint calls that redundant.
ALLOWED = {("W3005", "CustomS3AutoDeleteObjectsCustomResourceProvider")}


def findings(template: dict) -> list[str]:
    matches = lint(json.dumps(template), config=ManualArgs(regions=REGIONS))
    return [f"{m.rule.id} {'/'.join(map(str, m.path))}: {m.message}" for m in matches
            if not any(m.rule.id == rule and str(m.path[1] if len(m.path) > 1 else "").startswith(prefix)
                       for rule, prefix in ALLOWED)]


@pytest.mark.parametrize("env, kind", cdk_testkit.ENVIRONMENT_STACKS)
def test_pinned_templates_are_clean(env, kind):
    assert findings(cdk_testkit.synthesized(env, pinned=True).template(kind)) == []


@pytest.mark.parametrize("env, kind", cdk_testkit.ENVIRONMENT_STACKS)
def test_fresh_clone_templates_are_clean(env, kind):
    assert findings(cdk_testkit.synthesized(env, pinned=False).template(kind)) == []


def test_cfn_lint_knows_the_instance_pool_properties():
    """InstancePools and its neighbours are in cfn-lint's schema, so a wrong name or value there is caught."""
    bad = {"Resources": {"Config": {"Type": "AWS::SageMaker::EndpointConfig", "Properties": {
        "ProductionVariants": [{"VariantName": "AllTraffic", "ModelName": "m", "InitialInstanceCount": 1,
                                "InstancePools": [{"InstanceType": "ml.g6.xlarge", "Priority": 6},
                                                  {"InstanceTyp": "ml.g5.xlarge", "Priority": 1}],
                                "VariantInstanceProvisionTimeoutInSeconds": 120,
                                "InferenceAmiVersion": "al2-ami-sagemaker-inference-gpu-9"}]}}}}
    messages = "\n".join(findings(bad))
    assert "Priority" in messages and "6 is greater than the maximum of 5" in messages
    assert "InstanceTyp" in messages
    assert "120 is less than the minimum of 300" in messages
    assert "al2-ami-sagemaker-inference-gpu-9" in messages
