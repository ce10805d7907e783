"""The AWS calls each component makes, derived from the code that makes them, as IAM requests to evaluate.

- A CodeBuild project's buildspec (container/buildspec.yml as it is, or the mirror's inline one from the template)
  runs under bash with the project's environment, as CodeBuild runs it; ``aws``, ``docker``, ``skopeo`` and
  ``apt-get`` on its PATH are stand-ins that only record their arguments and answer as the real ones would, so that
  the script goes on. Every recorded command is then turned into the IAM requests the real tool makes
  (:func:`requests_of_command`). The stand-ins grant nothing: the verdicts come from the role's policies.
- The model build runs (``model_build.cli.main``) against moto's S3, and botocore's ``before-call`` event records
  every S3 operation it makes (:class:`BotocoreRecorder`); :func:`requests_of_operation` maps each to its action.
- CodeBuild's own calls with the role (logs, the source asset) and SageMaker's with an execution role (model data,
  image pull, logs, metrics, rollback alarms) follow from the synthesized resources that configure them.
- The operator commands and the invoke client (tests/cdk/test_cdk_access_policies.py) run against moto with every
  boto3 session recorded (:func:`record_sessions`); :class:`ApiRequests` maps each operation of the services they
  use to its action and resource, with the actions SageMaker authorizes with the caller's rights besides
  (PassRole, CreateGrant, AddTags), and refuses an operation it has no mapping for.

What the real tools do, where it is not one API operation: ``aws ecr get-login-password`` calls
GetAuthorizationToken, ``aws ecr-public get-login-password`` also needs sts:GetServiceBearerToken, ``aws s3 cp FILE
s3://B/K`` puts the object (in parts above 8 MiB: still s3:PutObject), and a push to ECR (docker push, skopeo copy)
needs the five actions of ECR_PUSH, a pull the three of ECR_PULL (Amazon ECR's "Required IAM permissions for
pushing an image" and private repository policy examples).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import botocore.session
from botocore import xform_name

from deploy import service_authorization
from deploy.iam_simulation import Deployment, Request

ECR_PUSH = ("ecr:BatchCheckLayerAvailability", "ecr:InitiateLayerUpload", "ecr:UploadLayerPart",
            "ecr:CompleteLayerUpload", "ecr:PutImage")
ECR_PULL = ("ecr:BatchCheckLayerAvailability", "ecr:GetDownloadUrlForLayer", "ecr:BatchGetImage")
DOCKER_V2 = "application/vnd.docker.distribution.manifest.v2+json"
# S3 operations whose IAM action is not s3:<Operation> (Amazon S3's "actions, resources and condition keys").
S3_ACTIONS = {"HeadObject": "s3:GetObject", "CreateMultipartUpload": "s3:PutObject", "UploadPart": "s3:PutObject",
              "CompleteMultipartUpload": "s3:PutObject", "ListObjectsV2": "s3:ListBucket",
              "ListParts": "s3:ListMultipartUploadParts", "HeadBucket": "s3:ListBucket"}
# The AWS CLI's service names whose IAM prefix differs (aws s3api ... is s3:).
CLI_SERVICES = {"s3api": "s3"}
PRIVATE_ECR = re.compile(r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/"
                         r"(?P<repository>[^:@]+)")

# Each stand-in records its argv as one line, fields split by the unit separator, in one write: the two sides of a
# pipe (``aws ecr get-login-password | docker login``) run at once, and a record written in pieces could interleave
# with the other side's (it did: ``docker login`` and ``get-login-password`` on one line, the call lost).
RECORD = r"""#!/usr/bin/env bash
record() { local line="$1"; shift; for a in "$@"; do line+=$'\x1f'"$a"; done; printf '%s\n' "$line" >> "$CALLS"; }
"""
STAND_INS = {
    "aws": RECORD + r"""record aws "$@"
case "$1 $2" in
  "ecr get-login-password"|"ecr-public get-login-password") echo token ;;
  "ecr describe-images")
    # Before the copy the mirror asks whether the tag is there (no); after a push, what ECR holds.
    case " $* " in *" --query "*) printf '%s\t%s\n' "$DOCKER_V2" "$PUSHED_DIGEST" ;; *) exit 254 ;; esac ;;
esac
""",
    "docker": RECORD + r"""record docker "$@"
case "$1" in
  login) cat > /dev/null ;;
  inspect) echo "$REPOSITORY_URI@$PUSHED_DIGEST" ;;
esac
""",
    "skopeo": RECORD + r"""record skopeo "$@"
case "$1" in
  login) cat > /dev/null ;;
  inspect) printf '{"mediaType": "%s"}\n' "$DOCKER_V2" ;;
esac
""",
    "apt-get": "#!/usr/bin/env bash\nexit 0\n",
}


def run_buildspec(spec: dict[str, Any], environment: dict[str, str], workdir: Path,
                  phases: tuple[str, ...] = ("install", "pre_build", "build", "post_build")) -> list[list[str]]:
    """Every command of the buildspec's phases in one bash, in order, as CodeBuild runs them; the argv of each
    ``aws``/``docker``/``skopeo`` command it ran."""
    assert spec["env"]["shell"] == "bash"
    script = "\n".join(c for phase in phases for c in spec["phases"].get(phase, {}).get("commands", []))
    bin_dir = workdir / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, text in STAND_INS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    calls = workdir / "calls"
    # What ECR reports for the pushed image: a built image's digest, or the mirrored source's (copied byte for byte).
    pushed = environment.get("SOURCE_IMAGE", "").rpartition("@")[2] or "sha256:" + "ab" * 32
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls), "DOCKER_V2": DOCKER_V2,
           "PUSHED_DIGEST": pushed, "CODEBUILD_BUILD_SUCCEEDING": "1",
           "CODEBUILD_BUILD_ID": "project:0001", "HOME": str(workdir), **environment}
    done = subprocess.run(["bash", "-c", script], cwd=workdir, env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise AssertionError(f"the buildspec failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return [line.split("\x1f") for line in calls.read_text().splitlines() if line] if calls.exists() else []


def requests_of_command(argv: list[str], *, account: str, region: str, partition: str = "aws") -> list[Request]:
    """The IAM requests the real tool makes for one recorded command line."""
    source = shlex.join(argv)
    tool, args = argv[0], argv[1:]
    if tool in ("docker", "skopeo"):
        found = []
        if tool == "docker" and args[0] == "push":
            found += _ecr_image_requests(args[1], ECR_PUSH, source, partition)
        if tool == "skopeo" and args[0] == "copy":
            images = [a.removeprefix("docker://") for a in args if a.startswith("docker://")]
            found += _ecr_image_requests(images[0], ECR_PULL, source, partition)
            found += _ecr_image_requests(images[1], ECR_PUSH, source, partition)
        if tool == "skopeo" and args[0] == "inspect":
            found += _ecr_image_requests(args[-1].removeprefix("docker://"), ("ecr:BatchGetImage",), source,
                                         partition)
        return found     # login, build, inspect: no AWS API (the registry token came from get-login-password)
    service, command, options = args[0], args[1], _options(args[2:])
    region = options.get("region", region)
    if (service, command) == ("ecr", "get-login-password"):
        return [Request("ecr:GetAuthorizationToken", "*", source=source)]
    if (service, command) == ("ecr-public", "get-login-password"):
        return [Request("ecr-public:GetAuthorizationToken", "*", source=source),
                Request("sts:GetServiceBearerToken", "*", source=source)]
    if (service, command) == ("s3", "cp"):
        local, target = [a for a in args[2:] if not a.startswith("--")][:2]
        if not target.startswith("s3://") or local.startswith("s3://"):
            raise ValueError(f"{source}: only uploads of a local file are mapped")
        bucket, _, key = target[5:].partition("/")
        return [Request("s3:PutObject", f"arn:{partition}:s3:::{bucket}/{key}", source=source)]
    operation = _operation(CLI_SERVICES.get(service, service), command)
    prefix = CLI_SERVICES.get(service, service)
    if prefix == "ecr" and "repository-name" in options:
        registry = options.get("registry-id", account)
        return [Request(f"ecr:{operation}", f"arn:{partition}:ecr:{region}:{registry}:repository/"
                                            f"{options['repository-name']}", source=source)]
    raise ValueError(f"{source}: no IAM mapping for aws {service} {command}; add it to tests/cdk/role_calls.py")


def _options(args: list[str]) -> dict[str, str]:
    found, i = {}, 0
    while i < len(args):
        if args[i].startswith("--"):
            name = args[i][2:]
            if "=" in name:
                name, value = name.split("=", 1)
                found[name] = value
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                found[name] = args[i + 1]
                i += 1
            else:
                found[name] = ""
        i += 1
    return found


def _operation(service: str, command: str) -> str:
    """The API operation an ``aws SERVICE COMMAND`` runs: the CLI names commands by xform_name(operation, '-')."""
    model = botocore.session.get_session().get_service_model(service)
    for name in model.operation_names:
        if xform_name(name, "-") == command:
            return name
    raise ValueError(f"aws {service} {command}: no such operation in botocore's {service} model")


def _ecr_image_requests(image: str, actions: tuple[str, ...], source: str, partition: str) -> list[Request]:
    match = PRIVATE_ECR.match(image)
    if match is None:
        return []        # a public registry: no IAM of this account
    arn = f"arn:{partition}:ecr:{match['region']}:{match['account']}:repository/{match['repository']}"
    return [Request(action, arn, source=source) for action in actions]


# --- boto3 calls, recorded as they are made -------------------------------------------------------------------

@dataclass(frozen=True)
class Operation:
    service: str
    name: str
    params: dict[str, Any]


class BotocoreRecorder:
    """Records every API operation the clients of a botocore session make, with its parameters (the
    ``before-parameter-build`` event), from any thread (s3transfer uploads parts in its own)."""

    def __init__(self) -> None:
        self.operations: list[Operation] = []
        self._lock = threading.Lock()

    def attach(self, events) -> None:
        events.register("before-parameter-build", self._record, unique_id="role-calls-recorder")

    def _record(self, params: dict[str, Any], model, **_: Any) -> None:
        with self._lock:
            self.operations.append(Operation(model.service_model.service_name, model.name, dict(params)))


def requests_of_operation(operation: Operation, *, partition: str = "aws") -> list[Request]:
    source = f"boto3 {operation.service}.{operation.name}"
    if operation.service != "s3":
        raise ValueError(f"{source}: only S3 operations are mapped")
    action = S3_ACTIONS.get(operation.name, f"s3:{operation.name}")
    params = operation.params
    if action == "s3:GetObject" and params.get("VersionId"):
        action = "s3:GetObjectVersion"     # a read of one version is authorized as such (S3's actions table)
    if "Key" in params:
        return [Request(action, f"arn:{partition}:s3:::{params['Bucket']}/{params['Key']}", source=source)]
    context = {"s3:prefix": params["Prefix"]} if "Prefix" in params else {}
    return [Request(action, f"arn:{partition}:s3:::{params['Bucket']}", context, source=source)]


# --- what the services themselves do with a role ----------------------------------------------------------------

def codebuild_service_requests(deployment: Deployment, stack: str, project: dict[str, Any],
                               bootstrap_key: str | None = None) -> list[Request]:
    """CodeBuild's own calls with a project's role: its log group (LogsConfig) and its S3 source; with
    ``bootstrap_key`` (the bootstrap bucket's customer managed key), S3's decryption of the source with it."""
    properties = deployment.resolve(stack, project["Properties"])
    group = properties["LogsConfig"]["CloudWatchLogs"]["GroupName"]
    streams = f"arn:{deployment.partition}:logs:{deployment.region}:{deployment.account}:log-group:{group}:" \
              f"log-stream:build-0001"
    found = [Request("logs:CreateLogStream", streams, source="CodeBuild: LogsConfig"),
             Request("logs:PutLogEvents", streams, source="CodeBuild: LogsConfig")]
    source = properties.get("Source", {})
    if source.get("Type") == "S3":
        bucket, _, key = source["Location"].partition("/")
        found += [Request(a, f"arn:{deployment.partition}:s3:::{bucket}/{key}", source="CodeBuild: Source")
                  for a in ("s3:GetObject", "s3:GetObjectVersion")]
        found += [Request(a, f"arn:{deployment.partition}:s3:::{bucket}", source="CodeBuild: Source")
                  for a in ("s3:GetBucketLocation", "s3:GetBucketAcl")]
        if bootstrap_key is not None:
            # GetObject of an SSE-KMS object: S3 decrypts the data key with the caller's rights, via S3.
            found.append(Request("kms:Decrypt", bootstrap_key,
                                 {"kms:ViaService": f"s3.{deployment.region}.amazonaws.com"},
                                 source="CodeBuild: Source (SSE-KMS)"))
    return found


def endpoint_execution_role(deployment: Deployment, stack: str) -> str:
    """The logical id of the execution role of an endpoint stack's one Model."""
    (model,) = deployment.resources_of_type(stack, "AWS::SageMaker::Model").values()
    return model["Properties"]["ExecutionRoleArn"]["Fn::GetAtt"][0]


def endpoint_execution_requests(deployment: Deployment, stack: str) -> list[Request]:
    """SageMaker's calls with an endpoint's execution role, from the Model, Endpoint and EndpointConfig: the model
    archive, the image, the container's logs and the instance metrics, and the rollback alarms' state."""
    (model,) = deployment.resources_of_type(stack, "AWS::SageMaker::Model").values()
    (endpoint,) = deployment.resources_of_type(stack, "AWS::SageMaker::Endpoint").values()
    container = deployment.resolve(stack, model["Properties"]["PrimaryContainer"])
    found = []
    bucket, _, key = container["ModelDataUrl"].removeprefix("s3://").partition("/")
    found.append(Request("s3:GetObject", f"arn:{deployment.partition}:s3:::{bucket}/{key}",
                         source="SageMaker: ModelDataUrl"))
    found.append(Request("ecr:GetAuthorizationToken", "*", source="SageMaker: Image"))
    found += _ecr_image_requests(container["Image"], ECR_PULL, "SageMaker: Image", deployment.partition)
    # SageMaker writes the container's output to /aws/sagemaker/Endpoints/<EndpointName>, a stream per instance.
    name = deployment.resolve(stack, endpoint["Properties"]["EndpointName"])
    group = f"arn:{deployment.partition}:logs:{deployment.region}:{deployment.account}:log-group:" \
            f"/aws/sagemaker/Endpoints/{name}"
    stream = f"{group}:log-stream:AllTraffic/i-0123456789abcdef0"
    # CloudWatch Logs authorizes a log-group action on the group's ARN with ":*" appended (what DescribeLogGroups
    # returns as its arn): a statement on the bare group ARN does not allow it.
    found += [Request("logs:CreateLogStream", stream, source="SageMaker: container logs"),
              Request("logs:PutLogEvents", stream, source="SageMaker: container logs"),
              Request("logs:DescribeLogStreams", f"{group}:*", source="SageMaker: container logs"),
              Request("cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": "/aws/sagemaker/Endpoints"},
                      source="SageMaker: instance metrics")]
    found += network_interface_requests(deployment, stack)
    found += data_capture_requests(deployment, stack)
    found += async_inference_requests(deployment, stack)
    rollback = deployment.resolve(stack, endpoint["Properties"]["DeploymentConfig"])["AutoRollbackConfiguration"]
    found += [Request("cloudwatch:DescribeAlarms", f"arn:{deployment.partition}:cloudwatch:{deployment.region}:"
                      f"{deployment.account}:alarm:{alarm['AlarmName']}", source="SageMaker: AutoRollbackConfiguration")
              for alarm in rollback["Alarms"]]
    return found


def data_capture_requests(deployment: Deployment, stack: str, *, endpoint_name: str | None = None) -> list[Request]:
    """SageMaker's writes with the execution role where the EndpointConfig captures data (none without it): one
    JSON-lines object per variant and hour under <DestinationS3Uri><endpoint>/<variant>/yyyy/mm/dd/hh/ (SageMaker's
    documented layout). ``endpoint_name`` replaces the endpoint's own (a negative check: another endpoint's part)."""
    (config,) = deployment.resources_of_type(stack, "AWS::SageMaker::EndpointConfig").values()
    if "DataCaptureConfig" not in config["Properties"]:
        return []
    capture = deployment.resolve(stack, config["Properties"]["DataCaptureConfig"])
    (endpoint,) = deployment.resources_of_type(stack, "AWS::SageMaker::Endpoint").values()
    name = endpoint_name or deployment.resolve(stack, endpoint["Properties"]["EndpointName"])
    bucket, _, prefix = capture["DestinationS3Uri"].removeprefix("s3://").partition("/")
    variant = config["Properties"]["ProductionVariants"][0]["VariantName"]
    key = f"{prefix}{name}/{variant}/2027/01/01/00/00-00-000-0123abcd-4567-89ef-0123-456789abcdef.jsonl"
    return [Request("s3:PutObject", f"arn:{deployment.partition}:s3:::{bucket}/{key}",
                    source="SageMaker: DataCaptureConfig")]


# An asynchronous request as SageMaker names its objects: the caller's input key, the answer <inference id>.out and
# the failure <inference id>-error.out under the output and failure paths.
EXAMPLE_INFERENCE_ID = "0123abcd-4567-89ef-0123-456789abcdef"


def async_inference_requests(deployment: Deployment, stack: str, *, input_key: str | None = None,
                             output_key: str | None = None, failure_key: str | None = None,
                             with_keys: bool = False) -> list[Request]:
    """SageMaker's calls with the execution role where the EndpointConfig has an AsyncInferenceConfig (none without
    one): the request body read from the caller's InputLocation (under the stack's AsyncInputPrefix output), the
    answer written under S3OutputPath or the failure under S3FailurePath, and the success or error notification
    published to its topic; ``with_keys``: also SNS's calls on the topics' KMS key with the publisher's rights (to
    evaluate with the key's policy, tests/cdk/test_cdk_async.py). The object keys replace the defaults (a negative
    check)."""
    (config,) = deployment.resources_of_type(stack, "AWS::SageMaker::EndpointConfig").values()
    if "AsyncInferenceConfig" not in config["Properties"]:
        return []
    output = deployment.resolve(stack, config["Properties"]["AsyncInferenceConfig"]["OutputConfig"])
    input_prefix = deployment.output(stack, "AsyncInputPrefix")
    bucket, _, output_prefix = output["S3OutputPath"].removeprefix("s3://").partition("/")
    _, _, failure_prefix = output["S3FailurePath"].removeprefix("s3://").partition("/")
    objects = f"arn:{deployment.partition}:s3:::{bucket}/"
    found = [Request("s3:GetObject", objects + (input_key or f"{input_prefix}request-{EXAMPLE_INFERENCE_ID}.json"),
                     source="SageMaker: InvokeEndpointAsync InputLocation"),
             Request("s3:PutObject", objects + (output_key or f"{output_prefix}{EXAMPLE_INFERENCE_ID}.out"),
                     source="SageMaker: AsyncInferenceConfig S3OutputPath"),
             Request("s3:PutObject", objects + (failure_key or f"{failure_prefix}{EXAMPLE_INFERENCE_ID}-error.out"),
                     source="SageMaker: AsyncInferenceConfig S3FailurePath")]
    topics = {logical_id: topic for logical_id, topic in deployment.resources_of_type(stack, "AWS::SNS::Topic").items()}
    notified = output["NotificationConfig"]
    for which in ("SuccessTopic", "ErrorTopic"):
        arn = notified[which]
        (logical_id,) = [lid for lid in topics if deployment.arn(stack, lid) == arn]
        key = deployment.resolve(stack, topics[logical_id]["Properties"]["KmsMasterKeyId"])
        found += [Request("sns:Publish", arn, source=f"SageMaker: NotificationConfig {which}")]
        # SNS encrypts the message with the topic's key, with the publisher's rights.
        found += [Request(action, key, {"kms:ViaService": f"sns.{deployment.region}.amazonaws.com"},
                          source=f"SNS: {which} encrypted") for action in ("kms:GenerateDataKey", "kms:Decrypt")
                  if with_keys]
    return found


EXAMPLE_INTERFACE = "eni-0123456789abcdef0"


def network_interface_requests(deployment: Deployment, stack: str, *, subnets: list[str] | None = None,
                               interface: str = EXAMPLE_INTERFACE) -> list[Request]:
    """SageMaker's calls with the execution role where the Model has a VpcConfig (none without one): per instance an
    elastic network interface in one of its subnets with its security groups, a permission on it for SageMaker's
    own account, and both deleted again; the describe calls that check the subnets, groups and the VPC's DHCP
    options. ``subnets`` replaces the VpcConfig's (a negative check: an interface elsewhere)."""
    (model,) = deployment.resources_of_type(stack, "AWS::SageMaker::Model").values()
    if "VpcConfig" not in model["Properties"]:
        return []
    vpc = deployment.resolve(stack, model["Properties"]["VpcConfig"])
    partition, region, account = deployment.partition, deployment.region, deployment.account
    ec2 = f"arn:{partition}:ec2:{region}:{account}"
    source = "SageMaker: VpcConfig"
    eni = f"{ec2}:network-interface/{interface}"
    found = [Request(f"ec2:{action}", "*", source=source) for action in (
        "DescribeSubnets", "DescribeSecurityGroups", "DescribeVpcs", "DescribeDhcpOptions",
        "DescribeNetworkInterfaces")]
    for subnet in subnets if subnets is not None else vpc["Subnets"]:
        subnet_arn = f"{ec2}:subnet/{subnet}"
        within = {"ec2:Subnet": subnet_arn}
        found += [Request("ec2:CreateNetworkInterface", eni, source=f"{source} ({subnet})"),
                  Request("ec2:CreateNetworkInterface", subnet_arn, source=f"{source} ({subnet})")]
        found += [Request("ec2:CreateNetworkInterface", f"{ec2}:security-group/{group}", source=f"{source} ({subnet})")
                  for group in vpc["SecurityGroupIds"]]
        found += [Request(f"ec2:{action}", eni, within, source=f"{source} ({subnet})")
                  for action in ("CreateNetworkInterfacePermission", "DeleteNetworkInterface")]
        # A permission is deleted by its own id (NetworkInterfacePermissionId): no interface in the request.
        found.append(Request("ec2:DeleteNetworkInterfacePermission", "*", source=f"{source} ({subnet})"))
    return found


def transform_requests(deployment: Deployment, bucket: str, plan_request: dict[str, Any], input_keys: list[str],
                       output_key: Callable[[str], str]) -> list[Request]:
    """SageMaker's calls with the model's role during a transform job that ``endpoint_client transform`` starts:
    list and read the S3Prefix input, write each output object, log and publish the job's instance metrics."""
    partition, region, account = deployment.partition, deployment.region, deployment.account
    source = f"SageMaker: transform job {plan_request['TransformJobName']}"
    prefix = plan_request["TransformInput"]["DataSource"]["S3DataSource"]["S3Uri"].removeprefix(f"s3://{bucket}/")
    found = [Request("s3:ListBucket", f"arn:{partition}:s3:::{bucket}", {"s3:prefix": prefix}, source=source)]
    found += [Request("s3:GetObject", f"arn:{partition}:s3:::{bucket}/{key}", source=source) for key in input_keys]
    found += [Request(action, f"arn:{partition}:s3:::{bucket}/{output_key(key)}", source=source)
              for key in input_keys for action in ("s3:PutObject", "s3:AbortMultipartUpload")]
    group = f"arn:{partition}:logs:{region}:{account}:log-group:/aws/sagemaker/TransformJobs"
    stream = f"{group}:log-stream:{plan_request['TransformJobName']}/i-0123456789abcdef0"
    found += [Request("logs:CreateLogStream", stream, source=source), Request("logs:PutLogEvents", stream, source=source),
              Request("logs:DescribeLogStreams", f"{group}:*", source=source),
              Request("cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": "/aws/sagemaker/TransformJobs"},
                      source=source)]
    return found


# --- the operator's and the invoker's boto3 calls ----------------------------------------------------------------

# botocore's service names whose IAM prefix differs.
IAM_PREFIXES = {"sagemaker-runtime": "sagemaker", "service-quotas": "servicequotas"}
# Variables of the Service Authorization Reference's ARN formats that a service's parameters name otherwise than
# the format does (the rest are the parameter of the same name): {(service, variable): parameter}.
ARN_PARAMETERS = {("ecr", "RepositoryName"): "repositoryName", ("ecr", "Account"): "registryId",
                  ("logs", "LogGroupName"): "logGroupName"}
# The Endpoint's configuration an UpdateEndpoint or CreateEndpoint activates is named by its EndpointConfigName.
ACTIVATES_CONFIG = ("CreateEndpoint", "UpdateEndpoint")


class ApiRequests:
    """The IAM requests of recorded boto3 operations: the operation's own action on every resource type the
    Service Authorization Reference authorizes it on (deploy/service_authorization.py, the simulator's own data:
    UpdateEndpoint on the endpoint and on the endpoint configuration; ``*`` where the action has no resource-level
    permissions), each ARN made from the operation's parameters, and what the services authorize besides with the
    caller's rights (SageMaker's documented dependent actions):

    - CreateModel passes its ExecutionRoleArn to SageMaker: ``iam:PassRole`` with ``iam:PassedToService``;
    - a Create* with Tags tags the new resource: ``sagemaker:AddTags`` on it;
    - CreateEndpoint and UpdateEndpoint to an EndpointConfig with a KmsKeyId: SageMaker creates a grant on that key
      with the caller's rights (``kms:CreateGrant`` through SageMaker; CreateEndpointConfig itself needs none, AWS's
      SageMaker API permissions reference). Whether SageMaker's grant says ``kms:GrantIsForAWSResource`` is not
      documented: the request carries only what is (``kms:ViaService``), and a policy that requires more denies it.

    ``tags_of(arn)`` gives a resource's tags (``aws:ResourceTag/...``), ``config_keys`` the KmsKeyId of the
    EndpointConfigs that exist before the calls (those created during them are added). An operation whose resource
    a parameter cannot name is refused (add its parameter to ARN_PARAMETERS)."""

    def __init__(self, *, account: str, region: str, partition: str = "aws",
                 tags_of: Callable[[str], dict[str, str]] = lambda arn: {},
                 config_keys: dict[str, str] | None = None):
        self.account, self.region, self.partition, self.tags_of = account, region, partition, tags_of
        self.config_keys = dict(config_keys or {})

    def arn(self, service: str, resource: str) -> str:
        return f"arn:{self.partition}:{service}:{self.region}:{self.account}:{resource}"

    def request(self, action: str, resource: str, source: str, context: dict[str, Any] | None = None) -> Request:
        tagged = {f"aws:ResourceTag/{k}": v for k, v in self.tags_of(resource).items()} if resource != "*" else {}
        return Request(action, resource, {**tagged, **(context or {})}, source=source)

    def resources(self, operation: Operation, action: str) -> list[str]:
        """Every ARN the action is authorized on for this operation: one per required resource type (per alarm
        where it names several), the optional ones its parameters name, else ``*``."""
        service, params = IAM_PREFIXES.get(operation.service, operation.service), operation.params
        found = []
        for resource_type in service_authorization.resource_types(action):
            values = {"Partition": self.partition, "Region": self.region, "Account": self.account}
            for variable in resource_type.variables:
                parameter = ARN_PARAMETERS.get((service, variable), variable)
                if parameter in params:
                    values[variable] = params[parameter]
            if service == "cloudformation":
                values["Id"] = "00000000-0000-0000-0000-000000000000"   # a stack's generated id
            if service == "sns" and "TopicArn" in params:
                values["TopicName"] = params["TopicArn"].rsplit(":", 1)[1]
            names = [values]
            if service == "cloudwatch" and "AlarmName" in resource_type.variables:
                listed = params.get("AlarmNames") or ([params["AlarmName"]] if "AlarmName" in params else [])
                names = [{**values, "AlarmName": name} for name in listed] or [{**values, "AlarmName": "*"}]
            missing = [v for v in resource_type.variables if v not in names[0]]
            if missing:
                if resource_type.required:
                    raise ValueError(f"boto3 {operation.service}.{operation.name}: no parameter names the "
                                     f"{resource_type.name} ({', '.join(missing)}) that {action} is authorized on; "
                                     f"add it to tests/cdk/role_calls.py (ARN_PARAMETERS)")
                continue
            for named in names:
                if service == "sagemaker":    # SageMaker's ARNs hold names in lower case
                    named = {k: v.lower() if k not in ("Partition", "Region", "Account") else v
                             for k, v in named.items()}
                arn = resource_type.arn(named)
                # CloudWatch Logs authorizes a log-group action on the group's ARN with ":*" appended (what
                # DescribeLogGroups returns as its arn): a statement on the bare group ARN does not allow it.
                found.append(arn + ":*" if resource_type.name == "log-group" else arn)
        return found or ["*"]

    def of(self, operation: Operation) -> list[Request]:
        service, name, params = operation.service, operation.name, operation.params
        if service == "s3":
            return requests_of_operation(operation, partition=self.partition)
        source = f"boto3 {service}.{name}"
        action = f"{IAM_PREFIXES.get(service, service)}:{name}"
        try:
            service_authorization.resource_types(action)
        except KeyError:
            raise ValueError(f"{source}: {action} is not an action of the Service Authorization Reference; map it "
                             f"in tests/cdk/role_calls.py (ApiRequests)") from None
        found = [self.request(action, resource, source) for resource in self.resources(operation, action)]
        if service not in ("sagemaker", "sagemaker-runtime"):
            return found
        if name == "CreateModel":
            found.append(Request("iam:PassRole", params["ExecutionRoleArn"],
                                 {"iam:PassedToService": "sagemaker.amazonaws.com"}, source=source))
        if name.startswith("Create") and params.get("Tags"):
            found += [Request("sagemaker:AddTags", r.resource, source=source) for r in found[:1]]
        if name == "CreateEndpointConfig" and params.get("KmsKeyId"):
            self.config_keys[params["EndpointConfigName"]] = params["KmsKeyId"]
        key = self.config_keys.get(params.get("EndpointConfigName", "")) if name in ACTIVATES_CONFIG else None
        if key:
            found.append(self.request("kms:CreateGrant", key, source,
                                      {"kms:ViaService": f"sagemaker.{self.region}.amazonaws.com"}))
        return found


def resource_type_problems(requests: list[Request]) -> list[str]:
    """Where a request does not say what the Service Authorization Reference authorizes its action on: a resource
    that is none of the action's resource types (or not '*' for an action without resource-level permissions), or,
    among one source's requests of an action, a required resource type that none of them names (UpdateEndpoint on
    the endpoint but not on its configuration). Empty when every call is checked on every resource AWS checks."""
    problems, covered = [], {}
    for request in requests:
        types = service_authorization.resource_types(request.action)
        if request.resource == "*":
            if any(t.required for t in types):
                problems.append(f"{request.action} on * <- {request.source}: it is authorized on "
                                f"{', '.join(t.name for t in types if t.required)}")
            continue
        found = service_authorization.resource_type_of(request.action, request.resource)
        if found is None:
            problems.append(f"{request.action} on {request.resource} <- {request.source}: not one of its resource "
                            f"types ({', '.join(t.name for t in types) or 'none: *'})")
            continue
        covered.setdefault((request.source, request.action), set()).add(found.name)
    for (source, action), names in covered.items():
        missing = {t.name for t in service_authorization.resource_types(action) if t.required} - names
        if missing:
            problems.append(f"{action} <- {source}: never requested on its {', '.join(sorted(missing))}")
    return problems


def record_sessions(monkeypatch, recorder: BotocoreRecorder, stubs: dict[str, Callable[..., Any]] | None = None
                    ) -> None:
    """Every boto3 session created from now on records its clients' operations; ``stubs`` (event name, e.g.
    ``before-call.sagemaker.UpdateEndpoint``: handler) answer operations the emulator lacks, after recording."""
    import boto3.session
    original = boto3.session.Session.__init__

    def recording_init(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        recorder.attach(self.events)
        for event, handler in (stubs or {}).items():
            self.events.register(event, handler, unique_id=f"role-calls-stub-{event}")
    monkeypatch.setattr(boto3.session.Session, "__init__", recording_init)
