"""The monitoring stack (``<prefix>-monitoring``): the environment's alarm topic and its dashboard.

Every endpoint stack sends its alarms (and their return to OK) to the one SNS topic here; cdk.json's
``monitoring.alarm_emails`` are subscribed to it. The topic is encrypted with a key of its own (the AWS-managed SNS
key does not let CloudWatch publish). A topic policy replaces the topic's default policy, so it says everything:
CloudWatch may publish, and use the key, for this account's endpoint alarms only (``aws:SourceAccount`` and
``aws:SourceArn``, the alarms' fixed ARNs), and every request without TLS is denied. The dashboard shows, per deployed endpoint, its
invocations and each metric an alarm watches, with the alarm's threshold; it names the metrics by the fixed
endpoint names, so this stack does not depend on the endpoint stacks (which could then not be destroyed alone).
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from constructs import Construct

from stacks.config import EnvironmentConfig
from stacks.endpoint_specs import EndpointSpec, async_metric, invocations_metric, latency_metric


class MonitoringStack(cdk.Stack):
    def __init__(self, scope: Construct, construct_id: str, *, config: EnvironmentConfig,
                 specs: tuple[EndpointSpec, ...], **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.topic_key = kms.Key(
            self, "AlarmTopicKey", enable_key_rotation=True, pending_window=cdk.Duration.days(7),
            removal_policy=cdk.RemovalPolicy.DESTROY,
            description=f"{config.name_prefix}: encrypts the alarm topic's messages")
        # The endpoint alarms, by their fixed names (EndpointSpec.alarm_name), of every endpoint kind: listed or
        # not, pinned or not, so that enabling an endpoint needs no change here before its alarms can notify.
        self.alarm_arns = [cdk.Arn.format(cdk.ArnComponents(
            service="cloudwatch", resource="alarm", resource_name=name, arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME),
            self) for spec in specs for name in spec.alarm_names]
        from_our_alarms = {"StringEquals": {"aws:SourceAccount": cdk.Aws.ACCOUNT_ID},
                           "ArnLike": {"aws:SourceArn": self.alarm_arns}}
        # CloudWatch encrypts each message it publishes to the topic with the topic's key.
        self.topic_key.add_to_resource_policy(iam.PolicyStatement(
            sid="CloudWatchAlarmsPublish", principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
            actions=["kms:Decrypt", "kms:GenerateDataKey*"], resources=["*"], conditions=from_our_alarms))
        # enforce_ssl: the Deny of every request without TLS, in the topic policy below.
        self.alarm_topic = sns.Topic(self, "AlarmTopic", display_name=f"{config.name_prefix} alarms",
                                     master_key=self.topic_key, enforce_ssl=True)
        self.alarm_topic.add_to_resource_policy(iam.PolicyStatement(
            sid="CloudWatchAlarmsPublish", principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
            actions=["sns:Publish"], resources=[self.alarm_topic.topic_arn], conditions=from_our_alarms))
        for index, address in enumerate(config.monitoring.alarm_emails):
            sns.Subscription(self, f"AlarmEmail{index}", topic=self.alarm_topic,
                             protocol=sns.SubscriptionProtocol.EMAIL, endpoint=address)

        deployed = [spec for spec in specs if spec.deployable]
        self.dashboard = cloudwatch.Dashboard(self, "Dashboard", default_interval=cdk.Duration.hours(3))
        if not deployed:
            self.dashboard.add_widgets(cloudwatch.TextWidget(
                markdown=f"# {config.name_prefix}\nNo endpoint is deployed yet (docs/deploy.md).", width=24))
        for spec in deployed:
            self.dashboard.add_widgets(*_endpoint_row(spec))

        # The endpoint stacks import the topic. Exported explicitly (under the automatic export's name), so that
        # the export stays while no endpoint is deployed: an automatic export would go with its last importer, and
        # CloudFormation refuses to delete an export that a stack still imports (the deploy that removes the last
        # endpoint would fail).
        self.export_value(self.alarm_topic.topic_arn)

        cdk.CfnOutput(self, "AlarmTopicArn", value=self.alarm_topic.topic_arn,
                      description="Every endpoint alarm; subscribe here (cdk.json monitoring.alarm_emails)")
        cdk.CfnOutput(self, "DashboardName", value=self.dashboard.dashboard_name,
                      description="CloudWatch dashboard of the environment's endpoints")


def _endpoint_row(spec: EndpointSpec) -> list[cloudwatch.IWidget]:
    widgets: list[cloudwatch.IWidget] = [
        cloudwatch.TextWidget(markdown=f"## {spec.endpoint_name}\n{spec.title}; stack `{spec.stack_name}`",
                              width=24, height=1),
        # An asynchronous endpoint publishes no Invocations metric: its queue instead.
        cloudwatch.GraphWidget(title="Queued requests (ApproximateBacklogSize)",
                               left=[async_metric(spec.endpoint_name, "ApproximateBacklogSize")], width=6)
        if spec.async_inference is not None else
        cloudwatch.GraphWidget(title="Invocations", left=[invocations_metric(spec.endpoint_name)], width=6),
        # Shown, not alarmed: latency moves with load and request shape (stacks/endpoint_specs.py).
        cloudwatch.GraphWidget(title="ModelLatency p99 (microseconds)", left=[latency_metric(spec.endpoint_name)],
                               width=6),
    ]
    for alarm in spec.alarms:
        widgets.append(cloudwatch.GraphWidget(
            title=alarm.construct_id + (" (rolls back updates)" if alarm.rolls_back else ""),
            left=[alarm.metric], width=6,
            left_annotations=[cloudwatch.HorizontalAnnotation(value=alarm.threshold, label="alarm")]))
    return widgets
