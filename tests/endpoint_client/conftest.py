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
from stacks.config import TRANSFORM_LOG_GROUP


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
