"""The access stack's managed policies allow exactly what the commands they are for call (stacks/access_stack.py).

- operator: ``python -m endpoint_client check-pins --protect``, ``preflight``, ``transform``, ``acceptance
  --rollback-drill cpu`` (which writes its report) and ``promote --from dev --to prod`` (which reads it) run in this
  process against moto on loopback, populated with dev's synthesized stacks as a
  deployment names them (deploy/iam_simulation.Deployment: stack outputs, Models, EndpointConfigs with their volume
  keys and tags, endpoints, alarms, the alarm topic, the bucket and the repository with the pinned images). Every
  boto3 operation of every session is recorded with botocore's events (role_calls.BotocoreRecorder), turned into
  the IAM requests AWS authorizes for it, with the services' dependent ones (role_calls.ApiRequests: PassRole,
  CreateGrant, AddTags), and evaluated against the synthesized operator policy with the policy simulator;
- invoker: ``python -m endpoint_client --endpoint-name ...`` recorded the same way;
- deployer: the roles the CDK CLI assumes with the caller's credentials, read from the synthesized cloud assembly
  (each stack's deploy and lookup role, each asset destination's publishing role). The deploy rehearsal
  (deploy/rehearse.py, tests/deploy) records the CLI's real calls against moto and evaluates them against the
  deployed policy as well.

moto evaluates no IAM: what it answers only lets the commands run on; the verdicts are the simulator's. Each policy
is also shown to need each of its statements (one removed, a recorded call is denied) and to refuse what belongs
to another environment.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import boto3
import pytest
from botocore.awsrequest import AWSResponse

import cdk_testkit
import role_calls
from deploy import service_authorization
from deploy.iam_simulation import Deployment, Request, denied, evaluate
from deploy.pins import EXAMPLE_REGION, image_digest, image_manifest
from loopback_servers import moto_server

REPOSITORY_ROOT = cdk_testkit.REPOSITORY_ROOT
DOCKER_V2 = "application/vnd.docker.distribution.manifest.v2+json"
MOTO_ACCOUNT = "123456789012"            # what moto's STS and ARNs say for any credentials
REGION = EXAMPLE_REGION
PRINCIPAL = f"arn:aws:iam::{MOTO_ACCOUNT}:role/someone"
# Alarm properties of AWS::CloudWatch::Alarm that PutMetricAlarm takes under the same name.
ALARM_PARAMETERS = ("AlarmName", "AlarmDescription", "MetricName", "Namespace", "Statistic", "ExtendedStatistic",
                    "Dimensions", "Period", "EvaluationPeriods", "DatapointsToAlarm", "Threshold",
                    "ComparisonOperator", "TreatMissingData", "AlarmActions", "OKActions", "Metrics",
                    "ActionsEnabled")
# The calls that show each command ran to its end (a command that stopped early would leave calls unevaluated).
EXPECTED_OPERATIONS = {
    "check-pins --protect": {"DescribeImages", "BatchGetImage", "PutImage", "HeadObject"},
    "preflight": {"ListServiceQuotas", "ListEndpoints", "DescribeScalableTargets"},
    "transform": {"ListObjectsV2", "DescribeLogGroups", "DescribeModel", "CreateTransformJob",
                  "DescribeTransformJob"},
    "acceptance": {"InvokeEndpoint", "FilterLogEvents", "GetMetricStatistics", "DescribeAlarms", "ListMetrics",
                   "ListSubscriptionsByTopic", "SetAlarmState", "DescribeAlarmHistory", "CreateModel",
                   "CreateEndpointConfig", "UpdateEndpoint", "DeleteEndpointConfig", "DeleteModel",
                   "DescribeEndpoint", "DescribeEndpointConfig", "DescribeModel", "PutObject"},
    # promote --from dev --to prod reads dev (prod's cdk.json pins are local): what it serves, its report.
    # (its PutImage of the pinned- tag: check-pins --protect tagged these images before)
    "promote": {"DescribeStacks", "DescribeEndpoint", "DescribeEndpointConfig", "DescribeModel", "GetObject",
                "DescribeImages"},
    "acceptance, not rolled back": {"CreateModel", "CreateEndpointConfig", "UpdateEndpoint", "DeleteEndpointConfig",
                                    "DeleteModel"},
    "promote --verify": {"GetObject"},
}


class Environment:
    """dev's synthesized stacks as deployed in moto's account, with what the requests need about them."""

    def __init__(self, synth: cdk_testkit.Synthesized):
        self.synth = synth
        self.deployment = Deployment(synth.outdir, MOTO_ACCOUNT, REGION)
        self.endpoint_stacks = [synth.stack_name(kind) for kind in cdk_testkit.ENDPOINT_STACKS.values()]
        self.access = synth.stack_name("access")
        self.bucket = self.deployment.output(synth.stack_name("artifacts"), "ArtifactBucketName")
        self.tags, self.config_keys, self.key_policies = {}, {}, {}
        for stack in self.endpoint_stacks:
            for logical_id, resource in self.deployment.templates[stack]["Resources"].items():
                kind = resource["Type"]
                if kind in ("AWS::SageMaker::Model", "AWS::SageMaker::EndpointConfig", "AWS::KMS::Key"):
                    arn = self.deployment.arn(stack, logical_id)
                    self.tags[arn.lower() if kind.startswith("AWS::SageMaker") else arn] = \
                        self.deployment.tags(stack, logical_id)
                if kind == "AWS::KMS::Key":
                    self.key_policies[self.deployment.arn(stack, logical_id)] = \
                        self.deployment.resolve(stack, resource["Properties"]["KeyPolicy"])
                if kind == "AWS::SageMaker::EndpointConfig" and "KmsKeyId" in resource["Properties"]:
                    self.config_keys[self.deployment.name(stack, logical_id)] = \
                        self.deployment.resolve(stack, resource["Properties"]["KmsKeyId"])

    def policy(self, role: str) -> dict:
        return self.deployment.managed_policy(self.access, f"{self.synth.prefix}-{role}")

    def api_requests(self) -> role_calls.ApiRequests:
        return role_calls.ApiRequests(account=MOTO_ACCOUNT, region=REGION, tags_of=lambda arn: self.tags.get(arn, {}),
                                      config_keys=self.config_keys)

    def populate(self, url: str) -> None:
        """The deployed environment in moto: what the commands read, under the names the stacks give it."""
        def client(service):
            return boto3.client(service, region_name=REGION, endpoint_url=url)
        d, synth = self.deployment, self.synth
        artifacts, monitoring = synth.stack_name("artifacts"), synth.stack_name("monitoring")
        outputs = {stack: {key: d.output(stack, key) for key in d.templates[stack].get("Outputs", {})
                           if not key.startswith("Exports")}
                   for stack in (artifacts, monitoring, *self.endpoint_stacks)}
        s3 = client("s3")
        s3.create_bucket(Bucket=self.bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
        s3.put_bucket_versioning(Bucket=self.bucket, VersioningConfiguration={"Status": "Enabled"})  # as the stack's
        model = cdk_testkit.TEST_PINS["model"]["s3_key"]
        s3.put_object(Bucket=self.bucket, Key=model, Body=b"archive")
        for name in ("a.jsonl", "b.jsonl"):
            s3.put_object(Bucket=self.bucket, Key=f"batch/input/run1/{name}", Body=b'{"state": "x"}\n')
        repository = outputs[artifacts]["ImageRepositoryUri"].split("/", 1)[1]
        ecr = client("ecr")
        ecr.create_repository(repositoryName=repository)
        for kind in ("cpu", "gpu", "text_generation"):
            ecr.put_image(repositoryName=repository, imageManifest=image_manifest(kind), imageTag=f"{kind}-build1",
                          imageDigest=image_digest(kind), imageManifestMediaType=DOCKER_V2)
        topic = client("sns").create_topic(Name=outputs[monitoring]["AlarmTopicArn"].rsplit(":", 1)[1])["TopicArn"]
        assert topic == outputs[monitoring]["AlarmTopicArn"]
        cloudformation = client("cloudformation")
        for stack, values in outputs.items():
            cloudformation.create_stack(StackName=stack, TemplateBody=json.dumps({
                "Resources": {"Placeholder": {"Type": "AWS::CloudFormation::WaitConditionHandle"}},
                "Outputs": {key: {"Value": value} for key, value in values.items()}}))
        logs = client("logs")
        logs.create_log_group(logGroupName="/aws/sagemaker/TransformJobs")
        sagemaker, cloudwatch = client("sagemaker"), client("cloudwatch")
        for stack in self.endpoint_stacks:
            resources = d.templates[stack]["Resources"]
            of_type = {r["Type"]: (lid, d.resolve(stack, r["Properties"])) for lid, r in resources.items()}
            model_id, model = of_type["AWS::SageMaker::Model"]
            config_id, config = of_type["AWS::SageMaker::EndpointConfig"]
            _, endpoint = of_type["AWS::SageMaker::Endpoint"]
            container = {k: v for k, v in model["PrimaryContainer"].items() if k in ("Image", "ModelDataUrl",
                                                                                       "Environment")}
            sagemaker.create_model(ModelName=d.name(stack, model_id), ExecutionRoleArn=model["ExecutionRoleArn"],
                                   PrimaryContainer=container, EnableNetworkIsolation=model["EnableNetworkIsolation"],
                                   Tags=model["Tags"])
            # moto knows older instance types only; the type plays no part in what is authorized.
            variants = [{"VariantName": v["VariantName"], "ModelName": d.name(stack, model_id),
                         "InitialInstanceCount": v["InitialInstanceCount"], "InstanceType": "ml.m5.xlarge",
                         "InitialVariantWeight": 1.0} for v in config["ProductionVariants"]]
            sagemaker.create_endpoint_config(EndpointConfigName=d.name(stack, config_id), ProductionVariants=variants,
                                             Tags=config["Tags"], **({"KmsKeyId": config["KmsKeyId"]}
                                                                     if "KmsKeyId" in config else {}))
            sagemaker.create_endpoint(EndpointName=endpoint["EndpointName"],
                                      EndpointConfigName=d.name(stack, config_id))
            logs.create_log_group(logGroupName=f"/aws/sagemaker/Endpoints/{endpoint['EndpointName']}")
            for alarm_id, resource in resources.items():
                if resource["Type"] == "AWS::CloudWatch::Alarm":
                    # The async endpoint's scale-out alarm has a generated name.
                    alarm = {"AlarmName": d.name(stack, alarm_id), **d.resolve(stack, resource["Properties"])}
                    cloudwatch.put_metric_alarm(**{k: alarm[k] for k in ALARM_PARAMETERS if k in alarm})


    def remove_bucket(self, url: str) -> None:
        """moto's backends are the process's, shared by every server on loopback: the bucket (S3 names are global)
        goes, so that another test creating it finds none."""
        s3 = boto3.resource("s3", region_name=REGION, endpoint_url=url).Bucket(self.bucket)
        s3.object_versions.all().delete()      # versioned, as the stack's bucket is
        s3.delete()


class Updates:
    """UpdateEndpoint as SageMaker accepts it (moto implements none), after the call is recorded. Rolled back (the
    default): the endpoint goes on InService on its configuration, as after a rollback; ``complete``: on the one the
    call names, as after an update that no alarm stopped (moto's own endpoint record is changed, so that every later
    DescribeEndpoint says so)."""

    def __init__(self):
        self.complete = False

    def __call__(self, params, **_):
        if self.complete:
            from moto.sagemaker.models import sagemaker_backends
            request = json.loads(params["body"])
            endpoint = sagemaker_backends[MOTO_ACCOUNT][REGION].endpoints[request["EndpointName"]]
            endpoint.endpoint_config_name = request["EndpointConfigName"]
        return AWSResponse("https://sagemaker.invalid/", 200, {}, None), {"EndpointArn": "stubbed"}


def _quotas(**_):
    """ListServiceQuotas as Service Quotas answers (moto has no SageMaker quotas): ample for every instance type."""
    from endpoint_client import preflight
    from stacks.config import load_environment
    context = cdk_testkit.context_for("dev")
    types = {need.instance_type for need in preflight.needs(load_environment(
        context["environments"], "dev", model_pins=["qwen3.5-4b"]))}
    return AWSResponse("https://servicequotas.invalid/", 200, {}, None), {"Quotas": [
        {"ServiceCode": "sagemaker", "QuotaName": f"{t} for endpoint usage", "QuotaCode": f"L-{i:08d}", "Value": 100.0}
        for i, t in enumerate(sorted(types))]}


@pytest.fixture(scope="module")
def environment():
    return Environment(cdk_testkit.synthesized("dev", pinned=True))


@pytest.fixture(scope="module")
def recorded(environment, tmp_path_factory):
    """{command: [its boto3 operations]}, each command run once against the populated moto."""
    from endpoint_client import acceptance, pins, preflight, promote, transform
    checkout = tmp_path_factory.mktemp("checkout")
    context = copy.deepcopy(cdk_testkit.context_for("dev"))
    context.pop("env")
    # prod takes dev's artifacts (cdk.json ships it so) and is located where dev is, as promote's target must be;
    # dev retains them, as it must once prod pins them (stacks/config.py).
    context["environments"]["prod"].update(account=MOTO_ACCOUNT, region=REGION)
    context["environments"]["dev"].update(account=MOTO_ACCOUNT, region=REGION)
    context["environments"]["dev"]["artifacts"]["removal_policy"] = "retain"
    (checkout / "cdk.json").write_text(json.dumps({"context": context}, indent=2) + "\n")
    (checkout / "model_build").mkdir()
    shutil.copy(REPOSITORY_ROOT / "model_build" / "pins.json", checkout / "model_build" / "pins.json")
    (checkout / "examples").symlink_to(REPOSITORY_ROOT / "examples")
    found = {}
    with moto_server() as url, pytest.MonkeyPatch.context() as patch:
        for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"):
            patch.delenv(name, raising=False)
        for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                            "AWS_DEFAULT_REGION": REGION, "AWS_CONFIG_FILE": os.devnull,
                            "AWS_SHARED_CREDENTIALS_FILE": os.devnull}.items():
            patch.setenv(name, value)
        environment.populate(url)
        recorder, updates = role_calls.BotocoreRecorder(), Updates()
        role_calls.record_sessions(patch, recorder, {"before-call.sagemaker.UpdateEndpoint": updates,
                                                     "before-call.service-quotas.ListServiceQuotas": _quotas})
        common = ["-c", "env=dev", "--cdk-json", str(checkout / "cdk.json"), "--endpoint-url", url,
                  "--region", REGION]
        runs = {
            "check-pins --protect": lambda: pins.main([*common, "--protect"]),
            "preflight": lambda: preflight.main(common),
            "transform": lambda: transform.main([*common, "--input", f"s3://{environment.bucket}/batch/input/run1/",
                                                 "--poll-interval", "0"]),
            "acceptance": lambda: acceptance.main([*common, "--emulator", "moto", "--wait", "0", "--rollback-drill",
                                                   "cpu", "--drill-fault", "fail"]),
            # After acceptance: its report is what promote reads.
            "promote": lambda: promote.main(["--from", "dev", "--to", "prod", "--cdk-json", str(checkout / "cdk.json"),
                                             "--endpoint-url", url, "--region", REGION, "--emulator", "moto"]),
            # Before prod's deploy: its pins against the report version promote recorded.
            "promote --verify": lambda: promote.main([
                "--from", "dev", "--to", "prod", "--verify", "--cdk-json", str(checkout / "cdk.json"),
                "--endpoint-url", url, "--region", REGION, "--emulator", "moto"]),
            # A drill that is not rolled back: acceptance undoes it, to the stack's EndpointConfig (and fails).
            "acceptance, not rolled back": lambda: acceptance.main([*common, "--emulator", "moto", "--wait", "0",
                                                                    "--rollback-drill", "cpu", "--drill-fault",
                                                                    "slow"]),
        }
        try:
            for command, run in runs.items():
                updates.complete = command == "acceptance, not rolled back"
                start = len(recorder.operations)
                code = run()
                found[command] = (code, recorder.operations[start:])
        finally:
            environment.remove_bucket(url)
    return found


def operator_requests(environment: Environment, recorded) -> list[Request]:
    api = environment.api_requests()
    return [r for _, operations in recorded.values() for op in operations for r in api.of(op)]


def verdicts(policy: dict, requests: list[Request], key_policies: dict[str, dict] | None = None):
    """The simulator's verdicts in the order of ``requests``; a request on a KMS key is evaluated with that key's
    policy too (KMS allows what an identity policy allows only where the key policy delegates to the account)."""
    key_policies = key_policies or {}
    groups: dict[str | None, list[int]] = {}
    for index, request in enumerate(requests):
        groups.setdefault(request.resource if request.resource in key_policies else None, []).append(index)
    found = [None] * len(requests)
    for key, indexes in groups.items():
        for index, verdict in zip(indexes, evaluate(PRINCIPAL, MOTO_ACCOUNT, [requests[i] for i in indexes],
                                                    identity_policies=[policy],
                                                    resource_policy=key_policies.get(key))):
            found[index] = verdict
    return found


def without(policy: dict, sid: str) -> dict:
    trimmed = copy.deepcopy(policy)
    trimmed["Statement"] = [s for s in trimmed["Statement"] if s.get("Sid") != sid]
    assert len(trimmed["Statement"]) == len(policy["Statement"]) - 1, sid
    return trimmed


def sids(role: str) -> list[str]:
    synth = cdk_testkit.synthesized("dev", pinned=True)
    return [s["Sid"] for s in Environment(synth).policy(role)["Statement"]]


# --- the operator -----------------------------------------------------------------------------------------------

def test_each_command_ran_to_its_end(recorded):
    for command, expected in EXPECTED_OPERATIONS.items():
        code, operations = recorded[command]
        missing = expected - {op.name for op in operations}
        assert not missing, f"{command} (exit {code}) never called {sorted(missing)}"
    assert {command: code for command, (code, _) in recorded.items()} == {
        "check-pins --protect": 0, "preflight": 0, "transform": 0, "acceptance": 0, "promote": 0,
        "promote --verify": 0, "acceptance, not rolled back": 1}
    updates = [op.params["EndpointConfigName"] for op in recorded["acceptance, not rolled back"][1]
               if op.name == "UpdateEndpoint"]
    assert len(updates) == 2 and "-drill-" in updates[0] and "-drill-" not in updates[1], "the drill, its undo"


def test_every_call_of_the_operator_commands_is_allowed_by_the_operator_policy(environment, recorded):
    requests = operator_requests(environment, recorded)
    assert {"iam:PassRole", "kms:CreateGrant", "sagemaker:AddTags"} <= {r.action for r in requests}
    lines = denied(verdicts(environment.policy("operator"), requests, environment.key_policies))
    assert not lines, "\n".join(lines)


@pytest.mark.parametrize("sid", sids("operator"))
def test_each_operator_statement_is_needed(environment, recorded, sid):
    policy = environment.policy("operator")
    (statement,) = [s for s in policy["Statement"] if s["Sid"] == sid]
    actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
    lines = denied(verdicts(without(policy, sid), operator_requests(environment, recorded), environment.key_policies))
    assert lines, f"nothing the commands call needs {sid}"
    assert all(any(f": {action} on" in line for action in actions) for line in lines), lines


def test_the_operator_passes_this_environments_execution_roles_to_sagemaker_only(environment, recorded):
    create, *_ = [op for _, ops in recorded.values() for op in ops if op.name == "CreateModel"]
    own = create.params["ExecutionRoleArn"]
    assert own == f"arn:aws:iam::{MOTO_ACCOUNT}:role/decision-dev-cpu-execution"
    to_sagemaker = {"iam:PassedToService": "sagemaker.amazonaws.com"}
    requests = [Request("iam:PassRole", own, to_sagemaker),
                Request("iam:PassRole", own.replace("decision-dev-", "decision-prod-"), to_sagemaker),
                Request("iam:PassRole", f"arn:aws:iam::{MOTO_ACCOUNT}:role/admin", to_sagemaker),
                Request("iam:PassRole", own, {"iam:PassedToService": "ec2.amazonaws.com"})]
    results = [v.result for v in verdicts(environment.policy("operator"), requests)]
    assert results == ["Allowed", "ImplicitlyDenied", "ImplicitlyDenied", "ImplicitlyDenied"]


def test_the_operator_grants_only_this_environments_volume_keys_to_sagemaker(environment):
    """Through SageMaker, on this environment's keys, whether or not SageMaker's grant says it is for an AWS resource
    (kms:GrantIsForAWSResource: AWS does not document that SageMaker sets it, so the policy does not require it)."""
    (key, tags), = [(arn, tags) for arn, tags in environment.tags.items() if ":key/" in arn][:1]
    via = {"kms:ViaService": f"sagemaker.{REGION}.amazonaws.com"}
    tagged = {f"aws:ResourceTag/{k}": v for k, v in tags.items()}
    requests = [Request("kms:CreateGrant", key, {**tagged, **via}),
                Request("kms:CreateGrant", key, {**tagged, **via, "kms:GrantIsForAWSResource": "true"}),
                Request("kms:CreateGrant", key, {**tagged, "aws:ResourceTag/environment": "prod", **via}),
                Request("kms:CreateGrant", key, tagged),
                Request("kms:CreateGrant", key, {**tagged, "kms:ViaService": f"ec2.{REGION}.amazonaws.com"}),
                Request("kms:Decrypt", key, {**tagged, **via})]
    results = [v.result for v in verdicts(environment.policy("operator"), requests, environment.key_policies)]
    assert results == ["Allowed", "Allowed", "ImplicitlyDenied", "ImplicitlyDenied", "ImplicitlyDenied",
                       "ImplicitlyDenied"]


def test_each_call_is_checked_on_every_resource_type_its_action_is_authorized_on(environment, recorded):
    """The Service Authorization Reference (the simulator's own data) decides which resources a call is authorized
    on: each recorded operation's action is requested on every resource type it requires, and on '*' only where it
    has no resource-level permissions. UpdateEndpoint is authorized on the endpoint and on the endpoint
    configuration it activates; CreateGrant follows CreateEndpoint and UpdateEndpoint, not CreateEndpointConfig."""
    api = environment.api_requests()
    problems = role_calls.resource_type_problems(operator_requests(environment, recorded))
    assert not problems, "\n".join(problems)
    for _, operations in recorded.values():
        for operation in operations:
            if operation.service == "s3":
                continue
            own = [r for r in api.of(operation) if r.action.split(":")[1] == operation.name]
            action = own[0].action
            types = service_authorization.resource_types(action)
            found = {getattr(service_authorization.resource_type_of(action, r.resource), "name", "*") for r in own}
            required = {t.name for t in types if t.required}
            assert required <= found, (operation.name, found)
            assert ("*" in found) == (not required and not (found - {"*"})), (operation.name, found)
    updates = [r for _, ops in recorded.values() for op in ops if op.name == "UpdateEndpoint" for r in api.of(op)]
    assert {r.resource.split(":")[-1].split("/")[0] for r in updates if r.action == "sagemaker:UpdateEndpoint"} == {
        "endpoint", "endpoint-config"}
    grants = [op.name for _, ops in recorded.values() for op in ops
              if any(r.action == "kms:CreateGrant" for r in api.of(op))]
    assert set(grants) == {"UpdateEndpoint"}, grants    # the drill and its undo; the drill's config creates none


def test_the_operator_policy_fits_iams_managed_policy_size():
    """IAM refuses a customer managed policy of more than 6,144 characters (white space not counted): the operator
    policy, resolved as a deployment names things (generated bucket and repository names, a long region), with the
    longest name prefix cdk.json allows (24 characters), for each environment."""
    for env in cdk_testkit.ENVIRONMENTS:
        def longest(environment):
            environment["name_prefix"] = (environment["name_prefix"] + "-" + "x" * 24)[:24]
        synth = cdk_testkit.synthesized_with(env, longest)
        deployment = Deployment(synth.outdir, "111122223333", "ap-southeast-2")
        document = deployment.managed_policy(synth.stack_name("access"), f"{synth.prefix}-operator")
        size = len(json.dumps(document, separators=(",", ":")))
        assert size <= 6144, f"{env}: {size} characters"


def test_the_operator_cannot_touch_another_environments_endpoints(environment):
    other = f"arn:aws:sagemaker:{REGION}:{MOTO_ACCOUNT}:endpoint/decision-prod-cpu"
    configs = f"arn:aws:sagemaker:{REGION}:{MOTO_ACCOUNT}:endpoint-config"
    own_tags = next(tags for arn, tags in environment.tags.items() if ":endpoint-config/" in arn)
    prods = {f"aws:ResourceTag/{k}": v for k, v in {**own_tags, "environment": "prod"}.items()}
    requests = [Request("sagemaker:UpdateEndpoint", other), Request("sagemaker:InvokeEndpoint", other),
                # UpdateEndpoint to another environment's configuration, or to an untagged one not the drill's
                Request("sagemaker:UpdateEndpoint", f"{configs}/decision-prod-endpoint-cpu-config-abc", prods),
                Request("sagemaker:UpdateEndpoint", f"{configs}/decision-prod-cpu-drill-20270101000000"),
                Request("sagemaker:UpdateEndpoint", f"{configs}/someone-elses-config"),
                Request("sagemaker:CreateModel", f"arn:aws:sagemaker:{REGION}:{MOTO_ACCOUNT}:model/decision-prod-"
                                                 f"cpu-drill-20270101000000"),
                Request("cloudwatch:SetAlarmState", f"arn:aws:cloudwatch:{REGION}:{MOTO_ACCOUNT}:alarm:"
                                                    f"decision-prod-cpu-DiskUtilization")]
    assert not [v for v in verdicts(environment.policy("operator"), requests) if v.allowed]


# --- the invoker ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def invoker_requests(environment):
    from endpoint_client import cli
    recorder = role_calls.BotocoreRecorder()
    with moto_server() as url, pytest.MonkeyPatch.context() as patch:
        for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                            "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}.items():
            patch.setenv(name, value)
        role_calls.record_sessions(patch, recorder)
        codes = [cli.main(["--endpoint-name", f"decision-dev-{kind}", "--file",
                           str(REPOSITORY_ROOT / "examples" / "support-route.json"), "--region", REGION,
                           "--endpoint-url", url]) for kind in ("cpu", "gpu", "text-generation")]
    assert codes == [0, 0, 0]
    api = environment.api_requests()
    return [r for op in recorder.operations for r in api.of(op)]


def test_the_invoker_may_call_this_environments_endpoints(environment, invoker_requests):
    assert {r.action for r in invoker_requests} == {"sagemaker:InvokeEndpoint"} and len(invoker_requests) == 3
    lines = denied(verdicts(environment.policy("invoker"), invoker_requests))
    assert not lines, "\n".join(lines)
    assert denied(verdicts(without(environment.policy("invoker"), "InvokeEndpoints"), invoker_requests))


def test_the_invoker_is_denied_another_environments_endpoint_and_everything_else(environment, invoker_requests):
    others = [Request(r.action, r.resource.replace("decision-dev-", "decision-prod-")) for r in invoker_requests]
    others += [Request("sagemaker:InvokeEndpointAsync", invoker_requests[0].resource),
               Request("sagemaker:DescribeEndpoint", invoker_requests[0].resource)]
    assert not [v for v in verdicts(environment.policy("invoker"), others) if v.allowed]


# --- the deployer -----------------------------------------------------------------------------------------------

def assumed_roles(synth: cdk_testkit.Synthesized, deployment: Deployment) -> list[Request]:
    """sts:AssumeRole of every role the CLI assumes for a deploy or diff of the environment: each stack's deploy
    role and lookup role, each asset destination's publishing role (the cloud assembly names them)."""
    def resolved(arn: str) -> str:
        return arn.replace("${AWS::Partition}", deployment.partition) \
            .replace("${AWS::AccountId}", deployment.account).replace("${AWS::Region}", deployment.region)
    manifest, roles = synth.manifest(), set()
    for name, artifact in manifest["artifacts"].items():
        properties = artifact.get("properties", {})
        if artifact["type"] == "aws:cloudformation:stack":
            roles |= {properties["assumeRoleArn"], properties["lookupRole"]["arn"]}
        if artifact["type"] == "cdk:asset-manifest":
            assets = json.loads((synth.outdir / properties["file"]).read_text())
            roles |= {destination["assumeRoleArn"] for section in ("files", "dockerImages")
                      for asset in assets.get(section, {}).values()
                      for destination in asset["destinations"].values()}
    return [Request("sts:AssumeRole", resolved(role), source=f"cdk deploy/diff ({name})") for role in sorted(roles)]


def test_the_deployer_may_assume_each_bootstrap_role_the_cli_uses(environment):
    requests = assumed_roles(environment.synth, environment.deployment)
    kinds = {r.resource.split(":role/cdk-")[1].split("-role-")[0].split("-", 1)[1] for r in requests}
    assert kinds == {"deploy", "lookup", "file-publishing"}, kinds   # no image asset in the app
    policy = environment.policy("deployer")
    lines = denied(verdicts(policy, requests))
    assert not lines, "\n".join(lines)
    assert len(denied(verdicts(without(policy, "AssumeCdkBootstrapRoles"), requests))) == len(requests)


def test_the_deployer_is_denied_other_roles(environment):
    deploy_role = assumed_roles(environment.synth, environment.deployment)[0].resource
    others = [deploy_role.replace("-hnb659fds-", "-otherqual-"), deploy_role.replace(REGION, "us-west-2"),
              f"arn:aws:iam::{MOTO_ACCOUNT}:role/decision-dev-cpu-execution"]
    requests = [Request("sts:AssumeRole", arn) for arn in others]
    requests.append(Request("cloudformation:CreateStack", f"arn:aws:cloudformation:{REGION}:{MOTO_ACCOUNT}:"
                                                          f"stack/decision-dev-access/x"))
    assert not [v for v in verdicts(environment.policy("deployer"), requests) if v.allowed]
