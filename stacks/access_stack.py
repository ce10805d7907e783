"""The access stack (``<prefix>-access``): the customer-managed policies that people, pipelines and applications
attach to work with this environment, and nothing else.

- ``<prefix>-operator``: what ``python -m endpoint_client acceptance`` (with ``--rollback-drill``), ``transform``,
  ``preflight``, ``check-pins --protect`` and ``promote`` (from this environment) call, on this environment's
  stacks, endpoints, alarms, logs, artifact bucket and repository, plus the acceptance reports under
  ``acceptance/<environment>/`` of the artifact bucket;
- ``<prefix>-capture-reader``, only where an endpoint kind captures data (its ``data_capture``): what ``capture``
  reads (the artifacts stack's outputs, the bucket's ``data-capture/`` prefix); captured bodies hold what callers
  sent, so reading them is not the operator's by default;
- ``<prefix>-deployer``: what ``npx cdk deploy`` / ``diff`` do with the caller's own credentials: assume the CDK
  bootstrap roles of this account and region (deploy, file and image publishing, lookup), which do the rest;
- ``<prefix>-invoker``: ``sagemaker:InvokeEndpoint`` on this environment's endpoints (fixed names,
  ``EnvironmentConfig.endpoint_name``); where cdk.json configures the async kind, ``InvokeEndpointAsync`` on the
  async endpoint, ``s3:PutObject`` under its input prefix and ``s3:GetObject`` under its output and failure
  prefixes (what an asynchronous call does).

Each statement exists for a call the commands make (tests/cdk/test_cdk_access_policies.py records those calls
against moto and evaluates them against these documents with the policy simulator; removing any one statement
denies one of them). Where a service authorizes no resource (ListMetrics, Service Quotas, ListEndpoints,
DescribeScalableTargets) the statement says ``*``; where this environment's resources have generated names (the
stacks' Models, EndpointConfigs and volume keys) it is limited by the tags app.py puts on every resource.

A stack of its own, by lifecycle: the policies outlive any endpoint and are attached to principals outside the
app, so ``cdk destroy`` of an endpoint never detaches them.
"""

from __future__ import annotations

from typing import Mapping

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sns as sns
from constructs import Construct

from stacks import nag
from stacks.artifacts_stack import ArtifactsStack
from stacks.config import (ACCEPTANCE_PREFIX, ADAPTER_KINDS, BATCH_INPUT_PREFIX, BATCH_OUTPUT_PREFIX,
                           DATA_CAPTURE_PREFIX, ENDPOINT_KINDS, MODEL_PREFIX, TRANSFORM_KINDS, EnvironmentConfig)

SAGEMAKER_SERVICE = "sagemaker.amazonaws.com"
# The roles `cdk deploy`/`diff` assume with the caller's credentials (modern bootstrap), as the CLI names them.
BOOTSTRAP_ROLE_ARNS = {
    "deploy": cdk.DefaultStackSynthesizer.DEFAULT_DEPLOY_ROLE_ARN,
    "file-publishing": cdk.DefaultStackSynthesizer.DEFAULT_FILE_ASSET_PUBLISHING_ROLE_ARN,
    "image-publishing": cdk.DefaultStackSynthesizer.DEFAULT_IMAGE_ASSET_PUBLISHING_ROLE_ARN,
    "lookup": cdk.DefaultStackSynthesizer.DEFAULT_LOOKUP_ROLE_ARN,
}

# Why a statement of the capture reader's policy names resources by a pattern.
CAPTURE_READER_REASONS = {
    "ReadCapturedData": "capture reads the objects SageMaker's data capture names per endpoint, variant, hour and "
                        "file, under the data-capture/ prefix of this environment's own artifact bucket (read only).",
    "ReadStackOutputs": "capture reads the artifacts stack's outputs (its bucket); CloudFormation stack ARNs end in a "
                        "generated id.",
}
# Why a statement of the invoker's policy names resources by a pattern.
INVOKER_REASONS = {
    "PutAsyncRequests": "An asynchronous call puts its request body under the async kind's input prefix of this "
                        "environment's artifact bucket, named per request.",
    "ReadAsyncResults": "An asynchronous call reads its answer or failure, named by SageMaker per request, under the "
                        "async kind's output and failure prefixes (read only).",
}
# Why a statement of the operator policy names resources by a pattern (cdk-nag's AwsSolutions-IAM5).
WILDCARD_REASONS = {
    "ReadStackOutputs": "The commands read the outputs of this environment's stacks, all named <prefix>-*; "
                        "CloudFormation stack ARNs end in a generated id.",
    "DescribeAccountEndpoints": "preflight counts the instances every endpoint of the account runs against the "
                                "account's instance quotas: it describes endpoints it does not own (read only).",
    "ListAccountEndpoints": "sagemaker:ListEndpoints has no resource-level permissions; the service requires '*'.",
    "DescribeEnvironmentModels": "The stacks' Models have names CloudFormation generates; the statement is limited "
                                 "to Models tagged with this project and environment.",
    "RollbackDrill": "acceptance --rollback-drill names its Model and EndpointConfig <endpoint>-drill-<UTC time>, "
                     "a new name per drill, of this environment's endpoints only.",
    "GrantVolumeKeysToSageMaker": "The endpoints' volume keys have generated ids; the grant is limited to keys "
                                  "tagged with this project and environment, requested through SageMaker.",
    "UpdateToEnvironmentConfigs": "The stacks' EndpointConfigs have names CloudFormation generates; the statement is "
                                  "limited to EndpointConfigs tagged with this project and environment.",
    "DescribeAlarms": "cloudwatch:DescribeAlarms with a name prefix is authorized on every alarm of the account, "
                      "not on the names it returns (read only).",
    "TestAlarmDelivery": "acceptance sets each alarm of this environment's endpoints (named <endpoint>-<alarm>) "
                         "to ALARM and back and reads its history.",
    "ReadMetrics": "cloudwatch:ListMetrics and GetMetricStatistics have no resource-level permissions; the service "
                   "requires '*'.",
    "ReadEndpointLogs": "CloudWatch Logs authorizes FilterLogEvents on the log group's ARN with ':*' appended; one "
                        "group per endpoint of this environment.",
    "CheckModelArchives": "check-pins checks a model pin before it is deployed, so any archive under models/ of "
                          "this environment's artifact bucket (read only).",
    "Preflight": "Service Quotas' list operations and DescribeScalableTargets have no resource-level permissions; "
                 "the services require '*'.",
    "AcceptanceReports": "acceptance writes acceptance/<environment>/<UTC time>.json and latest.json; one "
                         "environment's prefix of its own artifact bucket.",
    "RunTransformJobs": "transform names each job <endpoint>-<UTC time>, a new name per job, on this environment's "
                        "transform-capable endpoint only.",
    "FindTransformLogGroup": "logs:DescribeLogGroups has no resource-level permissions; the service requires '*' "
                             "(read only).",
}


class AccessStack(cdk.Stack):
    def __init__(self, scope: Construct, construct_id: str, *, config: EnvironmentConfig, artifacts: ArtifactsStack,
                 alarm_topic: sns.ITopic, resource_tags: Mapping[str, str], **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.config, self.artifacts, self._alarm_topic = config, artifacts, alarm_topic
        prefix = config.name_prefix
        # Resources of this environment whose names CloudFormation generates carry app.py's tags.
        self.tagged = {"StringEquals": {f"aws:ResourceTag/{key}": value for key, value in resource_tags.items()}}

        self.operator = iam.ManagedPolicy(
            self, "OperatorPolicy", managed_policy_name=f"{prefix}-operator", statements=self._operator_statements(),
            description=f"{prefix}: python -m endpoint_client acceptance, transform, preflight, check-pins and promote")
        self.deployer = iam.ManagedPolicy(
            self, "DeployerPolicy", managed_policy_name=f"{prefix}-deployer", statements=self._deployer_statements(),
            description=f"{prefix}: npx cdk deploy and diff through the CDK bootstrap roles")
        self.invoker = iam.ManagedPolicy(
            self, "InvokerPolicy", managed_policy_name=f"{prefix}-invoker", statements=[iam.PolicyStatement(
                sid="InvokeEndpoints", actions=["sagemaker:InvokeEndpoint"], resources=self._endpoint_arns()),
                *self._async_invoker_statements()],
            description=f"{prefix}: call this environment's endpoints")
        self._acknowledge(self.operator, WILDCARD_REASONS)
        self._acknowledge(self.invoker, INVOKER_REASONS)
        # Captured requests and responses hold what callers sent: reading them is a policy of its own, made only
        # where an endpoint kind captures data, for the people who audit decisions.
        self.capture_reader = None
        if any(config.endpoint_settings(kind).data_capture is not None
               for kind in config.endpoints if kind in ADAPTER_KINDS):
            self.capture_reader = iam.ManagedPolicy(
                self, "CaptureReaderPolicy", managed_policy_name=f"{prefix}-capture-reader",
                statements=self._capture_reader_statements(),
                description=f"{prefix}: python -m endpoint_client capture (the decisions data capture recorded)")
            self._acknowledge(self.capture_reader, CAPTURE_READER_REASONS)
        policies = [("Operator", self.operator, "people who accept, run and check the endpoints"),
                    ("Deployer", self.deployer, "the pipeline (or person) that runs cdk deploy"),
                    ("Invoker", self.invoker, "applications that call the endpoints")]
        if self.capture_reader is not None:
            policies.append(("CaptureReader", self.capture_reader, "people who audit the captured decisions"))
        for name, policy, who in policies:
            cdk.CfnOutput(self, f"{name}PolicyArn", value=policy.managed_policy_arn,
                          description=f"Attach to {who} (docs/deploy.md, Who attaches which policy)")

    # --- ARNs -----------------------------------------------------------------------------------------------------

    def _arn(self, service: str, resource: str, name: str, *, colon: bool = False, region: bool = True) -> str:
        return cdk.Arn.format(cdk.ArnComponents(
            service=service, resource=resource, resource_name=name, region=None if region else "",
            arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME if colon else cdk.ArnFormat.SLASH_RESOURCE_NAME), self)

    @property
    def _kinds(self) -> tuple[str, ...]:
        # Every kind, listed in cdk.json or not: the names are fixed, an unlisted endpoint does not exist, and the
        # policies (and the exports they import) stay the same when an endpoint is added or removed.
        return ENDPOINT_KINDS

    def _endpoint_arns(self) -> list[str]:
        return [self._arn("sagemaker", "endpoint", self.config.endpoint_name(kind)) for kind in self._kinds]

    def _bucket_objects(self, prefix: str) -> str:
        return self.artifacts.bucket_objects_arn(f"{prefix}*")

    @property
    def _bucket_arn(self) -> str:
        return cdk.Fn.import_value(self.artifacts.bucket_arn_export_name)

    # --- the operator ---------------------------------------------------------------------------------------------

    def _operator_statements(self) -> list[iam.PolicyStatement]:
        config, kinds = self.config, self._kinds
        endpoints = [config.endpoint_name(kind) for kind in kinds]
        drills = [f"{name}-drill-*" for name in endpoints]       # acceptance's drill Model and EndpointConfig
        transform_jobs = [self._arn("sagemaker", "transform-job", f"{config.endpoint_name(kind)}-*")
                          for kind in kinds if kind in TRANSFORM_KINDS]
        statements = [
            # Every command reads the artifacts, monitoring and endpoint stacks' outputs.
            iam.PolicyStatement(sid="ReadStackOutputs", actions=["cloudformation:DescribeStacks"],
                                resources=[self._arn("cloudformation", "stack", f"{config.name_prefix}-*/*")]),
            # acceptance: invoke, watch and update (the drill, and its undo) this environment's endpoints.
            iam.PolicyStatement(sid="OperateEndpoints", resources=self._endpoint_arns(), actions=[
                "sagemaker:InvokeEndpoint", "sagemaker:UpdateEndpoint"]),
            # preflight counts the instances of every endpoint of the account against the quotas (read only).
            iam.PolicyStatement(sid="DescribeAccountEndpoints", actions=[
                "sagemaker:DescribeEndpoint", "sagemaker:DescribeEndpointConfig"], resources=[
                self._arn("sagemaker", "endpoint", "*"), self._arn("sagemaker", "endpoint-config", "*")]),
            iam.PolicyStatement(sid="ListAccountEndpoints", actions=["sagemaker:ListEndpoints"], resources=["*"]),
            # The stacks' Models have generated names: this environment's carry its tags.
            iam.PolicyStatement(sid="DescribeEnvironmentModels", actions=["sagemaker:DescribeModel"],
                                resources=[self._arn("sagemaker", "model", "*")], conditions=self.tagged),
            # The rollback drill's copy of a Model and its EndpointConfig, named <endpoint>-drill-<time>; UpdateEndpoint
            # is authorized on the endpoint (OperateEndpoints) and on the configuration it activates (here).
            iam.PolicyStatement(sid="RollbackDrill", actions=[
                "sagemaker:CreateModel", "sagemaker:DeleteModel", "sagemaker:CreateEndpointConfig",
                "sagemaker:DeleteEndpointConfig", "sagemaker:UpdateEndpoint"], resources=[
                self._arn("sagemaker", kind, name) for kind in ("model", "endpoint-config") for name in drills]),
            # The drill's undo activates the stack's own EndpointConfig again (a generated name: this environment's
            # carry its tags).
            iam.PolicyStatement(sid="UpdateToEnvironmentConfigs", actions=["sagemaker:UpdateEndpoint"],
                                resources=[self._arn("sagemaker", "endpoint-config", "*")], conditions=self.tagged),
            # CreateModel passes the endpoint's own execution role to SageMaker, and no other role.
            iam.PolicyStatement(sid="PassExecutionRoles", actions=["iam:PassRole"], resources=[
                self._arn("iam", "role", config.execution_role_name(kind), region=False) for kind in kinds],
                conditions={"StringEquals": {"iam:PassedToService": SAGEMAKER_SERVICE}}),
            # An EndpointConfig with a volume key: SageMaker creates a grant on it with the caller's rights when an
            # endpoint is created or updated to it (the drill, and the undo; not when the config is created). Only
            # through SageMaker, only on this environment's keys. No kms:GrantIsForAWSResource: AWS does not say that
            # SageMaker sets it (the KMS guide listed EBS, RDS, Redshift and ACM), and requiring it could deny the
            # drill; acceptance's drill shows the grant on a real account (docs/deploy.md).
            iam.PolicyStatement(sid="GrantVolumeKeysToSageMaker", actions=["kms:CreateGrant"],
                                resources=[self._arn("kms", "key", "*")], conditions={
                                    "StringEquals": {**self.tagged["StringEquals"],
                                                     "kms:ViaService": f"sagemaker.{self.region}.amazonaws.com"}}),
            # acceptance reads every alarm (DescribeAlarms authorizes no name prefix) and tests the delivery of this
            # environment's: each set to ALARM and back, and its history read.
            iam.PolicyStatement(sid="DescribeAlarms", actions=["cloudwatch:DescribeAlarms"],
                                resources=[self._arn("cloudwatch", "alarm", "*", colon=True)]),
            iam.PolicyStatement(sid="TestAlarmDelivery", actions=[
                "cloudwatch:SetAlarmState", "cloudwatch:DescribeAlarmHistory"], resources=[
                self._arn("cloudwatch", "alarm", f"{name}-*", colon=True) for name in endpoints]),
            iam.PolicyStatement(sid="ReadMetrics", actions=["cloudwatch:ListMetrics",
                                                            "cloudwatch:GetMetricStatistics"], resources=["*"]),
            iam.PolicyStatement(sid="ReadEndpointLogs", actions=["logs:FilterLogEvents"], resources=[
                self._arn("logs", "log-group", f"/aws/sagemaker/Endpoints/{name}:*", colon=True)
                for name in endpoints]),
            iam.PolicyStatement(sid="ReadAlarmSubscriptions", actions=["sns:ListSubscriptionsByTopic"],
                                resources=[self._alarm_topic.topic_arn]),
            # check-pins: the pinned images (and --protect's tag); preflight runs the same check.
            iam.PolicyStatement(sid="CheckAndProtectPinnedImages", actions=[
                "ecr:DescribeImages", "ecr:BatchGetImage", "ecr:PutImage"],
                resources=[self.artifacts.repository.repository_arn]),
            iam.PolicyStatement(sid="Preflight", actions=[
                "servicequotas:ListServiceQuotas", "servicequotas:ListAWSDefaultServiceQuotas",
                "application-autoscaling:DescribeScalableTargets"], resources=["*"]),
            # acceptance's report (convention 4 of issue 33): written by acceptance, read by promote (and by
            # promote --verify, one version of it).
            iam.PolicyStatement(sid="AcceptanceReports", actions=["s3:PutObject", "s3:GetObject",
                                                                  "s3:GetObjectVersion"],
                                resources=[self._bucket_objects(f"{ACCEPTANCE_PREFIX}{config.name}/")]),
        ]
        archives = self._model_archives()
        report = self._promoted_report()
        if archives:
            # check-pins (and preflight): the archive; where pinned from another environment, preflight also reads
            # the very version of the acceptance report the pins were promoted on.
            statements.insert(1, iam.PolicyStatement(
                sid="CheckModelArchives", actions=["s3:GetObject", *(["s3:GetObjectVersion"] if report else [])],
                resources=[*archives, *report]))
        others = sorted({image.repository.arn for kind in config.endpoints
                         if (image := config.pins.images.of(kind)) is not None and image.repository is not None})
        if others:
            statements.append(iam.PolicyStatement(sid="CheckPinnedImagesElsewhere", actions=["ecr:DescribeImages"],
                                                  resources=others))
        if transform_jobs:
            statements += [
                # transform: the job (tagged at creation, hence AddTags) on a stack's Model, named <endpoint>-<time>.
                iam.PolicyStatement(sid="RunTransformJobs", resources=transform_jobs, actions=[
                    "sagemaker:CreateTransformJob", "sagemaker:DescribeTransformJob", "sagemaker:AddTags"]),
                iam.PolicyStatement(sid="ListBatchObjects", actions=["s3:ListBucket"], resources=[self._bucket_arn],
                                    conditions={"StringLike": {"s3:prefix": [f"{BATCH_INPUT_PREFIX}*",
                                                                             f"{BATCH_OUTPUT_PREFIX}*"]}}),
                # transform refuses to start without SageMaker's transform log group.
                iam.PolicyStatement(sid="FindTransformLogGroup", actions=["logs:DescribeLogGroups"],
                                    resources=["*"]),
            ]
        return statements

    def _promoted_report(self) -> list[str]:
        """The acceptance report this environment's pins were promoted on (pins.acceptance), in its source's bucket."""
        pin = self.config.pins.acceptance
        return [] if pin is None else [f"arn:{cdk.Aws.PARTITION}:s3:::{pin.bucket}/{pin.key}"]

    def _model_archives(self) -> list[str]:
        """What check-pins reads of the model archive: the builds' prefix of this environment's bucket; or, where
        the environment deploys another's builds (artifacts_from), the pinned archive in that bucket, once pinned."""
        model = self.config.pins.model
        if model is not None and model.bucket is not None:
            return [self.artifacts.archive_arn(model)]
        if self.config.artifacts_from is not None:
            return []
        return [self._bucket_objects(MODEL_PREFIX)]

    # --- the invoker of the asynchronous endpoint ---------------------------------------------------------------

    def _async_invoker_statements(self) -> list[iam.PolicyStatement]:
        """An asynchronous call (`python -m endpoint_client invoke --async`, or an application): put the request
        body under the async kind's input prefix, InvokeEndpointAsync on the async endpoint alone, read the answer
        or the failure under its output and failure prefixes. Only where cdk.json configures the async kind (its
        prefixes)."""
        settings = self.config.async_
        if settings is None:
            return []
        return [iam.PolicyStatement(sid="InvokeAsyncEndpoint", actions=["sagemaker:InvokeEndpointAsync"],
                                    resources=[self._arn("sagemaker", "endpoint", self.config.endpoint_name("async"))]),
                iam.PolicyStatement(sid="PutAsyncRequests", actions=["s3:PutObject"],
                                    resources=[self._bucket_objects(settings.input_prefix)]),
                iam.PolicyStatement(sid="ReadAsyncResults", actions=["s3:GetObject"],
                                    resources=[self._bucket_objects(settings.output_prefix),
                                               self._bucket_objects(settings.failure_prefix)])]

    # --- the capture reader -----------------------------------------------------------------------------------

    def _capture_reader_statements(self) -> list[iam.PolicyStatement]:
        """capture: the records SageMaker's data capture wrote under data-capture/ of this environment's own bucket
        (read only; every capture prefix is under it, stacks/config.py)."""
        return [iam.PolicyStatement(sid="ReadCapturedData", actions=["s3:GetObject"],
                                    resources=[self._bucket_objects(DATA_CAPTURE_PREFIX)]),
                iam.PolicyStatement(sid="ListCapturedData", actions=["s3:ListBucket"], resources=[self._bucket_arn],
                                    conditions={"StringLike": {"s3:prefix": [f"{DATA_CAPTURE_PREFIX}*"]}}),
                iam.PolicyStatement(sid="ReadStackOutputs", actions=["cloudformation:DescribeStacks"],
                                    resources=[self._arn("cloudformation", "stack",
                                                         f"{self.config.artifacts_stack_name}/*")])]

    # --- the deployer ---------------------------------------------------------------------------------------------

    def _deployer_statements(self) -> list[iam.PolicyStatement]:
        # The app uses the default synthesizer, so the bootstrap's default qualifier (cdk bootstrap without
        # --qualifier); the CLI makes no other call with the caller's credentials (deploy/rehearse.py records them).
        qualifier = cdk.DefaultStackSynthesizer.DEFAULT_QUALIFIER
        return [iam.PolicyStatement(sid="AssumeCdkBootstrapRoles", actions=["sts:AssumeRole"], resources=[
            cdk.Fn.sub(template, {"Qualifier": qualifier}) for template in BOOTSTRAP_ROLE_ARNS.values()])]

    def _acknowledge(self, policy: iam.ManagedPolicy, reasons: Mapping[str, str]) -> None:
        """cdk-nag's IAM5 for each resource with a wildcard in the policy, with its statement's reason."""
        for statement in policy.document.to_json()["Statement"]:
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            for resource in resources:
                if "*" in nag.flatten(self.resolve(resource)):
                    nag.acknowledge(policy, nag.wildcard_resource_of(self, resource), reasons[statement["Sid"]])
