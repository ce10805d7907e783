"""The build stack: the CodeBuild projects that produce what cdk.json pins.

- ``ModelBuild``: packages ``build.model_pin`` with ``model_build/buildspec.yml`` into
  ``s3://<artifact bucket>/models/<pin>/<gguf sha256>/model.tar.gz``;
- ``CpuImageBuild`` / ``GpuImageBuild``: build ``container/`` with ``container/buildspec.yml`` (privileged:
  Docker) and push it to the image repository, recording the digest under ``image-digests/<flavor>/``;
- ``TextGenerationMirror``: copies the pinned llama.cpp DLC image into the image repository byte for byte
  (SageMaker pulls only from private ECR), so its digest stays the public one.

Sources are CDK assets (only ``model_build/`` resp. ``container/``), read from the bootstrap's asset bucket (with
``kms:Decrypt`` on its key, through S3, where ``bootstrap.kms_key_arn`` names a customer managed key). Log groups
are encrypted with the environment's logs key and retained where the environment retains its logs. Each project has a fixed name
(``<prefix>-model-build``, ``-cpu-image-build``, ``-gpu-image-build``, ``-text-generation-mirror``) and its own role,
which CodeBuild may assume only for that project of this account (``aws:SourceAccount``, ``aws:SourceArn``), and
that role has exactly the statements written here (tests/cdk/test_cdk_role_calls.py runs every call each build
makes against them): the projects get an immutable view of it, so CodeBuild's L2
construct cannot add its defaults (report groups, wildcard asset reads).
"""

from __future__ import annotations

import re
from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from stacks import nag
from stacks.artifacts_stack import IMAGE_TAG_PREFIXES, ArtifactsStack
from stacks.config import IMAGE_DIGEST_PREFIX, MODEL_PREFIX, EnvironmentConfig
from stacks.retention import retention_days
from stacks.roles import policy_of

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
BUILD_IMAGE = codebuild.LinuxBuildImage.STANDARD_7_0  # Ubuntu 22.04: Docker, Python 3.11, apt (skopeo)
# Never part of an image build's source: local wheels for podman tests, caches.
CONTAINER_SOURCE_EXCLUDES = ["wheels/*.whl", "**/__pycache__", "**/*.pyc", "**/*.egg-info"]
# The model build needs model_build/ at the root of its source and nothing else from the repository.
MODEL_SOURCE_EXCLUDES = ["*", "!model_build/", "!model_build/**", "**/__pycache__", "**/*.pyc"]

ECR_AUTH_REASON = ("ecr:GetAuthorizationToken has no resource-level permissions; the service requires "
                   "Resource '*'. Pulls and pushes are limited to the one image repository.")


class BuildStack(cdk.Stack):
    def __init__(self, scope: Construct, construct_id: str, *, config: EnvironmentConfig,
                 artifacts: ArtifactsStack, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self._config = config
        self._artifacts = artifacts
        bucket, repository = artifacts.bucket, artifacts.repository

        # The environment's logs key (artifacts stack): every project's log group is encrypted with it.
        self._logs_key = artifacts.logs_key_in(self)
        self.encryption_key = kms.Key(
            self, "BuildEncryptionKey", enable_key_rotation=True, pending_window=cdk.Duration.days(7),
            removal_policy=cdk.RemovalPolicy.DESTROY,
            description=f"{config.name_prefix}: encrypts the CodeBuild projects' build output")

        model_source = s3_assets.Asset(self, "ModelBuildSource", path=str(REPOSITORY_ROOT),
                                       exclude=MODEL_SOURCE_EXCLUDES, ignore_mode=cdk.IgnoreMode.GIT)
        self.model_project = self._project(
            "ModelBuild", description="Packages a pinned GGUF into models/<pin>/<gguf sha256>/model.tar.gz",
            source=model_source, buildspec="model_build/buildspec.yml",
            environment={"ARTIFACT_BUCKET": bucket.bucket_name, "MODEL_PIN": config.build.model_pin,
                         "OUTPUT_PREFIX": MODEL_PREFIX},
            compute=codebuild.ComputeType.MEDIUM, timeout=cdk.Duration.minutes(60))
        role = self.model_project.role_with_policies
        # model_build/README.md, "CodeBuild": exactly these rights on the model prefix.
        role.add_to_policy(iam.PolicyStatement(
            sid="WriteModelArchives", actions=["s3:PutObject", "s3:GetObject", "s3:AbortMultipartUpload"],
            resources=[artifacts.bucket_objects_arn(f"{MODEL_PREFIX}*")]))
        role.add_to_policy(iam.PolicyStatement(
            sid="ListModelPrefix", actions=["s3:ListBucket"], resources=[cdk.Fn.import_value(
                artifacts.bucket_arn_export_name)],
            conditions={"StringLike": {"s3:prefix": [f"{MODEL_PREFIX}*"]}}))
        nag.acknowledge(role, artifacts.bucket_objects_finding(f"{MODEL_PREFIX}*"),
                        "The archive key is models/<pin>/<gguf sha256>/model.tar.gz, chosen per build; the role may "
                        "write under the models/ prefix only (put, head/get, abort its multipart upload).")

        container_source = s3_assets.Asset(self, "ContainerSource", path=str(REPOSITORY_ROOT / "container"),
                                           exclude=CONTAINER_SOURCE_EXCLUDES)
        self.image_projects: dict[str, _Project] = {}
        for flavor, timeout, title in (("cpu", 90, "CPU"), ("gpu", 240, "GPU (CUDA)")):
            project = self._project(
                f"{flavor.capitalize()}ImageBuild", description=f"Builds and pushes the {title} adapter image",
                source=container_source, buildspec="buildspec.yml",
                environment={"REPOSITORY_URI": repository.repository_uri, "IMAGE_FLAVOR": flavor,
                             "ARTIFACT_BUCKET": bucket.bucket_name, "DIGEST_PREFIX": IMAGE_DIGEST_PREFIX},
                # docker build and push need the Docker daemon, which CodeBuild runs only in privileged mode.
                compute=codebuild.ComputeType.LARGE, timeout=cdk.Duration.minutes(timeout), privileged=True)
            role = project.role_with_policies
            repository.grant_pull_push(role)
            # container/buildspec.yml reads the pushed manifest's media type and digest back from ECR.
            repository.grant(role, "ecr:DescribeImages")
            digest_records = f"{IMAGE_DIGEST_PREFIX}{flavor}/*"
            role.add_to_policy(iam.PolicyStatement(
                sid="RecordImageDigests", actions=["s3:PutObject"],
                resources=[artifacts.bucket_objects_arn(digest_records)]))
            # container/buildspec.yml logs in to public ECR: authenticated pulls of the DLC base image are not
            # rate-limited like anonymous ones.
            role.add_to_policy(iam.PolicyStatement(
                sid="PublicEcrLogin", actions=["ecr-public:GetAuthorizationToken", "sts:GetServiceBearerToken"],
                resources=["*"]))
            nag.acknowledge(role, "AwsSolutions-IAM5[Resource::*]",
                            f"{ECR_AUTH_REASON} ecr-public:GetAuthorizationToken and sts:GetServiceBearerToken "
                            "(public ECR login for the base image) have no resource-level permissions either.")
            nag.acknowledge(role, artifacts.bucket_objects_finding(digest_records),
                            f"Each build writes image-digests/{flavor}/<unique tag>.json and latest.json; the tag "
                            "is made at build time, so the role may put objects under that prefix only.")
            self.image_projects[flavor] = project

        self.mirror_project = self._project(
            "TextGenerationMirror",
            description="Copies the pinned llama.cpp DLC image into the image repository (digest preserved)",
            source=None, buildspec=_mirror_buildspec(),
            environment={"SOURCE_IMAGE": config.build.text_generation_source_image,
                         "REPOSITORY_URI": repository.repository_uri,
                         "REPOSITORY_NAME": repository.repository_name,
                         "TAG_PREFIX": IMAGE_TAG_PREFIXES["text_generation"]},
            compute=codebuild.ComputeType.SMALL, timeout=cdk.Duration.minutes(30))
        role = self.mirror_project.role_with_policies
        repository.grant_pull_push(role)
        repository.grant(role, "ecr:DescribeImages")
        nag.acknowledge(role, "AwsSolutions-IAM5[Resource::*]", ECR_AUTH_REASON)

        for name, project in (("ModelBuildProject", self.model_project), ("CpuImageBuildProject",
                              self.image_projects["cpu"]), ("GpuImageBuildProject", self.image_projects["gpu"]),
                              ("TextGenerationMirrorProject", self.mirror_project)):
            cdk.CfnOutput(self, name, value=project.project.project_name,
                          description="aws codebuild start-build --project-name <this>")

    def _project(self, construct_id: str, *, description: str, source: s3_assets.Asset | None,
                 buildspec: str | codebuild.BuildSpec, environment: dict[str, str],
                 compute: codebuild.ComputeType, timeout: cdk.Duration, privileged: bool = False) -> "_Project":
        # A fixed name, so that the role's trust can name its one project (the name is ModelBuild ->
        # <prefix>-model-build, CpuImageBuild -> <prefix>-cpu-image-build, ...).
        project_name = f"{self._config.name_prefix}-{_kebab(construct_id)}"
        project_arn = cdk.Arn.format(cdk.ArnComponents(service="codebuild", resource="project",
                                                       resource_name=project_name), self)
        # Confused-deputy protection: CodeBuild may assume the role only for this account's project of that name.
        role = iam.Role(self, f"{construct_id}Role", assumed_by=iam.ServicePrincipal(
            "codebuild.amazonaws.com", conditions={"StringEquals": {"aws:SourceAccount": cdk.Aws.ACCOUNT_ID},
                                                   "ArnLike": {"aws:SourceArn": project_arn}}),
            description=f"{self._config.name_prefix}: {description}")
        log_group = logs.LogGroup(self, f"{construct_id}Logs", encryption_key=self._logs_key,
                                  removal_policy=(cdk.RemovalPolicy.RETAIN if self._config.retain_logs
                                                  else cdk.RemovalPolicy.DESTROY),
                                  retention=retention_days(self._config.build.log_retention_days))
        log_group.grant_write(role)
        self.encryption_key.grant(role, "kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey")
        if source is not None:
            # CodeBuild downloads the asset zip: that one object, plus the bucket's location and ACL.
            role.add_to_policy(iam.PolicyStatement(
                sid="ReadSource", actions=["s3:GetObject", "s3:GetObjectVersion"],
                resources=[source.bucket.arn_for_objects(source.s3_object_key)]))
            role.add_to_policy(iam.PolicyStatement(
                sid="LocateSourceBucket", actions=["s3:GetBucketLocation", "s3:GetBucketAcl"],
                resources=[source.bucket.bucket_arn]))
            bootstrap_key = self._config.bootstrap.kms_key_arn
            if bootstrap_key is not None:
                # The bootstrap's asset bucket is encrypted with a customer managed key (cdk bootstrap
                # --bootstrap-kms-key-id / --bootstrap-customer-key): reading the source object decrypts with it,
                # through S3 only.
                role.add_to_policy(iam.PolicyStatement(
                    sid="DecryptSource", actions=["kms:Decrypt"], resources=[bootstrap_key],
                    conditions={"StringEquals": {"kms:ViaService": f"s3.{self.region}.amazonaws.com"}}))
        project = codebuild.Project(
            self, construct_id, project_name=project_name,
            description=f"{self._config.name_prefix}: {description}",
            role=role.without_policy_updates(),
            source=None if source is None else codebuild.Source.s3(bucket=source.bucket, path=source.s3_object_key),
            build_spec=(codebuild.BuildSpec.from_source_filename(buildspec) if isinstance(buildspec, str)
                        else buildspec),
            environment=codebuild.BuildEnvironment(build_image=BUILD_IMAGE, compute_type=compute,
                                                   privileged=privileged),
            environment_variables={name: codebuild.BuildEnvironmentVariable(value=value)
                                   for name, value in environment.items()},
            logging=codebuild.LoggingOptions(cloud_watch=codebuild.CloudWatchLoggingOptions(log_group=log_group)),
            encryption_key=self.encryption_key,
            timeout=timeout,
        )
        # The role's policy must exist before CloudFormation creates the project (CodeBuild checks the role).
        project.node.add_dependency(policy_of(role))
        return _Project(project=project, role_with_policies=role, log_group=log_group)


def _kebab(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "-", name).lower()


class _Project:
    """A CodeBuild project with the role whose policies it runs with and its log group."""

    def __init__(self, *, project: codebuild.Project, role_with_policies: iam.Role, log_group: logs.LogGroup):
        self.project, self.role_with_policies, self.log_group = project, role_with_policies, log_group


DOCKER_V2_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


def _mirror_buildspec() -> codebuild.BuildSpec:
    # skopeo copies registry to registry without a Docker daemon (no privileged mode). SageMaker pulls only Docker
    # schema 2 manifests: a source that is one is copied byte for byte (the mirror keeps its digest, checked); an
    # OCI manifest, or an index of several platforms, is copied as the linux/amd64 image converted to Docker schema
    # 2, which gives it a digest of its own. Either way the build fails unless ECR reports the pushed manifest as
    # Docker schema 2, and it prints the digest to pin.
    return codebuild.BuildSpec.from_object({
        "version": "0.2",
        "env": {"shell": "bash"},
        "phases": {
            "install": {"commands": [
                "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q skopeo >/dev/null"]},
            "build": {"commands": [_MIRROR_SCRIPT]},
        },
    })


_MIRROR_SCRIPT = f"""set -euo pipefail
DOCKER_V2="{DOCKER_V2_MANIFEST}"
SOURCE_DIGEST="${{SOURCE_IMAGE##*@}}"; TAG="${{TAG_PREFIX}}${{SOURCE_DIGEST#sha256:}}"; TAG="${{TAG:0:128}}"
REGISTRY="${{REPOSITORY_URI%%/*}}"
aws ecr get-login-password --region "$AWS_REGION" | skopeo login --username AWS --password-stdin "$REGISTRY"
SOURCE_TYPE="$(skopeo inspect --raw "docker://$SOURCE_IMAGE" | python3 -c 'import json, sys; print(json.load(sys.stdin).get("mediaType", "application/vnd.oci.image.manifest.v1+json"))')"
if aws ecr describe-images --repository-name "$REPOSITORY_NAME" --image-ids imageTag="$TAG" >/dev/null 2>&1; then
  echo "$SOURCE_IMAGE is already in $REPOSITORY_NAME as $TAG"
elif [ "$SOURCE_TYPE" = "$DOCKER_V2" ]; then
  skopeo copy --retry-times 3 "docker://$SOURCE_IMAGE" "docker://$REPOSITORY_URI:$TAG"
else
  echo "$SOURCE_IMAGE is $SOURCE_TYPE: copying its linux/amd64 image as a Docker schema 2 manifest (a new digest)"
  skopeo copy --retry-times 3 --override-os linux --override-arch amd64 --format v2s2 \\
    "docker://$SOURCE_IMAGE" "docker://$REPOSITORY_URI:$TAG"
fi
PUSHED="$(aws ecr describe-images --repository-name "$REPOSITORY_NAME" --image-ids imageTag="$TAG" \\
  --query 'imageDetails[0].[imageManifestMediaType,imageDigest]' --output text)"
read -r MEDIA_TYPE DIGEST <<<"$PUSHED"
if [ "$MEDIA_TYPE" != "$DOCKER_V2" ]; then
  echo "mirror: $REPOSITORY_URI:$TAG is $MEDIA_TYPE; SageMaker accepts only $DOCKER_V2" >&2; exit 1
fi
if [ "$SOURCE_TYPE" = "$DOCKER_V2" ] && [ "$DIGEST" != "$SOURCE_DIGEST" ]; then
  echo "mirror: digest changed to $DIGEST" >&2; exit 1
fi
echo "Mirrored $SOURCE_IMAGE as $REPOSITORY_URI@$DIGEST"
echo "Pin it in cdk.json under environments.<env>.pins.images:"
echo "  \\"text_generation\\": \\"$DIGEST\\""
"""
