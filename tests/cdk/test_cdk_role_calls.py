"""Every AWS call each component makes is allowed by its own role, and the service roles trust only their own use.

The calls come from the code that makes them (tests/cdk/role_calls.py): the build projects' buildspecs run as they
are, with stand-ins that record each ``aws``/``docker``/``skopeo`` command; the model build run against moto's S3
with its boto3 calls recorded; SageMaker's calls with an execution role read off the synthesized Model, Endpoint
and EndpointConfig, and a transform job's from the request ``endpoint_client transform`` builds. Each call is
evaluated against the synthesized policies of that role, resolved as a deployment resolves them
(deploy/iam_simulation.py, @cloud-copilot/iam-simulate), never against a list of allowed calls written here.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import boto3
import pytest
import yaml

import cdk_testkit
import role_calls
from cdk_testkit import ENDPOINT_STACKS, EXAMPLE_ACCOUNT, EXAMPLE_REGION
from deploy.iam_simulation import Deployment, Request, denied, evaluate
from endpoint_client import transform
from loopback_servers import JsonServer, Reply, moto_server

ENVIRONMENTS = cdk_testkit.ENVIRONMENTS


@pytest.fixture(scope="module", params=ENVIRONMENTS)
def deployed(request):
    synth = cdk_testkit.synthesized(request.param, pinned=True)
    return synth, Deployment(synth.outdir, EXAMPLE_ACCOUNT, EXAMPLE_REGION)


@pytest.fixture(scope="module", params=cdk_testkit.BUILDERS)
def built(request):
    """An environment with a build stack (prod takes dev's artifacts and has none)."""
    synth = cdk_testkit.synthesized(request.param, pinned=True)
    return synth, Deployment(synth.outdir, EXAMPLE_ACCOUNT, EXAMPLE_REGION)


def role_of(deployment: Deployment, stack: str, resource: dict) -> str:
    """The logical id of the role a resource's ServiceRole / ExecutionRoleArn names (Fn::GetAtt <role>.Arn)."""
    properties = resource["Properties"]
    reference = properties.get("ServiceRole") or properties.get("ExecutionRoleArn")
    return reference["Fn::GetAtt"][0]


def verdicts_for(deployment: Deployment, stack: str, role: str, requests: list[Request]):
    return evaluate(deployment.arn(stack, role), deployment.account, requests,
                    identity_policies=deployment.role_policies(stack, role))


def projects(deployed_pair):
    synth, deployment = deployed_pair
    stack = synth.stack_name("build")
    return stack, deployment.resources_of_type(stack, "AWS::CodeBuild::Project")


def buildspec_of(synth, deployment: Deployment, stack: str, project: dict) -> dict:
    """The buildspec CodeBuild runs: inline in the template, or the file in the project's source asset (as staged
    in the cloud assembly, which is what the CLI uploads)."""
    source = deployment.resolve(stack, project["Properties"]["Source"])
    spec = source["BuildSpec"]
    if spec.lstrip().startswith("{"):
        return json.loads(spec)
    asset_hash = source["Location"].rsplit("/", 1)[1].removesuffix(".zip")
    return yaml.safe_load((synth.outdir / f"asset.{asset_hash}" / spec).read_text())


def project_environment(deployment: Deployment, stack: str, project: dict) -> dict[str, str]:
    variables = deployment.resolve(stack, project["Properties"]["Environment"]["EnvironmentVariables"])
    return {"AWS_REGION": deployment.region, "AWS_DEFAULT_REGION": deployment.region,
            "CODEBUILD_RESOLVED_SOURCE_VERSION": "0123456789abcdef", **{v["Name"]: v["Value"] for v in variables}}


def test_every_command_of_each_build_project_is_allowed_by_its_role(built, tmp_path):
    synth, deployment = built
    stack, found = projects(built)
    assert len(found) == 4
    seen_actions = {}
    for logical_id, project in found.items():
        spec = buildspec_of(synth, deployment, stack, project)
        script = "\n".join(c for phase in spec["phases"].values() for c in phase.get("commands", []))
        if "python3 -m model_build package" in script:
            # Its AWS calls are the model build's own boto3 calls (the next test); no aws CLI command.
            assert "aws " not in script.replace("python3 -m model_build", "")
            commands = []
        else:
            commands = role_calls.run_buildspec(spec, project_environment(deployment, stack, project),
                                                tmp_path / logical_id)
        requests = [r for argv in commands for r in role_calls.requests_of_command(
            argv, account=deployment.account, region=deployment.region)]
        requests += role_calls.codebuild_service_requests(deployment, stack, project)
        assert not role_calls.resource_type_problems(requests), role_calls.resource_type_problems(requests)
        verdicts = verdicts_for(deployment, stack, role_of(deployment, stack, project), requests)
        assert not denied(verdicts), f"{logical_id}:\n" + "\n".join(denied(verdicts))
        seen_actions[project["Properties"]["Name"]] = {r.action for r in requests}
    prefix = synth.prefix
    # The image builds read the pushed manifest back (ecr:DescribeImages: container/buildspec.yml), push and record
    # the digest; the mirror pushes and reads back too.
    for name in (f"{prefix}-cpu-image-build", f"{prefix}-gpu-image-build", f"{prefix}-text-generation-mirror"):
        assert {"ecr:DescribeImages", "ecr:PutImage", "ecr:GetAuthorizationToken"} <= seen_actions[name], name
    assert "s3:PutObject" in seen_actions[f"{prefix}-cpu-image-build"]


def test_without_describe_images_the_image_builds_are_denied(built, tmp_path):
    """The check above is not vacuous: the role as it was before (grant_pull_push alone) fails on describe-images."""
    synth, deployment = built
    stack, found = projects(built)
    (logical_id, project), = [(lid, p) for lid, p in found.items() if "CpuImageBuild" in lid]
    role = role_of(deployment, stack, project)
    policies = deployment.role_policies(stack, role)
    for policy in policies:
        for statement in policy["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            statement["Action"] = [a for a in actions if a != "ecr:DescribeImages"] or ["ecr:ListTagsForResource"]
    commands = role_calls.run_buildspec(buildspec_of(synth, deployment, stack, project),
                                        project_environment(deployment, stack, project), tmp_path)
    requests = [r for argv in commands for r in role_calls.requests_of_command(
        argv, account=deployment.account, region=deployment.region)]
    verdicts = evaluate(deployment.arn(stack, role), deployment.account, requests, identity_policies=policies)
    lines = denied(verdicts)
    assert lines and all("ecr:DescribeImages" in line for line in lines), lines


def test_the_model_builds_s3_calls_are_allowed_by_its_role(built, tmp_path, monkeypatch):
    """python -m model_build package as the buildspec runs it, against moto's S3, with a GGUF larger than one
    64 MiB part (so the upload is multipart, as the 3 GB archive's is); every boto3 operation it made is evaluated."""
    synth, deployment = built
    stack, found = projects(built)
    (project,) = [p for lid, p in found.items() if lid.startswith("ModelBuild")]
    environment = project_environment(deployment, stack, project)
    data = os.urandom(65 * 1024 * 1024)
    pins = tmp_path / "pins.json"
    with JsonServer(lambda request: Reply(200, body=data, headers={"Content-Type": "application/octet-stream"})) \
            as origin, moto_server() as s3_url:
        pins.write_text(json.dumps({"default": environment["MODEL_PIN"], "pins": {environment["MODEL_PIN"]: {
            "url": f"{origin.url}/model.gguf", "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}}}))
        for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                            "AWS_DEFAULT_REGION": deployment.region, "AWS_CONFIG_FILE": os.devnull,
                            "AWS_SHARED_CREDENTIALS_FILE": os.devnull}.items():
            monkeypatch.setenv(name, value)
        boto3.client("s3", endpoint_url=s3_url, region_name="us-east-1").create_bucket(
            Bucket=environment["ARTIFACT_BUCKET"])
        recorder = role_calls.BotocoreRecorder()
        boto3.setup_default_session()
        recorder.attach(boto3.DEFAULT_SESSION.events)
        from model_build import cli
        try:
            # The buildspec's command line, with the test's pins file, S3 endpoint and work folder.
            code = cli.main(["package", "--pin", environment["MODEL_PIN"], "--bucket", environment["ARTIFACT_BUCKET"],
                             "--prefix", environment["OUTPUT_PREFIX"], "--pins", str(pins), "--s3-endpoint-url",
                             s3_url, "--work-dir", str(tmp_path / "work")])
        finally:
            boto3.DEFAULT_SESSION = None
    assert code == 0
    operations = {op.name for op in recorder.operations}
    assert {"HeadObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload"} <= operations
    requests = [r for op in recorder.operations for r in role_calls.requests_of_operation(op)]
    assert not role_calls.resource_type_problems(requests), role_calls.resource_type_problems(requests)
    verdicts = verdicts_for(deployment, stack, role_of(deployment, stack, project), requests)
    assert not denied(verdicts), "\n".join(denied(verdicts))


@pytest.mark.parametrize("kind", ENDPOINT_STACKS)
def test_what_sagemaker_does_with_each_execution_role_is_allowed(deployed, kind):
    synth, deployment = deployed
    stack = synth.stack_name(ENDPOINT_STACKS[kind])
    (model,) = deployment.resources_of_type(stack, "AWS::SageMaker::Model").values()
    role = role_of(deployment, stack, model)
    requests = role_calls.endpoint_execution_requests(deployment, stack)
    assert not role_calls.resource_type_problems(requests), role_calls.resource_type_problems(requests)
    verdicts = verdicts_for(deployment, stack, role, requests)
    assert not denied(verdicts), "\n".join(denied(verdicts))
    # A Batch Transform job on the model, as endpoint_client transform starts it (default output location).
    bucket = deployment.output(synth.stack_name("artifacts"), "ArtifactBucketName")
    job = f"{synth.prefix}-{kind}-20270101-000000"
    plan = transform.TransformPlan(
        job_name=job, model_name="model", input=transform.S3Location(bucket, f"{transform.INPUT_PREFIX}run1/"),
        output=transform.S3Location(bucket, f"{transform.OUTPUT_PREFIX}{job}/"), input_keys=("batch/input/run1/a.jsonl",),
        instance_type="ml.c7i.xlarge", instance_count=1, parameters=transform.ExecutionParameters(None, None, None))
    batch = role_calls.transform_requests(deployment, bucket, plan.request({}), list(plan.input_keys),
                                          lambda key: transform._output_key(plan, key))
    assert not role_calls.resource_type_problems(batch), role_calls.resource_type_problems(batch)
    verdicts = verdicts_for(deployment, stack, role, batch)
    if kind in transform.TRANSFORM_KINDS:
        assert not denied(verdicts), "\n".join(denied(verdicts))
    else:   # transform refuses this model: its role has no batch access at all
        assert all(not v.allowed for v in verdicts if v.request.action.startswith("s3:"))


def service_roles(deployment: Deployment):
    """(stack, role logical id, service) of every role a service assumes, in every stack."""
    for stack, template in deployment.templates.items():
        for logical_id, resource in template["Resources"].items():
            if resource["Type"] != "AWS::IAM::Role":
                continue
            for statement in resource["Properties"]["AssumeRolePolicyDocument"]["Statement"]:
                service = statement.get("Principal", {}).get("Service")
                if service:
                    yield stack, logical_id, service


# CDK's own provider of the dev buckets' auto-delete custom resource: a Lambda execution role, which Lambda assumes
# for that one function; Lambda documents no confused-deputy keys for execution roles.
CDK_PROVIDER_ROLES = ("CustomS3AutoDeleteObjectsCustomResourceProviderRole",)


def test_every_service_role_trusts_only_its_own_use_in_this_account(deployed):
    synth, deployment = deployed
    checked = 0
    other_account = "999988887777"
    for stack, role, service in service_roles(deployment):
        if role.startswith(CDK_PROVIDER_ROLES):
            continue
        role_arn = deployment.arn(stack, role)
        users = [(lid, r) for lid, r in deployment.templates[stack]["Resources"].items()
                 if r["Type"] in ("AWS::CodeBuild::Project", "AWS::SageMaker::Model")
                 and role_of(deployment, stack, r) == role]
        assert users, f"{stack}/{role}: no resource uses it"
        for user_id, user in users:
            source_arn = deployment.arn(stack, user_id) if user["Type"] == "AWS::CodeBuild::Project" else \
                f"arn:aws:sagemaker:{deployment.region}:{deployment.account}:endpoint/{synth.prefix}-x"
            own = {"aws:SourceAccount": deployment.account, "aws:SourceArn": source_arn}
            cases = [(own, "Allowed"), ({**own, "aws:SourceAccount": other_account}, "ImplicitlyDenied"), ({}, None)]
            if user["Type"] == "AWS::CodeBuild::Project":
                cases.append(({**own, "aws:SourceArn": source_arn.rsplit("/", 1)[0] + "/someone-elses-project"},
                              "ImplicitlyDenied"))
            for context, expected in cases:
                (verdict,) = evaluate(service, deployment.account, [Request("sts:AssumeRole", role_arn, context,
                                      source=f"{service} for {user_id}")], identity_policies=[],
                                      resource_policy=deployment.trust_policy(stack, role))
                if expected is None:   # no confused-deputy keys at all: never trusted
                    assert not verdict.allowed, f"{stack}/{role} trusts {service} without conditions"
                else:
                    assert verdict.result == expected, (stack, role, context, verdict.result)
            checked += 1
    # four CodeBuild projects (where the environment builds), three execution roles
    assert checked >= (4 if cdk_testkit.builds(synth.env) else 0) + 3


def test_both_sides_of_a_pipe_are_recorded_whole(tmp_path):
    """The recorder itself: ``aws ... | docker login`` runs both stand-ins at once; each call must come back as its
    own argv (a record written in pieces once interleaved with the other side's and the aws call was lost)."""
    pipe = "aws ecr get-login-password --region eu-west-1 | docker login --username AWS --password-stdin 1.dkr"
    spec = {"env": {"shell": "bash"}, "phases": {"build": {"commands": [pipe] * 200}}}
    commands = role_calls.run_buildspec(spec, {}, tmp_path)
    assert sorted(map(tuple, commands)) == sorted(
        [("aws", "ecr", "get-login-password", "--region", "eu-west-1")] * 200
        + [("docker", "login", "--username", "AWS", "--password-stdin", "1.dkr")] * 200)


BOOTSTRAP_KEY = f"arn:aws:kms:{EXAMPLE_REGION}:{EXAMPLE_ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab"
# The key policy of the key `cdk bootstrap --bootstrap-customer-key` creates, as far as the account's roles are
# concerned: the account (root) may use it, i.e. IAM policies decide (KMS needs the key policy to say so).
BOOTSTRAP_KEY_POLICY = {"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Principal": {"AWS": f"arn:aws:iam::{EXAMPLE_ACCOUNT}:root"}, "Action": "kms:*",
    "Resource": "*"}]}


def test_a_bootstrap_with_a_customer_key_lets_the_builds_decrypt_their_source_and_nothing_else():
    """cdk bootstrap --bootstrap-kms-key-id: the asset bucket's objects are SSE-KMS, so CodeBuild's read of the
    source needs kms:Decrypt on that key (bootstrap.kms_key_arn), through S3 only; without the setting no role has
    it."""
    # prod building its own (cdk_testkit.rebuilding): prod's location is the one the example key is in.
    keyed = cdk_testkit.synthesized_with("prod", lambda e: (cdk_testkit.rebuilding(e), e.__setitem__(
        "bootstrap", {"kms_key_arn": BOOTSTRAP_KEY})))
    plain = cdk_testkit.synthesized_with("prod", cdk_testkit.rebuilding)
    for synth, expected in ((keyed, "Allowed"), (plain, "ImplicitlyDenied")):
        deployment = Deployment(synth.outdir, EXAMPLE_ACCOUNT, EXAMPLE_REGION)
        stack, found = projects((synth, deployment))
        with_source = {lid: p for lid, p in found.items() if p["Properties"]["Source"]["Type"] == "S3"}
        assert len(with_source) == 3
        for logical_id, project in with_source.items():
            role = role_of(deployment, stack, project)
            requests = role_calls.codebuild_service_requests(deployment, stack, project, bootstrap_key=BOOTSTRAP_KEY)
            (decrypt,) = [r for r in requests if r.action == "kms:Decrypt"]
            assert not denied(verdicts_for(deployment, stack, role, [r for r in requests if r is not decrypt]))

            def with_key(*kms_requests):
                return [v.result for v in evaluate(deployment.arn(stack, role), deployment.account, kms_requests,
                                                   identity_policies=deployment.role_policies(stack, role),
                                                   resource_policy=BOOTSTRAP_KEY_POLICY)]
            assert with_key(decrypt) == [expected], logical_id
            if expected == "Allowed":
                assert with_key(
                    Request("kms:Decrypt", BOOTSTRAP_KEY.replace("1234abcd", "5678abcd"), decrypt.context),
                    Request("kms:Decrypt", BOOTSTRAP_KEY, {}, source="not through S3"),
                    Request("kms:Encrypt", BOOTSTRAP_KEY, decrypt.context)) == ["ImplicitlyDenied"] * 3
