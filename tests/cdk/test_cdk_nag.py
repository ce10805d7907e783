"""cdk-nag's AwsSolutions pack, applied by app.py: no unacknowledged finding, and no acknowledgment without one."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from aws_cdk import aws_s3 as s3

import app as cdk_app
import cdk_testkit
import stacks.nag


def report(outdir: Path) -> dict:
    path = outdir / "validation-report.json"
    return json.loads(path.read_text()) if path.exists() else {"pluginReports": []}


def violations(outdir: Path) -> set[tuple[str, str, str]]:
    """(plugin, rule, construct path) of every unacknowledged finding of the validation plugins.

    Construct annotations (the endpoint stack's 'left out until pinned' warnings, tested in
    test_cdk_endpoint_stacks) appear in the same report under 'Construct Annotations'; they are not findings.
    """
    return {(plugin["pluginName"], violation["ruleName"], construct["constructPath"])
            for plugin in report(outdir)["pluginReports"] if plugin["pluginName"] != "Construct Annotations"
            for violation in plugin.get("violations", []) for construct in violation["violatingConstructs"]}


def assert_clean(synth):
    # synthesized() raised if cdk-nag had reported anything; the report says the same.
    assert violations(synth.outdir) == set()
    for plugin in report(synth.outdir)["pluginReports"]:
        assert plugin["conclusion"] == "success", plugin["pluginName"]


def test_pinned_environments_have_zero_unacknowledged_findings(pinned):
    assert_clean(pinned)


def test_fresh_clone_environments_have_zero_unacknowledged_findings(fresh_clone):
    assert_clean(fresh_clone)


def test_a_noncompliant_resource_fails_synthesis(monkeypatch, tmp_path):
    """Proof that the checks run: an unencrypted-by-policy, unlogged bucket in the build stack is refused."""
    add_stacks = cdk_app.add_stacks

    def with_a_bad_bucket(app, config):
        created = add_stacks(app, config)
        s3.Bucket(created["build"], "Unlogged")
        return created

    monkeypatch.setattr(cdk_app, "add_stacks", with_a_bad_bucket)
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        cdk_testkit.synthesize(cdk_testkit.context_for("dev"), tmp_path)
    found = {(rule, path) for plugin, rule, path in violations(tmp_path) if plugin == "AwsSolutions"}
    assert found == {("AwsSolutions-S1", "decision-dev-build/Unlogged/Resource"),
                     ("AwsSolutions-S10", "decision-dev-build/Unlogged/Resource")}


@pytest.mark.parametrize("env", cdk_testkit.ENVIRONMENTS)
def test_each_acknowledgment_covers_a_real_finding(monkeypatch, env):
    """Synthesize without the acknowledgments: the findings must be exactly the acknowledged ones."""
    acknowledged = []
    monkeypatch.setattr(stacks.nag, "acknowledge",
                        lambda scope, rule_id, reason: acknowledged.append((scope.node.path, rule_id, reason)))
    outdir = Path(tempfile.mkdtemp(prefix=f"cdk-{env}-unacknowledged-"))
    cdk_testkit._OUTDIRS.append(outdir)
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        cdk_testkit.synthesize(cdk_testkit.context_for(env), outdir)
    found = violations(outdir)
    assert {plugin for plugin, _, _ in found} == {"AwsSolutions"}
    for path, rule_id, reason in acknowledged:
        covered = {(rule, where) for _, rule, where in found if rule == rule_id and where.startswith(path + "/")}
        assert covered, f"{rule_id} on {path} acknowledges nothing"
        assert len(reason) > 40
    for _, rule, where in found:
        assert any(rule == rule_id and where.startswith(path + "/") for path, rule_id, _ in acknowledged), \
            (rule, where)


ENDPOINT_SLUGS = ("cpu", "gpu", "text-generation", "async")


def test_the_only_acknowledged_rules_are_wildcard_resources(pinned):
    """IAM5 for Resource::* (service-wide actions), the build and Batch Transform prefixes of the artifact bucket,
    the transform jobs' log streams, the review role's read-only stacks and parameter, and the operator policy's
    patterns (each with its reason in stacks/access_stack.py); nothing else is waived."""
    acknowledged = set()
    for metadata_file in pinned.outdir.glob("*.metadata.json"):
        for entries in json.loads(metadata_file.read_text()).values():
            for entry in entries:
                if entry["type"] == "aws:cdk:acknowledged-rules":
                    acknowledged |= set(entry["data"])
    export = f"{pinned.prefix}-artifacts:ArtifactBucketArn"
    # dev is synthesized without a region (<AWS::Region>), prod in the region cdk.json names (a literal).
    def location(service):
        return f"arn:<AWS::Partition>:{service}:<AWS::Region>:<AWS::AccountId>" if pinned.env == "dev" else \
            f"arn:aws:{service}:{cdk_testkit.EXAMPLE_REGION}:{cdk_testkit.EXAMPLE_ACCOUNT}"
    # The build roles' prefixes, where the environment builds (prod takes dev's artifacts: no build stack).
    builds = {f"AwsSolutions-IAM5[Resource::{export}/models/*]",
              f"AwsSolutions-IAM5[Resource::{export}/image-digests/cpu/*]",
              f"AwsSolutions-IAM5[Resource::{export}/image-digests/gpu/*]"} if cdk_testkit.builds(pinned.env) else set()
    assert {rule.removeprefix("Annotation::") for rule in acknowledged} == builds | {
        "AwsSolutions-IAM5[Resource::*]",
        f"AwsSolutions-IAM5[Resource::{export}/batch/input/*]",
        f"AwsSolutions-IAM5[Resource::{export}/batch/output/*]",
        # The asynchronous endpoint (its role, and the invoker's): request bodies, answers and failures under their
        # prefixes of async-inference/; its role publishes to its topics with their key (kms:GenerateDataKey*).
        f"AwsSolutions-IAM5[Resource::{export}/async-inference/input/*]",
        f"AwsSolutions-IAM5[Resource::{export}/async-inference/output/*]",
        f"AwsSolutions-IAM5[Resource::{export}/async-inference/failure/*]",
        "AwsSolutions-IAM5[Action::kms:GenerateDataKey*]",
        f"AwsSolutions-IAM5[Resource::{location('logs')}:log-group:/aws/sagemaker/TransformJobs:log-stream:*]",
        # The review role: this environment's stacks, the bootstrap stack and its version parameter, read only.
        f"AwsSolutions-IAM5[Resource::{location('cloudformation')}:stack/{pinned.prefix}-*/*]",
        f"AwsSolutions-IAM5[Resource::{location('cloudformation')}:stack/CDKToolkit/*]",
        f"AwsSolutions-IAM5[Resource::{location('ssm')}:parameter/cdk-bootstrap/*]",
        # The operator policy (stacks/access_stack.py): generated names found by this environment's tags, the
        # names its commands make per run, one pattern per endpoint of this environment, and list calls.
        f"AwsSolutions-IAM5[Resource::{location('sagemaker')}:model/*]",
        f"AwsSolutions-IAM5[Resource::{location('sagemaker')}:endpoint/*]",
        f"AwsSolutions-IAM5[Resource::{location('sagemaker')}:endpoint-config/*]",
        f"AwsSolutions-IAM5[Resource::{location('kms')}:key/*]",
        f"AwsSolutions-IAM5[Resource::{location('cloudwatch')}:alarm:*]",
        f"AwsSolutions-IAM5[Resource::{location('sagemaker')}:transform-job/{pinned.prefix}-cpu-*]",
        f"AwsSolutions-IAM5[Resource::{export}/acceptance/{pinned.env}/*]",
        *(f"AwsSolutions-IAM5[Resource::{location('sagemaker')}:{kind}/{pinned.prefix}-{slug}-drill-*]"
          for kind in ("model", "endpoint-config") for slug in ENDPOINT_SLUGS),
        *(f"AwsSolutions-IAM5[Resource::{location('cloudwatch')}:alarm:{pinned.prefix}-{slug}-*]"
          for slug in ENDPOINT_SLUGS),
        *(f"AwsSolutions-IAM5[Resource::{location('logs')}:log-group:/aws/sagemaker/Endpoints/{pinned.prefix}-{slug}:*]"
          for slug in ENDPOINT_SLUGS),
    }
