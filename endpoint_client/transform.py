"""``python -m endpoint_client transform -c env=NAME --endpoint cpu --input s3://...``: a Batch Transform job.

Runs the endpoint stack's pinned Model (its ``ModelName`` output) over JSON-lines files: each line one request
object (``{"decision": ...}``, ``{"decisions": [...]}`` or a System One body), each output line the result of the
input line at the same place, in ``<input file>.out`` under the output prefix. The job splits the files by line
(SplitType Line), packs as many lines into one request as the container says it can finish (BatchStrategy,
MaxPayloadInMB) and joins the results by line (AssembleWith Line).

How many lines one request may hold is what the container answers at ``GET /execution-parameters``, sized from
the speed it measured (the adapter's server/batch.py): by default the job leaves BatchStrategy, MaxPayloadInMB and
MaxConcurrentTransforms out, and SageMaker asks the container itself; ``--execution-parameters URL`` reads them
from a container at hand instead (e.g. ``make run``'s, or an image under test on the same instance type), and
``--max-payload-mb`` lowers the payload. The job's ModelClientConfig gives each request the
InvocationsTimeoutInSeconds that the container budgets a mini-batch for (its ``ADAPTER_BATCH_TIMEOUT_S``, read
from the model's environment; SageMaker's maximum, 3,600 s, unless set), the job's Environment tells the container
it runs as a transform (``ADAPTER_DEPLOYMENT=transform``, with that budget: the same model serves the real-time
endpoint, whose requests keep the real-time deadline) and one retry
(``InvocationsMaxRetries``): a mini-batch is answered record by record, bad records as error lines, so a retry
helps only when the container itself failed.

Only the CPU model runs: transform hosts offer NVIDIA drivers 470 and 535 (``TransformAmiVersion``), and the GPU
image links CUDA 13, which needs driver 580 or later, so ``--endpoint gpu`` is refused with that reason before any
job is created. The model's execution role reads only ``batch/input/`` and writes only ``batch/output/`` of the artifact bucket
(stacks/endpoint_stack.py); the command refuses other locations rather than start a job that fails later. It
waits, printing the job's status and how many input files have their output, then prints the output location
(JSON on stdout). Exit codes: 0 completed (or started, with --no-wait), 1 failed or stopped, 2 bad arguments or
input, 4 no region or credentials.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Sequence

from botocore.exceptions import ClientError, NoCredentialsError, PartialCredentialsError

from endpoint_client.deployment import (EXIT_CONFIGURATION, EXIT_FAILED, EXIT_OK, EXIT_USAGE, Aws, CommandError,
                                        add_common_arguments, aws_for, error_code, load_config, stack_outputs)
from stacks import instance_types
from stacks.config import ADAPTER_KINDS, BATCH_INPUT_PREFIX as INPUT_PREFIX, TRANSFORM_KINDS
from stacks.config import BATCH_OUTPUT_PREFIX as OUTPUT_PREFIX, TRANSFORM_LOG_GROUP

JSON_LINES = "application/jsonlines"
# What the adapter budgets a mini-batch for unless ADAPTER_BATCH_TIMEOUT_S says otherwise: SageMaker's maximum.
DEFAULT_INVOCATION_TIMEOUT_S = 3600
INVOCATION_RETRIES = 1
STRATEGIES = {"MULTI_RECORD": "MultiRecord", "SINGLE_RECORD": "SingleRecord"}
TERMINAL = ("Completed", "Failed", "Stopped")


@dataclass(frozen=True)
class S3Location:
    bucket: str
    key: str

    @classmethod
    def parse(cls, uri: str) -> "S3Location":
        if not uri.startswith("s3://") or "/" not in uri[5:]:
            raise CommandError(f"{uri!r} is not an S3 URI (s3://bucket/prefix/)")
        bucket, _, key = uri[5:].partition("/")
        return cls(bucket, key)

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


@dataclass(frozen=True)
class ExecutionParameters:
    """What the job says of its requests; None leaves a value out, and SageMaker asks the container."""

    batch_strategy: str | None  # MultiRecord or SingleRecord
    max_payload_mb: int | None
    max_concurrent_transforms: int | None

    def describe(self) -> str:
        if self.batch_strategy is None:
            return "batches as the container's /execution-parameters says"
        return f"{self.batch_strategy} batches up to {self.max_payload_mb} MB"


def execution_parameters(url: str | None, max_payload_mb: int | None) -> ExecutionParameters:
    """The container's answer at GET /execution-parameters (when url is given), or none (SageMaker asks)."""
    if url is None:
        return ExecutionParameters("MultiRecord" if max_payload_mb else None, max_payload_mb, None)
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            answer = json.loads(response.read())
    except (OSError, ValueError) as error:
        raise CommandError(f"GET {url}: {error}") from None
    strategy = STRATEGIES.get(answer.get("BatchStrategy"))
    if strategy is None:
        raise CommandError(f"{url} answers BatchStrategy {answer.get('BatchStrategy')!r}, not one of "
                           f"{', '.join(STRATEGIES)}")
    payload = answer.get("MaxPayloadInMB")
    if not isinstance(payload, int) or payload < 1:
        raise CommandError(f"{url} answers no MaxPayloadInMB: {answer}")
    if max_payload_mb is not None and max_payload_mb > payload:
        raise CommandError(f"--max-payload-mb {max_payload_mb} is above the container's {payload}")
    concurrent = answer.get("MaxConcurrentTransforms")
    return ExecutionParameters(strategy, max_payload_mb or payload, concurrent if isinstance(concurrent, int) else None)


@dataclass(frozen=True)
class TransformPlan:
    job_name: str
    model_name: str
    input: S3Location
    output: S3Location
    input_keys: tuple[str, ...]
    instance_type: str
    instance_count: int
    parameters: ExecutionParameters
    invocation_timeout_s: int = DEFAULT_INVOCATION_TIMEOUT_S

    def request(self, tags: dict[str, str]) -> dict[str, Any]:
        request: dict[str, Any] = {
            "TransformJobName": self.job_name, "ModelName": self.model_name,
            "ModelClientConfig": {"InvocationsTimeoutInSeconds": self.invocation_timeout_s,
                                  "InvocationsMaxRetries": INVOCATION_RETRIES},
            # The container learns it runs as a transform from its environment (the adapter's settings.py): every
            # request a mini-batch with this budget, a single-record one too.
            "Environment": {"ADAPTER_DEPLOYMENT": "transform",
                            "ADAPTER_BATCH_TIMEOUT_S": str(self.invocation_timeout_s)},
            "TransformInput": {"DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": self.input.uri}},
                               "ContentType": JSON_LINES, "SplitType": "Line", "CompressionType": "None"},
            "TransformOutput": {"S3OutputPath": self.output.uri, "Accept": JSON_LINES, "AssembleWith": "Line"},
            "TransformResources": {"InstanceType": self.instance_type, "InstanceCount": self.instance_count},
            "Tags": [{"Key": key, "Value": value} for key, value in sorted(tags.items())],
        }
        known = {"BatchStrategy": self.parameters.batch_strategy, "MaxPayloadInMB": self.parameters.max_payload_mb,
                 "MaxConcurrentTransforms": self.parameters.max_concurrent_transforms}
        request.update({key: value for key, value in known.items() if value is not None})
        return request


def refuse_gpu_model(kind: str) -> None:
    """Batch Transform hosts run the drivers of TransformAmiVersion (470, 535), which cannot run the GPU image's
    CUDA: the job would start, and the model would fall back to the CPU or fail. Refused before anything is made."""
    if kind in TRANSFORM_KINDS:
        return
    drivers = ", ".join(str(d) for d in sorted(instance_types.GPU_TRANSFORM_AMIS.values()))
    cuda = instance_types.GPU_IMAGE_CUDA_VERSION
    raise CommandError(
        f"--endpoint {kind}: the GPU model does not run in Batch Transform: transform hosts offer NVIDIA drivers "
        f"{drivers} (TransformAmiVersion), and the GPU image is built with CUDA {cuda}, which needs driver "
        f"{instance_types.driver_for_cuda(cuda)} or later. Run the job on the CPU model (--endpoint cpu), or invoke "
        f"the GPU endpoint in real time")


def plan(args: argparse.Namespace, aws: Aws, config: Any, now: datetime) -> TransformPlan:
    cloudformation = aws.client("cloudformation")
    bucket = stack_outputs(cloudformation, config.artifacts_stack_name, ["ArtifactBucketName"])["ArtifactBucketName"]
    endpoint_outputs = stack_outputs(cloudformation, config.endpoint_stack_name(args.endpoint),
                                     ["ModelName", "TransformInstanceType"])
    source = S3Location.parse(args.input)
    if source.bucket != bucket or not source.key.startswith(INPUT_PREFIX):
        raise CommandError(f"the input must be under s3://{bucket}/{INPUT_PREFIX}, the only input the execution "
                           f"role reads (got {source.uri})")
    job_name = args.job_name or f"{config.endpoint_name(args.endpoint)}-{now:%Y%m%d-%H%M%S}"[:63]
    target = S3Location.parse(args.output) if args.output else S3Location(bucket, f"{OUTPUT_PREFIX}{job_name}/")
    if target.bucket != bucket or not target.key.startswith(OUTPUT_PREFIX):
        raise CommandError(f"the output must be under s3://{bucket}/{OUTPUT_PREFIX}, the only place the execution "
                           f"role writes (got {target.uri})")
    keys = tuple(_keys(aws.client("s3"), source))
    if not keys:
        raise CommandError(f"no input objects under {source.uri}")
    model_name = endpoint_outputs["ModelName"]
    return TransformPlan(job_name=job_name, model_name=model_name, input=source, output=target,
                         input_keys=keys, instance_type=args.instance_type or endpoint_outputs["TransformInstanceType"],
                         instance_count=args.instance_count,
                         parameters=execution_parameters(args.execution_parameters, args.max_payload_mb),
                         invocation_timeout_s=_invocation_timeout(aws.client("sagemaker"), model_name))


def _invocation_timeout(sagemaker: Any, model_name: str) -> int:
    """The mini-batch budget the model's container works to: its ADAPTER_BATCH_TIMEOUT_S, or the default."""
    description = sagemaker.describe_model(ModelName=model_name)
    containers = [description.get("PrimaryContainer", {}), *description.get("Containers", [])]
    for container in containers:
        value = (container.get("Environment") or {}).get("ADAPTER_BATCH_TIMEOUT_S")
        if value:
            return int(value)
    return DEFAULT_INVOCATION_TIMEOUT_S


def _keys(s3: Any, location: S3Location) -> list[str]:
    keys = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=location.bucket, Prefix=location.key):
        keys += [item["Key"] for item in page.get("Contents", []) if not item["Key"].endswith("/")]
    return keys


def _require_log_group(logs: Any, config: Any) -> None:
    """All transform jobs of an account and region log to one group, which the artifacts stack of the environment
    with ``create_transform_log_group`` owns (retention, the logs key). The execution role may write to it but not
    create it, and a group this command created would have neither and make that stack's deploy fail ("already
    exists"), so a missing group stops the job before it starts: it would run without logs."""
    groups = logs.describe_log_groups(logGroupNamePrefix=TRANSFORM_LOG_GROUP).get("logGroups", [])
    if not any(group["logGroupName"] == TRANSFORM_LOG_GROUP for group in groups):
        owner = (f"deploy {config.artifacts_stack_name}, which creates it" if config.create_transform_log_group
                 else f"{config.key('create_transform_log_group')} is false: deploy the artifacts stack of the "
                      f"environment of this account and region that creates it")
        raise CommandError(f"the log group {TRANSFORM_LOG_GROUP} does not exist ({owner}); the job would have no "
                           f"logs", EXIT_FAILED)


def wait(aws: Aws, job: TransformPlan, *, poll_s: float, report: Callable[[str], None],
         sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Poll the job until it ends; report its status and the input files whose output exists, when they change."""
    sagemaker, s3 = aws.client("sagemaker"), aws.client("s3")
    started, last = clock(), None
    expected = {_output_key(job, key) for key in job.input_keys}
    while True:
        description = sagemaker.describe_transform_job(TransformJobName=job.job_name)
        status = description["TransformJobStatus"]
        done = len(expected & set(_keys(s3, job.output)))
        line = f"{status}: {done}/{len(expected)} input files done"
        if line != last:
            elapsed = int(clock() - started)
            report(f"[{elapsed // 60:02d}:{elapsed % 60:02d}] {job.job_name} {line}")
            last = line
        if status in TERMINAL:
            return {**description, "OutputsDone": done}
        sleep(poll_s)


def _output_key(job: TransformPlan, input_key: str) -> str:
    # SageMaker keeps an input file's path below the input prefix and appends .out.
    return job.output.key + input_key[len(job.input.key):].lstrip("/") + ".out"


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m endpoint_client transform",
        description="Run a Batch Transform job on an endpoint stack's pinned model over S3 JSON-lines files "
                    "(SplitType Line, batches as the container sizes them, AssembleWith Line) and wait for it.")
    add_common_arguments(parser)
    parser.add_argument("--endpoint", choices=ADAPTER_KINDS, default="cpu",
                        help="whose stack's model to run (default cpu; gpu is refused: transform hosts' NVIDIA "
                             "drivers cannot run the GPU image)")
    parser.add_argument("--input", required=True, help="s3://<artifact bucket>/batch/input/<prefix>/")
    parser.add_argument("--output", help="default s3://<artifact bucket>/batch/output/<job name>/")
    parser.add_argument("--job-name", help="default <endpoint name>-<UTC time>")
    parser.add_argument("--instance-type", help="default the stack's TransformInstanceType output")
    parser.add_argument("--instance-count", type=int, default=1)
    parser.add_argument("--execution-parameters", metavar="URL",
                        help="a running container's /execution-parameters, e.g. http://127.0.0.1:8080/"
                             "execution-parameters (default: SageMaker asks the job's own container)")
    parser.add_argument("--max-payload-mb", type=int, help="at most the container's MaxPayloadInMB")
    parser.add_argument("--poll-interval", type=float, default=30.0, help="seconds between status checks")
    parser.add_argument("--no-wait", action="store_true", help="start the job and print it, do not wait")
    args = parser.parse_args(argv)
    report = lambda message: print(f"endpoint_client transform: {message}", file=sys.stderr)  # noqa: E731
    if args.instance_count < 1 or (args.max_payload_mb is not None and args.max_payload_mb < 1):
        report("--instance-count and --max-payload-mb must be at least 1")
        return EXIT_USAGE
    try:
        refuse_gpu_model(args.endpoint)
        config = load_config(args)
        aws = aws_for(args, config)
        job = plan(args, aws, config, datetime.now(timezone.utc))
        _require_log_group(aws.client("logs"), config)
        arn = aws.client("sagemaker").create_transform_job(**job.request({
            "endpoint-kind": args.endpoint, "environment": config.name}))["TransformJobArn"]
        report(f"started {arn}: {len(job.input_keys)} input files, {job.parameters.describe()}, "
               f"{job.invocation_timeout_s} s per request, {job.instance_count} x {job.instance_type}")
        result = {"job": job.job_name, "arn": arn, "input": job.input.uri, "output": job.output.uri}
        if args.no_wait:
            print(json.dumps({**result, "status": "InProgress"}))
            return EXIT_OK
        description = wait(aws, job, poll_s=args.poll_interval, report=report)
    except CommandError as error:
        report(str(error))
        return error.exit_code
    except (NoCredentialsError, PartialCredentialsError) as error:
        report(f"no AWS credentials: {error}")
        return EXIT_CONFIGURATION
    except ClientError as error:
        report(f"{error_code(error)}: {error}")
        return EXIT_FAILED
    status = description["TransformJobStatus"]
    print(json.dumps({**result, "status": status, "outputs": description["OutputsDone"],
                      **({"failure": description["FailureReason"]} if description.get("FailureReason") else {})}))
    if status != "Completed":
        report(f"{job.job_name} {status}: {description.get('FailureReason') or 'no reason given'}")
        return EXIT_FAILED
    report(f"results in {job.output.uri}")
    return EXIT_OK
