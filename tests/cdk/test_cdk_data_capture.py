"""SageMaker data capture per endpoint kind (cdk.json ``<kind>.data_capture``): the EndpointConfig's
DataCaptureConfig (sampling, input and/or output, JSON bodies, the artifact bucket's own data-capture/ prefix), the
execution role's writes evaluated with the policy simulator (its own endpoint's part of the prefix: allowed;
another endpoint's part or another prefix: denied), the capture reader's reads of them with ``endpoint_client capture``
(data-capture/ of its own bucket only; the operator reads none), cdk-nag and cfn-lint clean; each refusal named by its key (a
prefix outside the bucket's data-capture/ first); the shipped environments capture nothing."""

from __future__ import annotations

import json
import os

import pytest

import app as cdk_app
import cdk_testkit
import role_calls
from cdk_testkit import ENDPOINT_STACKS, EXAMPLE_ACCOUNT, EXAMPLE_REGION
from deploy.iam_simulation import Deployment, Request, denied, evaluate
from stacks.config import ConfigError, load_environment
from test_cdk_botocore import problems as api_problems
from test_cdk_botocore import requests_of
from test_cdk_cfn_lint import findings

CAPTURES = {"cpu": {"sampling_percentage": 25},
            "gpu": {"sampling_percentage": 100, "capture": ["input"], "prefix": "data-capture/audit/"}}


def capturing(captures):
    def edit(environment):
        for kind, capture in captures.items():
            environment[kind]["data_capture"] = dict(capture)
    return edit


@pytest.fixture(scope="module", params=cdk_testkit.ENVIRONMENTS)
def captured(request):
    return cdk_testkit.synthesized_with(request.param, capturing(CAPTURES))


def endpoint_config(synth, kind):
    return synth.resource(ENDPOINT_STACKS[kind], "AWS::SageMaker::EndpointConfig", "Endpoint")["Properties"]


def test_each_kind_captures_as_cdk_json_says(captured):
    # The environment's own artifact bucket, by its name imported from its artifacts stack.
    bucket_name = endpoint_config(captured, "cpu")["DataCaptureConfig"]["DestinationS3Uri"]["Fn::Join"][1][1]
    assert bucket_name["Fn::ImportValue"].startswith(f"{captured.prefix}-artifacts:ExportsOutputRefArtifactBucket")
    expected = {
        "cpu": {"EnableCapture": True, "InitialSamplingPercentage": 25,
                "CaptureOptions": [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}],
                "DestinationS3Uri": {"Fn::Join": ["", ["s3://", bucket_name, "/data-capture/"]]},
                "CaptureContentTypeHeader": {"JsonContentTypes": ["application/json"]}},
        "gpu": {"EnableCapture": True, "InitialSamplingPercentage": 100, "CaptureOptions": [{"CaptureMode": "Input"}],
                "DestinationS3Uri": {"Fn::Join": ["", ["s3://", bucket_name, "/data-capture/audit/"]]},
                "CaptureContentTypeHeader": {"JsonContentTypes": ["application/json"]}}}
    for kind in ENDPOINT_STACKS:
        assert endpoint_config(captured, kind).get("DataCaptureConfig") == expected.get(kind), kind


def test_a_capturing_environment_is_nag_and_cfn_lint_clean(captured):
    report = captured.outdir / "validation-report.json"
    if report.exists():
        for plugin in json.loads(report.read_text())["pluginReports"]:
            assert plugin["conclusion"] == "success", plugin
    for kind in captured.stack_kinds:
        assert findings(captured.template(kind)) == [], kind


@pytest.mark.parametrize("kind", ENDPOINT_STACKS)
def test_the_requests_with_data_capture_are_valid_for_sagemakers_api(captured, kind):
    """CreateEndpointConfig with its DataCaptureConfig (and the rest) as botocore's service model defines them."""
    calls = requests_of(captured.template(ENDPOINT_STACKS[kind]))
    (config,) = [params for _, operation, params in calls if operation == "CreateEndpointConfig"]
    assert ("DataCaptureConfig" in config) is (kind in CAPTURES)
    for service, operation, params in calls:
        assert api_problems(service, operation, params) == [], (operation, params)


@pytest.mark.parametrize("kind", ENDPOINT_STACKS)
def test_sagemaker_writes_its_own_endpoints_captures_and_nothing_else(captured, kind):
    deployment = Deployment(captured.outdir, EXAMPLE_ACCOUNT, EXAMPLE_REGION)
    stack = captured.stack_name(ENDPOINT_STACKS[kind])
    role = role_calls.endpoint_execution_role(deployment, stack)

    def verdicts(requests):
        return evaluate(deployment.arn(stack, role), deployment.account, requests,
                        identity_policies=deployment.role_policies(stack, role))

    requests = role_calls.endpoint_execution_requests(deployment, stack)
    writes = role_calls.data_capture_requests(deployment, stack)
    assert len(writes) == (kind in CAPTURES)
    assert all(w in requests for w in writes)
    assert not role_calls.resource_type_problems(requests), role_calls.resource_type_problems(requests)
    assert not denied(verdicts(requests)), "\n".join(denied(verdicts(requests)))
    bucket = deployment.output(captured.stack_name("artifacts"), "ArtifactBucketName")
    prefix = CAPTURES.get(kind, {}).get("prefix", "data-capture/")
    elsewhere = [Request("s3:PutObject", f"arn:aws:s3:::{bucket}/{key}", source="elsewhere") for key in (
        f"{prefix}{captured.prefix}-other/AllTraffic/2027/01/01/00/x.jsonl",   # another endpoint's part
        f"models/{captured.prefix}-{ENDPOINT_STACKS[kind].removeprefix('endpoint-')}/x.jsonl",
        "image-digests/cpu/x")]
    elsewhere += role_calls.data_capture_requests(deployment, stack, endpoint_name=f"{captured.prefix}-other")
    assert all(not v.allowed for v in verdicts(elsewhere)), [v.line() for v in verdicts(elsewhere) if v.allowed]


def test_the_shipped_environments_capture_nothing(pinned):
    for kind in ENDPOINT_STACKS:
        assert "DataCaptureConfig" not in endpoint_config(pinned, kind), kind
    for _, template in pinned.templates():
        assert not [s for _, s in cdk_testkit.statements(template) if s.get("Sid") == "WriteCapturedData"]


def problems(capture, kind="cpu", env="dev") -> list[str]:
    context = cdk_testkit.context_for(env, edit=capturing({kind: capture}))
    with pytest.raises(ConfigError) as raised:
        load_environment(context["environments"], env, model_pins=cdk_app.model_pin_names())
    return list(raised.value.problems)


OUTSIDE = ("is outside the artifact bucket's data-capture/ prefix: captured requests and responses go to this "
           "environment's artifact bucket only, under data-capture/")


@pytest.mark.parametrize("prefix", ["s3://someone-elses-bucket/data-capture/", "models/", "/data-capture/x/",
                                    "arn:aws:s3:::bucket/data-capture/", "capture/"])
def test_a_prefix_outside_the_buckets_data_capture_prefix_is_refused(prefix):
    (problem,) = problems({"sampling_percentage": 10, "prefix": prefix}, kind="gpu")
    assert problem == f"environments.dev.gpu.data_capture.prefix: {prefix!r} {OUTSIDE} (name a key prefix such as " \
                      f"'data-capture/audit/', not a bucket or a URI)"


@pytest.mark.parametrize("capture, expected", [
    ({}, "environments.dev.cpu.data_capture.sampling_percentage: is required"),
    ({"sampling_percentage": 0}, "environments.dev.cpu.data_capture.sampling_percentage: 0 is outside 1..100"),
    ({"sampling_percentage": 101}, "environments.dev.cpu.data_capture.sampling_percentage: 101 is outside 1..100"),
    ({"sampling_percentage": 5, "prefix": "data-capture/../models/"},
     "environments.dev.cpu.data_capture.prefix: 'data-capture/../models/' is not a key prefix"),
    ({"sampling_percentage": 5, "prefix": "data-capture/audit"},
     "environments.dev.cpu.data_capture.prefix: 'data-capture/audit' is not a key prefix ending with '/'"),
    ({"sampling_percentage": 5, "capture": []},
     "environments.dev.cpu.data_capture.capture: expected a list of input and/or output, got a list ([])"),
    ({"sampling_percentage": 5, "capture": ["request"]},
     "environments.dev.cpu.data_capture.capture: 'request' is not one of input, output"),
    ({"sampling_percentage": 5, "capture": ["output", "output"]},
     "environments.dev.cpu.data_capture.capture: ['output', 'output'] names a mode twice"),
    ({"sampling_percentage": 5, "kms_key": "x"},
     "environments.dev.cpu.data_capture.kms_key: unknown key (expected one of: sampling_percentage, capture, prefix)"),
], ids=["no-sampling", "zero", "above-100", "dot-dot", "no-slash", "no-modes", "bad-mode", "repeated-mode",
        "unknown-key"])
def test_each_bad_capture_setting_is_refused_naming_its_key(capture, expected):
    (problem,) = problems(capture)
    assert problem.startswith(expected), problem


def test_the_capture_reader_may_read_back_each_capturing_endpoints_records_and_nothing_else(captured, tmp_path):
    """``python -m endpoint_client capture`` run against moto on loopback for each capturing endpoint, its calls
    recorded and evaluated against the synthesized <prefix>-capture-reader policy with the simulator (the artifacts
    stack's outputs, the data-capture/ prefix of the environment's own bucket); other prefixes, another bucket's
    data-capture/ and a listing of the whole bucket denied; the operator policy reads no capture."""
    import boto3

    from endpoint_client import capture
    from loopback_servers import moto_server

    deployment = Deployment(captured.outdir, EXAMPLE_ACCOUNT, EXAMPLE_REGION)
    access, artifacts = captured.stack_name("access"), captured.stack_name("artifacts")
    policy = deployment.managed_policy(access, f"{captured.prefix}-capture-reader")
    operator = deployment.managed_policy(access, f"{captured.prefix}-operator")
    bucket = deployment.output(artifacts, "ArtifactBucketName")
    context = cdk_testkit.context_for(captured.env, edit=capturing(CAPTURES))
    context.pop("env")
    (tmp_path / "cdk.json").write_text(json.dumps({"context": context}))
    (tmp_path / "model_build").mkdir()
    (tmp_path / "model_build" / "pins.json").write_text((cdk_testkit.REPOSITORY_ROOT / "model_build" /
                                                         "pins.json").read_text())
    kinds = [kind for kind in CAPTURES if kind in context["environments"][captured.env]["endpoints"]]
    recorder = role_calls.BotocoreRecorder()
    with moto_server() as url, pytest.MonkeyPatch.context() as patch:
        for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"):
            patch.delenv(name, raising=False)
        for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                            "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}.items():
            patch.setenv(name, value)
        # moto's state is one per process, shared with every other moto server of the session: this test makes
        # its bucket and stack anew (another test may have left ones of the same names) and removes them after.
        s3 = boto3.client("s3", region_name=EXAMPLE_REGION, endpoint_url=url)
        cloudformation = boto3.client("cloudformation", region_name=EXAMPLE_REGION, endpoint_url=url)
        cloudformation.delete_stack(StackName=artifacts)
        try:
            s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": EXAMPLE_REGION})
        except s3.exceptions.BucketAlreadyOwnedByYou:
            pass
        cloudformation.create_stack(StackName=artifacts, TemplateBody=json.dumps({
            "Resources": {"Placeholder": {"Type": "AWS::SNS::Topic"}},
            "Outputs": {"ArtifactBucketName": {"Value": bucket}}}))
        keys = []
        try:
            for kind in kinds:
                prefix = CAPTURES[kind].get("prefix", "data-capture/")
                keys.append(f"{prefix}{captured.prefix}-{kind}/AllTraffic/2026/12/07/18/capture.jsonl")
                s3.put_object(Bucket=bucket, Body=b"{}\n", Key=keys[-1])
            role_calls.record_sessions(patch, recorder)
            codes = [capture.main(["-c", f"env={captured.env}", "--cdk-json", str(tmp_path / "cdk.json"),
                                   "--endpoint-url", url, "--region", EXAMPLE_REGION, "--kind", kind,
                                   "--since", "2026-12-07T18:00:00Z", "--until", "2026-12-07T18:30:00Z"])
                     for kind in kinds]
        finally:  # through the clients made before recording: the cleanup is not among capture's calls
            for key in keys:
                s3.delete_object(Bucket=bucket, Key=key)
            if not s3.list_objects_v2(Bucket=bucket).get("KeyCount"):
                s3.delete_bucket(Bucket=bucket)
            cloudformation.delete_stack(StackName=artifacts)
    assert codes == [0] * len(kinds)
    reads = [r for op in recorder.operations if op.service == "s3" for r in role_calls.requests_of_operation(op)]
    assert {r.action for r in reads} == {"s3:ListBucket", "s3:GetObject"}
    assert len([r for r in reads if r.action == "s3:GetObject"]) == len(kinds)
    stacks = [Request("cloudformation:DescribeStacks", f"arn:aws:cloudformation:{EXAMPLE_REGION}:{EXAMPLE_ACCOUNT}:"
                      f"stack/{artifacts}/00000000-0000-0000-0000-000000000000", source=op.name)
              for op in recorder.operations if op.name == "DescribeStacks"]
    assert stacks and all(op.params == {"StackName": artifacts} for op in recorder.operations
                          if op.name == "DescribeStacks")

    def verdicts(requests, document=policy):
        return evaluate(f"arn:aws:iam::{EXAMPLE_ACCOUNT}:role/auditor", EXAMPLE_ACCOUNT, requests,
                        identity_policies=[document])

    assert not denied(verdicts(reads + stacks)), "\n".join(denied(verdicts(reads + stacks)))
    for statement in policy["Statement"]:   # each statement is needed: without it, one of the calls is denied
        trimmed = {**policy, "Statement": [s for s in policy["Statement"] if s is not statement]}
        assert denied(verdicts(reads + stacks, trimmed)), f"nothing capture calls needs {statement['Sid']}"
    # Captured bodies hold what callers sent: the operator policy does not read them.
    assert all(not v.allowed for v in verdicts(reads, operator)), [v.line() for v in verdicts(reads, operator)
                                                                    if v.allowed]
    elsewhere = [Request("s3:GetObject", f"arn:aws:s3:::{key}", source="elsewhere") for key in (
        f"{bucket}/batch/output/x.jsonl.out", f"{bucket}/image-digests/cpu/x",
        f"someone-elses-bucket/data-capture/{captured.prefix}-cpu/AllTraffic/2026/12/07/18/x.jsonl")]
    elsewhere += [Request("s3:ListBucket", f"arn:aws:s3:::{bucket}", {"s3:prefix": prefix}, source="elsewhere")
                  for prefix in ("", "models/", "batch/output/")]
    assert all(not v.allowed for v in verdicts(elsewhere)), [v.line() for v in verdicts(elsewhere) if v.allowed]
