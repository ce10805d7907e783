"""A moto server on loopback with a deployed-looking environment: the artifacts stack's bucket and repository
(and its outputs), pushed images, an uploaded model archive, and an endpoint stack with its Model."""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest

import loopback_servers
from registry_testkit import ACCOUNT, FAKE_CREDENTIALS, REGION, REPOSITORY_ROOT, manifest, push
from stacks.config import TRANSFORM_LOG_GROUP, image_kind


@pytest.fixture(scope="session")
def moto_server():
    with loopback_servers.moto_server() as url:
        yield url


@pytest.fixture
def aws_environment(monkeypatch):
    for name in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in FAKE_CREDENTIALS.items():
        monkeypatch.setenv(name, value)


@dataclass
class Deployment:
    """One environment as it would look deployed: names, pins and a cdk.json that pins them."""
    url: str
    root: Path
    prefix: str
    bucket: str
    repository: str
    digests: dict[str, str]
    model_key: str
    model_sha256: str

    def client(self, service: str):
        return boto3.client(service, region_name=REGION, endpoint_url=self.url)

    @property
    def cdk_json(self) -> Path:
        return self.root / "cdk.json"

    def write_cdk_json(self, edit=None) -> Path:
        cdk_json = json.loads((REPOSITORY_ROOT / "cdk.json").read_text())
        environment = cdk_json["context"]["environments"]["dev"]
        environment["region"] = REGION
        environment["pins"] = {"images": copy.deepcopy(self.digests),
                               "model": {"s3_key": self.model_key, "gguf_sha256": self.model_sha256}}
        if edit is not None:
            edit(environment)
        self.cdk_json.write_text(json.dumps(cdk_json))
        return self.cdk_json

    def args(self, *extra: str) -> list[str]:
        return ["-c", "env=dev", "--cdk-json", str(self.cdk_json), "--endpoint-url", self.url, *extra]


def _stack(cloudformation, name: str, outputs: dict[str, str]) -> None:
    template = {"Resources": {"Placeholder": {"Type": "AWS::SNS::Topic"}},
                "Outputs": {key: {"Value": value} for key, value in outputs.items()}}
    cloudformation.create_stack(StackName=name, TemplateBody=json.dumps(template))


@pytest.fixture
def deployment(moto_server, aws_environment, tmp_path, request):
    """A fresh deployment per test: resource names carry the test's name, so tests do not see each other's."""
    tag = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:16]
    prefix = "decision-dev"
    bucket, repository = f"artifacts-{tag}", f"images-{tag}"
    s3 = boto3.client("s3", region_name=REGION, endpoint_url=moto_server)
    ecr = boto3.client("ecr", region_name=REGION, endpoint_url=moto_server)
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})   # as the stack's
    ecr.create_repository(repositoryName=repository, imageTagMutability="IMMUTABLE")
    digests = {}
    for kind, seed, tag_prefix in (("cpu", "1", "cpu-"), ("gpu", "2", "gpu-"), ("text_generation", "3", "textgen-")):
        digests[kind] = push(ecr, repository, manifest(seed + tag[:1]), f"{tag_prefix}20260101T000000Z")
    model_sha256 = "4" * 64
    model_key = f"models/qwen3.5-4b/{model_sha256}/model.tar.gz"
    s3.put_object(Bucket=bucket, Key=model_key, Body=b"archive")
    (tmp_path / "model_build").mkdir()
    shutil.copy(REPOSITORY_ROOT / "model_build" / "pins.json", tmp_path / "model_build" / "pins.json")
    cloudformation = boto3.client("cloudformation", region_name=REGION, endpoint_url=moto_server)
    for name in [s["StackName"] for s in cloudformation.describe_stacks()["Stacks"]]:
        cloudformation.delete_stack(StackName=name)
    # The artifacts stack owns SageMaker's transform log group (create_transform_log_group); moto's server is shared,
    # so a test that removed it gets it back.
    logs = boto3.client("logs", region_name=REGION, endpoint_url=moto_server)
    if not logs.describe_log_groups(logGroupNamePrefix=TRANSFORM_LOG_GROUP)["logGroups"]:
        logs.create_log_group(logGroupName=TRANSFORM_LOG_GROUP)
    _stack(cloudformation, f"{prefix}-artifacts", {
        "ArtifactBucketName": bucket, "ImageRepositoryUri": f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/{repository}"})
    found = Deployment(url=moto_server, root=tmp_path, prefix=prefix, bucket=bucket, repository=repository,
                       digests=digests, model_key=model_key, model_sha256=model_sha256)
    found.write_cdk_json()
    return found


@pytest.fixture
def endpoint_stack(deployment):
    """The CPU endpoint stack with its Model (as CloudFormation names it) and outputs."""
    sagemaker = deployment.client("sagemaker")
    model_name = f"EndpointModel-{deployment.bucket[-12:]}"
    sagemaker.create_model(ModelName=model_name, ExecutionRoleArn=f"arn:aws:iam::{ACCOUNT}:role/execution",
                           PrimaryContainer={"Image": f"{deployment.repository}@{deployment.digests['cpu']}"})
    _stack(deployment.client("cloudformation"), f"{deployment.prefix}-endpoint-cpu", {
        "EndpointName": f"{deployment.prefix}-cpu", "ModelName": model_name, "TransformInstanceType": "ml.c7i.xlarge"})
    return model_name


class Serving:
    """dev's endpoints as its endpoint stacks deploy them on moto (Model -> EndpointConfig -> Endpoint, the image by
    digest in the artifacts stack's repository, the archive in its bucket), its monitoring stack's topic and each
    endpoint's DiskUtilization alarm: what ``acceptance`` checks and ``promote`` reads."""

    KINDS = ("cpu", "gpu", "text_generation", "async")

    def __init__(self, deployment: Deployment):
        self.deployment = deployment
        self.sagemaker = deployment.client("sagemaker")
        self.cloudwatch = deployment.client("cloudwatch")
        self.deploys = 0

    @staticmethod
    def endpoint_name(kind: str) -> str:
        return f"decision-dev-{kind.replace('_', '-')}"

    def image(self, digest: str) -> str:
        return f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/{self.deployment.repository}@{digest}"

    @property
    def model_data_url(self) -> str:
        return f"s3://{self.deployment.bucket}/{self.deployment.model_key}"

    def deploy(self, kind: str, digest: str | None = None) -> None:
        """(Re)deploy the kind's endpoint with a new Model and EndpointConfig (moto has no UpdateEndpoint: the
        endpoint is deleted and created again under its name)."""
        self.deploys += 1
        name, unique = self.endpoint_name(kind), f"{self.deployment.bucket[-16:]}-{self.deploys}"
        self.sagemaker.create_model(
            ModelName=f"EndpointModel-{unique}", ExecutionRoleArn=f"arn:aws:iam::{ACCOUNT}:role/execution",
            PrimaryContainer={"Image": self.image(digest or self.deployment.digests[image_kind(kind)]),
                              "ModelDataUrl": self.model_data_url})
        self.sagemaker.create_endpoint_config(EndpointConfigName=f"EndpointConfig-{unique}", ProductionVariants=[{
            "VariantName": "AllTraffic", "ModelName": f"EndpointModel-{unique}", "InitialInstanceCount": 1,
            "InstanceType": "ml.c5.xlarge"}])
        self.remove(kind)
        self.sagemaker.create_endpoint(EndpointName=name, EndpointConfigName=f"EndpointConfig-{unique}")
        self.cloudwatch.put_metric_alarm(
            AlarmName=f"{name}-DiskUtilization", Namespace="/aws/sagemaker/Endpoints", MetricName="DiskUtilization",
            Dimensions=[{"Name": "EndpointName", "Value": name}, {"Name": "VariantName", "Value": "AllTraffic"}],
            Statistic="Maximum", Period=300, EvaluationPeriods=1, Threshold=85, ComparisonOperator="GreaterThanThreshold")

    def remove(self, kind: str) -> None:
        name = self.endpoint_name(kind)
        if any(e["EndpointName"] == name for e in self.sagemaker.list_endpoints(NameContains=name)["Endpoints"]):
            self.sagemaker.delete_endpoint(EndpointName=name)
        self.cloudwatch.delete_alarms(AlarmNames=[f"{name}-DiskUtilization"])

    def set_status(self, kind: str, status: str) -> None:
        """An endpoint state moto never enters by itself (it implements no UpdateEndpoint), set in its backend: the
        server runs in this process."""
        from moto.sagemaker.models import sagemaker_backends
        sagemaker_backends[ACCOUNT][REGION].endpoints[self.endpoint_name(kind)].endpoint_status = status


@pytest.fixture
def serving(deployment):
    """dev deployed: its three endpoints in service, alarmed, with the monitoring stack's topic."""
    (deployment.root / "examples").mkdir()
    shutil.copy(REPOSITORY_ROOT / "examples" / "support-route.json", deployment.root / "examples")
    topic = deployment.client("sns").create_topic(Name=f"alarms-{deployment.bucket}")["TopicArn"]
    _stack(deployment.client("cloudformation"), f"{deployment.prefix}-monitoring", {"AlarmTopicArn": topic})
    found = Serving(deployment)
    for kind in Serving.KINDS:
        found.deploy(kind)
    forget_moto_answers()
    yield found
    for kind in Serving.KINDS:
        found.remove(kind)
    forget_moto_answers()


def forget_moto_answers() -> None:
    """moto answers a repeated InvokeEndpoint (the same body: behind its server it files every endpoint's answers
    under None) with the answer it gave first, and keeps answers queued for later calls: a test that ran earlier in
    this process (xdist puts modules side by side) would answer this one's example request, and this one's a later
    test's. Forget both, before and after (the server runs in this process)."""
    from moto.sagemakerruntime.models import sagemakerruntime_backends
    backend = sagemakerruntime_backends[ACCOUNT][REGION]
    backend.results.clear()
    backend.results_queue.clear()
