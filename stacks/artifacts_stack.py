"""The artifacts stack: what outlives builds and endpoints.

It owns the artifact bucket (model archives under ``models/``, image-digest records under ``image-digests/``),
the bucket that receives its server access logs, and the ECR repository for the adapter images and the
mirrored llama.cpp DLC image. ``artifacts.removal_policy`` decides what ``cdk destroy`` does with them:
``destroy`` empties and deletes them (dev), ``retain`` leaves all three in the account (prod).

It also owns the KMS key that encrypts every log group of the environment (the builds', the endpoints', and
SageMaker's transform-job group, which this stack creates where ``create_transform_log_group`` is true): CloudWatch
Logs may use it for this account's log groups in this region only. The key and the log groups are retained with
the artifacts (``EnvironmentConfig.retain_logs``): a retained log group whose key were deleted could not be read.

Where other environments of cdk.json take their artifacts from this one (their ``artifacts_from``), the repository
policy and the bucket policy let exactly those environments' endpoint execution roles pull the images and read
the model archives (``models/``), in the same account or another; the repository policy also names SageMaker's
service principal for those accounts (``aws:SourceAccount``), which CreateModel's validation of a cross-account
image looks for.

Every value another stack imports is exported explicitly (``export_value``), so that the export stays whether or
not any stack imports it at the moment: CloudFormation refuses to remove an export that a stack still imports, and
an automatic export would disappear with its last importer.
"""

from __future__ import annotations

import re

import aws_cdk as cdk
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks import nag
from stacks.config import MODEL_PREFIX, PINNED_TAG_PREFIX, TRANSFORM_LOG_GROUP, EnvironmentConfig, ModelPin
from stacks.retention import retention_days

# Tag prefixes the builds push under; the ECR lifecycle keeps the newest images of each.
IMAGE_TAG_PREFIXES = {"cpu": "cpu-", "gpu": "gpu-", "text_generation": "textgen-"}
# The first lifecycle rule selects the images `check-pins --protect` tagged pinned-<digest hex> (PINNED_TAG_PREFIX)
# and keeps up to this many; an image a higher-priority rule selects cannot be expired by a lower one, so the
# per-kind rules cannot remove a pinned image either.
PINNED_IMAGES_KEPT = 9999


class ArtifactsStack(cdk.Stack):
    def __init__(self, scope: Construct, construct_id: str, *, config: EnvironmentConfig, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        settings = config.artifacts
        removal = cdk.RemovalPolicy.RETAIN if settings.retain else cdk.RemovalPolicy.DESTROY
        # Only a destroyable bucket gets emptied on delete; a retained one keeps its objects.
        empty_on_delete = not settings.retain

        self.access_log_bucket = s3.Bucket(
            self, "AccessLogBucket",
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=[s3.LifecycleRule(
                id="expire-access-logs", expiration=cdk.Duration.days(settings.access_log_expiration_days),
                abort_incomplete_multipart_upload_after=cdk.Duration.days(1))],
            removal_policy=removal,
            auto_delete_objects=empty_on_delete,
        )
        # Not logged itself (it is the artifact bucket's log target; cdk-nag's S1 knows that).

        self.bucket = s3.Bucket(
            self, "ArtifactBucket",
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            versioned=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            server_access_logs_bucket=self.access_log_bucket,
            server_access_logs_prefix="artifact-bucket/",
            lifecycle_rules=[
                # A failed model upload (64 MiB multipart parts) leaves parts behind that nobody resumes.
                s3.LifecycleRule(id="abort-incomplete-uploads",
                                 abort_incomplete_multipart_upload_after=cdk.Duration.days(7)),
                # Superseded versions (latest.json digest records, replaced objects) and the delete markers
                # left once they expire.
                s3.LifecycleRule(id="expire-noncurrent-versions",
                                 noncurrent_version_expiration=cdk.Duration.days(
                                     settings.noncurrent_version_expiration_days),
                                 expired_object_delete_marker=True),
            ],
            removal_policy=removal,
            auto_delete_objects=empty_on_delete,
        )

        self.repository = ecr.Repository(
            self, "ImageRepository",
            image_tag_mutability=ecr.TagMutability.IMMUTABLE,
            image_scan_on_push=True,
            encryption=ecr.RepositoryEncryption.AES_256,
            lifecycle_rules=[
                ecr.LifecycleRule(
                    rule_priority=1, tag_prefix_list=[PINNED_TAG_PREFIX], max_image_count=PINNED_IMAGES_KEPT,
                    description="never expire pinned images (tagged by check-pins --protect)"),
                *(ecr.LifecycleRule(
                    rule_priority=priority, tag_prefix_list=[prefix], max_image_count=settings.images_kept_per_kind,
                    description=f"keep the newest {settings.images_kept_per_kind} {kind} images")
                  for priority, (kind, prefix) in enumerate(IMAGE_TAG_PREFIXES.items(), start=2)),
            ],
            removal_policy=removal,
            empty_on_delete=empty_on_delete,
        )

        retain_logs = cdk.RemovalPolicy.RETAIN if config.retain_logs else cdk.RemovalPolicy.DESTROY
        self.logs_key = kms.Key(
            self, "LogsKey", enable_key_rotation=True, removal_policy=retain_logs,
            pending_window=cdk.Duration.days(30 if config.retain_logs else 7),
            description=f"{config.name_prefix}: encrypts the environment's CloudWatch log groups")
        # CloudWatch Logs encrypts and decrypts each log group's events with the key, with the group's ARN as the
        # encryption context: the condition limits the service to this account's log groups in this region.
        self.logs_key.add_to_resource_policy(iam.PolicyStatement(
            sid="CloudWatchLogsEncryptLogGroups",
            principals=[iam.ServicePrincipal(f"logs.{self.region}.amazonaws.com")],
            actions=["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"],
            resources=["*"],
            conditions={"ArnLike": {"kms:EncryptionContext:aws:logs:arn": cdk.Arn.format(cdk.ArnComponents(
                service="logs", resource="log-group", resource_name="*",
                arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME), self)}}))
        self.logs_key_arn_export_name = f"{self.stack_name}:LogsKeyArn"
        self.export_value(self.logs_key.key_arn, name=self.logs_key_arn_export_name)

        # SageMaker's one log group for every transform job of the account and region (python -m endpoint_client
        # transform): owned here, so that it has a retention and the logs key (the execution role may not create it).
        self.transform_log_group = None
        if config.create_transform_log_group:
            self.transform_log_group = logs.LogGroup(
                self, "TransformJobLogs", log_group_name=TRANSFORM_LOG_GROUP, encryption_key=self.logs_key,
                retention=retention_days(config.endpoint_log_retention_days), removal_policy=retain_logs)

        # Statements in other stacks name paths in this bucket through this named export, so that cdk-nag's
        # finding ids for their prefix wildcards read '<stack>:ArtifactBucketArn/models/*' rather than a
        # generated export name (see bucket_objects_arn).
        self.bucket_arn_export_name = f"{self.stack_name}:ArtifactBucketArn"
        self.export_value(self.bucket.bucket_arn, name=self.bucket_arn_export_name)
        # What the build and endpoint stacks refer to, under the names CDK's automatic exports have.
        for value in (self.bucket.bucket_name, self.repository.repository_name, self.repository.repository_arn):
            self.export_value(value)

        self._allow_consumers(config)

        cdk.CfnOutput(self, "ArtifactBucketName", value=self.bucket.bucket_name,
                      description="Model archives (models/) and image-digest records (image-digests/)")
        cdk.CfnOutput(self, "ImageRepositoryUri", value=self.repository.repository_uri,
                      description="Adapter images and the mirrored llama.cpp DLC image; pin them by digest")

    def _allow_consumers(self, config: EnvironmentConfig) -> None:
        """Each environment whose artifacts_from names this one pulls the images and reads the model archives: the
        principal is its account, and the condition names exactly its endpoints' execution roles (never '*'). From
        another account the pull needs these statements and the roles' own identity statements
        (stacks/endpoint_stack.py) both; from this account the identity statements alone would allow it, and these
        say, here, who else reads. The bucket is SSE-S3 and the repository AES256, so no KMS key policy is
        involved."""
        for consumer in config.artifact_consumers:
            if not consumer.endpoint_kinds:
                continue
            account = consumer.account or cdk.Aws.ACCOUNT_ID
            roles = [f"arn:{cdk.Aws.PARTITION}:iam::{account}:role/{name}" for name in consumer.execution_role_names]
            only_its_execution_roles = {"ArnEquals": {"aws:PrincipalArn": roles}}
            sid = "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", consumer.name))
            pull = ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"]
            self.repository.add_to_resource_policy(iam.PolicyStatement(
                sid=f"{sid}EndpointsPullImages", principals=[iam.AccountPrincipal(account)], actions=pull,
                conditions=only_its_execution_roles))
            # SageMaker's CreateModel validates an image in another account's repository against the repository
            # policy's grant to its service principal (aws/deep-learning-containers#5657: "does not grant ... to
            # sagemaker.amazonaws.com service principal"); the grant holds only for SageMaker acting for the
            # consumer's account (aws:SourceAccount), and the pull itself still needs the statement above.
            self.repository.add_to_resource_policy(iam.PolicyStatement(
                sid=f"{sid}SageMakerPullsImages", principals=[iam.ServicePrincipal("sagemaker.amazonaws.com")],
                actions=pull, conditions={"StringEquals": {"aws:SourceAccount": account}}))
            self.bucket.add_to_resource_policy(iam.PolicyStatement(
                sid=f"{sid}EndpointsReadModelArchives", principals=[iam.AccountPrincipal(account)],
                actions=["s3:GetObject"], resources=[self.bucket.arn_for_objects(f"{MODEL_PREFIX}*")],
                conditions=only_its_execution_roles))

    def bucket_objects_arn(self, key_pattern: str) -> str:
        """ARN of the artifact-bucket objects matching key_pattern, for IAM statements in another stack."""
        return cdk.Fn.join("", [cdk.Fn.import_value(self.bucket_arn_export_name), "/", key_pattern])

    def archive_arn(self, model: ModelPin) -> str:
        """The pinned model archive's object ARN, for a statement in another stack: in this bucket, or in the bucket
        the pin names (an artifact source's, artifacts_from)."""
        if model.bucket is None:
            return self.bucket_objects_arn(model.s3_key)
        return f"arn:{cdk.Aws.PARTITION}:s3:::{model.bucket}/{model.s3_key}"

    def bucket_objects_finding(self, key_pattern: str) -> str:
        """The cdk-nag IAM5 finding id that bucket_objects_arn(key_pattern) raises when it has a wildcard."""
        return nag.wildcard_resource(f"{self.bucket_arn_export_name}/{key_pattern}")

    def logs_key_in(self, scope: Construct) -> kms.IKey:
        """The logs key in another stack, through its named export."""
        return kms.Key.from_key_arn(scope, "LogsKey", cdk.Fn.import_value(self.logs_key_arn_export_name))
