"""The async endpoint kind (cdk.json ``async``, issue 48): SageMaker Asynchronous Inference on the CPU adapter image.

Its EndpointConfig's AsyncInferenceConfig (answers and failures under the artifact bucket's async-inference/
prefixes, the two topics of its stack, the requests an instance gets at once), the Model's environment
(ADAPTER_DEPLOYMENT=async), the execution role's rights evaluated with the policy simulator (exactly its prefixes
and topics), scaling on the queue down to 0 (target tracking on ApproximateBacklogSizePerInstance and a step out
from 0 on HasBacklogWithoutCapacity), the oldest-request alarm (it notifies, it never rolls back), the invoker's
rights; cdk-nag and cfn-lint clean, in-process and through the pinned CLI with a VPC and data capture beside it;
each refusal named by its key (an async kind without output paths first).
"""

from __future__ import annotations

import json
import shutil

import pytest

import app as cdk_app
import cdk_testkit
import role_calls
from deploy.iam_simulation import Deployment, Request, denied, evaluate
from stacks.config import ConfigError, load_environment
from test_cdk_botocore import problems as api_problems
from test_cdk_botocore import requests_of
from test_cdk_cfn_lint import findings
from test_cdk_cli import pinned_checkout, run_cdk

STACK = cdk_testkit.ENDPOINT_STACKS["async"]
SETTINGS = cdk_testkit.cdk_json_context()["environments"]["dev"]["async"]


@pytest.fixture(scope="module")
def dev():
    return cdk_testkit.synthesized("dev", pinned=True)


def resource(synth, resource_type, prefix="Endpoint"):
    return synth.resource(STACK, resource_type, prefix)["Properties"]


def bucket_import(synth):
    return resource(synth, "AWS::SageMaker::EndpointConfig")["AsyncInferenceConfig"]["OutputConfig"][
        "S3OutputPath"]["Fn::Join"][1][1]


# --- the template -----------------------------------------------------------------------------------------------

def test_the_endpoint_config_queues_into_the_artifact_bucket_and_notifies_its_topics(dev):
    config = resource(dev, "AWS::SageMaker::EndpointConfig")
    bucket = bucket_import(dev)
    assert bucket["Fn::ImportValue"].startswith(f"{dev.prefix}-artifacts:ExportsOutputRefArtifactBucket")
    topics = dev.resources(STACK, "AWS::SNS::Topic")
    success, error = (next(lid for lid in topics if lid.startswith(which)) for which in ("Success", "Error"))
    assert config["AsyncInferenceConfig"] == {
        "OutputConfig": {"S3OutputPath": {"Fn::Join": ["", ["s3://", bucket, "/async-inference/output/"]]},
                         "S3FailurePath": {"Fn::Join": ["", ["s3://", bucket, "/async-inference/failure/"]]},
                         "NotificationConfig": {"SuccessTopic": {"Ref": success}, "ErrorTopic": {"Ref": error}}},
        "ClientConfig": {"MaxConcurrentInvocationsPerInstance": SETTINGS["max_concurrent_invocations_per_instance"]}}
    # The bucket is S3-managed (SSE-S3): no KmsKeyId for the answers; the volume key stays the EndpointConfig's.
    assert "KmsKeyId" not in config["AsyncInferenceConfig"]["OutputConfig"]
    (variant,) = config["ProductionVariants"]
    assert variant["InstanceType"] == SETTINGS["instance_type"] and variant["InitialInstanceCount"] == 1
    # No other kind is asynchronous.
    for kind, stack in cdk_testkit.ENDPOINT_STACKS.items():
        other = dev.resource(stack, "AWS::SageMaker::EndpointConfig", "Endpoint")["Properties"]
        assert ("AsyncInferenceConfig" in other) is (kind == "async"), kind


def test_the_model_runs_the_cpu_image_as_an_async_deployment(dev):
    container = resource(dev, "AWS::SageMaker::Model")["PrimaryContainer"]
    cpu = dev.resource(cdk_testkit.ENDPOINT_STACKS["cpu"], "AWS::SageMaker::Model", "Endpoint")["Properties"]
    assert container["Image"] == cpu["PrimaryContainer"]["Image"]       # pins.images.cpu: no pin of its own
    assert container["Environment"] == {
        "ADAPTER_THREADS": str(SETTINGS["threads"]), "ADAPTER_GPU_LAYERS": "0", "ADAPTER_DEPLOYMENT": "async",
        "ADAPTER_ASYNC_TIMEOUT_S": str(SETTINGS["invocation_timeout_s"]),
        "ADAPTER_IMAGE_DIGEST": cdk_testkit.TEST_PINS["images"]["cpu"]}


def test_the_topics_are_encrypted_with_the_stacks_key_and_refuse_requests_without_tls(dev):
    topics = dev.resources(STACK, "AWS::SNS::Topic")
    (key,) = dev.resources(STACK, "AWS::KMS::Key").keys() - {k for k in dev.resources(STACK, "AWS::KMS::Key")
                                                             if k.startswith("VolumeKey")}
    assert len(topics) == 2
    for topic in topics.values():
        assert topic["Properties"]["KmsMasterKeyId"] == {"Fn::GetAtt": [key, "Arn"]}
    for policy in dev.resources(STACK, "AWS::SNS::TopicPolicy").values():
        (statement,) = policy["Properties"]["PolicyDocument"]["Statement"]
        assert statement["Effect"] == "Deny" and statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert dev.resource(STACK, "AWS::KMS::Key", "NotificationTopicKey")["Properties"]["EnableKeyRotation"] is True


def test_it_scales_on_the_queue_down_to_zero_and_out_from_zero(dev):
    target = resource(dev, "AWS::ApplicationAutoScaling::ScalableTarget")
    assert (target["MinCapacity"], target["MaxCapacity"]) == (0, SETTINGS["max_instance_count"])
    policies = {p["Properties"]["PolicyName"]: p["Properties"]
                for p in dev.resources(STACK, "AWS::ApplicationAutoScaling::ScalingPolicy").values()}
    assert set(policies) == {"backlog-per-instance", "scale-out-from-zero"}
    tracking = policies["backlog-per-instance"]["TargetTrackingScalingPolicyConfiguration"]
    assert tracking == {
        "TargetValue": SETTINGS["target_backlog_per_instance"],
        "CustomizedMetricSpecification": {"Namespace": "AWS/SageMaker", "MetricName": "ApproximateBacklogSizePerInstance",
                                          "Dimensions": [{"Name": "EndpointName", "Value": f"{dev.prefix}-async"}],
                                          "Statistic": "Average"},
        "ScaleInCooldown": SETTINGS["scale_in_cooldown_s"], "ScaleOutCooldown": SETTINGS["scale_out_cooldown_s"]}
    step = policies["scale-out-from-zero"]
    assert step["PolicyType"] == "StepScaling" and step["StepScalingPolicyConfiguration"] == {
        "AdjustmentType": "ChangeInCapacity", "MetricAggregationType": "Average",
        "Cooldown": SETTINGS["scale_out_cooldown_s"],
        "StepAdjustments": [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}]}
    alarm = resource(dev, "AWS::CloudWatch::Alarm", "EndpointHasBacklogWithoutCapacity")
    (step_id,) = [lid for lid, p in dev.resources(STACK, "AWS::ApplicationAutoScaling::ScalingPolicy").items()
                  if p["Properties"]["PolicyName"] == "scale-out-from-zero"]
    assert {k: alarm[k] for k in ("Namespace", "MetricName", "Dimensions", "Statistic", "Period", "Threshold",
                                  "ComparisonOperator", "EvaluationPeriods", "AlarmActions")} == {
        "Namespace": "AWS/SageMaker", "MetricName": "HasBacklogWithoutCapacity",
        "Dimensions": [{"Name": "EndpointName", "Value": f"{dev.prefix}-async"}], "Statistic": "Average",
        "Period": 60, "Threshold": 1, "ComparisonOperator": "GreaterThanOrEqualToThreshold", "EvaluationPeriods": 1,
        "AlarmActions": [{"Ref": step_id}]}      # a scaling policy's Ref is its ARN
    # The real-time kinds keep their minimum at the initial count and track invocations.
    cpu = dev.resource(cdk_testkit.ENDPOINT_STACKS["cpu"], "AWS::ApplicationAutoScaling::ScalableTarget",
                       "Endpoint")["Properties"]
    assert cpu["MinCapacity"] == cdk_testkit.cdk_json_context()["environments"]["dev"]["cpu"]["initial_instance_count"]


def test_prod_keeps_one_instance():
    prod = cdk_testkit.synthesized("prod", pinned=True)
    target = prod.resource(STACK, "AWS::ApplicationAutoScaling::ScalableTarget", "Endpoint")["Properties"]
    assert target["MinCapacity"] == 1


def test_the_oldest_request_alarm_notifies_and_never_rolls_back(dev):
    alarm = resource(dev, "AWS::CloudWatch::Alarm", "EndpointOldestRequestAge")
    threshold = SETTINGS["model_download_timeout_s"] + SETTINGS["startup_health_check_timeout_s"] + \
        SETTINGS["invocation_timeout_s"]
    assert (alarm["MetricName"], alarm["Statistic"], alarm["Threshold"]) == (
        "ApproximateAgeOfOldestRequest", "Maximum", threshold)
    assert alarm["AlarmName"] == f"{dev.prefix}-async-OldestRequestAge" and alarm["AlarmActions"]
    endpoint = resource(dev, "AWS::SageMaker::Endpoint", "Endpoint")
    rollback = [a["AlarmName"] for a in endpoint["DeploymentConfig"]["AutoRollbackConfiguration"]["Alarms"]]
    assert f"{dev.prefix}-async-OldestRequestAge" not in rollback and rollback
    # Guardrails apply to asynchronous endpoints: blue/green, all at once (its minimum is 0 instances).
    assert endpoint["DeploymentConfig"]["BlueGreenUpdatePolicy"]["TrafficRoutingConfiguration"]["Type"] == \
        "ALL_AT_ONCE"


def test_the_outputs_name_the_prefixes_topics_and_timeout(dev):
    outputs = dev.template(STACK)["Outputs"]
    for key in ("AsyncSuccessTopicArn", "AsyncErrorTopicArn", "EndpointName"):
        assert key in outputs, key
    assert {key: outputs[key]["Value"] for key in ("AsyncInputPrefix", "AsyncOutputPrefix", "AsyncFailurePrefix")} == {
        "AsyncInputPrefix": SETTINGS["input_prefix"], "AsyncOutputPrefix": SETTINGS["output_prefix"],
        "AsyncFailurePrefix": SETTINGS["failure_prefix"]}
    assert outputs["AsyncInvocationTimeoutS"]["Value"] == str(SETTINGS["invocation_timeout_s"])


def test_the_requests_are_valid_for_sagemakers_api(dev):
    """CreateEndpointConfig with its AsyncInferenceConfig, PutScalingPolicy and PutMetricAlarm as botocore's service
    models define them."""
    calls = requests_of(dev.template(STACK))
    (config,) = [params for _, operation, params in calls if operation == "CreateEndpointConfig"]
    assert "AsyncInferenceConfig" in config
    for service, operation, params in calls:
        assert api_problems(service, operation, params) == [], (operation, params)


# --- the execution role and the invoker -------------------------------------------------------------------------

def test_sagemaker_reads_and_writes_exactly_the_async_prefixes_and_publishes_to_its_topics(dev):
    deployment = Deployment(dev.outdir, cdk_testkit.EXAMPLE_ACCOUNT, cdk_testkit.EXAMPLE_REGION)
    stack = dev.stack_name(STACK)
    role = role_calls.endpoint_execution_role(deployment, stack)

    keys = {deployment.arn(stack, lid): deployment.resolve(stack, key["Properties"]["KeyPolicy"])
            for lid, key in deployment.resources_of_type(stack, "AWS::KMS::Key").items()}

    def verdicts(requests):
        """A request on a KMS key with that key's policy too (KMS allows what an identity policy allows only where
        the key policy delegates to the account)."""
        found = []
        for request in requests:
            found += evaluate(deployment.arn(stack, role), deployment.account, [request],
                              identity_policies=deployment.role_policies(stack, role),
                              resource_policy=keys.get(request.resource))
        return found

    requests = role_calls.endpoint_execution_requests(deployment, stack)
    assert all(call in requests for call in role_calls.async_inference_requests(deployment, stack))
    calls = role_calls.async_inference_requests(deployment, stack, with_keys=True)
    assert len(calls) == 3 + 2 * 3
    requests += [call for call in calls if call not in requests]
    assert not role_calls.resource_type_problems(requests), role_calls.resource_type_problems(requests)
    assert not denied(verdicts(requests)), "\n".join(denied(verdicts(requests)))
    # Its rights on the bucket are exactly those: each prefix only for its own use, nothing beside them.
    elsewhere = role_calls.async_inference_requests(
        deployment, stack, input_key="async-inference/output/x.out", output_key="async-inference/input/x.json",
        failure_key="async-inference/other/x-error.out")[:3]
    bucket = deployment.output(dev.stack_name("artifacts"), "ArtifactBucketName")
    elsewhere += [Request("s3:GetObject", f"arn:aws:s3:::{bucket}/{key}", source="elsewhere") for key in (
        "async-inference/other/x.json", "acceptance/dev/latest.json", "batch/input/x.jsonl")]
    elsewhere += [Request("sns:Publish", f"arn:aws:sns:{deployment.region}:{deployment.account}:other",
                          source="elsewhere")]
    assert all(not v.allowed for v in verdicts(elsewhere)), [v.line() for v in verdicts(elsewhere) if v.allowed]
    # The other kinds' roles have none of it.
    for kind, other in cdk_testkit.ENDPOINT_STACKS.items():
        if kind != "async":
            assert role_calls.async_inference_requests(deployment, dev.stack_name(other)) == [], kind


def test_the_invoker_may_call_the_async_endpoint_through_its_prefixes_only(dev):
    deployment = Deployment(dev.outdir, cdk_testkit.EXAMPLE_ACCOUNT, cdk_testkit.EXAMPLE_REGION)
    policy = deployment.managed_policy(dev.stack_name("access"), f"{dev.prefix}-invoker")
    bucket = deployment.output(dev.stack_name("artifacts"), "ArtifactBucketName")
    arn = f"arn:aws:sagemaker:{deployment.region}:{deployment.account}:endpoint"
    objects = f"arn:aws:s3:::{bucket}/async-inference"

    def results(requests):
        return [v.result for v in evaluate(f"arn:aws:iam::{deployment.account}:role/app", deployment.account,
                                           requests, identity_policies=[policy])]
    allowed = [Request("sagemaker:InvokeEndpointAsync", f"{arn}/{dev.prefix}-async"),
               Request("s3:PutObject", f"{objects}/input/request.json"),
               Request("s3:GetObject", f"{objects}/output/{role_calls.EXAMPLE_INFERENCE_ID}.out"),
               Request("s3:GetObject", f"{objects}/failure/{role_calls.EXAMPLE_INFERENCE_ID}-error.out")]
    assert set(results(allowed)) == {"Allowed"}
    refused = [Request("sagemaker:InvokeEndpointAsync", f"{arn}/{dev.prefix}-cpu"),
               Request("sagemaker:InvokeEndpointAsync", f"{arn}/decision-prod-async"),
               Request("s3:PutObject", f"{objects}/output/forged.out"),
               Request("s3:GetObject", f"{objects}/input/someone-elses.json"),
               Request("s3:GetObject", f"arn:aws:s3:::{bucket}/acceptance/dev/latest.json")]
    assert set(results(refused)) == {"ImplicitlyDenied"}


# --- clean, in-process and through the pinned CLI ---------------------------------------------------------------

def test_the_async_stack_is_nag_and_cfn_lint_clean(dev):
    report = dev.outdir / "validation-report.json"
    if report.exists():
        for plugin in json.loads(report.read_text())["pluginReports"]:
            assert plugin["conclusion"] == "success", plugin
    assert findings(dev.template(STACK)) == []
    assert findings(cdk_testkit.synthesized("dev", pinned=False).template(STACK)) == []


def test_npx_cdk_synth_with_a_vpc_data_capture_and_an_async_endpoint(tmp_path):
    """The issue's done-when: cdk synth through the pinned CLI, with pins, for an environment with a VPC, data
    capture and an async endpoint: nag-clean (no finding printed), cfn-lint clean."""
    from test_cdk_vpc import CREATED, GROUPS, SUBNETS, VPC
    def placed_and_captured(cdk_json: dict) -> None:
        environment = cdk_json["context"]["environments"]["dev"]
        environment["vpc"] = {**VPC, "create_endpoints": CREATED}
        environment["async"]["data_capture"] = {"sampling_percentage": 10}
        environment["cpu"]["data_capture"] = {"sampling_percentage": 10}
    checkout = pinned_checkout(tmp_path, placed_and_captured)
    environment = json.loads((checkout / "cdk.json").read_text())["context"]["environments"]["dev"]
    assert "async" in environment["endpoints"] and environment["vpc"]["create_endpoints"] == CREATED
    out = tmp_path / "cdk.out"
    completed = run_cdk("synth", "-c", "env=dev", "--output", str(out), "--quiet", cwd=checkout, region="eu-west-1")
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "AwsSolutions" not in completed.stderr and "left out" not in completed.stderr
    prefix = environment["name_prefix"]
    for path in out.glob(f"{prefix}-*.template.json"):
        assert findings(json.loads(path.read_text())) == [], path.name
    template = json.loads((out / f"{prefix}-{STACK}.template.json").read_text())
    of_type = {r["Type"]: r["Properties"] for r in template["Resources"].values()}
    assert of_type["AWS::SageMaker::Model"]["VpcConfig"] == {"Subnets": SUBNETS, "SecurityGroupIds": GROUPS}
    config = of_type["AWS::SageMaker::EndpointConfig"]
    assert config["DataCaptureConfig"]["InitialSamplingPercentage"] == 10 and "AsyncInferenceConfig" in config
    shutil.rmtree(out)


# --- refusals ---------------------------------------------------------------------------------------------------

def problems(edit, env="dev") -> list[str]:
    context = cdk_testkit.context_for(env, edit=edit)
    with pytest.raises(ConfigError) as raised:
        load_environment(context["environments"], env, model_pins=cdk_app.model_pin_names())
    return list(raised.value.problems)


def with_async(**changes):
    def edit(environment):
        for key, value in changes.items():
            if value is None:
                environment["async"].pop(key)
            else:
                environment["async"][key] = value
    return edit


OUTSIDE = "is outside the artifact bucket's async-inference/ prefix"


@pytest.mark.parametrize("changes, expected", [
    # An async kind without output paths.
    ({"output_prefix": None}, ["environments.dev.async.output_prefix: is required"]),
    ({"failure_prefix": None}, ["environments.dev.async.failure_prefix: is required"]),
    ({"output_prefix": None, "failure_prefix": None}, ["environments.dev.async.output_prefix: is required",
                                                       "environments.dev.async.failure_prefix: is required"]),
    ({"input_prefix": None}, ["environments.dev.async.input_prefix: is required"]),
    ({"output_prefix": "results/"}, [f"environments.dev.async.output_prefix: 'results/' {OUTSIDE}"]),
    ({"failure_prefix": "s3://elsewhere/async-inference/failure/"},
     ["environments.dev.async.failure_prefix: 's3://elsewhere/async-inference/failure/' " + OUTSIDE]),
    ({"input_prefix": "async-inference/"}, [f"environments.dev.async.input_prefix: 'async-inference/' {OUTSIDE}"]),
    ({"output_prefix": "async-inference/out"}, ["environments.dev.async.output_prefix: 'async-inference/out' is not "
                                                "a key prefix ending with '/'"]),
    ({"failure_prefix": "async-inference/output/"},
     ["environments.dev.async.failure_prefix: 'async-inference/output/' is also environments.dev.async."
      "output_prefix: requests, answers and failures each need a prefix of their own"]),
    ({"failure_prefix": "async-inference/output/failed/"},
     ["environments.dev.async.failure_prefix: 'async-inference/output/failed/' and environments.dev.async."
      "output_prefix ('async-inference/output/') nest"]),
    ({"max_concurrent_invocations_per_instance": 0},
     ["environments.dev.async.max_concurrent_invocations_per_instance: 0 is outside 1..1000"]),
    ({"invocation_timeout_s": 3601}, ["environments.dev.async.invocation_timeout_s: 3601 is outside 1..3600"]),
    ({"min_instance_count": -1}, ["environments.dev.async.min_instance_count: -1 is outside 0..100"]),
    ({"min_instance_count": 2}, ["environments.dev.async.min_instance_count: 2 is above initial_instance_count (1)"]),
    ({"target_invocations_per_instance": {"ml.c7i.xlarge": 2}},
     ["environments.dev.async.target_invocations_per_instance: an asynchronous endpoint publishes no Invocations "
      "metric"]),
    ({"instance_type": "ml.g5.xlarge"}, ["environments.dev.async.instance_type: 'ml.g5.xlarge' is an accelerated "
                                         "instance"]),
], ids=["no-output", "no-failure", "no-output-paths", "no-input", "outside", "uri", "the-prefix-itself",
        "no-slash", "equal", "nested", "concurrency", "timeout", "negative-minimum", "minimum-above-initial",
        "invocations-target", "gpu-instance"])
def test_each_bad_async_setting_is_refused_naming_its_key(changes, expected):
    found = problems(with_async(**changes))
    for line in expected:
        assert any(problem.startswith(line) for problem in found), (line, found)


def test_scale_to_zero_is_the_async_kinds_alone():
    """min_instance_count is no key of the real-time kinds: SageMaker queues nothing for them while no instance runs."""
    found = problems(lambda environment: environment["cpu"].__setitem__("min_instance_count", 0))
    assert any(p.startswith("environments.dev.cpu.min_instance_count: unknown key") for p in found), found


def test_listing_async_without_its_settings_is_refused():
    def edit(environment):
        environment.pop("async")
    found = problems(edit)
    assert any(p.startswith("environments.dev.endpoints[3]: 'async' is listed, but this environment has no 'async' "
                            "settings") for p in found), found
    # Unlisted, an environment needs none.
    context = cdk_testkit.context_for("dev", edit=lambda e: (e.pop("async"), e["endpoints"].remove("async")))
    assert load_environment(context["environments"], "dev", model_pins=cdk_app.model_pin_names()).async_ is None


def test_there_is_no_async_image_pin():
    def edit(environment):
        environment["pins"]["images"]["async"] = environment["pins"]["images"]["cpu"]
    assert any(p.startswith("environments.dev.pins.images.async: unknown key") for p in problems(edit))


def test_an_async_invocation_as_boto3_makes_it_is_allowed_by_the_invoker(dev):
    """What `python -m endpoint_client invoke --async` calls, as role_calls turns boto3 operations into the IAM
    requests AWS authorizes (the Service Authorization Reference: InvokeEndpointAsync on the endpoint): the upload,
    the call, the answer's read; allowed by the invoker policy, and refused on the real-time cpu endpoint."""
    deployment = Deployment(dev.outdir, cdk_testkit.EXAMPLE_ACCOUNT, cdk_testkit.EXAMPLE_REGION)
    policy = deployment.managed_policy(dev.stack_name("access"), f"{dev.prefix}-invoker")
    bucket = deployment.output(dev.stack_name("artifacts"), "ArtifactBucketName")
    api = role_calls.ApiRequests(account=deployment.account, region=deployment.region)
    key = "async-inference/input/request.json"

    def requests(endpoint_name):
        operations = [
            role_calls.Operation("s3", "PutObject", {"Bucket": bucket, "Key": key}),
            role_calls.Operation("sagemaker-runtime", "InvokeEndpointAsync", {
                "EndpointName": endpoint_name, "InputLocation": f"s3://{bucket}/{key}", "InvocationTimeoutSeconds": 900}),
            role_calls.Operation("s3", "GetObject", {"Bucket": bucket,
                                                     "Key": f"async-inference/output/{role_calls.EXAMPLE_INFERENCE_ID}.out"})]
        return [r for op in operations for r in api.of(op)]

    own = requests(f"{dev.prefix}-async")
    assert "sagemaker:InvokeEndpointAsync" in {r.action for r in own}
    assert not role_calls.resource_type_problems(own), role_calls.resource_type_problems(own)
    verdicts = evaluate(f"arn:aws:iam::{deployment.account}:role/app", deployment.account, own,
                        identity_policies=[policy])
    assert not denied(verdicts), "\n".join(denied(verdicts))
    elsewhere = [r for r in requests(f"{dev.prefix}-cpu") if r.action == "sagemaker:InvokeEndpointAsync"]
    assert not [v for v in evaluate(f"arn:aws:iam::{deployment.account}:role/app", deployment.account, elsewhere,
                                    identity_policies=[policy]) if v.allowed]
