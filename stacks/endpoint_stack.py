"""One endpoint's stack (``<prefix>-endpoint-<kind>``): its execution role, volume key and endpoint.

The execution role has a fixed name (``<prefix>-<kind>-execution``) and may read exactly the pinned model archive
and pull from exactly the pinned image's repository: this environment's, or, for an environment whose
``artifacts_from`` names another, the source's repository and bucket that the pins name in full (the source's
resource policies allow these roles, stacks/artifacts_stack.py). Where cdk.json places the environment in a VPC
(``vpc``), the role may create and manage network interfaces in its subnets only; where the kind captures data
(``<kind>.data_capture``), it may write under its own endpoint's part of the artifact bucket's capture prefix only.

Each endpoint kind has a stack of its own, so that a failed GPU deployment (an instance quota of 0 is common;
pools fall back on capacity, not on quota) rolls back that stack alone, and each can be deployed, diffed and
destroyed by name. The stack imports from the artifacts stack (bucket, repository) and the monitoring stack
(alarm topic) and exports nothing, so destroying it never waits for another stack.

An endpoint that cdk.json does not list, or whose image or model is not pinned yet, leaves its stack with a
no-op placeholder (AWS::CloudFormation::WaitConditionHandle); an unpinned one adds a synth warning naming the
keys to set. Deploying that stack removes an endpoint that was there.
"""

from __future__ import annotations

import hashlib

import aws_cdk as cdk
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from constructs import Construct

from stacks import nag
from stacks.artifacts_stack import ArtifactsStack
from stacks.config import BATCH_INPUT_PREFIX, BATCH_OUTPUT_PREFIX, RECOMMENDED_SUBNETS, TRANSFORM_LOG_GROUP
from stacks.endpoint import SageMakerEndpoint
from stacks.endpoint_specs import INSTANCE_NAMESPACE, TRANSFORM_INSTANCE_NAMESPACE, EndpointSpec


class EndpointStack(cdk.Stack):
    def __init__(self, scope: Construct, construct_id: str, *, spec: EndpointSpec, artifacts: ArtifactsStack,
                 alarm_topic: sns.ITopic, name_prefix: str, execution_role_name: str, log_retention_days: int,
                 retain_logs: bool, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.spec, self._artifacts = spec, artifacts
        self.endpoint: SageMakerEndpoint | None = None
        if spec.enabled and spec.missing_pins:
            missing = spec.missing_pins
            cdk.Annotations.of(self).add_warning_v2(
                f"decision-models:unpinned-{spec.kind}",
                f"The {spec.kind} endpoint is left out until {' and '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} set in cdk.json (docs/deploy.md, 3. Pin, preflight, diff "
                f"and deploy the endpoints).")
        if spec.deployable and not spec.settings.autoscaling:
            cdk.Annotations.of(self).add_warning_v2(
                f"decision-models:scaling-detached-{spec.kind}",
                f"Auto scaling of the {spec.kind} endpoint is detached ({spec.settings_key}.autoscaling is false): its "
                f"fleet stays at the instance count it has. Set it back to true once the instance type or pool "
                f"change is deployed (docs/deploy.md, Change the instance type or the pools).")
        if spec.deployable and spec.vpc is not None and len(spec.vpc.subnet_ids) < RECOMMENDED_SUBNETS:
            cdk.Annotations.of(self).add_warning_v2(
                f"decision-models:one-subnet-{spec.kind}",
                f"The {spec.kind} endpoint's instances all run in one Availability Zone: vpc.subnet_ids names one "
                f"subnet. Name {RECOMMENDED_SUBNETS} or more, in different zones, so that an endpoint of 2 or more "
                f"instances survives a zone's outage (docs/deploy.md, VPC).")
        if not spec.deployable:
            # A template needs one resource. This one does nothing and costs nothing; it keeps the stack
            # deployable (and diffable) until the endpoint is listed and pinned.
            cdk.CfnWaitConditionHandle(self, "NoEndpointYet")
            return

        self.execution_role = iam.Role(
            self, "ExecutionRole",
            # Named (EnvironmentConfig.execution_role_name), so that the artifact source's repository and bucket
            # policies and the operator's iam:PassRole can name it before it exists.
            role_name=execution_role_name,
            # Only SageMaker acting for this account may assume it (confused-deputy protection).
            assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com", conditions={
                "StringEquals": {"aws:SourceAccount": cdk.Aws.ACCOUNT_ID}}),
            description=f"{name_prefix}: the {spec.title} endpoint reads the pinned model archive and pulls the "
                        f"pinned image")
        role = self.execution_role
        model = spec.model
        # The pinned archive exactly: in this environment's bucket, or in the artifact source's that the pin names
        # (whose bucket policy allows this role: stacks/artifacts_stack.py).
        role.add_to_policy(iam.PolicyStatement(
            sid="ReadPinnedModelArchive", actions=["s3:GetObject"], resources=[artifacts.archive_arn(model)]))
        # The instances' CPU, GPU, memory and disk metrics; PutMetricData has no resource-level permissions.
        namespaces = [INSTANCE_NAMESPACE] + ([TRANSFORM_INSTANCE_NAMESPACE] if spec.serves_batch_transform else [])
        role.add_to_policy(iam.PolicyStatement(
            sid="PublishInstanceMetrics", actions=["cloudwatch:PutMetricData"], resources=["*"],
            conditions={"StringEquals": {"cloudwatch:namespace": namespaces}}))
        acknowledged = ["ecr:GetAuthorizationToken", "cloudwatch:PutMetricData (limited to SageMaker's namespace "
                        + " and ".join(namespaces) + ")"]
        if spec.serves_batch_transform:
            self._grant_batch_transform(role)
        if spec.vpc is not None:
            acknowledged.append(self._grant_network_interfaces(role))
        nag.acknowledge(role, "AwsSolutions-IAM5[Resource::*]",
                        f"{' and '.join(acknowledged)} have no resource-level permissions; the services require "
                        "Resource '*'. Image pulls are limited to the pinned image's repository.")

        # SageMaker refuses a volume key on instances with local NVMe storage (encrypted in hardware), so only
        # EBS-backed variants get one.
        self.volume_key = None
        if not spec.variant.has_instance_storage:
            self.volume_key = kms.Key(
                self, "VolumeKey", enable_key_rotation=True, pending_window=cdk.Duration.days(7),
                removal_policy=cdk.RemovalPolicy.DESTROY,
                description=f"{name_prefix}: encrypts the EBS volumes of the {spec.title} endpoint")

        capture_destination = self._grant_data_capture(role) if spec.settings.data_capture is not None else None
        self.notification_topics = self._async_topics(role, name_prefix) if spec.async_inference is not None else None
        self.endpoint = SageMakerEndpoint(
            self, "Endpoint", spec=spec, image_uri=self._image_uri(), execution_role=role,
            capture_destination=capture_destination,
            async_bucket=artifacts.bucket.bucket_name if spec.async_inference is not None else None,
            async_topics=self.notification_topics,
            model_data_url=f"s3://{model.bucket or artifacts.bucket.bucket_name}/{model.s3_key}",
            volume_key=self.volume_key,
            alarm_topic=alarm_topic, log_retention_days=log_retention_days,
            log_key=artifacts.logs_key_in(self), retain_logs=retain_logs,
            tags={"endpoint-kind": spec.kind, "image-digest": spec.image.digest,
                  "model-gguf-sha256": model.gguf_sha256})
        cdk.CfnOutput(self, "EndpointName", value=self.endpoint.endpoint.attr_endpoint_name,
                      description=f"python -m endpoint_client --endpoint-name <this> ({spec.kind})")
        cdk.CfnOutput(self, "ModelName", value=self.endpoint.model.attr_model_name,
                      description="The pinned Model (Batch Transform runs on it)")
        if spec.async_inference is not None:
            self._async_outputs()
        if spec.serves_batch_transform:
            cdk.CfnOutput(self, "TransformInstanceType", value=spec.variant.instance_types[0],
                          description="python -m endpoint_client transform uses it unless --instance-type is given")

    def _grant_network_interfaces(self, role: iam.Role) -> str:
        """What SageMaker does with the role to place the instances in cdk.json's subnets (the Model's VpcConfig):
        create an elastic network interface per instance in one of the subnets with the security groups, let its
        own service account use it (a permission on the interface), and delete both when the instance goes; the
        describe calls check the subnets, groups and the VPC's DHCP options. Interfaces are created and managed only
        in these subnets; the describe calls have no resource-level permissions. What the acknowledgment of the
        role's '*' resources says of them is returned."""
        vpc = self.spec.vpc
        subnets = [self.format_arn(service="ec2", resource="subnet", resource_name=s) for s in vpc.subnet_ids]
        groups = [self.format_arn(service="ec2", resource="security-group", resource_name=g)
                  for g in vpc.security_group_ids]
        interfaces = self.format_arn(service="ec2", resource="network-interface", resource_name="*")
        role.add_to_policy(iam.PolicyStatement(
            sid="CreateNetworkInterfacesInTheSubnets", actions=["ec2:CreateNetworkInterface"],
            resources=[interfaces, *subnets, *groups]))
        role.add_to_policy(iam.PolicyStatement(
            sid="ManageNetworkInterfacesInTheSubnets",
            actions=["ec2:CreateNetworkInterfacePermission", "ec2:DeleteNetworkInterface"],
            resources=[interfaces], conditions={"ArnEquals": {"ec2:Subnet": subnets}}))
        describe = ["ec2:DescribeNetworkInterfaces", "ec2:DescribeVpcs", "ec2:DescribeDhcpOptions",
                    "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups"]
        role.add_to_policy(iam.PolicyStatement(
            sid="DescribeTheNetwork", actions=[*describe, "ec2:DeleteNetworkInterfacePermission"], resources=["*"]))
        nag.acknowledge(role, nag.wildcard_resource_of(self, interfaces),
                        "SageMaker creates one network interface per instance, named by EC2 when created; the role may "
                        "create interfaces only in cdk.json's subnets with its security groups, and manage only "
                        "interfaces in those subnets (ec2:Subnet).")
        return ("the EC2 describe calls SageMaker makes to place instances in a VPC and "
                "ec2:DeleteNetworkInterfacePermission (a permission is named by its own id, not by an interface)")

    def _grant_data_capture(self, role: iam.Role) -> str:
        """SageMaker writes the endpoint's captured requests and responses with the execution role, as
        <destination><endpoint>/<variant>/yyyy/mm/dd/hh/<file>.jsonl: the role may put objects under its own
        endpoint's part of the capture prefix of the artifact bucket, nothing else there. The destination URI is
        returned."""
        capture, artifacts = self.spec.settings.data_capture, self._artifacts
        own = f"{capture.prefix}{self.spec.endpoint_name}/*"
        role.add_to_policy(iam.PolicyStatement(
            sid="WriteCapturedData", actions=["s3:PutObject"], resources=[artifacts.bucket_objects_arn(own)]))
        nag.acknowledge(role, artifacts.bucket_objects_finding(own),
                        "SageMaker's data capture names its objects per variant, hour and file; the role may only put "
                        f"objects under this endpoint's part of the {capture.prefix} prefix of the artifact bucket.")
        return f"s3://{artifacts.bucket.bucket_name}/{capture.prefix}"

    def _async_topics(self, role: iam.Role, name_prefix: str) -> tuple[sns.Topic, sns.Topic]:
        """Asynchronous inference: SageMaker reads each request's body under the input prefix, writes its answer
        under the output prefix or its failure under the failure prefix, and notifies the success or the error
        topic, all with the execution role. The role may do exactly that: get objects under the one prefix, put
        objects under the two others, publish to the two topics (encrypted with a key of this stack, which the role
        may use for them: Topic.grant_publish). Every request without TLS to a topic is denied."""
        asynchronous, artifacts = self.spec.async_inference, self._artifacts
        topic_key = kms.Key(
            self, "NotificationTopicKey", enable_key_rotation=True, pending_window=cdk.Duration.days(7),
            removal_policy=cdk.RemovalPolicy.DESTROY,
            description=f"{name_prefix}: encrypts the {self.spec.title} endpoint's success and error notifications")
        topics = tuple(sns.Topic(self, f"{what}Topic", display_name=f"{self.spec.endpoint_name} {what.lower()}",
                                 master_key=topic_key, enforce_ssl=True) for what in ("Success", "Error"))
        for topic in topics:
            topic.grant_publish(role)
        nag.acknowledge(role, "AwsSolutions-IAM5[Action::kms:GenerateDataKey*]",
                        "Topic.grant_publish: SageMaker publishes each notification encrypted with the topics' own key "
                        "(this stack's, for these two topics only); GenerateDataKey* are the two data-key calls of "
                        "that one key.")
        role.add_to_policy(iam.PolicyStatement(
            sid="ReadAsyncRequests", actions=["s3:GetObject"],
            resources=[artifacts.bucket_objects_arn(f"{asynchronous.input_prefix}*")]))
        role.add_to_policy(iam.PolicyStatement(
            sid="WriteAsyncResults", actions=["s3:PutObject"],
            resources=[artifacts.bucket_objects_arn(f"{prefix}*")
                       for prefix in (asynchronous.output_prefix, asynchronous.failure_prefix)]))
        for prefix, why in ((asynchronous.input_prefix, "reads each request's body, named by its caller,"),
                            (asynchronous.output_prefix, "writes each answer, named by its inference id,"),
                            (asynchronous.failure_prefix, "writes each failure, named by its inference id,")):
            nag.acknowledge(role, artifacts.bucket_objects_finding(f"{prefix}*"),
                            f"Asynchronous inference {why} under the {prefix} prefix of the artifact bucket only.")
        return topics

    def _async_outputs(self) -> None:
        """What `python -m endpoint_client invoke --async` and acceptance read: where to put a request, where its
        answer or failure appears, the topics, and the timeout to give InvokeEndpointAsync."""
        asynchronous = self.spec.async_inference
        # Key prefixes of the artifact bucket (the artifacts stack's ArtifactBucketName: an output may not be an
        # import of another stack's).
        for name, prefix, what in (("AsyncInputPrefix", asynchronous.input_prefix, "request bodies"),
                                   ("AsyncOutputPrefix", asynchronous.output_prefix, "answers"),
                                   ("AsyncFailurePrefix", asynchronous.failure_prefix, "failures")):
            cdk.CfnOutput(self, name, value=prefix,
                          description=f"Asynchronous inference: {what}, under this key prefix of the artifact bucket")
        success, error = self.notification_topics
        cdk.CfnOutput(self, "AsyncSuccessTopicArn", value=success.topic_arn,
                      description="Notified of each answer (subscribe to be told)")
        cdk.CfnOutput(self, "AsyncErrorTopicArn", value=error.topic_arn,
                      description="Notified of each failure (subscribe to be told)")
        cdk.CfnOutput(self, "AsyncInvocationTimeoutS", value=str(asynchronous.invocation_timeout_s),
                      description="InvokeEndpointAsync's InvocationTimeoutSeconds (the adapter's deadline)")

    def _grant_batch_transform(self, role: iam.Role) -> None:
        artifacts = self._artifacts
        role.add_to_policy(iam.PolicyStatement(
            sid="ReadBatchInput", actions=["s3:GetObject"],
            resources=[artifacts.bucket_objects_arn(f"{BATCH_INPUT_PREFIX}*")]))
        role.add_to_policy(iam.PolicyStatement(
            sid="ListBatchInput", actions=["s3:ListBucket"],
            resources=[cdk.Fn.import_value(artifacts.bucket_arn_export_name)],
            conditions={"StringLike": {"s3:prefix": [f"{BATCH_INPUT_PREFIX}*"]}}))
        role.add_to_policy(iam.PolicyStatement(
            sid="WriteBatchOutput", actions=["s3:PutObject", "s3:AbortMultipartUpload"],
            resources=[artifacts.bucket_objects_arn(f"{BATCH_OUTPUT_PREFIX}*")]))
        # Transform jobs log to one account-wide group, which the runner creates; the role only writes to it.
        streams = cdk.Arn.format(cdk.ArnComponents(
            service="logs", resource="log-group", resource_name=f"{TRANSFORM_LOG_GROUP}:log-stream:*",
            arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME), self)
        group = cdk.Arn.format(cdk.ArnComponents(
            service="logs", resource="log-group", resource_name=TRANSFORM_LOG_GROUP,
            arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME), self)
        role.add_to_policy(iam.PolicyStatement(
            sid="WriteTransformLogs", actions=["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
            resources=[group, streams]))
        for prefix, why in ((BATCH_INPUT_PREFIX, "reads the job's input objects (listed and read under the prefix)"),
                            (BATCH_OUTPUT_PREFIX, "writes one .out object per input object under the output prefix")):
            nag.acknowledge(role, artifacts.bucket_objects_finding(f"{prefix}*"),
                            f"Batch Transform {why}; the object keys are chosen per job, so the role is limited to "
                            f"the {prefix} prefix of the artifact bucket.")
        nag.acknowledge(role, nag.wildcard_resource_of(self, streams),
            "SageMaker names a transform job's log streams per job and instance; the role may write streams of "
            "the one transform log group only.")

    def _image_uri(self) -> str:
        """The pinned image's URI; the execution role may pull from its repository."""
        image, role = self.spec.image, self.execution_role
        if image.repository is None:
            self._artifacts.repository.grant_pull(role)
            return self._artifacts.repository.repository_uri_for_digest(image.digest)
        repository = ecr.Repository.from_repository_arn(
            self, "PinnedRepository" + hashlib.sha256(image.repository.arn.encode()).hexdigest()[:8],
            image.repository.arn)
        repository.grant_pull(role)
        return f"{image.repository.uri}@{image.digest}"
