"""One SageMaker endpoint, real-time or asynchronous, as its spec (stacks/endpoint_specs.py) describes it.

It owns the Model, EndpointConfig and Endpoint, the container's log group and the metric filters on its lines,
the alarms (to the environment's topic), and auto scaling. Model and EndpointConfig have generated names,
because CloudFormation replaces them on every change; the Endpoint keeps its name and is updated in place:
SageMaker keeps the variant's current instance count through the update (RetainAllVariantProperties), shifts
traffic as the spec's DeploymentConfig says, and rolls back to the old fleet when a rollback alarm fires.

An asynchronous endpoint (the spec's async_inference) has an AsyncInferenceConfig (answers and failures under the
artifact bucket's prefixes, notified on the endpoint stack's two topics) and scales on its queue, down to 0.
SageMaker's deployment guardrails apply to asynchronous endpoints as to real-time ones (the SageMaker guide:
deployment guardrails are available for asynchronous and real-time inference endpoints), so it keeps the same
DeploymentConfig and rollback alarms.
"""

from __future__ import annotations

import aws_cdk as cdk
import jsii
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sagemaker as sagemaker
from aws_cdk import aws_sns as sns
from constructs import Construct

from stacks import updates
from stacks.endpoint_specs import INVOCATIONS_NAMESPACE, VARIANT_NAME, Deployment, EndpointSpec, async_metric
from stacks.retention import retention_days
from stacks.roles import policy_of


class SageMakerEndpoint(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, spec: EndpointSpec, image_uri: str,
                 model_data_url: str, execution_role: iam.IRole, volume_key: kms.IKey | None,
                 alarm_topic: sns.ITopic, log_retention_days: int, log_key: kms.IKey, retain_logs: bool,
                 tags: dict[str, str], capture_destination: str | None = None,
                 async_bucket: str | None = None, async_topics: tuple[sns.ITopic, sns.ITopic] | None = None) -> None:
        super().__init__(scope, construct_id)
        variant = spec.variant
        if volume_key is not None and variant.has_instance_storage:
            raise ValueError(f"{spec.endpoint_name}: SageMaker rejects a volume KMS key for instance types with "
                             f"local instance storage ({', '.join(variant.instance_types)})")
        self.endpoint_name = spec.endpoint_name
        cfn_tags = [cdk.CfnTag(key=key, value=value) for key, value in sorted(tags.items())]

        # The container's log group, created here so that it has a retention and goes with the stack. The role
        # may write to it but not create it: a log group SageMaker recreated after a destroy would make the next
        # deploy fail with "already exists".
        self.log_group = logs.LogGroup(self, "Logs", log_group_name=f"/aws/sagemaker/Endpoints/{spec.endpoint_name}",
                                       retention=retention_days(log_retention_days), encryption_key=log_key,
                                       removal_policy=(cdk.RemovalPolicy.RETAIN if retain_logs
                                                       else cdk.RemovalPolicy.DESTROY))
        self.log_group.grant_write(execution_role)
        self.log_group.grant(execution_role, "logs:DescribeLogStreams")
        self.metric_filters = [
            logs.MetricFilter(self, metric.construct_id, log_group=self.log_group,
                              filter_pattern=logs.FilterPattern.literal(metric.pattern),
                              metric_namespace=spec.log_metrics_namespace, metric_name=metric.metric_name,
                              metric_value=metric.value, default_value=0)
            for metric in spec.log_metrics]

        # Alarms name the endpoint by its fixed name (not a reference), so the endpoint can name them in turn. Their
        # own names are fixed too: the alarm topic's policy lets CloudWatch publish for these alarm ARNs only.
        self.alarms: dict[str, cloudwatch.Alarm] = {}
        for alarm_spec in spec.alarms:
            alarm = cloudwatch.Alarm(
                self, alarm_spec.construct_id, alarm_name=spec.alarm_name(alarm_spec),
                alarm_description=alarm_spec.description, metric=alarm_spec.metric,
                threshold=alarm_spec.threshold, comparison_operator=alarm_spec.comparison,
                evaluation_periods=alarm_spec.evaluation_periods, datapoints_to_alarm=alarm_spec.datapoints_to_alarm,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING)
            alarm.add_alarm_action(cloudwatch_actions.SnsAction(alarm_topic))
            alarm.add_ok_action(cloudwatch_actions.SnsAction(alarm_topic))
            self.alarms[alarm_spec.construct_id] = alarm
        self.rollback_alarms = [self.alarms[a.construct_id] for a in spec.rollback_alarms]
        # SageMaker reads the rollback alarms' state with the execution role during an update.
        execution_role.add_to_principal_policy(iam.PolicyStatement(
            sid="ReadRollbackAlarms", actions=["cloudwatch:DescribeAlarms"],
            resources=[alarm.alarm_arn for alarm in self.rollback_alarms]))

        self.model = sagemaker.CfnModel(
            self, "Model",
            execution_role_arn=execution_role.role_arn,
            # No network access from the container: the model comes from S3 through SageMaker, nothing else.
            enable_network_isolation=True,
            primary_container=sagemaker.CfnModel.ContainerDefinitionProperty(
                image=image_uri, model_data_url=model_data_url, environment=spec.environment),
            # cdk.json's vpc: SageMaker places the instances' network interfaces in these subnets with these
            # security groups, and pulls the image and the archive through them (the execution role may manage
            # interfaces there: stacks/endpoint_stack.py).
            vpc_config=None if spec.vpc is None else sagemaker.CfnModel.VpcConfigProperty(
                subnets=list(spec.vpc.subnet_ids), security_group_ids=list(spec.vpc.security_group_ids)),
            tags=cfn_tags,
        )
        # CreateModel checks that the role can read the image and the archive: its policy must exist first.
        self.model.node.add_dependency(policy_of(execution_role))

        settings = spec.settings
        production_variant = sagemaker.CfnEndpointConfig.ProductionVariantProperty(
            variant_name=VARIANT_NAME,
            model_name=self.model.attr_model_name,
            initial_instance_count=settings.initial_instance_count,
            initial_variant_weight=1,
            instance_type=variant.instance_type,
            instance_pools=[sagemaker.CfnEndpointConfig.InstancePoolProperty(instance_type=pool, priority=priority)
                            for priority, pool in enumerate(variant.instance_pools, start=1)] or None,
            variant_instance_provision_timeout_in_seconds=variant.provision_timeout_s,
            inference_ami_version=variant.inference_ami_version,
            container_startup_health_check_timeout_in_seconds=settings.startup_health_check_timeout_s,
            model_data_download_timeout_in_seconds=settings.model_download_timeout_s,
            # EBS-backed types get a volume sized for the model (stacks/sizing.py); NVMe types use their disks.
            volume_size_in_gb=variant.volume_size_gib,
            routing_config=sagemaker.CfnEndpointConfig.RoutingConfigProperty(
                routing_strategy=variant.routing_strategy) if variant.routing_strategy else None,
        )
        capture = spec.settings.data_capture
        self.endpoint_config = sagemaker.CfnEndpointConfig(
            self, "EndpointConfig", production_variants=[production_variant],
            kms_key_id=volume_key.key_arn if volume_key is not None else None,
            # cdk.json's <kind>.data_capture: the sampled requests and responses, written by SageMaker with the
            # execution role under capture_destination (the artifact bucket's data-capture/ prefix), as JSON text
            # (the adapter's and llama-server's bodies are application/json), not base64.
            data_capture_config=None if capture is None else sagemaker.CfnEndpointConfig.DataCaptureConfigProperty(
                enable_capture=True, initial_sampling_percentage=capture.sampling_percentage,
                destination_s3_uri=capture_destination,
                capture_options=[sagemaker.CfnEndpointConfig.CaptureOptionProperty(capture_mode=mode.capitalize())
                                 for mode in capture.capture],
                capture_content_type_header=sagemaker.CfnEndpointConfig.CaptureContentTypeHeaderProperty(
                    json_content_types=["application/json"])),
            async_inference_config=_async_inference_config(spec, async_bucket, async_topics),
            tags=cfn_tags)

        self.endpoint = sagemaker.CfnEndpoint(
            self, "Endpoint", endpoint_name=spec.endpoint_name,
            endpoint_config_name=self.endpoint_config.attr_endpoint_config_name,
            # A new pin keeps the instance count auto scaling has reached (prod at 6, not back to 2 at peak).
            retain_all_variant_properties=True,
            deployment_config=_deployment_config(spec.deployment, self.rollback_alarms),
            tags=cfn_tags)
        # Container logs from the first instance must find their log group; the update reads the alarms' state.
        self.endpoint.node.add_dependency(self.log_group)
        self.endpoint.node.add_dependency(policy_of(execution_role))

        # Target tracking on invocations per instance, between the initial and the maximum count. Application
        # Auto Scaling uses its SageMaker service-linked role (no RoleARN). cdk.json autoscaling false leaves both
        # out: SageMaker refuses to change the instance type of a variant registered with auto scaling, so an
        # instance-type change deploys once without them (docs/deploy.md, "Change the instance type or the pools").
        self.scalable_target = self.scaling_policy = self.scale_from_zero_policy = self.scale_from_zero_alarm = None
        if settings.autoscaling:
            self._add_scaling(spec)

    def _add_scaling(self, spec: EndpointSpec) -> None:
        settings = spec.settings
        self.scalable_target = appscaling.CfnScalableTarget(
            self, "ScalableTarget",
            service_namespace="sagemaker",
            scalable_dimension="sagemaker:variant:DesiredInstanceCount",
            resource_id=f"endpoint/{self.endpoint.attr_endpoint_name}/variant/{VARIANT_NAME}",
            # initial_instance_count, or an asynchronous endpoint's min_instance_count (0: none while idle).
            min_capacity=spec.min_instance_count,
            max_capacity=settings.max_instance_count,
        )
        if spec.async_inference is not None:
            self._add_backlog_scaling(spec)
            return
        self.scaling_policy = appscaling.CfnScalingPolicy(
            self, "InvocationsPerInstance",
            policy_name="invocations-per-instance",
            policy_type="TargetTrackingScaling",
            scaling_target_id=self.scalable_target.ref,
            target_tracking_scaling_policy_configuration=appscaling.CfnScalingPolicy
            .TargetTrackingScalingPolicyConfigurationProperty(
                target_value=spec.scaling_target,
                predefined_metric_specification=appscaling.CfnScalingPolicy.PredefinedMetricSpecificationProperty(
                    predefined_metric_type="SageMakerVariantInvocationsPerInstance"),
                scale_in_cooldown=settings.scale_in_cooldown_s,
                scale_out_cooldown=settings.scale_out_cooldown_s,
            ),
        )


    def _add_backlog_scaling(self, spec: EndpointSpec) -> None:
        """AWS's pattern for an asynchronous endpoint that scales to zero: target tracking on the queued requests
        per instance (ApproximateBacklogSizePerInstance, Average) scales between min and max, in to 0 once the queue
        is empty; it cannot scale out from 0 instances (a metric per instance has no instance to divide by), so a
        step policy adds one instance when HasBacklogWithoutCapacity reads 1 (requests queued, no instance)."""
        settings = spec.settings
        Policy = appscaling.CfnScalingPolicy
        self.scaling_policy = Policy(
            self, "BacklogPerInstance",
            policy_name="backlog-per-instance",
            policy_type="TargetTrackingScaling",
            scaling_target_id=self.scalable_target.ref,
            target_tracking_scaling_policy_configuration=Policy.TargetTrackingScalingPolicyConfigurationProperty(
                target_value=spec.scaling_target,
                customized_metric_specification=Policy.CustomizedMetricSpecificationProperty(
                    namespace=INVOCATIONS_NAMESPACE, metric_name="ApproximateBacklogSizePerInstance",
                    dimensions=[Policy.MetricDimensionProperty(name="EndpointName", value=spec.endpoint_name)],
                    statistic="Average"),
                scale_in_cooldown=settings.scale_in_cooldown_s,
                scale_out_cooldown=settings.scale_out_cooldown_s,
            ),
        )
        self.scale_from_zero_policy = Policy(
            self, "ScaleOutFromZero",
            policy_name="scale-out-from-zero",
            policy_type="StepScaling",
            scaling_target_id=self.scalable_target.ref,
            step_scaling_policy_configuration=Policy.StepScalingPolicyConfigurationProperty(
                adjustment_type="ChangeInCapacity", metric_aggregation_type="Average",
                cooldown=settings.scale_out_cooldown_s,
                step_adjustments=[Policy.StepAdjustmentProperty(metric_interval_lower_bound=0,
                                                                scaling_adjustment=1)]),
        )
        # Not an alarm of the spec: it notifies nobody and rolls nothing back; it only starts the first instance.
        self.scale_from_zero_alarm = cloudwatch.Alarm(
            self, "HasBacklogWithoutCapacity",
            alarm_description=f"{spec.endpoint_name}: requests are queued and no instance runs: add one "
                              f"(the step policy scale-out-from-zero)",
            metric=async_metric(spec.endpoint_name, "HasBacklogWithoutCapacity"),
            threshold=1, comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1, datapoints_to_alarm=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING)
        self.scale_from_zero_alarm.add_alarm_action(_PolicyAction(self.scale_from_zero_policy.attr_arn))


@jsii.implements(cloudwatch.IAlarmAction)
class _PolicyAction:
    """An alarm action that runs an Application Auto Scaling policy given by its ARN (a CfnScalingPolicy)."""

    def __init__(self, policy_arn: str) -> None:
        self.policy_arn = policy_arn

    def bind(self, scope: Construct, alarm: cloudwatch.IAlarm) -> cloudwatch.AlarmActionConfig:
        return cloudwatch.AlarmActionConfig(alarm_action_arn=self.policy_arn)


def _async_inference_config(spec: EndpointSpec, bucket: str | None, topics: tuple[sns.ITopic, sns.ITopic] | None
                            ) -> sagemaker.CfnEndpointConfig.AsyncInferenceConfigProperty | None:
    """Answers and failures under the artifact bucket's prefixes (S3-managed encryption: no KmsKeyId), each
    notified on its topic; at most max_concurrent_invocations_per_instance requests sent to an instance at once."""
    asynchronous = spec.async_inference
    if asynchronous is None:
        return None
    if bucket is None or topics is None:
        raise ValueError(f"{spec.endpoint_name}: an asynchronous endpoint needs its bucket and topics")
    EndpointConfig = sagemaker.CfnEndpointConfig
    success, error = topics
    return EndpointConfig.AsyncInferenceConfigProperty(
        output_config=EndpointConfig.AsyncInferenceOutputConfigProperty(
            s3_output_path=f"s3://{bucket}/{asynchronous.output_prefix}",
            s3_failure_path=f"s3://{bucket}/{asynchronous.failure_prefix}",
            notification_config=EndpointConfig.AsyncInferenceNotificationConfigProperty(
                success_topic=success.topic_arn, error_topic=error.topic_arn)),
        client_config=EndpointConfig.AsyncInferenceClientConfigProperty(
            max_concurrent_invocations_per_instance=asynchronous.max_concurrent_invocations_per_instance))


def _deployment_config(deployment: Deployment, rollback_alarms: list[cloudwatch.Alarm]
                       ) -> sagemaker.CfnEndpoint.DeploymentConfigProperty:
    Endpoint = sagemaker.CfnEndpoint
    rollback = Endpoint.AutoRollbackConfigProperty(
        alarms=[Endpoint.AlarmProperty(alarm_name=alarm.alarm_name) for alarm in rollback_alarms])
    if deployment.strategy == "rolling":
        return Endpoint.DeploymentConfigProperty(
            auto_rollback_configuration=rollback,
            rolling_update_policy=Endpoint.RollingUpdatePolicyProperty(
                # Half the fleet per batch, the most SageMaker allows; a rollback restores the old fleet at once.
                maximum_batch_size=Endpoint.CapacitySizeProperty(type="CAPACITY_PERCENT",
                                                                  value=updates.ROLLING_BATCH_PERCENT),
                rollback_maximum_batch_size=Endpoint.CapacitySizeProperty(type="CAPACITY_PERCENT", value=100),
                wait_interval_in_seconds=deployment.bake_s,
                maximum_execution_timeout_in_seconds=deployment.maximum_execution_timeout_s))
    return Endpoint.DeploymentConfigProperty(
        auto_rollback_configuration=rollback,
        blue_green_update_policy=Endpoint.BlueGreenUpdatePolicyProperty(
            traffic_routing_configuration=Endpoint.TrafficRoutingConfigProperty(
                type=deployment.traffic, wait_interval_in_seconds=deployment.bake_s,
                canary_size=Endpoint.CapacitySizeProperty(type="INSTANCE_COUNT", value=1)
                if deployment.traffic == "CANARY" else None),
            # The old fleet stays this long after all traffic has moved: the last chance to roll back.
            termination_wait_in_seconds=deployment.bake_s,
            maximum_execution_timeout_in_seconds=deployment.maximum_execution_timeout_s))
