"""The monitoring stack: one encrypted alarm topic per environment, optional email subscriptions, one dashboard;
and termination protection on every stack of prod."""

from __future__ import annotations

import json
import re

import pytest

import cdk_testkit
from cdk_testkit import ENDPOINT_STACKS, flatten


def dashboard_body(synth) -> dict:
    (dashboard,) = synth.resources("monitoring", "AWS::CloudWatch::Dashboard").values()
    body = dashboard["Properties"]["DashboardBody"]
    # The body is a Fn::Join of JSON text and references (region): resolve them to read the JSON.
    text = "".join(part if isinstance(part, str) else "us-east-1" for part in body["Fn::Join"][1]) \
        if isinstance(body, dict) else body
    return json.loads(text)


def endpoint_alarms(synth, stack) -> list[dict]:
    """An endpoint stack's alarms, not the asynchronous endpoint's scale-out from 0 (no name, no notification: it
    only runs its step scaling policy)."""
    return [alarm for alarm in synth.resources(stack, "AWS::CloudWatch::Alarm").values()
            if "AlarmName" in alarm["Properties"]]


def endpoint_alarm_names(synth) -> set[str]:
    return {alarm["Properties"]["AlarmName"] for stack in ENDPOINT_STACKS.values()
            for alarm in endpoint_alarms(synth, stack)}


def alarm_arn_names(statement) -> set[str]:
    """The alarm names of a statement's aws:SourceArn condition (each an ARN of this account and region)."""
    arns = [flatten(arn) for arn in statement["Condition"]["ArnLike"]["aws:SourceArn"]]
    pattern = re.compile(r"^arn:(?:aws|<AWS::Partition>):cloudwatch:(?:[a-z0-9-]+|<AWS::Region>):"
                         r"(?:\d{12}|<AWS::AccountId>):alarm:(?P<name>[^*?]+)$")
    assert all(pattern.match(arn) for arn in arns), arns
    return {pattern.match(arn)["name"] for arn in arns}


def test_one_topic_encrypted_with_its_own_key(pinned):
    (topic,) = pinned.resources("monitoring", "AWS::SNS::Topic").values()
    assert flatten(topic["Properties"]["KmsMasterKeyId"]).startswith("<AlarmTopicKey")
    (key,) = pinned.resources("monitoring", "AWS::KMS::Key").values()
    assert key["Properties"]["EnableKeyRotation"] is True


def test_the_topic_policy_lets_cloudwatch_publish_for_this_accounts_endpoint_alarms_over_tls_only(pinned):
    """A TopicPolicy replaces the topic's default policy: without this Allow no alarm reaches anyone."""
    (topic_id,) = pinned.resources("monitoring", "AWS::SNS::Topic")
    (policy,) = pinned.resources("monitoring", "AWS::SNS::TopicPolicy").values()
    assert policy["Properties"]["Topics"] == [{"Ref": topic_id}]
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    (deny,) = [s for s in statements if s["Effect"] == "Deny"]
    assert deny["Principal"] == "*" and deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    (allow,) = [s for s in statements if s["Effect"] == "Allow"]
    assert allow["Principal"] == {"Service": "cloudwatch.amazonaws.com"}
    assert allow["Action"] == "sns:Publish" and allow["Resource"] == {"Ref": topic_id}
    assert allow["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
    # Exactly the endpoint stacks' alarms (by their fixed names), of this account and region.
    assert alarm_arn_names(allow) == endpoint_alarm_names(pinned)
    assert set(allow["Condition"]) == {"StringEquals", "ArnLike"}


def test_the_key_lets_cloudwatch_encrypt_for_the_same_alarms_only(pinned):
    (key,) = pinned.resources("monitoring", "AWS::KMS::Key").values()
    statements = key["Properties"]["KeyPolicy"]["Statement"]
    (cloudwatch,) = [s for s in statements if s.get("Principal") == {"Service": "cloudwatch.amazonaws.com"}]
    assert cloudwatch["Effect"] == "Allow"
    assert sorted(cloudwatch["Action"]) == ["kms:Decrypt", "kms:GenerateDataKey*"]
    assert cloudwatch["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
    (policy,) = pinned.resources("monitoring", "AWS::SNS::TopicPolicy").values()
    (allow,) = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Allow"]
    assert cloudwatch["Condition"]["ArnLike"] == allow["Condition"]["ArnLike"]


def test_unpinned_endpoints_alarms_are_allowed_before_they_exist(fresh_clone):
    """The policy names every kind's alarms, so a later pin needs no change of the monitoring stack to notify."""
    (policy,) = fresh_clone.resources("monitoring", "AWS::SNS::TopicPolicy").values()
    (allow,) = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Allow"]
    names = alarm_arn_names(allow)
    assert endpoint_alarm_names(fresh_clone) == set()
    for kind in ENDPOINT_STACKS:
        assert f"{fresh_clone.prefix}-{kind.replace('_', '-')}-ScoringFailures" in names or kind == "text_generation"
        assert f"{fresh_clone.prefix}-{kind.replace('_', '-')}-DiskUtilization" in names


def test_no_email_subscription_unless_cdk_json_names_one(pinned):
    assert pinned.resources("monitoring", "AWS::SNS::Subscription") == {}


def test_configured_emails_are_subscribed():
    emails = ["oncall@example.com", "ml-team@example.com"]
    synth = cdk_testkit.synthesized_with("dev", lambda e: e["monitoring"].__setitem__("alarm_emails", emails))
    subscriptions = synth.resources("monitoring", "AWS::SNS::Subscription").values()
    assert sorted(s["Properties"]["Endpoint"] for s in subscriptions) == sorted(emails)
    assert {s["Properties"]["Protocol"] for s in subscriptions} == {"email"}
    (topic_id,) = synth.resources("monitoring", "AWS::SNS::Topic")
    assert all(s["Properties"]["TopicArn"] == {"Ref": topic_id} for s in subscriptions)


def test_every_endpoint_alarm_goes_to_the_one_topic(pinned):
    (topic_id,) = pinned.resources("monitoring", "AWS::SNS::Topic")
    for stack in ENDPOINT_STACKS.values():
        for alarm in endpoint_alarms(pinned, stack):
            assert topic_id in flatten(alarm["Properties"]["AlarmActions"])


def test_the_dashboard_shows_every_alarmed_metric_per_endpoint(pinned):
    widgets = dashboard_body(pinned)["widgets"]
    text = [w["properties"]["markdown"] for w in widgets if w["type"] == "text"]
    graphs = [w["properties"] for w in widgets if w["type"] == "metric"]
    for kind, stack in ENDPOINT_STACKS.items():
        name = f"{pinned.prefix}-{kind.replace('_', '-')}"
        assert any(t.startswith(f"## {name}\n") for t in text)
        alarms = endpoint_alarms(pinned, stack)
        mine = [g for g in graphs if name in json.dumps(g["metrics"])]
        # Invocations (an asynchronous endpoint's queue: it publishes no Invocations), ModelLatency (shown, not
        # alarmed) and one graph per alarm, each with its threshold drawn in.
        assert len(mine) == len(alarms) + 2
        first = '"ApproximateBacklogSize"' if kind == "async" else '"Invocations"'
        assert any(first in json.dumps(g["metrics"]) and "annotations" not in g for g in mine)
        assert any('"ModelLatency"' in json.dumps(g["metrics"]) and "annotations" not in g for g in mine)
        thresholds = sorted(a["Properties"]["Threshold"] for a in alarms)
        drawn = sorted(g["annotations"]["horizontal"][0]["value"] for g in mine if "annotations" in g)
        assert drawn == thresholds
    assert any("DecisionAdapter/" + pinned.prefix + "-gpu" in json.dumps(g["metrics"]) for g in graphs)


def test_a_fresh_clone_has_a_dashboard_that_says_nothing_is_deployed(fresh_clone):
    widgets = dashboard_body(fresh_clone)["widgets"]
    assert [w["type"] for w in widgets] == ["text"]
    assert "No endpoint is deployed yet" in widgets[0]["properties"]["markdown"]


@pytest.mark.parametrize("env, kind", cdk_testkit.ENVIRONMENT_STACKS)
def test_prod_stacks_have_termination_protection_and_dev_stacks_do_not(env, kind):
    pinned = cdk_testkit.synthesized(env, pinned=True)
    artifact = pinned.manifest()["artifacts"][pinned.stack_name(kind)]
    protected = artifact["properties"].get("terminationProtection", False)
    assert protected is (pinned.env == "prod")


def exports(synth, kind):
    return {output["Export"]["Name"]: output["Value"] for output in synth.template(kind).get("Outputs", {}).values()
            if "Export" in output}


@pytest.mark.parametrize("without", [
    lambda e: e.__setitem__("endpoints", []),
    lambda e: e["pins"].__setitem__("model", None),
], ids=["no-endpoint-listed", "nothing-pinned"])
def test_the_exports_do_not_depend_on_endpoints(dev, without):
    """Removing the last endpoint must not remove an export: CloudFormation refuses to delete an export that a stack
    still imports, so the monitoring (and artifacts) stack's deploy would fail while the endpoint stacks import it."""
    bare = cdk_testkit.synthesized_with("dev", without)
    assert not any(bare.resources(stack, "AWS::SageMaker::Endpoint") for stack in cdk_testkit.ENDPOINT_STACKS.values())
    for kind in ("monitoring", "artifacts"):
        assert exports(bare, kind) == exports(dev, kind), kind
    assert f"{dev.prefix}-monitoring:ExportsOutputRefAlarmTopicD01E77F99DF7FB73" in exports(bare, "monitoring")


def test_every_import_names_an_export_of_the_environment(dev):
    exported = {name for kind in cdk_testkit.STACK_KINDS for name in exports(dev, kind)}
    imported = set()

    def walk(value):
        if isinstance(value, dict):
            if "Fn::ImportValue" in value:
                imported.add(value["Fn::ImportValue"])
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
    for _, template in dev.templates():
        walk(template)
    assert imported and imported <= exported
