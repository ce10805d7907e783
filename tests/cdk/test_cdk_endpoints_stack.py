"""The endpoints stack: Models, EndpointConfigs, Endpoints and their scaling, as the pins and settings say."""

from __future__ import annotations

import re
import pytest
from aws_cdk.assertions import Capture, Match

import cdk_testkit
from cdk_testkit import MODEL_SHA256, REPOSITORY_ROOT, TEST_PINS, as_list, flatten, statements

KINDS = {"cpu": "CpuEndpoint", "gpu": "GpuEndpoint", "text_generation": "TextGenerationEndpoint"}
MODEL_KEY = TEST_PINS["model"]["s3_key"]


def model(synth, kind):
    return synth.resource("endpoints", "AWS::SageMaker::Model", f"{KINDS[kind]}Model")["Properties"]


def variant(synth, kind):
    config = synth.resource("endpoints", "AWS::SageMaker::EndpointConfig", f"{KINDS[kind]}EndpointConfig")
    (production_variant,) = config["Properties"]["ProductionVariants"]
    return production_variant


def test_one_model_config_endpoint_and_scaling_per_kind(pinned):
    template = pinned.assertions("endpoints")
    for resource_type in ("AWS::SageMaker::Model", "AWS::SageMaker::EndpointConfig", "AWS::SageMaker::Endpoint",
                          "AWS::ApplicationAutoScaling::ScalableTarget",
                          "AWS::ApplicationAutoScaling::ScalingPolicy"):
        template.resource_count_is(resource_type, 3)
    template.resource_count_is("AWS::IAM::Role", 1)


def test_every_model_runs_network_isolated_on_the_pinned_archive(pinned):
    template = pinned.assertions("endpoints")
    template.all_resources_properties("AWS::SageMaker::Model", {
        "EnableNetworkIsolation": True,
        "ExecutionRoleArn": {"Fn::GetAtt": [Match.string_like_regexp("^ExecutionRole"), "Arn"]},
        "PrimaryContainer": Match.object_like({"ModelDataUrl": {"Fn::Join": ["", [
            "s3://", {"Fn::ImportValue": Match.string_like_regexp(f"^{pinned.prefix}-artifacts:ExportsOutputRef"
                                                                  "ArtifactBucket")},
            f"/{MODEL_KEY}"]]}}),
        "Tags": Match.array_with([{"Key": "model-gguf-sha256", "Value": MODEL_SHA256}]),
    })


@pytest.mark.parametrize("kind", ["cpu", "gpu", "text_generation"])
def test_images_are_the_pinned_digests_in_the_project_repository(pinned, kind):
    image = flatten(model(pinned, kind)["PrimaryContainer"]["Image"])
    digest = TEST_PINS["images"][kind]
    assert image.endswith(f"/{pinned.prefix}-artifacts:ExportsOutputRefImageRepository" +
                          image.split("ExportsOutputRefImageRepository")[1].split("@")[0] + f"@{digest}")
    assert ".dkr.ecr." in image and ":latest" not in image


def test_container_environments(pinned):
    config = cdk_testkit.cdk_json_context()["environments"][pinned.env]
    assert model(pinned, "cpu")["PrimaryContainer"]["Environment"] == {
        "ADAPTER_THREADS": str(config["cpu"]["threads"]), "ADAPTER_GPU_LAYERS": "0"}
    assert model(pinned, "gpu")["PrimaryContainer"]["Environment"] == {"ADAPTER_GPU_LAYERS": "-1"}
    text = config["text_generation"]
    assert model(pinned, "text_generation")["PrimaryContainer"]["Environment"] == {
        "SM_LLAMA_CPP_MODEL_DIR": "/opt/ml/model", "SM_LLAMA_CPP_CTX_SIZE": str(text["ctx_size"]),
        "SM_LLAMA_CPP_THREADS": str(text["threads"]), "SM_LLAMA_CPP_PARALLEL": str(text["parallel"]),
        "SM_LLAMA_CPP_ALIAS": "qwen3.5-4b"}


def test_adapter_variables_exist_in_the_adapter_settings():
    """Every ADAPTER_* variable the stack sets is one that container/decision_adapter/settings.py reads."""
    settings = (REPOSITORY_ROOT / "container" / "decision_adapter" / "settings.py").read_text()
    known = set(re.findall(r'"((?:ADAPTER|SAGEMAKER)_[A-Z_]+)"', settings))
    synth = cdk_testkit.synthesized("dev")
    for kind in ("cpu", "gpu"):
        assert set(model(synth, kind)["PrimaryContainer"]["Environment"]) <= known


def test_the_gpu_variant_has_ordered_pools_and_no_instance_type(pinned):
    config = cdk_testkit.cdk_json_context()["environments"][pinned.env]["gpu"]
    gpu = variant(pinned, "gpu")
    assert "InstanceType" not in gpu
    assert gpu["InstancePools"] == [{"InstanceType": t, "Priority": i}
                                    for i, t in enumerate(config["instance_pools"], start=1)]
    assert gpu["VariantInstanceProvisionTimeoutInSeconds"] == config["provision_timeout_s"]
    assert gpu["InferenceAmiVersion"] == config["inference_ami_version"]
    assert gpu["ContainerStartupHealthCheckTimeoutInSeconds"] == config["startup_health_check_timeout_s"]
    assert gpu["ModelDataDownloadTimeoutInSeconds"] == config["model_download_timeout_s"]


def test_pool_priorities_follow_the_configured_order():
    reordered = ["ml.g4dn.xlarge", "ml.g6e.xlarge", "ml.g6.xlarge"]
    synth = cdk_testkit.synthesized_with("dev", lambda e: e["gpu"].__setitem__("instance_pools", reordered))
    pools = Capture()
    synth.assertions("endpoints").has_resource_properties("AWS::SageMaker::EndpointConfig", {
        "ProductionVariants": [Match.object_like({"InstancePools": pools, "InstanceType": Match.absent()})]})
    assert pools.as_array() == [{"InstanceType": "ml.g4dn.xlarge", "Priority": 1},
                                {"InstanceType": "ml.g6e.xlarge", "Priority": 2},
                                {"InstanceType": "ml.g6.xlarge", "Priority": 3}]


@pytest.mark.parametrize("kind", ["cpu", "text_generation"])
def test_cpu_variants_have_an_instance_type_and_no_pools(pinned, kind):
    config = cdk_testkit.cdk_json_context()["environments"][pinned.env][kind]
    production_variant = variant(pinned, kind)
    assert production_variant["InstanceType"] == config["instance_type"]
    for absent in ("InstancePools", "VariantInstanceProvisionTimeoutInSeconds", "InferenceAmiVersion"):
        assert absent not in production_variant
    assert production_variant["InitialInstanceCount"] == config["initial_instance_count"]
    assert production_variant["ContainerStartupHealthCheckTimeoutInSeconds"] == \
        config["startup_health_check_timeout_s"]


def test_volumes_use_the_kms_key_except_on_instance_storage(pinned):
    """EBS-backed CPU instances get the stack's KMS key; GPU pools (local NVMe, encrypted in hardware) must not."""
    key = pinned.resource("endpoints", "AWS::KMS::Key", "VolumeKey")
    assert key["Properties"]["EnableKeyRotation"] is True
    configs = pinned.resources("endpoints", "AWS::SageMaker::EndpointConfig")
    key_ids = {lid.split("EndpointConfig")[0]: flatten(c["Properties"].get("KmsKeyId", "")) for lid, c in configs.items()}
    assert key_ids["CpuEndpoint"].startswith("<VolumeKey")
    assert key_ids["TextGenerationEndpoint"].startswith("<VolumeKey")
    assert key_ids["GpuEndpoint"] == ""


@pytest.mark.parametrize("kind", ["cpu", "gpu", "text_generation"])
def test_scaling_tracks_invocations_between_the_configured_counts(pinned, kind):
    config = cdk_testkit.cdk_json_context()["environments"][pinned.env][kind]
    endpoint_id = KINDS[kind]
    target = pinned.resource("endpoints", "AWS::ApplicationAutoScaling::ScalableTarget", f"{endpoint_id}Scalable")
    assert target["Properties"]["MinCapacity"] == config["initial_instance_count"]
    assert target["Properties"]["MaxCapacity"] == config["max_instance_count"]
    assert target["Properties"]["ScalableDimension"] == "sagemaker:variant:DesiredInstanceCount"
    assert "RoleARN" not in target["Properties"]  # the service-linked role
    assert flatten(target["Properties"]["ResourceId"]) == f"endpoint/<{flatten_id(pinned, endpoint_id)}" \
                                                          ".EndpointName>/variant/AllTraffic"
    policy = pinned.resource("endpoints", "AWS::ApplicationAutoScaling::ScalingPolicy", f"{endpoint_id}Invocations")
    assert policy["Properties"]["TargetTrackingScalingPolicyConfiguration"] == {
        "PredefinedMetricSpecification": {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"},
        "TargetValue": config["target_invocations_per_instance"],
        "ScaleInCooldown": config["scale_in_cooldown_s"], "ScaleOutCooldown": config["scale_out_cooldown_s"]}


def flatten_id(synth, endpoint_id):
    (logical_id,) = [lid for lid in synth.resources("endpoints", "AWS::SageMaker::Endpoint")
                     if lid.startswith(endpoint_id)]
    return logical_id


def test_endpoints_have_stable_names_and_generated_configs(pinned):
    endpoints = pinned.resources("endpoints", "AWS::SageMaker::Endpoint")
    assert sorted(e["Properties"]["EndpointName"] for e in endpoints.values()) == [
        f"{pinned.prefix}-cpu", f"{pinned.prefix}-gpu", f"{pinned.prefix}-text-generation"]
    for resource_type in ("AWS::SageMaker::Model", "AWS::SageMaker::EndpointConfig"):
        for resource in pinned.resources("endpoints", resource_type).values():
            assert not {"ModelName", "EndpointConfigName"} & set(resource["Properties"])


def test_log_groups_exist_before_the_endpoints(pinned):
    for kind, endpoint_id in KINDS.items():
        (logical_id, group), = [(lid, g) for lid, g in pinned.resources("endpoints", "AWS::Logs::LogGroup").items()
                                if lid.startswith(f"{endpoint_id}Logs")]
        name = f"{pinned.prefix}-{kind.replace('_', '-')}"
        assert group["Properties"]["LogGroupName"] == f"/aws/sagemaker/Endpoints/{name}"
        endpoint = pinned.resources("endpoints", "AWS::SageMaker::Endpoint")[flatten_id(pinned, endpoint_id)]
        assert logical_id in endpoint["DependsOn"]


def test_the_execution_role_reads_the_model_and_pulls_from_the_one_repository(pinned):
    template = pinned.template("endpoints")
    found = {}
    for _, statement in statements(template):
        for action in as_list(statement["Action"]):
            found.setdefault(action, []).extend(flatten(r) for r in as_list(statement["Resource"]))
    assert found["s3:GetObject"] == [f"{pinned.prefix}-artifacts:ArtifactBucketArn/{MODEL_KEY}"]
    for action in ("ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"):
        assert len(found[action]) == 1 and "ImageRepository" in found[action][0]
    assert found["ecr:GetAuthorizationToken"] == ["*"]
    assert not [a for a in found if "*" in a]
    assert [a for a, resources in found.items() if "*" in resources] == ["ecr:GetAuthorizationToken"]
    assert sorted(found["logs:PutLogEvents"]) == sorted(f"<{lid}.Arn>" for lid in pinned.resources(
        "endpoints", "AWS::Logs::LogGroup"))
    assert not [a for a in found if a.startswith(("s3:Put", "ecr:Put", "s3:Delete"))]


def test_models_wait_for_the_execution_role_policy(pinned):
    for resource in pinned.resources("endpoints", "AWS::SageMaker::Model").values():
        assert any(d.startswith("ExecutionRoleDefaultPolicy") for d in resource["DependsOn"])


def test_a_pin_outside_the_project_repository_gets_its_own_pull_grant():
    uri = "763104351884.dkr.ecr.us-east-1.amazonaws.com/llama-cpp@sha256:" + "9" * 64
    synth = cdk_testkit.synthesized_with("dev", lambda e: e["pins"]["images"].__setitem__("text_generation", uri))
    assert model(synth, "text_generation")["PrimaryContainer"]["Image"] == uri
    pulls = sorted(flatten(r) for _, s in statements(synth.template("endpoints"))
                   if "ecr:BatchGetImage" in as_list(s["Action"]) for r in as_list(s["Resource"]))
    assert len(pulls) == 2
    assert pulls[0] == "arn:aws:ecr:us-east-1:763104351884:repository/llama-cpp"
    assert "ImageRepository" in pulls[1]  # the CPU and GPU images stay in the project repository


def test_a_fresh_clone_leaves_the_endpoints_out_and_says_which_keys_to_set(fresh_clone):
    resources = fresh_clone.template("endpoints")["Resources"]
    resources.pop("CDKMetadata", None)
    # Only the no-op placeholder that keeps the template valid; no role, key or endpoint yet.
    assert [r["Type"] for r in resources.values()] == ["AWS::CloudFormation::WaitConditionHandle"]
    warnings = [w for w in fresh_clone.warnings() if "endpoint is left out" in w]
    env = fresh_clone.env
    assert sorted(warnings) == sorted(
        f"The {kind} endpoint is left out until environments.{env}.pins.images.{kind} and "
        f"environments.{env}.pins.model are set in cdk.json (README.md, Deploy)."
        for kind in ("cpu", "gpu", "text_generation"))
    # The artifacts and build stacks do not wait for pins.
    assert fresh_clone.resources("build", "AWS::CodeBuild::Project")
    assert fresh_clone.resources("artifacts", "AWS::ECR::Repository")


def test_only_the_pinned_endpoints_are_created():
    def edit(environment):
        environment["pins"]["images"]["gpu"] = None
        environment["endpoints"] = ["cpu", "gpu"]
    synth = cdk_testkit.synthesized_with("prod", edit)
    endpoints = synth.resources("endpoints", "AWS::SageMaker::Endpoint")
    assert [e["Properties"]["EndpointName"] for e in endpoints.values()] == ["decision-prod-cpu"]
    assert [w for w in synth.warnings() if "left out" in w] == [
        "The gpu endpoint is left out until environments.prod.pins.images.gpu is set in cdk.json (README.md, "
        "Deploy)."]
