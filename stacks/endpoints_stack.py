"""The endpoints stack: the SageMaker execution role and one endpoint per enabled, fully pinned kind.

- ``cpu``: the decision adapter (CPU image) on ``cpu.instance_type``;
- ``gpu``: the decision adapter (GPU image) on ordered ``gpu.instance_pools`` with a provisioning timeout and
  the pinned inference AMI, and no InstanceType;
- ``text_generation``: llama.cpp's ``llama-server`` from the llama.cpp DLC image (OpenAI chat completions at
  ``/invocations``), configured through ``SM_LLAMA_CPP_*`` variables.

All three serve the same pinned ``model.tar.gz``. An enabled endpoint whose image or model is not pinned yet is
left out with a synth warning that names the keys to set; with none pinned the stack holds only a no-op
placeholder (AWS::CloudFormation::WaitConditionHandle).
"""

from __future__ import annotations

import hashlib

import aws_cdk as cdk
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from stacks import instance_types, nag
from stacks.artifacts_stack import ArtifactsStack
from stacks.config import EnvironmentConfig, ImagePin
from stacks.endpoint import SageMakerEndpoint, Variant

ENDPOINT_SUFFIXES = {"cpu": "cpu", "gpu": "gpu", "text_generation": "text-generation"}
CONSTRUCT_IDS = {"cpu": "CpuEndpoint", "gpu": "GpuEndpoint", "text_generation": "TextGenerationEndpoint"}


class EndpointsStack(cdk.Stack):
    def __init__(self, scope: Construct, construct_id: str, *, config: EnvironmentConfig,
                 artifacts: ArtifactsStack, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self._config, self._artifacts = config, artifacts
        self.endpoints: dict[str, SageMakerEndpoint] = {}

        kinds = []
        for kind in config.endpoints:
            missing = config.missing_pins(kind)
            if missing:
                cdk.Annotations.of(self).add_warning_v2(
                    f"decision-models:unpinned-{kind}",
                    f"The {kind} endpoint is left out until {' and '.join(missing)} "
                    f"{'is' if len(missing) == 1 else 'are'} set in cdk.json (README.md, Deploy).")
            else:
                kinds.append(kind)
        if not kinds:
            # A template needs one resource. This one does nothing and costs nothing; it keeps the stack
            # deployable (and diffable) until the first endpoint is pinned.
            cdk.CfnWaitConditionHandle(self, "NoEndpointPinnedYet")
            return

        self.execution_role = iam.Role(
            self, "ExecutionRole", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
            description=f"{config.name_prefix}: SageMaker endpoints read the pinned model archive and pull the "
                        f"pinned images")
        nag.acknowledge(self.execution_role, "AwsSolutions-IAM5[Resource::*]",
                        "ecr:GetAuthorizationToken has no resource-level permissions; the service requires "
                        "Resource '*'. Image pulls are limited to the pinned images' repositories.")
        model = config.pins.model
        self.execution_role.add_to_policy(iam.PolicyStatement(
            sid="ReadPinnedModelArchive", actions=["s3:GetObject"],
            resources=[artifacts.bucket_objects_arn(model.s3_key)]))
        model_data_url = f"s3://{artifacts.bucket.bucket_name}/{model.s3_key}"

        # SageMaker refuses a volume key on instances with local NVMe storage (encrypted in hardware), so only
        # EBS-backed variants get one.
        variants = {kind: self._variant(kind) for kind in kinds}
        ebs_backed = {kind: not any(map(instance_types.has_instance_storage, variant.instance_types))
                      for kind, variant in variants.items()}
        self.volume_key = None
        if any(ebs_backed.values()):
            self.volume_key = kms.Key(
                self, "VolumeKey", enable_key_rotation=True, pending_window=cdk.Duration.days(7),
                removal_policy=cdk.RemovalPolicy.DESTROY,
                description=f"{config.name_prefix}: encrypts the EBS volumes of the SageMaker endpoints")

        pulled: dict[str, ecr.IRepository] = {}
        for kind in kinds:
            variant = variants[kind]
            image = getattr(config.pins.images, kind)
            image_uri = self._image_uri(image, pulled)
            settings = getattr(config, kind)
            endpoint = SageMakerEndpoint(
                self, CONSTRUCT_IDS[kind],
                endpoint_name=f"{config.name_prefix}-{ENDPOINT_SUFFIXES[kind]}",
                image_uri=image_uri, model_data_url=model_data_url, environment=self._environment(kind),
                execution_role=self.execution_role, variant=variant, settings=settings,
                volume_key=self.volume_key if ebs_backed[kind] else None,
                log_retention_days=config.endpoint_log_retention_days,
                tags={"endpoint-kind": kind, "image-digest": image.digest,
                      "model-gguf-sha256": model.gguf_sha256})
            self.endpoints[kind] = endpoint
            cdk.CfnOutput(self, f"{endpoint.node.id}Name", value=endpoint.endpoint.attr_endpoint_name,
                          description=f"python -m endpoint_client --endpoint-name <this> ({kind})")

    def _variant(self, kind: str) -> Variant:
        if kind == "gpu":
            gpu = self._config.gpu
            return Variant(instance_pools=gpu.instance_pools, provision_timeout_s=gpu.provision_timeout_s,
                           inference_ami_version=gpu.inference_ami_version)
        return Variant(instance_type=getattr(self._config, kind).instance_type)

    def _environment(self, kind: str) -> dict[str, str]:
        config = self._config
        if kind == "cpu":
            # container/decision_adapter/settings.py; the CPU image reads the model from /opt/ml/model.
            return {"ADAPTER_THREADS": str(config.cpu.threads), "ADAPTER_GPU_LAYERS": "0"}
        if kind == "gpu":
            # The GPU image also defaults to -1; stating it keeps the Model's intent in the template.
            return {"ADAPTER_GPU_LAYERS": "-1"}
        text = config.text_generation
        pin_name = config.pins.model.s3_key.split("/")[1]
        # The DLC entrypoint turns SM_LLAMA_CPP_FOO_BAR=v into llama-server --foo-bar v; it finds the GGUF in
        # SM_LLAMA_CPP_MODEL_DIR.
        return {"SM_LLAMA_CPP_MODEL_DIR": "/opt/ml/model", "SM_LLAMA_CPP_CTX_SIZE": str(text.ctx_size),
                "SM_LLAMA_CPP_THREADS": str(text.threads), "SM_LLAMA_CPP_PARALLEL": str(text.parallel),
                "SM_LLAMA_CPP_ALIAS": pin_name}

    def _image_uri(self, image: ImagePin, pulled: dict[str, ecr.IRepository]) -> str:
        """The image URI of a pin; the execution role may pull from each pinned repository."""
        if image.repository is None:
            key, uri = "project", self._artifacts.repository.repository_uri_for_digest(image.digest)
        else:
            key, uri = image.repository.arn, f"{image.repository.uri}@{image.digest}"
        if key not in pulled:
            pulled[key] = self._artifacts.repository if image.repository is None else ecr.Repository.from_repository_arn(
                self, "PinnedRepository" + hashlib.sha256(key.encode()).hexdigest()[:8], key)
            pulled[key].grant_pull(self.execution_role)
        return uri
