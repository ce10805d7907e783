"""The API calls the endpoint templates imply, checked against botocore's service models (boto3 1.44.8).

CloudFormation passes these resources' properties to SageMaker's CreateModel / CreateEndpointConfig /
CreateEndpoint (and UpdateEndpoint when a pin changes: RetainAllVariantProperties and the DeploymentConfig),
Application Auto Scaling's RegisterScalableTarget / PutScalingPolicy, CloudWatch's PutMetricAlarm and CloudWatch
Logs' PutMetricFilter. Each endpoint template is resolved with realistic placeholder values for references, turned
into those requests and validated: botocore's ParamValidator catches unknown field names, wrong types and
out-of-range numbers or lengths; the enums (instance types, AMI versions, metric types, deployment types) and
patterns that ParamValidator leaves out are checked here as well.
"""

from __future__ import annotations

import re
from typing import Any

import botocore.session
import pytest
from botocore.model import Shape
from botocore.validate import ParamValidator

import cdk_testkit

ACCOUNT, REGION = "123456789012", "us-east-1"
PSEUDO = {"AWS::Partition": "aws", "AWS::Region": REGION, "AWS::AccountId": ACCOUNT, "AWS::URLSuffix": "amazonaws.com",
          "AWS::StackName": "stack"}
SESSION = botocore.session.get_session()
SAGEMAKER = SESSION.get_service_model("sagemaker")
AUTOSCALING = SESSION.get_service_model("application-autoscaling")
CLOUDWATCH = SESSION.get_service_model("cloudwatch")
LOGS = SESSION.get_service_model("logs")


class Resolver:
    """Resolves CloudFormation intrinsics of one template to the values they would have in an account."""

    def __init__(self, template: dict[str, Any]):
        self.resources = template["Resources"]

    def __call__(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self(v) for v in value]
        if not isinstance(value, dict):
            return value
        if len(value) != 1 or not next(iter(value)).startswith(("Fn::", "Ref")):
            return {k: self(v) for k, v in value.items()}
        (function, argument), = value.items()
        if function == "Ref":
            return PSEUDO.get(argument) or self.ref(argument)
        if function == "Fn::GetAtt":
            return self.get_att(*argument)
        if function == "Fn::Join":
            return argument[0].join(str(self(part)) for part in argument[1])
        if function == "Fn::Select":
            return self(argument[1])[int(argument[0])]
        if function == "Fn::Split":
            return str(self(argument[1])).split(argument[0])
        if function == "Fn::Sub":
            return re.sub(r"\$\{([^}]+)\}", lambda m: PSEUDO[m[1]], argument)
        if function == "Fn::ImportValue":
            return self.imported(argument)
        raise AssertionError(f"unexpected intrinsic {function}")

    def ref(self, logical_id: str) -> str:
        resource = self.resources[logical_id]
        if resource["Type"] == "AWS::ApplicationAutoScaling::ScalableTarget":
            return logical_id
        if resource["Type"] == "AWS::Logs::LogGroup":
            return resource["Properties"]["LogGroupName"]
        if resource["Type"] == "AWS::CloudWatch::Alarm":
            return resource["Properties"].get("AlarmName") or f"stack-{logical_id[:40]}-A1B2C3D4E5F6"
        if resource["Type"] == "AWS::SNS::Topic":      # its Ref is its ARN
            return f"arn:aws:sns:{REGION}:{ACCOUNT}:stack-{logical_id[:40]}-A1B2C3D4E5F6"
        return f"{logical_id.lower()[:40]}-a1b2c3"

    def get_att(self, logical_id: str, attribute: str) -> str:
        resource = self.resources[logical_id]
        name = f"{logical_id[:40]}-A1B2C3D4"
        return {
            ("AWS::IAM::Role", "Arn"): f"arn:aws:iam::{ACCOUNT}:role/{name}",
            ("AWS::KMS::Key", "Arn"): f"arn:aws:kms:{REGION}:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab",
            ("AWS::SageMaker::Model", "ModelName"): name,
            ("AWS::SageMaker::EndpointConfig", "EndpointConfigName"): name,
            ("AWS::SageMaker::Endpoint", "EndpointName"): resource["Properties"].get("EndpointName", name),
            ("AWS::Logs::LogGroup", "Arn"): f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{name}:*",
            ("AWS::CloudWatch::Alarm", "Arn"): f"arn:aws:cloudwatch:{REGION}:{ACCOUNT}:alarm:{self.ref(logical_id)}",
            ("AWS::ApplicationAutoScaling::ScalingPolicy", "Arn"):
                f"arn:aws:autoscaling:{REGION}:{ACCOUNT}:scalingPolicy:1234abcd-12ab-34cd-56ef-1234567890ab:resource/"
                f"sagemaker/endpoint/x/variant/AllTraffic:policyName/{logical_id.lower()}",
        }[(resource["Type"], attribute)]

    @staticmethod
    def imported(export_name: str) -> str:
        bucket, repository = "decision-artifacts-artifactbucket-1a2b3c4d5e6f", "decision-artifacts-imagerepository-1a2b"
        if export_name.endswith(":ArtifactBucketArn"):
            return f"arn:aws:s3:::{bucket}"
        if "RefArtifactBucket" in export_name:
            return bucket
        if "RefImageRepository" in export_name:
            return repository
        if "ImageRepository" in export_name and "Arn" in export_name:
            return f"arn:aws:ecr:{REGION}:{ACCOUNT}:repository/{repository}"
        if export_name.endswith(":LogsKeyArn"):
            return f"arn:aws:kms:{REGION}:{ACCOUNT}:key/1a2b3c4d-1a2b-1a2b-1a2b-1a2b3c4d5e6f"
        if "RefAlarmTopic" in export_name:
            return f"arn:aws:sns:{REGION}:{ACCOUNT}:decision-monitoring-AlarmTopic-1A2B3C4D"
        raise AssertionError(f"unexpected import {export_name}")


def problems(service, operation: str, params: dict[str, Any]) -> list[str]:
    shape = service.operation_model(operation).input_shape
    report = ParamValidator().validate(params, shape)
    found = [report.generate_report()] if report.has_errors() else []
    found += constraint_problems(params, shape, operation)
    return found


def constraint_problems(value: Any, shape: Shape, path: str) -> list[str]:
    """The checks botocore's ParamValidator leaves out: maxima, enums and patterns."""
    found = []
    maximum = shape.metadata.get("max")
    if maximum is not None:
        size = value if shape.type_name in ("integer", "long", "float", "double") else len(value)
        if size > maximum:
            found.append(f"{path}: {value!r} is above {shape.name}'s maximum {maximum}")
    if shape.type_name == "structure" and isinstance(value, dict):
        for name, member in shape.members.items():
            if name in value:
                found += constraint_problems(value[name], member, f"{path}.{name}")
    elif shape.type_name == "list" and isinstance(value, list):
        for index, item in enumerate(value):
            found += constraint_problems(item, shape.member, f"{path}[{index}]")
    elif shape.type_name == "map" and isinstance(value, dict):
        for key, item in value.items():
            found += constraint_problems(key, shape.key, f"{path} key")
            found += constraint_problems(item, shape.value, f"{path}.{key}")
    elif shape.type_name == "string" and isinstance(value, str):
        if shape.enum and value not in shape.enum:
            found.append(f"{path}: {value!r} is not one of {shape.name}'s {len(shape.enum)} values")
        pattern = shape.metadata.get("pattern")
        if pattern:
            try:
                compiled = re.compile(pattern)
            except re.error:
                compiled = None
            if compiled is not None and not compiled.fullmatch(value):
                found.append(f"{path}: {value!r} does not match {shape.name}'s pattern {pattern}")
    return found


def camel(value: Any) -> Any:
    """CloudFormation's PascalCase keys as CloudWatch Logs' API spells them (camelCase)."""
    if isinstance(value, dict):
        return {key[0].lower() + key[1:]: camel(item) for key, item in value.items()}
    if isinstance(value, list):
        return [camel(item) for item in value]
    return value


def requests_of(template: dict[str, Any]) -> list[tuple[Any, str, dict[str, Any]]]:
    """(service model, operation, params) for every endpoint resource of a template."""
    resolve = Resolver(template)
    calls = []
    for logical_id, resource in template["Resources"].items():
        properties = resolve(resource.get("Properties", {}))
        kind = resource["Type"]
        if kind == "AWS::SageMaker::Model":
            calls.append((SAGEMAKER, "CreateModel", {"ModelName": resolve.get_att(logical_id, "ModelName"),
                                                      **properties}))
        elif kind == "AWS::SageMaker::EndpointConfig":
            calls.append((SAGEMAKER, "CreateEndpointConfig", {
                "EndpointConfigName": resolve.get_att(logical_id, "EndpointConfigName"), **properties}))
        elif kind == "AWS::SageMaker::Endpoint":
            # Creation takes the name, config, deployment config and tags; an update (a new pin: a new
            # EndpointConfig) also the variant-retention flags, and no tags.
            update_only = ("RetainAllVariantProperties", "ExcludeRetainedVariantProperties", "RetainDeploymentConfig")
            calls.append((SAGEMAKER, "CreateEndpoint", {k: v for k, v in properties.items() if k not in update_only}))
            calls.append((SAGEMAKER, "UpdateEndpoint", {k: v for k, v in properties.items() if k != "Tags"}))
        elif kind == "AWS::ApplicationAutoScaling::ScalableTarget":
            tags = {tag["Key"]: tag["Value"] for tag in properties.pop("Tags", [])}  # a map in the API
            calls.append((AUTOSCALING, "RegisterScalableTarget", {**properties, "Tags": tags}))
        elif kind == "AWS::ApplicationAutoScaling::ScalingPolicy":
            target = resolve(template["Resources"][properties.pop("ScalingTargetId")]["Properties"])
            calls.append((AUTOSCALING, "PutScalingPolicy", {
                **properties, "ServiceNamespace": target["ServiceNamespace"], "ResourceId": target["ResourceId"],
                "ScalableDimension": target["ScalableDimension"]}))
        elif kind == "AWS::CloudWatch::Alarm":
            calls.append((CLOUDWATCH, "PutMetricAlarm", {"AlarmName": resolve.ref(logical_id), **properties}))
        elif kind == "AWS::Logs::MetricFilter":
            calls.append((LOGS, "PutMetricFilter", {"filterName": f"{logical_id}-A1B2C3", **camel(properties)}))
    return calls


@pytest.mark.parametrize("stack", cdk_testkit.ENDPOINT_STACKS.values())
def test_pinned_endpoint_requests_are_valid(pinned, stack):
    calls = requests_of(pinned.template(stack))
    operations = sorted({operation for _, operation, _ in calls})
    assert operations == sorted(["CreateEndpoint", "CreateEndpointConfig", "CreateModel", "PutScalingPolicy",
                                 "RegisterScalableTarget", "UpdateEndpoint", "PutMetricAlarm"]
                                + (["PutMetricFilter"] if stack != "endpoint-text-generation" else []))
    for service, operation, params in calls:
        assert problems(service, operation, params) == [], (operation, params)


@pytest.mark.parametrize("stack", cdk_testkit.ENDPOINT_STACKS.values())
def test_the_update_keeps_variant_properties_and_names_existing_alarms(pinned, stack):
    calls = requests_of(pinned.template(stack))
    (update,) = [p for _, op, p in calls if op == "UpdateEndpoint"]
    assert update["RetainAllVariantProperties"] is True
    alarm_names = {p["AlarmName"] for _, op, p in calls if op == "PutMetricAlarm"}
    rollback = [a["AlarmName"] for a in update["DeploymentConfig"]["AutoRollbackConfiguration"]["Alarms"]]
    assert rollback and set(rollback) <= alarm_names
    (policy_name,) = {"BlueGreenUpdatePolicy", "RollingUpdatePolicy"} & set(update["DeploymentConfig"])
    assert problems(SAGEMAKER, "UpdateEndpoint", update) == []


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["BlueGreenUpdatePolicy"]["TrafficRoutingConfiguration"].__setitem__("Type", "SOMETIMES"),
     "UpdateEndpoint.DeploymentConfig.BlueGreenUpdatePolicy.TrafficRoutingConfiguration.Type: 'SOMETIMES' is not"),
    (lambda d: d["BlueGreenUpdatePolicy"].__setitem__("TerminationWaitInSeconds", 4000),
     "UpdateEndpoint.DeploymentConfig.BlueGreenUpdatePolicy.TerminationWaitInSeconds: 4000 is above"),
    (lambda d: d["BlueGreenUpdatePolicy"].__setitem__("MaximumExecutionTimeoutInSeconds", 60),
     "Invalid value for parameter DeploymentConfig.BlueGreenUpdatePolicy.MaximumExecutionTimeoutInSeconds"),
    (lambda d: d["AutoRollbackConfiguration"].__setitem__("Alarms", [{"AlarmName": "a"}] * 11),
     "UpdateEndpoint.DeploymentConfig.AutoRollbackConfiguration.Alarms: ["),
    (lambda d: d.__setitem__("RollingPolicy", {}), 'Unknown parameter in DeploymentConfig: "RollingPolicy"'),
])
def test_the_validation_catches_a_wrong_deployment_config(dev, mutate, expected):
    (update,) = [p for _, op, p in requests_of(dev.template("endpoint-cpu")) if op == "UpdateEndpoint"]
    mutate(update["DeploymentConfig"])
    assert any(expected in problem for problem in problems(SAGEMAKER, "UpdateEndpoint", update)), \
        problems(SAGEMAKER, "UpdateEndpoint", update)


def test_the_gpu_request_uses_instance_pools_as_the_api_defines_them(pinned):
    (params,) = [p for _, op, p in requests_of(pinned.template("endpoint-gpu")) if op == "CreateEndpointConfig"]
    pool_shape = SAGEMAKER.shape_for("ProductionVariant").members["InstancePools"]
    assert pool_shape.metadata == {"min": 1, "max": 5}
    (variant,) = params["ProductionVariants"]
    assert "InstanceType" not in variant and "KmsKeyId" not in params
    assert 300 <= variant["VariantInstanceProvisionTimeoutInSeconds"] <= 3600


@pytest.mark.parametrize("mutate, expected", [
    (lambda v: v.__setitem__("InstancePool", v.pop("InstancePools")), 'Unknown parameter in ProductionVariants[0]: '
                                                                      '"InstancePool"'),
    (lambda v: v.__setitem__("VariantInstanceProvisionTimeoutInSeconds", 4000),
     "CreateEndpointConfig.ProductionVariants[0].VariantInstanceProvisionTimeoutInSeconds: 4000 is above"),
    (lambda v: v.__setitem__("VariantInstanceProvisionTimeoutInSeconds", 60),
     "Invalid value for parameter ProductionVariants[0].VariantInstanceProvisionTimeoutInSeconds, value: 60"),
    (lambda v: v["InstancePools"].append({"InstanceType": "ml.g6.2xlarge", "Priority": 9}),
     "CreateEndpointConfig.ProductionVariants[0].InstancePools[4].Priority: 9 is above"),
    (lambda v: v["InstancePools"].extend([{"InstanceType": "ml.g6.2xlarge", "Priority": 5}] * 2),
     "CreateEndpointConfig.ProductionVariants[0].InstancePools: ["),
    (lambda v: v["InstancePools"][0].__setitem__("InstanceType", "ml.g6.huge"),
     "CreateEndpointConfig.ProductionVariants[0].InstancePools[0].InstanceType: 'ml.g6.huge' is not one of"),
    (lambda v: v.__setitem__("InferenceAmiVersion", "al2-ami-sagemaker-inference-gpu-9"),
     "CreateEndpointConfig.ProductionVariants[0].InferenceAmiVersion: 'al2-ami-sagemaker-inference-gpu-9'"),
])
def test_the_validation_catches_wrong_names_and_values(dev, mutate, expected):
    (params,) = [p for _, op, p in requests_of(dev.template("endpoint-gpu")) if op == "CreateEndpointConfig"]
    mutate(params["ProductionVariants"][0])
    assert any(expected in problem for problem in problems(SAGEMAKER, "CreateEndpointConfig", params))


def test_configured_instance_types_and_ami_versions_are_in_the_service_model():
    """stacks/config.py's choices and cdk.json's instance types are values SageMaker accepts."""
    from stacks.config import GPU_INFERENCE_AMI_VERSIONS
    ami_enum = SAGEMAKER.shape_for("ProductionVariantInferenceAmiVersion").enum
    assert set(GPU_INFERENCE_AMI_VERSIONS) <= set(ami_enum)
    instance_enum = set(SAGEMAKER.shape_for("ProductionVariantInstanceType").enum)
    from stacks.config import DEFAULT_GPU_POOLS
    for env, settings in cdk_testkit.cdk_json_context()["environments"].items():
        types = [settings["cpu"]["instance_type"], settings["text_generation"]["instance_type"],
                 *settings["gpu"].get("instance_pools", DEFAULT_GPU_POOLS)]
        assert set(types) <= instance_enum, (env, set(types) - instance_enum)


def test_the_ami_table_matches_the_service_models_documentation():
    """stacks/instance_types.py's driver and CUDA version per inference AMI, as botocore documents each AMI."""
    from stacks.instance_types import GPU_INFERENCE_AMIS
    text = re.sub(r"<[^>]+>", " ", SAGEMAKER.shape_for("ProductionVariant").members["InferenceAmiVersion"].documentation)
    documented = {name: (int(driver), cuda) for name, driver, cuda in re.findall(
        r"(al2\S*-ami-sagemaker-inference-gpu-[0-9-]+)\s+Accelerator: GPU\s+NVIDIA driver version: ([0-9]+)\s+"
        r"CUDA version: ([0-9.]+)", text)}
    assert documented == GPU_INFERENCE_AMIS


def test_the_transform_ami_table_matches_the_service_models_documentation():
    """The drivers Batch Transform hosts offer (why transform refuses the GPU model), as botocore documents them."""
    from stacks.instance_types import GPU_TRANSFORM_AMIS
    resources = SAGEMAKER.operation_model("CreateTransformJob").input_shape.members["TransformResources"]
    text = re.sub(r"<[^>]+>", " ", resources.members["TransformAmiVersion"].documentation)
    documented = {name: int(driver) for name, driver in re.findall(
        r"(al2\S*-ami-sagemaker-batch-gpu-[0-9]+)\s+Accelerator: GPU\s+NVIDIA driver version: ([0-9]+)", text)}
    assert documented == GPU_TRANSFORM_AMIS
