"""The endpoint stacks: one per kind, each with its role, Model, EndpointConfig, Endpoint, scaling and alarms."""

from __future__ import annotations

import re

import pytest
from aws_cdk.assertions import Capture, Match

import cdk_testkit
from cdk_testkit import (ENDPOINT_STACKS, EXAMPLE_REGION, MODEL_SHA256, REPOSITORY_ROOT, TEST_PINS, as_list, flatten,
                         statements)
from stacks import instance_types, sizing
from stacks.adapter_logs import metric_logs
from stacks.config import image_kind

KINDS = tuple(ENDPOINT_STACKS)
ADAPTER_KINDS = ("cpu", "gpu", "async")
# The real-time kinds (the asynchronous one, its queue, scaling and prefixes: test_cdk_async.py).
REALTIME_KINDS = tuple(kind for kind in KINDS if kind != "async")
MODEL_KEY = TEST_PINS["model"]["s3_key"]
WALKTHROUGH_POOLS = ["ml.g6e.xlarge", "ml.g6.xlarge", "ml.g5.xlarge", "ml.g4dn.xlarge"]


def settings(synth, kind):
    return cdk_testkit.cdk_json_context()["environments"][synth.env][kind]


def one(synth, kind, resource_type):
    (resource,) = synth.resources(ENDPOINT_STACKS[kind], resource_type).values()
    return resource


def model(synth, kind):
    return one(synth, kind, "AWS::SageMaker::Model")["Properties"]


def variant(synth, kind):
    (production_variant,) = one(synth, kind, "AWS::SageMaker::EndpointConfig")["Properties"]["ProductionVariants"]
    return production_variant


def endpoint(synth, kind):
    return one(synth, kind, "AWS::SageMaker::Endpoint")


def alarms(synth, kind):
    """{construct id prefix (e.g. 'EndpointBusyRate'): alarm resource} of one endpoint stack."""
    found = synth.resources(ENDPOINT_STACKS[kind], "AWS::CloudWatch::Alarm")
    # Not the asynchronous endpoint's scale-out alarm, which only runs a scaling policy (test_cdk_async.py).
    return {re.sub(r"[0-9A-F]{8}$", "", logical_id).removeprefix("Endpoint"): alarm
            for logical_id, alarm in found.items() if not logical_id.startswith("EndpointHasBacklogWithoutCapacity")}


def logical_id(synth, kind, resource_type):
    (found,) = synth.resources(ENDPOINT_STACKS[kind], resource_type)
    return found


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_has_its_own_stack_with_one_of_everything(pinned, kind):
    template = pinned.assertions(ENDPOINT_STACKS[kind])
    for resource_type in ("AWS::SageMaker::Model", "AWS::SageMaker::EndpointConfig", "AWS::SageMaker::Endpoint",
                          "AWS::ApplicationAutoScaling::ScalableTarget", "AWS::ApplicationAutoScaling::ScalingPolicy",
                          "AWS::IAM::Role", "AWS::Logs::LogGroup"):
        # The asynchronous endpoint also steps out from 0 instances (a second policy).
        count = 2 if kind == "async" and resource_type.endswith("ScalingPolicy") else 1
        template.resource_count_is(resource_type, count)
    assert endpoint(pinned, kind)["Properties"]["EndpointName"] == f"{pinned.prefix}-{kind.replace('_', '-')}"


def test_stack_names_and_dependencies(pinned):
    """Endpoint stacks import from artifacts and monitoring and export nothing: each can be destroyed alone."""
    manifest = pinned.manifest()["artifacts"]
    for kind, stack in ENDPOINT_STACKS.items():
        name = pinned.stack_name(stack)
        assert name == f"{pinned.prefix}-endpoint-{kind.replace('_', '-')}"
        assert set(manifest[name]["dependencies"]) >= {f"{pinned.prefix}-artifacts", f"{pinned.prefix}-monitoring"}
        assert "Outputs" not in pinned.template(stack) or not any(
            "Export" in output for output in pinned.template(stack)["Outputs"].values())
    for other in [kind for kind in ("artifacts", "build", "monitoring") if kind in pinned.stack_kinds]:
        deps = manifest[pinned.stack_name(other)].get("dependencies", [])
        assert not [d for d in deps if "-endpoint-" in d], (other, deps)


def test_every_model_runs_network_isolated_on_the_pinned_archive(pinned):
    source_bucket = cdk_testkit.pins_of(pinned.env)["model"].get("bucket")
    # The environment's own bucket, or (prod: artifacts_from dev) the source's bucket that the pin names.
    model_data_url = f"s3://{source_bucket}/{MODEL_KEY}" if source_bucket else {"Fn::Join": ["", [
        "s3://", {"Fn::ImportValue": Match.string_like_regexp(
            f"^{pinned.prefix}-artifacts:ExportsOutputRefArtifactBucket")}, f"/{MODEL_KEY}"]]}
    for stack in ENDPOINT_STACKS.values():
        pinned.assertions(stack).all_resources_properties("AWS::SageMaker::Model", {
            "EnableNetworkIsolation": True,
            "ExecutionRoleArn": {"Fn::GetAtt": [Match.string_like_regexp("^ExecutionRole"), "Arn"]},
            "PrimaryContainer": Match.object_like({"ModelDataUrl": model_data_url}),
            "Tags": Match.array_with([{"Key": "model-gguf-sha256", "Value": MODEL_SHA256}]),
        })


@pytest.mark.parametrize("kind", KINDS)
def test_images_are_the_pinned_digests_in_the_project_repository(pinned, kind):
    image = flatten(model(pinned, kind)["PrimaryContainer"]["Image"])
    digest = TEST_PINS["images"][image_kind(kind)]     # the async kind runs the cpu image
    if cdk_testkit.builds(pinned.env):
        assert re.fullmatch(rf".*/{pinned.prefix}-artifacts:ExportsOutputRefImageRepository\w+@{digest}", image), \
            image
    else:   # the source's (dev's) repository, as the pin names it in full
        assert image == cdk_testkit.pins_of(pinned.env)["images"][image_kind(kind)] and image.endswith(f"@{digest}")
        assert "/decision-dev-artifacts-imagerepository" in image
    assert ".dkr.ecr." in image and ":latest" not in image


def test_container_environments(pinned):
    cpu, text = settings(pinned, "cpu"), settings(pinned, "text_generation")
    # The adapter names its image's digest (the pin's) in every answer's x_request.
    digests = {kind: TEST_PINS["images"][kind] for kind in ("cpu", "gpu")}
    assert model(pinned, "cpu")["PrimaryContainer"]["Environment"] == {
        "ADAPTER_THREADS": str(cpu["threads"]), "ADAPTER_GPU_LAYERS": "0", "ADAPTER_REQUEST_TIMEOUT_S": "55",
        "ADAPTER_IMAGE_DIGEST": digests["cpu"]}
    assert model(pinned, "gpu")["PrimaryContainer"]["Environment"] == {
        "ADAPTER_GPU_LAYERS": "-1", "ADAPTER_REQUEST_TIMEOUT_S": "55", "ADAPTER_IMAGE_DIGEST": digests["gpu"]}
    assert model(pinned, "text_generation")["PrimaryContainer"]["Environment"] == {
        "SM_LLAMA_CPP_MODEL_DIR": "/opt/ml/model", "SM_LLAMA_CPP_CTX_SIZE": str(text["ctx_size"]),
        "SM_LLAMA_CPP_THREADS": str(text["threads"]), "SM_LLAMA_CPP_PARALLEL": str(text["parallel"]),
        "SM_LLAMA_CPP_ALIAS": "qwen3.5-4b"}


def test_adapter_variables_exist_in_the_adapter_settings(dev):
    """Every ADAPTER_* variable the stacks set is one that container/decision_adapter/settings.py reads."""
    known = set(re.findall(r'"((?:ADAPTER|SAGEMAKER)_[A-Z_]+)"',
                           (REPOSITORY_ROOT / "container" / "decision_adapter" / "settings.py").read_text()))
    for kind in ADAPTER_KINDS:
        assert set(model(dev, kind)["PrimaryContainer"]["Environment"]) <= known


def test_the_gpu_variant_has_the_walkthrough_pools_in_both_environments(pinned):
    """cdk.json sets no pools: both environments get the walkthrough's order, g6e first."""
    assert "instance_pools" not in settings(pinned, "gpu")
    config = settings(pinned, "gpu")
    gpu = variant(pinned, "gpu")
    assert "InstanceType" not in gpu
    assert gpu["InstancePools"] == [{"InstanceType": t, "Priority": i} for i, t in enumerate(WALKTHROUGH_POOLS, 1)]
    assert gpu["VariantInstanceProvisionTimeoutInSeconds"] == config["provision_timeout_s"]
    assert gpu["InferenceAmiVersion"] == config["inference_ami_version"] == "al2023-ami-sagemaker-inference-gpu-4-1"
    assert gpu["ContainerStartupHealthCheckTimeoutInSeconds"] == config["startup_health_check_timeout_s"]
    assert gpu["ModelDataDownloadTimeoutInSeconds"] == config["model_download_timeout_s"]


def test_pools_set_in_cdk_json_keep_their_order():
    reordered = ["ml.g4dn.xlarge", "ml.g6e.xlarge", "ml.g6.xlarge"]

    def edit(environment):
        environment["gpu"]["instance_pools"] = reordered
        environment["gpu"]["target_invocations_per_instance"] = {"ml.g4dn.xlarge": 90, "ml.g6e.xlarge": 400,
                                                                 "ml.g6.xlarge": 200}
    synth = cdk_testkit.synthesized_with("dev", edit)
    pools = Capture()
    synth.assertions("endpoint-gpu").has_resource_properties("AWS::SageMaker::EndpointConfig", {
        "ProductionVariants": [Match.object_like({"InstancePools": pools, "InstanceType": Match.absent()})]})
    assert pools.as_array() == [{"InstanceType": t, "Priority": i} for i, t in enumerate(reordered, 1)]
    # The slowest pool's target: a fleet that fell back to T4s must not be loaded like L40Ss.
    policy = one(synth, "gpu", "AWS::ApplicationAutoScaling::ScalingPolicy")["Properties"]
    assert policy["TargetTrackingScalingPolicyConfiguration"]["TargetValue"] == 90


@pytest.mark.parametrize("kind", ["cpu", "text_generation"])
def test_cpu_variants_have_an_instance_type_and_no_pools(pinned, kind):
    config = settings(pinned, kind)
    production_variant = variant(pinned, kind)
    assert production_variant["InstanceType"] == config["instance_type"]
    for absent in ("InstancePools", "VariantInstanceProvisionTimeoutInSeconds", "InferenceAmiVersion"):
        assert absent not in production_variant
    assert production_variant["InitialInstanceCount"] == config["initial_instance_count"]
    assert production_variant["ContainerStartupHealthCheckTimeoutInSeconds"] == \
        config["startup_health_check_timeout_s"]


@pytest.mark.parametrize("kind", KINDS)
def test_adapter_variants_route_to_the_least_busy_instance(pinned, kind):
    """The adapter answers a busy 503 beyond its queue: send requests where fewest are outstanding."""
    routing = variant(pinned, kind).get("RoutingConfig")
    if kind in REALTIME_KINDS and kind in ADAPTER_KINDS:   # SageMaker's queue feeds the asynchronous one
        assert routing == {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"}
    else:
        assert routing is None


def test_volumes_use_a_kms_key_except_on_instance_storage(pinned):
    """EBS-backed CPU instances get their stack's KMS key; GPU pools (local NVMe, encrypted in hardware) must not."""
    for kind in ("cpu", "text_generation"):
        key = one(pinned, kind, "AWS::KMS::Key")
        assert key["Properties"]["EnableKeyRotation"] is True
        key_id = one(pinned, kind, "AWS::SageMaker::EndpointConfig")["Properties"]["KmsKeyId"]
        assert flatten(key_id).startswith("<VolumeKey")
    assert pinned.resources("endpoint-gpu", "AWS::KMS::Key") == {}
    assert "KmsKeyId" not in one(pinned, "gpu", "AWS::SageMaker::EndpointConfig")["Properties"]


@pytest.mark.parametrize("kind", KINDS)
def test_ebs_volumes_hold_the_pinned_model_twice_below_the_disk_alarm_and_nvme_types_get_none(pinned, kind):
    """SageMaker downloads the archive (as large as the GGUF: it hardly compresses) and extracts the GGUF beside it
    on the ML volume; an instance type's default volume shrinks with its size. NVMe types use their own disks, and
    SageMaker refuses VolumeSizeInGB for them."""
    production_variant = variant(pinned, kind)
    types = cdk_testkit.variant_instance_types(production_variant)
    if any(map(instance_types.has_instance_storage, types)):
        assert "VolumeSizeInGB" not in production_variant
        return
    gguf = sizing.model_bytes("qwen3.5-4b", MODEL_SHA256)
    disk_alarm = alarms(pinned, kind)["DiskUtilization"]["Properties"]["Threshold"]
    volume = production_variant["VolumeSizeInGB"] * 2**30
    assert 2 * gguf <= volume * sizing.MODEL_SHARE_OF_VOLUME < volume * disk_alarm / 100
    assert 1 <= production_variant["VolumeSizeInGB"] <= 512


@pytest.mark.parametrize("kind", REALTIME_KINDS)
def test_scaling_tracks_invocations_with_the_instance_types_target(pinned, kind):
    config = settings(pinned, kind)
    target = one(pinned, kind, "AWS::ApplicationAutoScaling::ScalableTarget")["Properties"]
    assert target["MinCapacity"] == config["initial_instance_count"]
    assert target["MaxCapacity"] == config["max_instance_count"]
    assert target["ScalableDimension"] == "sagemaker:variant:DesiredInstanceCount"
    assert "RoleARN" not in target  # the service-linked role
    assert flatten(target["ResourceId"]) == \
        f"endpoint/<{logical_id(pinned, kind, 'AWS::SageMaker::Endpoint')}.EndpointName>/variant/AllTraffic"
    targets = config["target_invocations_per_instance"]
    policy = one(pinned, kind, "AWS::ApplicationAutoScaling::ScalingPolicy")["Properties"]
    assert policy["TargetTrackingScalingPolicyConfiguration"] == {
        "PredefinedMetricSpecification": {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"},
        "TargetValue": min(targets.values()),
        "ScaleInCooldown": config["scale_in_cooldown_s"], "ScaleOutCooldown": config["scale_out_cooldown_s"]}


def test_a_different_cpu_instance_type_gets_its_own_target():
    def edit(environment):
        environment["cpu"]["instance_type"] = "ml.c7i.4xlarge"
        environment["cpu"]["target_invocations_per_instance"] = {"ml.c7i.4xlarge": 120}
    synth = cdk_testkit.synthesized_with("prod", edit)
    policy = one(synth, "cpu", "AWS::ApplicationAutoScaling::ScalingPolicy")["Properties"]
    assert policy["TargetTrackingScalingPolicyConfiguration"]["TargetValue"] == 120
    assert variant(synth, "cpu")["InstanceType"] == "ml.c7i.4xlarge"


@pytest.mark.parametrize("kind", KINDS)
def test_updates_keep_the_scaled_instance_count(pinned, kind):
    properties = endpoint(pinned, kind)["Properties"]
    assert properties["RetainAllVariantProperties"] is True
    assert "ExcludeRetainedVariantProperties" not in properties and "RetainDeploymentConfig" not in properties


def alarm_names(synth, kind, ids):
    found = alarms(synth, kind)
    return [{"AlarmName": {"Ref": next(lid for lid in synth.resources(ENDPOINT_STACKS[kind], "AWS::CloudWatch::Alarm")
                                       if lid.startswith(f"Endpoint{alarm_id}"))}} for alarm_id in ids
            if alarm_id in found]


ROLLBACK_ALARMS = ["Invocation5xxRate", "ScoringFailures", "SlowCompute", "MemoryUtilization", "DiskUtilization"]


@pytest.mark.parametrize("kind", KINDS)
def test_updates_roll_back_on_faults_never_on_load(pinned, kind):
    deployment = endpoint(pinned, kind)["Properties"]["DeploymentConfig"]
    rollback = deployment["AutoRollbackConfiguration"]["Alarms"]
    assert rollback == alarm_names(pinned, kind, ROLLBACK_ALARMS)
    assert len(rollback) == (5 if kind in ADAPTER_KINDS else 3)
    # Busy 503s and utilization are load, not a fault of the new version: they notify, they never roll back.
    load = ["GpuUtilization" if kind == "gpu" else "CpuUtilization"] + (["BusyRate"] if kind in ADAPTER_KINDS else [])
    for alarm_id in load:
        assert alarm_id in alarms(pinned, kind) and alarm_names(pinned, kind, [alarm_id])[0] not in rollback


def test_deployment_strategies_per_variant_and_fleet(pinned):
    """GPU: rolling when the fleet has 2+ instances (prod), else blue/green; CPU: blue/green, canary with 2+."""
    expected = {"dev": {"cpu": ("BlueGreen", "ALL_AT_ONCE"), "gpu": ("BlueGreen", "ALL_AT_ONCE"),
                        "text_generation": ("BlueGreen", "ALL_AT_ONCE")},
                "prod": {"cpu": ("BlueGreen", "CANARY"), "gpu": ("Rolling", None),
                         "text_generation": ("BlueGreen", "ALL_AT_ONCE")}}[pinned.env]
    for kind, (strategy, traffic) in expected.items():
        deployment = endpoint(pinned, kind)["Properties"]["DeploymentConfig"]
        if strategy == "Rolling":
            policy = deployment["RollingUpdatePolicy"]
            assert "BlueGreenUpdatePolicy" not in deployment
            assert policy["MaximumBatchSize"] == {"Type": "CAPACITY_PERCENT", "Value": 50}
            assert policy["RollbackMaximumBatchSize"] == {"Type": "CAPACITY_PERCENT", "Value": 100}
            assert policy["WaitIntervalInSeconds"] == 600
            assert settings(pinned, kind)["initial_instance_count"] >= 2   # 50 % of the fleet is a whole instance
        else:
            policy = deployment["BlueGreenUpdatePolicy"]
            assert "RollingUpdatePolicy" not in deployment
            routing = policy["TrafficRoutingConfiguration"]
            assert routing["Type"] == traffic and routing["WaitIntervalInSeconds"] == 600
            assert policy["TerminationWaitInSeconds"] == 600
            if traffic == "CANARY":
                assert routing["CanarySize"] == {"Type": "INSTANCE_COUNT", "Value": 1}
                assert settings(pinned, kind)["initial_instance_count"] >= 2
        assert 600 <= policy["MaximumExecutionTimeoutInSeconds"] <= 28800


@pytest.mark.parametrize("kind", KINDS)
def test_alarms_watch_the_endpoint_and_notify_the_environment_topic(pinned, kind):
    found = alarms(pinned, kind)
    expected = {"Invocation5xxRate", "MemoryUtilization", "DiskUtilization",
                "GpuUtilization" if kind == "gpu" else "CpuUtilization"}
    if kind in ADAPTER_KINDS:
        expected |= {"BusyRate", "ScoringFailures", "SlowCompute"}
    if kind == "async":
        expected |= {"OldestRequestAge"}
    assert set(found) == expected
    name = f"{pinned.prefix}-{kind.replace('_', '-')}"
    for alarm_id, alarm in found.items():
        properties = alarm["Properties"]
        for actions in ("AlarmActions", "OKActions"):
            (topic,) = properties[actions]
            assert flatten(topic).startswith(f"{pinned.prefix}-monitoring:ExportsOutputRefAlarmTopic"), alarm_id
        assert properties["TreatMissingData"] == "notBreaching"
        dimensions = [d for m in properties.get("Metrics", [properties]) for d in
                      m.get("MetricStat", {}).get("Metric", m).get("Dimensions", [])]
        if alarm_id not in ("BusyRate", "ScoringFailures", "SlowCompute"):
            assert {"Name": "EndpointName", "Value": name} in dimensions, alarm_id


def test_the_slow_release_alarm_divides_the_adapters_own_compute_by_its_evaluated_tokens(pinned):
    """Every job's compute per evaluated token (the adapter's log line, deadline misses included: metric_logs), per
    minute, against the slowest instance type's derived threshold (stacks/sizing.py) for the pinned model."""
    gguf = sizing.model_bytes("qwen3.5-4b", MODEL_SHA256)
    for kind in ADAPTER_KINDS:
        properties = alarms(pinned, kind)["SlowCompute"]["Properties"]
        expression, inputs = metric_math(properties)
        namespace = f"DecisionAdapter/{pinned.prefix}-{kind}"
        assert inputs == {"compute": (namespace, metric_logs.COMPUTE_SECONDS.metric_name),
                          "tokens": (namespace, metric_logs.EVALUATED_TOKENS.metric_name)}
        assert expression == "IF(tokens > 0, 1000 * compute / tokens, 0)"
        types = cdk_testkit.variant_instance_types(variant(pinned, kind))
        assert properties["Threshold"] == max(sizing.slow_release_ms_per_token(t, gguf) for t in types)
        # 3 breaching minutes, of 6: the newest 3 may not be published yet (test_cdk_rollback_alarms.py)
        assert (properties["EvaluationPeriods"], properties["DatapointsToAlarm"]) == (6, 3)
    assert "SlowCompute" not in alarms(pinned, "text_generation")


def test_scoring_failures_roll_back_on_a_rate_one_bad_request_cannot_hold(pinned):
    """Requests with a scoring failure (one per request, however many of a batch's records failed: metric_logs) per
    logged request, above the fault-rate threshold in 3 of 6 minutes: a single failure breaches one minute."""
    for kind in ADAPTER_KINDS:
        properties = alarms(pinned, kind)["ScoringFailures"]["Properties"]
        expression, inputs = metric_math(properties)
        namespace = f"DecisionAdapter/{pinned.prefix}-{kind}"
        assert inputs == {"failed": (namespace, metric_logs.FAILED_REQUESTS.metric_name),
                          "requests": (namespace, metric_logs.REQUESTS.metric_name)}
        assert expression == "IF(requests > 0, 100 * failed / requests, 0)"
        assert properties["Threshold"] == 5 and properties["ComparisonOperator"] == "GreaterThanThreshold"
        assert (properties["EvaluationPeriods"], properties["DatapointsToAlarm"]) == (6, 3)


def pools(synth, kind) -> list[str]:
    """The instance types of a variant's pools (none for a single instance type)."""
    return [pool["InstanceType"] for pool in variant(synth, kind).get("InstancePools", [])]


def pooled(name: str, synth, kind) -> str:
    """What a SageMaker count of the variant reads as (endpoint_specs.VariantSeries): the series itself, or with
    pools the larger of it and the pools' total."""
    if not pools(synth, kind):
        return name
    return f"MAX([{name}, {' + '.join(f'{name}{i}' for i in range(len(pools(synth, kind))))}])"


def metric_math(properties) -> tuple[str, dict[str, tuple[str, str]]]:
    (expression,) = [m for m in properties["Metrics"] if "Expression" in m]
    inputs = {m["Id"]: (m["MetricStat"]["Metric"]["Namespace"], m["MetricStat"]["Metric"]["MetricName"])
              for m in properties["Metrics"] if "MetricStat" in m}
    return expression["Expression"], inputs


@pytest.mark.parametrize("kind", KINDS)
def test_the_fault_rate_leaves_out_the_adapters_admission_refusals_but_counts_its_deadline_misses(pinned, kind):
    """SageMaker's Invocation5XXErrors counts every 503 the adapter answers: its admission refusals (load) are
    subtracted, its deadline misses (a fault of the release, metric_logs) stay counted. A pooled variant's 5xx are
    read from the variant's series or its pools' (InstanceType), whichever SageMaker publishes."""
    properties = alarms(pinned, kind)["Invocation5xxRate"]["Properties"]
    expression, inputs = metric_math(properties)
    errors, invocations = pooled("errors", pinned, kind), pooled("invocations", pinned, kind)
    name = f"{pinned.prefix}-{kind.replace('_', '-')}"
    variant_dimensions = {"EndpointName": name, "VariantName": "AllTraffic"}
    dimensions = {m["Id"]: {d["Name"]: d["Value"] for d in m["MetricStat"]["Metric"].get("Dimensions", [])}
                  for m in properties["Metrics"] if "MetricStat" in m}
    series = ["errors"] + [f"errors{i}" for i in range(len(pools(pinned, kind)))]
    for i, pool in enumerate([None] + pools(pinned, kind)):
        assert inputs[series[i]] == ("AWS/SageMaker", "Invocation5XXErrors")
        assert dimensions[series[i]] == ({**variant_dimensions, "InstanceType": pool} if pool else variant_dimensions)
    if kind in ADAPTER_KINDS:
        namespace = f"DecisionAdapter/{pinned.prefix}-{kind}"
        assert inputs["busy"] == (namespace, metric_logs.BUSY_RESPONSES.metric_name)
        assert inputs["requests"] == (namespace, metric_logs.REQUESTS.metric_name)
        assert set(inputs) == {*series, "busy", "requests"}
        assert expression == f"IF({errors} > busy, 100 * ({errors} - busy) / MAX([requests, {errors}]), 0)"
        # SageMaker's minutes can be in before the log metrics' (3 of them): 5 breaches of 8.
        assert (properties["EvaluationPeriods"], properties["DatapointsToAlarm"]) == (8, 5)
        # The busy count is the admission refusals only: a 503 with a deadline miss is not subtracted.
        assert f"$.{metric_logs.DEADLINE_MISSES_FIELD} = 0" in metric_logs.BUSY_RESPONSES.filter_pattern()
    else:   # llama-server queues behind its slots: its 5xx are faults
        assert inputs["invocations"] == ("AWS/SageMaker", "Invocations")
        assert set(inputs) == {*series, *(s.replace("errors", "invocations") for s in series)}
        assert expression == f"IF({invocations} > 0, 100 * {errors} / {invocations}, 0)"
    assert properties["Threshold"] == 5
    # CloudWatch allows an alarm at most 10 metrics.
    assert len(inputs) <= 10


def test_a_canary_must_carry_more_traffic_than_the_fault_rate_threshold():
    """At 20 instances a one-instance canary that failed every request would be 5 % of the traffic: no rollback."""
    with pytest.raises(Exception, match=r"environments\.prod\.cpu\.max_instance_count: 20 instances: a canary of "
                                        r"one instance would carry 5\.0 % of the traffic"):
        cdk_testkit.synthesized_with("prod", lambda e: e["cpu"].__setitem__("max_instance_count", 20))


@pytest.mark.parametrize("kind", KINDS)
def test_memory_growth_rolls_back(pinned, kind):
    properties = alarms(pinned, kind)["MemoryUtilization"]["Properties"]
    if not pools(pinned, kind):
        assert (properties["Namespace"], properties["MetricName"], properties["Statistic"]) == (
            "/aws/sagemaker/Endpoints", "MemoryUtilization", "Maximum")
    else:
        # A pooled variant may publish per-instance-type series only: the largest of the variant's and every
        # pool's series.
        expression, inputs = metric_math(properties)
        ids = ["m"] + [f"m{i}" for i in range(len(pools(pinned, kind)))]
        assert expression == f"MAX([{', '.join(ids)}])"
        assert inputs == dict.fromkeys(ids, ("/aws/sagemaker/Endpoints", "MemoryUtilization"))
        assert {m["MetricStat"]["Stat"] for m in properties["Metrics"] if "MetricStat" in m} == {"Maximum"}
    assert properties["Threshold"] == 90


@pytest.mark.parametrize("alarm_id", ["MemoryUtilization", "DiskUtilization", "GpuUtilization"])
def test_gpu_instance_alarms_read_every_pools_series_too(pinned, alarm_id):
    """SageMaker adds an InstanceType dimension for instance pools; where it publishes only those series, an alarm
    on {EndpointName, VariantName} alone would read nothing and never fire."""
    properties = alarms(pinned, "gpu")[alarm_id]["Properties"]
    name = f"{pinned.prefix}-gpu"
    read = [m["MetricStat"]["Metric"] for m in properties["Metrics"] if "MetricStat" in m]
    dimension_sets = [{d["Name"]: d["Value"] for d in metric["Dimensions"]} for metric in read]
    variant_dimensions = {"EndpointName": name, "VariantName": "AllTraffic"}
    assert dimension_sets == [variant_dimensions] + [{**variant_dimensions, "InstanceType": t}
                                                     for t in pools(pinned, "gpu")]
    assert pools(pinned, "gpu") == WALKTHROUGH_POOLS


def test_error_and_busy_rates_are_metric_math(pinned):
    busy = alarms(pinned, "cpu")["BusyRate"]["Properties"]
    namespaces = {m["MetricStat"]["Metric"]["Namespace"] for m in busy["Metrics"] if "MetricStat" in m}
    assert namespaces == {f"DecisionAdapter/{pinned.prefix}-cpu"}


def test_the_adapter_log_lines_feed_the_busy_and_failure_metrics(pinned):
    """Metric filters on the adapter's JSON request log: the fields logger, message and status are its contract."""
    for kind in KINDS:
        filters = {f["Properties"]["MetricTransformations"][0]["MetricName"]: f["Properties"]
                   for f in pinned.resources(ENDPOINT_STACKS[kind], "AWS::Logs::MetricFilter").values()}
        if kind not in ADAPTER_KINDS:
            assert filters == {}
            continue
        assert set(filters) == {"Requests", "BusyResponses", "DeadlineMisses", "ScoringFailures", "FailedRequests",
                                "ComputeSeconds", "EvaluatedTokens"}
        log_group = logical_id(pinned, kind, "AWS::Logs::LogGroup")
        values = {"DeadlineMisses": "$.deadline_misses", "ComputeSeconds": "$.compute_s",
                  "EvaluatedTokens": "$.evaluated_tokens"}
        for name, metric_filter in filters.items():
            assert metric_filter["LogGroupName"] == {"Ref": log_group}
            (transformation,) = metric_filter["MetricTransformations"]
            assert transformation["MetricNamespace"] == f"DecisionAdapter/{pinned.prefix}-{kind}"
            assert (transformation["MetricValue"], transformation["DefaultValue"]) == (values.get(name, "1"), 0)
        # The adapter's own definitions (container/decision_adapter/metric_logs.py); tests/deploy/test_log_contract
        # checks them against the lines the running adapter writes.
        assert {name: f["FilterPattern"] for name, f in filters.items()} == {
            m.metric_name: m.filter_pattern() for m in metric_logs.METRICS}
        assert filters["ScoringFailures"]["FilterPattern"] == \
            '{ $.logger = "decision_adapter.requests" && $.message = "scoring failed" }'


def test_endpoints_have_stable_names_and_generated_configs(pinned):
    for kind in KINDS:
        for resource_type in ("AWS::SageMaker::Model", "AWS::SageMaker::EndpointConfig"):
            assert not {"ModelName", "EndpointConfigName"} & set(one(pinned, kind, resource_type)["Properties"])
        # Alarms have fixed names, which the alarm topic's policy lists (test_cdk_monitoring_stack).
        name = f"{pinned.prefix}-{kind.replace('_', '-')}"
        assert {alarm_id: a["Properties"]["AlarmName"] for alarm_id, a in alarms(pinned, kind).items()} == {
            alarm_id: f"{name}-{alarm_id}" for alarm_id in alarms(pinned, kind)}


def test_log_groups_exist_before_the_endpoints(pinned):
    for kind in KINDS:
        group = one(pinned, kind, "AWS::Logs::LogGroup")
        assert group["Properties"]["LogGroupName"] == f"/aws/sagemaker/Endpoints/{pinned.prefix}-{kind.replace('_', '-')}"
        assert logical_id(pinned, kind, "AWS::Logs::LogGroup") in endpoint(pinned, kind)["DependsOn"]


def grants_of(synth, kind):
    found = {}
    for _, statement in statements(synth.template(ENDPOINT_STACKS[kind])):
        assert statement["Effect"] == "Allow"
        for action in as_list(statement["Action"]):
            found.setdefault(action, []).append(statement)
    return found


def resources_of(statements_list):
    return [flatten(r) for s in statements_list for r in as_list(s["Resource"])]


@pytest.mark.parametrize("kind", KINDS)
def test_the_execution_role_reads_the_model_and_pulls_from_the_one_repository(pinned, kind):
    found = grants_of(pinned, kind)
    export = f"{pinned.prefix}-artifacts:ArtifactBucketArn"
    get_objects = resources_of(found["s3:GetObject"])
    pins = cdk_testkit.pins_of(pinned.env)
    # Exactly the pinned archive and repository: this environment's, or the artifact source's the pins name.
    archive = f"arn:<AWS::Partition>:s3:::{pins['model']['bucket']}/{MODEL_KEY}" if "bucket" in pins["model"] else \
        f"{export}/{MODEL_KEY}"
    assert archive in get_objects
    for action in ("ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"):
        (repository,) = resources_of(found[action])
        if cdk_testkit.builds(pinned.env):
            assert "ImageRepository" in repository
        else:
            registry, name = pins["images"][image_kind(kind)].split("@")[0].split("/", 1)
            assert repository == f"arn:aws:ecr:{EXAMPLE_REGION}:{registry.split('.')[0]}:repository/{name}"
    assert resources_of(found["ecr:GetAuthorizationToken"]) == ["*"]
    # The asynchronous endpoint's topics' key: Topic.grant_publish's kms:GenerateDataKey* (test_cdk_async.py).
    assert [a for a in found if "*" in a] == (["kms:GenerateDataKey*"] if kind == "async" else [])
    assert sorted(a for a in found if "*" in resources_of(found[a])) == [
        "cloudwatch:PutMetricData", "ecr:GetAuthorizationToken"]
    assert not [a for a in found if a.startswith(("ecr:Put", "s3:Delete"))]
    if kind == "cpu":   # Batch Transform (the CPU model only): read the input prefix, write the output prefix
        assert sorted(get_objects) == sorted([archive, f"{export}/batch/input/*"])
        assert resources_of(found["s3:PutObject"]) == [f"{export}/batch/output/*"]
        (list_bucket,) = found["s3:ListBucket"]
        assert list_bucket["Condition"] == {"StringLike": {"s3:prefix": ["batch/input/*"]}}
    elif kind == "async":   # its request bodies; its answers and failures
        assert sorted(get_objects) == sorted([archive, f"{export}/async-inference/input/*"])
        assert sorted(resources_of(found["s3:PutObject"])) == [f"{export}/async-inference/failure/*",
                                                               f"{export}/async-inference/output/*"]
    else:
        assert get_objects == [archive] and "s3:PutObject" not in found


@pytest.mark.parametrize("kind", KINDS)
def test_the_role_writes_its_log_group_but_cannot_create_log_groups(pinned, kind):
    found = grants_of(pinned, kind)
    assert "logs:CreateLogGroup" not in found
    group = logical_id(pinned, kind, "AWS::Logs::LogGroup")
    assert f"<{group}.Arn>" in resources_of(found["logs:PutLogEvents"])
    assert f"<{group}.Arn>" in resources_of(found["logs:DescribeLogStreams"])


@pytest.mark.parametrize("kind", KINDS)
def test_the_role_publishes_instance_metrics_in_sagemakers_namespace_only(pinned, kind):
    (statement,) = grants_of(pinned, kind)["cloudwatch:PutMetricData"]
    namespaces = statement["Condition"]["StringEquals"]["cloudwatch:namespace"]
    assert as_list(namespaces)[0] == "/aws/sagemaker/Endpoints"
    assert set(as_list(namespaces)) <= {"/aws/sagemaker/Endpoints", "/aws/sagemaker/TransformJobs"}


@pytest.mark.parametrize("kind", KINDS)
def test_the_role_reads_exactly_the_rollback_alarms(pinned, kind):
    (statement,) = grants_of(pinned, kind)["cloudwatch:DescribeAlarms"]
    rollback = [a["AlarmName"]["Ref"] for a in
                endpoint(pinned, kind)["Properties"]["DeploymentConfig"]["AutoRollbackConfiguration"]["Alarms"]]
    assert sorted(resources_of([statement])) == sorted(f"<{lid}.Arn>" for lid in rollback)


@pytest.mark.parametrize("kind", KINDS)
def test_only_sagemaker_of_this_account_assumes_the_role(pinned, kind):
    (statement,) = one(pinned, kind, "AWS::IAM::Role")["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert statement["Principal"] == {"Service": "sagemaker.amazonaws.com"}
    assert statement["Action"] == "sts:AssumeRole"
    assert statement["Condition"] == {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}


def test_models_and_endpoints_wait_for_the_execution_role_policy(pinned):
    for kind in KINDS:
        for resource_type in ("AWS::SageMaker::Model", "AWS::SageMaker::Endpoint"):
            assert any(d.startswith("ExecutionRoleDefaultPolicy") for d in one(pinned, kind, resource_type)["DependsOn"])


def test_a_pin_outside_the_project_repository_gets_its_own_pull_grant():
    uri = "763104351884.dkr.ecr.us-east-1.amazonaws.com/llama-cpp@sha256:" + "9" * 64
    synth = cdk_testkit.synthesized_with("dev", lambda e: e["pins"]["images"].__setitem__("text_generation", uri))
    assert model(synth, "text_generation")["PrimaryContainer"]["Image"] == uri
    assert resources_of(grants_of(synth, "text_generation")["ecr:BatchGetImage"]) == [
        "arn:aws:ecr:us-east-1:763104351884:repository/llama-cpp"]
    # The CPU and GPU images stay in the project repository.
    assert "ImageRepository" in resources_of(grants_of(synth, "cpu")["ecr:BatchGetImage"])[0]


def test_a_fresh_clone_leaves_the_endpoints_out_and_says_which_keys_to_set(fresh_clone):
    for stack in ENDPOINT_STACKS.values():
        resources = fresh_clone.template(stack)["Resources"]
        resources.pop("CDKMetadata", None)
        # Only the no-op placeholder that keeps the template valid; no role, key or endpoint yet.
        assert [r["Type"] for r in resources.values()] == ["AWS::CloudFormation::WaitConditionHandle"]
    warnings = [w for w in fresh_clone.warnings() if "endpoint is left out" in w]
    env = fresh_clone.env
    assert sorted(warnings) == sorted(
        f"The {kind} endpoint is left out until environments.{env}.pins.images.{image_kind(kind)} and "
        f"environments.{env}.pins.model are set in cdk.json (docs/deploy.md, 3. Pin, preflight, diff and deploy the "
        f"endpoints)." for kind in KINDS)
    # The artifacts, build and monitoring stacks do not wait for pins.
    if cdk_testkit.builds(fresh_clone.env):
        assert fresh_clone.resources("build", "AWS::CodeBuild::Project")
    else:
        assert "build" not in fresh_clone.stack_kinds
    assert fresh_clone.resources("artifacts", "AWS::ECR::Repository")
    assert fresh_clone.resources("monitoring", "AWS::SNS::Topic")


def test_only_listed_and_pinned_endpoints_are_created():
    def edit(environment):
        environment["pins"]["images"]["gpu"] = None
        environment["endpoints"] = ["cpu", "gpu"]
    synth = cdk_testkit.synthesized_with("prod", edit)
    assert [e["Properties"]["EndpointName"] for e in synth.resources("endpoint-cpu", "AWS::SageMaker::Endpoint")
            .values()] == ["decision-prod-cpu"]
    for stack in ("endpoint-gpu", "endpoint-text-generation"):   # unpinned; not listed
        assert synth.resources(stack, "AWS::SageMaker::Endpoint") == {}
        assert synth.resources(stack, "AWS::CloudFormation::WaitConditionHandle")
    assert [w for w in synth.warnings() if "left out" in w] == [
        "The gpu endpoint is left out until environments.prod.pins.images.gpu is set in cdk.json (docs/deploy.md, "
        "3. Pin, preflight, diff and deploy the endpoints)."]


def test_outputs_name_the_endpoint_model_and_transform_instance(pinned):
    for kind in KINDS:
        outputs = pinned.template(ENDPOINT_STACKS[kind])["Outputs"]
        assert flatten(outputs["EndpointName"]["Value"]).endswith(".EndpointName>")
        assert flatten(outputs["ModelName"]["Value"]).endswith(".ModelName>")
        if kind == "cpu":   # the GPU model does not run in Batch Transform (endpoint_client/transform.py)
            assert outputs["TransformInstanceType"]["Value"] == settings(pinned, kind)["instance_type"]
        else:
            assert "TransformInstanceType" not in outputs


def test_autoscaling_false_detaches_scaling_and_keeps_the_endpoint():
    """Step one of an instance-type change: the endpoint stays, the scalable target and its policy go."""
    synth = cdk_testkit.synthesized_with("prod", lambda e: e["cpu"].__setitem__("autoscaling", False))
    assert synth.resources("endpoint-cpu", "AWS::ApplicationAutoScaling::ScalableTarget") == {}
    assert synth.resources("endpoint-cpu", "AWS::ApplicationAutoScaling::ScalingPolicy") == {}
    assert [e["Properties"]["EndpointName"] for e in synth.resources("endpoint-cpu", "AWS::SageMaker::Endpoint")
            .values()] == ["decision-prod-cpu"]
    assert endpoint(synth, "cpu")["Properties"]["RetainAllVariantProperties"] is True
    # The other endpoints keep theirs, and the template says why the fleet no longer scales.
    assert synth.resources("endpoint-gpu", "AWS::ApplicationAutoScaling::ScalableTarget")
    assert [w for w in synth.warnings() if "detached" in w] == [
        "Auto scaling of the cpu endpoint is detached (environments.prod.cpu.autoscaling is false): its fleet stays "
        "at the instance count it has. Set it back to true once the instance type or pool change is deployed "
        "(docs/deploy.md, Change the instance type or the pools)."]


def test_step_two_changes_the_instance_type_with_scaling_still_detached_then_step_three_attaches_it():
    def new_type(attached):
        def edit(environment):
            environment["cpu"]["instance_type"] = "ml.c7i.4xlarge"
            environment["cpu"]["threads"] = 8
            environment["cpu"]["target_invocations_per_instance"] = {"ml.c7i.4xlarge": 17}
            environment["cpu"]["autoscaling"] = attached
        return edit
    detached = cdk_testkit.synthesized_with("prod", new_type(False))
    assert variant(detached, "cpu")["InstanceType"] == "ml.c7i.4xlarge"
    assert detached.resources("endpoint-cpu", "AWS::ApplicationAutoScaling::ScalableTarget") == {}
    attached = cdk_testkit.synthesized_with("prod", new_type(True))
    policy = one(attached, "cpu", "AWS::ApplicationAutoScaling::ScalingPolicy")["Properties"]
    assert policy["TargetTrackingScalingPolicyConfiguration"]["TargetValue"] == 17
