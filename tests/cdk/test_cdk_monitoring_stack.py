"""The monitoring stack: one encrypted alarm topic per environment, optional email subscriptions, one dashboard;
and termination protection on every stack of prod."""

from __future__ import annotations

import json

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


def test_one_topic_encrypted_with_its_own_key_and_tls_only(pinned):
    (topic,) = pinned.resources("monitoring", "AWS::SNS::Topic").values()
    assert flatten(topic["Properties"]["KmsMasterKeyId"]).startswith("<AlarmTopicKey")
    (key,) = pinned.resources("monitoring", "AWS::KMS::Key").values()
    assert key["Properties"]["EnableKeyRotation"] is True
    statements = key["Properties"]["KeyPolicy"]["Statement"]
    (cloudwatch,) = [s for s in statements if s.get("Principal") == {"Service": "cloudwatch.amazonaws.com"}]
    assert sorted(cloudwatch["Action"]) == ["kms:Decrypt", "kms:GenerateDataKey*"]
    assert cloudwatch["Condition"] == {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}
    (policy,) = pinned.resources("monitoring", "AWS::SNS::TopicPolicy").values()
    (deny,) = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Deny"]
    assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


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
        for alarm in pinned.resources(stack, "AWS::CloudWatch::Alarm").values():
            assert topic_id in flatten(alarm["Properties"]["AlarmActions"])


def test_the_dashboard_shows_every_alarmed_metric_per_endpoint(pinned):
    widgets = dashboard_body(pinned)["widgets"]
    text = [w["properties"]["markdown"] for w in widgets if w["type"] == "text"]
    graphs = [w["properties"] for w in widgets if w["type"] == "metric"]
    for kind, stack in ENDPOINT_STACKS.items():
        name = f"{pinned.prefix}-{kind.replace('_', '-')}"
        assert any(t.startswith(f"## {name}\n") for t in text)
        alarms = pinned.resources(stack, "AWS::CloudWatch::Alarm").values()
        mine = [g for g in graphs if name in json.dumps(g["metrics"])]
        # Invocations and one graph per alarm, each with the alarm's threshold drawn in.
        assert len(mine) == len(alarms) + 1
        thresholds = sorted(a["Properties"]["Threshold"] for a in alarms)
        drawn = sorted(g["annotations"]["horizontal"][0]["value"] for g in mine if "annotations" in g)
        assert drawn == thresholds
    assert any("DecisionAdapter/" + pinned.prefix + "-gpu" in json.dumps(g["metrics"]) for g in graphs)


def test_a_fresh_clone_has_a_dashboard_that_says_nothing_is_deployed(fresh_clone):
    widgets = dashboard_body(fresh_clone)["widgets"]
    assert [w["type"] for w in widgets] == ["text"]
    assert "No endpoint is deployed yet" in widgets[0]["properties"]["markdown"]


@pytest.mark.parametrize("kind", cdk_testkit.STACK_KINDS)
def test_prod_stacks_have_termination_protection_and_dev_stacks_do_not(pinned, kind):
    artifact = pinned.manifest()["artifacts"][pinned.stack_name(kind)]
    protected = artifact["properties"].get("terminationProtection", False)
    assert protected is (pinned.env == "prod")
