"""One SageMaker real-time endpoint: its Model, EndpointConfig, Endpoint, log group and auto scaling.

The same construct serves the CPU and GPU decision endpoints and the text-generation endpoint; what differs is
passed in: the image, the container environment and the variant (one instance type, or ordered instance pools
with a provisioning timeout and an inference AMI). Model and EndpointConfig have generated names, because
CloudFormation replaces them on every change; the Endpoint keeps its name and is updated in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct

from stacks import instance_types
from stacks.config import EndpointSettings
from stacks.retention import retention_days
from stacks.roles import policy_of

VARIANT_NAME = "AllTraffic"


@dataclass(frozen=True)
class Variant:
    """Where the endpoint runs: exactly one of instance_type and instance_pools (priority = order)."""
    instance_type: str | None = None
    instance_pools: tuple[str, ...] = ()
    provision_timeout_s: int | None = None
    inference_ami_version: str | None = None

    def __post_init__(self) -> None:
        if (self.instance_type is None) == (not self.instance_pools):
            raise ValueError("a variant has either an instance type or instance pools")
        if self.provision_timeout_s is not None and not self.instance_pools:
            raise ValueError("a provisioning timeout applies to instance pools only")

    @property
    def instance_types(self) -> tuple[str, ...]:
        return (self.instance_type,) if self.instance_type else self.instance_pools


class SageMakerEndpoint(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, endpoint_name: str, image_uri: str,
                 model_data_url: str, environment: dict[str, str], execution_role: iam.IRole, variant: Variant,
                 settings: EndpointSettings, volume_key: kms.IKey | None,
                 log_retention_days: int, tags: dict[str, str]) -> None:
        super().__init__(scope, construct_id)
        if volume_key is not None and any(map(instance_types.has_instance_storage, variant.instance_types)):
            raise ValueError(f"{endpoint_name}: SageMaker rejects a volume KMS key for instance types with local "
                             f"instance storage ({', '.join(variant.instance_types)})")
        self.endpoint_name = endpoint_name

        # The container's log group, created here so that it has a retention and goes with the stack.
        self.log_group = logs.LogGroup(self, "Logs", log_group_name=f"/aws/sagemaker/Endpoints/{endpoint_name}",
                                       retention=retention_days(log_retention_days),
                                       removal_policy=cdk.RemovalPolicy.DESTROY)
        self.log_group.grant_write(execution_role)
        self.log_group.grant(execution_role, "logs:CreateLogGroup", "logs:DescribeLogStreams")

        self.model = sagemaker.CfnModel(
            self, "Model",
            execution_role_arn=execution_role.role_arn,
            # No network access from the container: the model comes from S3 through SageMaker, nothing else.
            enable_network_isolation=True,
            primary_container=sagemaker.CfnModel.ContainerDefinitionProperty(
                image=image_uri, model_data_url=model_data_url, environment=environment),
            tags=[cdk.CfnTag(key=key, value=value) for key, value in sorted(tags.items())],
        )
        # CreateModel checks that the role can read the image and the archive: its policy must exist first.
        self.model.node.add_dependency(policy_of(execution_role))

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
        )
        self.endpoint_config = sagemaker.CfnEndpointConfig(
            self, "EndpointConfig", production_variants=[production_variant],
            kms_key_id=volume_key.key_arn if volume_key is not None else None,
            tags=[cdk.CfnTag(key=key, value=value) for key, value in sorted(tags.items())])

        self.endpoint = sagemaker.CfnEndpoint(
            self, "Endpoint", endpoint_name=endpoint_name,
            endpoint_config_name=self.endpoint_config.attr_endpoint_config_name,
            tags=[cdk.CfnTag(key=key, value=value) for key, value in sorted(tags.items())])
        # Container logs from the first instance must find their log group.
        self.endpoint.node.add_dependency(self.log_group)

        # Target tracking on invocations per instance, between the initial and the maximum count. Application
        # Auto Scaling uses its SageMaker service-linked role (no RoleARN).
        self.scalable_target = appscaling.CfnScalableTarget(
            self, "ScalableTarget",
            service_namespace="sagemaker",
            scalable_dimension="sagemaker:variant:DesiredInstanceCount",
            resource_id=f"endpoint/{self.endpoint.attr_endpoint_name}/variant/{VARIANT_NAME}",
            min_capacity=settings.initial_instance_count,
            max_capacity=settings.max_instance_count,
        )
        self.scaling_policy = appscaling.CfnScalingPolicy(
            self, "InvocationsPerInstance",
            policy_name="invocations-per-instance",
            policy_type="TargetTrackingScaling",
            scaling_target_id=self.scalable_target.ref,
            target_tracking_scaling_policy_configuration=appscaling.CfnScalingPolicy
            .TargetTrackingScalingPolicyConfigurationProperty(
                target_value=settings.target_invocations_per_instance,
                predefined_metric_specification=appscaling.CfnScalingPolicy.PredefinedMetricSpecificationProperty(
                    predefined_metric_type="SageMakerVariantInvocationsPerInstance"),
                scale_in_cooldown=settings.scale_in_cooldown_s,
                scale_out_cooldown=settings.scale_out_cooldown_s,
            ),
        )
