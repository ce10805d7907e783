"""The deployment configuration: cdk.json's named environments, parsed and validated once into frozen models.

``app.py`` is the only reader of CDK context (``-c env=NAME``); it calls :func:`load_environment` and hands
the result to the stacks, which never read context or ``os.environ`` themselves. The models are pydantic v2
models (frozen, unknown keys forbidden); every check raises its own message, and :func:`load_environment`
reports every problem of the chosen environment at once, each under its key path, e.g.
``environments.prod.gpu.instance_pools[2]: 'ml.p3.2xlarge' has an NVIDIA V100 (sm_70) ...``. So a typo never
passes silently, and no message is pydantic's generic wording.

An environment's ``artifacts_from`` names another environment whose builds it deploys; load_environment reads what
the pair needs from the other environments of cdk.json once (``artifact_source``, and on the source's side
``artifact_consumers``, whose execution roles its repository and bucket policies name), so that no stack reads
context for it.

Nothing here imports the CDK, so that command-line tools (``python -m endpoint_client check-pins``) can read
the same configuration without it.
"""


import re
from typing import Annotated, Any, Callable, Mapping, Sequence, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from stacks import instance_types

# Where the model packaging writes (model_build/buildspec.yml OUTPUT_PREFIX) and what the key must look like:
# models/<pin>/<gguf sha256>/model.tar.gz (model_build/README.md, "Outputs").
MODEL_PREFIX = "models/"
# Where the image builds record pushed digests (container/buildspec.yml DIGEST_PREFIX).
IMAGE_DIGEST_PREFIX = "image-digests/"
# Where python -m endpoint_client acceptance writes its reports (acceptance/<environment>/...), which promote reads
# and the operator policy allows (stacks/access_stack.py).
ACCEPTANCE_PREFIX = "acceptance/"
# Batch Transform (python -m endpoint_client transform) reads and writes under these prefixes of the artifact
# bucket with the model's execution role, and logs to SageMaker's one group for transform jobs.
BATCH_INPUT_PREFIX = "batch/input/"
BATCH_OUTPUT_PREFIX = "batch/output/"
TRANSFORM_LOG_GROUP = "/aws/sagemaker/TransformJobs"
# SageMaker's data capture writes each endpoint's captured requests and responses under this prefix of the
# artifact bucket (or a prefix below it that cdk.json names), as <prefix><endpoint>/<variant>/yyyy/mm/dd/hh/*.jsonl.
DATA_CAPTURE_PREFIX = "data-capture/"
CAPTURE_MODES = ("input", "output")
# SageMaker Asynchronous Inference (the async endpoint kind) reads each request's body from, and writes its answer or
# its failure under, key prefixes of the artifact bucket below this one that cdk.json names (async.input_prefix,
# output_prefix, failure_prefix).
ASYNC_INFERENCE_PREFIX = "async-inference/"

ENDPOINT_KINDS = ("cpu", "gpu", "text_generation", "async")
# The kinds the decision adapter serves (the other is llama-server).
ADAPTER_KINDS = ("cpu", "gpu", "async")
# The kinds that run another kind's image (pins.images has no key of their own): the async endpoint is the CPU
# adapter image behind SageMaker's queue. Every lookup of a kind's image pin goes through image_kind.
IMAGE_KIND = {"async": "cpu"}
# The kinds behind SageMaker Asynchronous Inference's queue (the others are real-time endpoints).
ASYNC_KINDS = ("async",)
# The image builds, pins.images' keys.
IMAGE_KINDS = ("cpu", "gpu", "text_generation")
# An endpoint kind's field of EnvironmentConfig where it differs from the kind (a Python keyword).
FIELD_OF_KIND = {"async": "async_"}


def image_kind(kind: str) -> str:
    """The pins.images key (and image build) of an endpoint kind's image."""
    return IMAGE_KIND.get(kind, kind)
# The kinds whose Model a Batch Transform job runs: the CPU adapter's. Transform hosts offer NVIDIA drivers 470 and
# 535 only (TransformAmiVersion), which cannot run the GPU image's CUDA 13 (driver 580 or later), so
# `python -m endpoint_client transform` refuses the GPU model (endpoint_client/transform.py).
TRANSFORM_KINDS = ("cpu",)
# The tag `python -m endpoint_client check-pins --protect` adds to each pinned image in the project repository
# (pinned-<digest hex>); the repository's first lifecycle rule never expires images tagged so.
PINNED_TAG_PREFIX = "pinned-"
GPU_INFERENCE_AMI_VERSIONS = tuple(instance_types.GPU_INFERENCE_AMIS)
# The retention periods CloudWatch Logs accepts.
LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557,
                      2922, 3288, 3653)

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_PRIVATE_ECR_IMAGE = re.compile(
    r"^(?P<account>[0-9]{12})\.dkr\.ecr\.(?P<region>[a-z]{2}(?:-[a-z]+)+-[0-9])\.amazonaws\.com(?P<cn>\.cn)?/"
    r"(?P<repository>[a-z0-9]+(?:[._/-][a-z0-9]+)*)@(?P<digest>sha256:[0-9a-f]{64})$")
_ANY_IMAGE_BY_DIGEST = re.compile(r"^[a-z0-9.-]+(?::[0-9]+)?/[a-z0-9._/-]+@sha256:[0-9a-f]{64}$")
_MODEL_KEY = re.compile(r"^models/(?P<pin>[a-z0-9._-]{1,64})/(?P<sha256>[0-9a-f]{64})/model\.tar\.gz$")
_PIN_NAME = re.compile(r"^[a-z0-9._-]{1,64}$")
_NAME_PREFIX = re.compile(r"^[a-z][a-z0-9-]{1,22}[a-z0-9]$")
# S3's rules for a general purpose bucket name: 3 to 63 characters of a-z 0-9 . -, starting and ending with a
# letter or digit, no two adjacent dots, not formatted as an IP address, no reserved prefix.
_BUCKET_NAME = re.compile(r"^(?!\d+\.\d+\.\d+\.\d+$)(?!xn--|sthree-)(?!.*\.\.)[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_ACCOUNT = re.compile(r"^[0-9]{12}$")
_REGION = re.compile(r"^[a-z]{2}(?:-[a-z]+)+-[0-9]$")
_PARTITION = r"aws(?:-cn|-us-gov)?"
_OIDC_PROVIDER_ARN = re.compile(
    rf"^arn:(?P<partition>{_PARTITION}):iam::(?P<account>[0-9]{{12}}):"
    r"oidc-provider/token\.actions\.githubusercontent\.com$")
_KMS_KEY_ARN = re.compile(
    rf"^arn:(?P<partition>{_PARTITION}):kms:(?P<region>[a-z]{{2}}(?:-[a-z]+)+-[0-9]):(?P<account>[0-9]{{12}}):"
    r"key/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


class ConfigError(ValueError):
    """The configuration has one or more invalid values; each line of the message names its key path."""

    def __init__(self, problems: Sequence[str]):
        self.problems = tuple(problems)
        super().__init__("invalid cdk.json configuration:\n  " + "\n  ".join(self.problems))


# --- checks: each raises a message of its own, which load_environment prefixes with the key path -------------

def _problem(message: str) -> PydanticCustomError:
    # Without a context pydantic leaves the text as it is (braces in a value's repr included).
    return PydanticCustomError("config", message)


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__) + f" ({value!r})"[:80]


def _checked(check: Callable[..., Any], base: Any = Any) -> Any:
    return Annotated[base, BeforeValidator(check)]


def Integer(low: int, high: int) -> Any:  # noqa: N802 (a type)
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _problem(f"expected an integer from {low} to {high}, got {_describe(value)}")
        if not low <= value <= high:
            raise _problem(f"{value} is outside {low}..{high}")
        return value
    return _checked(check, int)


def Text(pattern: re.Pattern[str], what: str) -> Any:  # noqa: N802 (a type)
    return _checked(lambda value: _matching(value, pattern, what), str)


def OneOf(choices: Sequence[Any]) -> Any:  # noqa: N802 (a type)
    def check(value: Any) -> Any:
        if not isinstance(value, str) or value not in choices:
            raise _problem(f"{value!r} is not one of {', '.join(map(str, choices))}")
        return value
    return _checked(check, str)


def _matching(value: Any, pattern: re.Pattern[str], what: str) -> str:
    if not isinstance(value, str):
        raise _problem(f"expected {what}, got {_describe(value)}")
    if not pattern.match(value):
        raise _problem(f"{value!r} is not {what}")
    return value


def _log_retention(value: Any) -> int:
    if isinstance(value, bool) or value not in LOG_RETENTION_DAYS:
        raise _problem(f"{value!r} is not a CloudWatch Logs retention ({', '.join(map(str, LOG_RETENTION_DAYS))})")
    return value


def _x86_cpu_instance(image: str) -> Any:
    def check(value: Any) -> str:
        value = _matching(value, instance_types.INSTANCE_TYPE, "an ML instance type such as ml.c7i.xlarge")
        if instance_types.is_accelerated(value):
            raise _problem(f"{value!r} is an accelerated instance; {image} runs on the CPU only")
        if instance_types.is_graviton(value):
            raise _problem(f"{value!r} is a Graviton (arm64) instance; {image} is built for x86-64")
        return value
    return _checked(check, str)


def _gpu_pool(value: Any) -> str:
    value = _matching(value, instance_types.INSTANCE_TYPE, "an ML instance type such as ml.g6.xlarge")
    gpu = instance_types.nvidia_gpu(value)
    if gpu is None:
        supported = sorted(f for f, (_, sm) in instance_types.NVIDIA_FAMILIES.items()
                           if sm in instance_types.GPU_IMAGE_CUDA_ARCHITECTURES)
        raise _problem(f"{value!r} is not an NVIDIA GPU instance family (supported: {', '.join(supported)})")
    gpu_name, compute_capability = gpu
    if compute_capability not in instance_types.GPU_IMAGE_CUDA_ARCHITECTURES:
        built = ";".join(map(str, instance_types.GPU_IMAGE_CUDA_ARCHITECTURES))
        raise _problem(f"{value!r} has an NVIDIA {gpu_name} (sm_{compute_capability}), which the GPU image is not "
                       f"compiled for (container/Dockerfile.gpu CUDA_ARCHITECTURES={built})")
    return value


def _inference_ami(value: Any) -> str:
    if not isinstance(value, str) or value not in instance_types.GPU_INFERENCE_AMIS:
        raise _problem(f"{value!r} is not one of {', '.join(GPU_INFERENCE_AMI_VERSIONS)}")
    driver, cuda = instance_types.GPU_INFERENCE_AMIS[value]
    needed = instance_types.GPU_IMAGE_CUDA_VERSION
    if int(cuda.split(".")[0]) < int(needed.split(".")[0]):
        raise _problem(f"{value!r} has NVIDIA driver {driver} (CUDA {cuda}), older than the CUDA {needed} the GPU "
                       f"image is built with (container/Dockerfile.gpu BASE_CUDA_VERSION)")
    return value


def _list_of(low: int, high: int, what: str) -> Callable[[Any], list]:
    def check(value: Any) -> list:
        if not isinstance(value, list) or not low <= len(value) <= high:
            raise _problem(f"expected {what}, got {_describe(value)}")
        return value
    return check


def _object(what: str) -> Callable[[Any], dict]:
    def check(value: Any) -> dict:
        if not isinstance(value, Mapping):
            raise _problem(f"expected {what}, got {_describe(value)}")
        return dict(value)
    return check


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _problem(f"expected true or false, got {_describe(value)}")
    return value


def _boolean_or_unset(value: Any) -> bool | None:
    """true, false, or null: unset, for load_environment to decide (``_shared_resources``)."""
    return None if value is None else _boolean(value)


_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[a-z]{2,}$", re.IGNORECASE)


def _endpoint_kind(value: Any) -> str:
    if value not in ENDPOINT_KINDS:
        raise _problem(f"{value!r} is not one of {', '.join(ENDPOINT_KINDS)}")
    return value


def _field_problems(model: str, problems: list[tuple[tuple[str | int, ...], str, Any]]) -> ValidationError:
    """Problems found across fields (after each field passed alone), placed at the fields they name."""
    return ValidationError.from_exception_data(model, [
        InitErrorDetails(type=_problem(message), loc=loc, input=value) for loc, message, value in problems])


def _repeats(field: str, values: Sequence[Any], repeated: Callable[[Any, int], str]) -> list:
    """(loc, message, value) for each value seen before in values, as _field_problems takes them."""
    return [((field, index), repeated(value, values.index(value)), value)
            for index, value in enumerate(values) if values.index(value) != index]


# Value types of the models below, each with its own check and message.
AdapterCpuInstance = _x86_cpu_instance("the CPU adapter image")
DlcCpuInstance = _x86_cpu_instance("the llama.cpp DLC CPU image")
ModelKey = Text(_MODEL_KEY, "a key of the form models/<pin>/<gguf sha256>/model.tar.gz (printed by the model build "
                           "as s3_uri)")
Sha256Hex = Text(_HEX64, "64 lowercase hex characters")
RemovalPolicy = OneOf(("destroy", "retain"))
EmailAddress = Text(_EMAIL, "an email address")
class _LocationRequired:
    """Stands for an account or region that cdk.json must name but does not (see _require_location): its field's
    check reports the reason, beside every other problem of the environment."""

    def __init__(self, message: str):
        self.message = message


def _location(pattern: re.Pattern[str], what: str) -> Any:
    def check(value: Any) -> str:
        if isinstance(value, _LocationRequired):
            raise _problem(value.message)
        return _matching(value, pattern, what)
    return _checked(check, str)


AccountId = _location(_ACCOUNT, "a 12-digit AWS account id")
RegionName = _location(_REGION, "an AWS region name such as us-east-1")
NamePrefix = Text(_NAME_PREFIX, "3 to 24 characters of a-z, 0-9 and '-', starting with a letter (stack names and tags)")


# --- the models ---------------------------------------------------------------------------------------------

class _Settings(BaseModel):
    # Frozen, and unknown keys are errors. CDK context (passed through jsii) drops null values, so a nullable key
    # is an Optional field with a default: null and absent cannot be told apart.
    model_config = ConfigDict(frozen=True, extra="forbid")


# A key prefix of S3's safe characters, ending with '/', without empty or '.'/'..' segments.
_CAPTURE_PREFIX = re.compile(r"^(?:(?!\.{1,2}/)[A-Za-z0-9!_.*'()-]+/)+$")


def _artifact_key_prefix(value: Any, root: str, *, what: str, where: str, example: str, below_root: bool) -> str:
    """A key prefix of the environment's artifact bucket under ``root`` (``below_root``: not ``root`` itself), or the
    problem that names what goes there (``what``, ``where``) and an example below ``root``."""
    if not isinstance(value, str):
        raise _problem(f"expected a key prefix under {root} of the artifact bucket, got {_describe(value)}")
    if value.startswith(("s3://", "arn:", "/")) or not value.startswith(root) or (below_root and value == root):
        raise _problem(f"{value!r} is outside the artifact bucket's {root} prefix: {what} go to this environment's "
                       f"artifact bucket only, {where} (name a key prefix such as '{root}{example}', not a bucket or "
                       f"a URI)")
    if not _CAPTURE_PREFIX.match(value):
        raise _problem(f"{value!r} is not a key prefix ending with '/' of a-z A-Z 0-9 ! _ . * ' ( ) - without empty, "
                       f"'.' or '..' parts")
    return value


def _capture_prefix(value: Any) -> str:
    return _artifact_key_prefix(value, DATA_CAPTURE_PREFIX, what="captured requests and responses",
                                where=f"under {DATA_CAPTURE_PREFIX}", example="audit/", below_root=False)


def _async_prefix(value: Any) -> str:
    return _artifact_key_prefix(value, ASYNC_INFERENCE_PREFIX, what="asynchronous requests, answers and failures",
                                where=f"each under a prefix of its own below {ASYNC_INFERENCE_PREFIX}",
                                example="output/", below_root=True)


def _capture_modes(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise _problem(f"expected a list of {' and/or '.join(CAPTURE_MODES)}, got {_describe(value)}")
    for mode in value:
        if mode not in CAPTURE_MODES:
            raise _problem(f"{mode!r} is not one of {', '.join(CAPTURE_MODES)}")
    if len(set(value)) != len(value):
        raise _problem(f"{value!r} names a mode twice")
    return tuple(value)


class DataCaptureSettings(_Settings):
    """``<kind>.data_capture``: SageMaker's data capture of the endpoint's requests and responses (its
    EndpointConfig's DataCaptureConfig), written with the execution role to the environment's own artifact bucket
    under ``prefix`` (default ``data-capture/``; never another bucket), as JSON lines per endpoint, variant and
    hour."""
    # InitialSamplingPercentage: the share of requests captured.
    sampling_percentage: Integer(1, 100)
    capture: Annotated[tuple[str, ...], BeforeValidator(_capture_modes)] = CAPTURE_MODES
    prefix: _checked(_capture_prefix, str) = DATA_CAPTURE_PREFIX


class EndpointSettings(_Settings):
    """What every endpoint has: instance counts, target tracking and container timeouts."""
    initial_instance_count: Integer(1, 100)
    max_instance_count: Integer(1, 100)
    # Target tracking on SageMakerVariantInvocationsPerInstance (per minute), one target per instance type the
    # variant runs on; the policy tracks the lowest (the slowest pool's). Derived in stacks/sizing.py.
    target_invocations_per_instance: Annotated[dict[str, Integer(1, 100_000)], BeforeValidator(_object(
        "an object mapping each instance type of the endpoint to its target invocations per instance and minute"))]
    scale_in_cooldown_s: Integer(0, 3600)
    scale_out_cooldown_s: Integer(0, 3600)
    # ProductionVariant ContainerStartupHealthCheckTimeoutInSeconds / ModelDataDownloadTimeoutInSeconds: 60..3600.
    startup_health_check_timeout_s: Integer(60, 3600)
    model_download_timeout_s: Integer(60, 3600)
    # Auto scaling registered (ScalableTarget and target tracking). false for the one deploy that changes the
    # instance type or the pools: SageMaker refuses UpdateEndpoint on a variant registered with auto scaling.
    autoscaling: _checked(_boolean, bool) = True
    # null: nothing captured (as cdk.json ships).
    data_capture: DataCaptureSettings | None = None

    @property
    def variant_instance_types(self) -> tuple[str, ...]:
        """Every instance type the variant may run on."""
        raise NotImplementedError

    @property
    def scaling_target(self) -> int:
        """The slowest instance type's target: a fleet that fell back to it must not be loaded like a faster one."""
        return min(self.target_invocations_per_instance[t] for t in self.variant_instance_types)

    def _own_problems(self) -> list:
        """Cross-field problems particular to a kind, as _field_problems takes them."""
        return []

    @model_validator(mode="after")
    def _cross_field_checks(self):
        problems = self._own_problems()
        for key, what in (("target_invocations_per_instance", "target"),):
            per_type = getattr(self, key)
            if per_type is None:      # a kind that scales on another metric (AsyncEndpointSettings)
                continue
            for instance_type in self.variant_instance_types:
                if instance_type not in per_type:
                    problems.append(((key,), f"has no {what} for {instance_type} (every instance type the endpoint "
                                     f"runs on needs one)", per_type))
            for instance_type in per_type:
                if instance_type not in self.variant_instance_types:
                    problems.append(((key, instance_type), f"is not an instance type of this endpoint "
                                     f"({', '.join(self.variant_instance_types)})", per_type[instance_type]))
        if self.initial_instance_count > self.max_instance_count:
            problems.append((("initial_instance_count",), f"{self.initial_instance_count} is above "
                             f"max_instance_count ({self.max_instance_count})", self.initial_instance_count))
        threads, instance_type = getattr(self, "threads", None), getattr(self, "instance_type", None)
        if threads is not None and threads > instance_types.physical_cores(instance_type):
            problems.append((("threads",), f"{threads} threads exceed the {instance_types.physical_cores(instance_type)} "
                             f"physical cores of {instance_type} ({instance_types.vcpus(instance_type)} vCPUs): "
                             f"llama.cpp runs one thread per core", threads))
        if problems:
            raise _field_problems(type(self).__name__, problems)
        return self


class CpuEndpointSettings(EndpointSettings):
    instance_type: AdapterCpuInstance
    threads: Integer(1, 192)                      # ADAPTER_THREADS; at most the instance's physical cores

    @property
    def variant_instance_types(self) -> tuple[str, ...]:
        return (self.instance_type,)


def _no_invocations_target(value: Any) -> None:
    if value is not None:
        raise _problem("an asynchronous endpoint publishes no Invocations metric (SageMaker's asynchronous inference "
                       "metrics), so it cannot track invocations per instance: set target_backlog_per_instance")
    return None


class AsyncEndpointSettings(EndpointSettings):
    """``async``: the CPU decision adapter behind SageMaker Asynchronous Inference. A caller puts the request body
    under ``input_prefix`` of the artifact bucket and calls InvokeEndpointAsync; SageMaker queues it, answers into
    ``output_prefix`` (or ``failure_prefix``) and notifies the endpoint stack's success or error topic. The fleet
    scales on the queue (ApproximateBacklogSizePerInstance), down to ``min_instance_count``: 0 scales to zero when
    idle (docs/deploy.md, "Asynchronous inference and dev at zero")."""
    instance_type: AdapterCpuInstance
    threads: Integer(1, 192)                      # ADAPTER_THREADS; at most the instance's physical cores
    # Key prefixes of the artifact bucket under async-inference/: required (no default), distinct and not nested.
    input_prefix: _checked(_async_prefix, str)
    output_prefix: _checked(_async_prefix, str)
    failure_prefix: _checked(_async_prefix, str)
    # AsyncInferenceConfig.ClientConfig.MaxConcurrentInvocationsPerInstance (SageMaker's range).
    max_concurrent_invocations_per_instance: Integer(1, 1000)
    # InvokeEndpointAsync's InvocationTimeoutSeconds (SageMaker's most: 3600), given per request by the client
    # (CloudFormation's ClientConfig has no such key) and to the adapter as its deadline (ADAPTER_ASYNC_TIMEOUT_S).
    invocation_timeout_s: Integer(1, 3600)
    # The scalable target's MinCapacity: 0 = no instance while the queue is empty (the first request after idle
    # waits for one to start). The endpoint is created with initial_instance_count (SageMaker needs at least 1).
    min_instance_count: Integer(0, 100)
    # Target tracking on ApproximateBacklogSizePerInstance (queued requests per instance, Average).
    target_backlog_per_instance: Integer(1, 100_000)
    target_invocations_per_instance: _checked(_no_invocations_target, None) = None

    @property
    def variant_instance_types(self) -> tuple[str, ...]:
        return (self.instance_type,)

    @property
    def scaling_target(self) -> int:
        return self.target_backlog_per_instance

    @property
    def prefixes(self) -> dict[str, str]:
        return {"input_prefix": self.input_prefix, "output_prefix": self.output_prefix,
                "failure_prefix": self.failure_prefix}

    def _own_problems(self) -> list:
        problems, seen = [], []
        for key, prefix in self.prefixes.items():
            for other, earlier in seen:
                if prefix == earlier:
                    problems.append(((key,), f"{prefix!r} is also {{key:{other}}}: requests, answers and failures "
                                     f"each need a prefix of their own", prefix))
                elif prefix.startswith(earlier) or earlier.startswith(prefix):
                    problems.append(((key,), f"{prefix!r} and {{key:{other}}} ({earlier!r}) nest: the execution "
                                     f"role's rights on one would reach the other's objects", prefix))
            seen.append((key, prefix))
        if self.min_instance_count > self.initial_instance_count:
            problems.append((("min_instance_count",), f"{self.min_instance_count} is above initial_instance_count "
                             f"({self.initial_instance_count})", self.min_instance_count))
        return problems


# The walkthrough's order: the fastest GPU first, falling back on capacity to the older, slower ones.
DEFAULT_GPU_POOLS = ("ml.g6e.xlarge", "ml.g6.xlarge", "ml.g5.xlarge", "ml.g4dn.xlarge")


class GpuEndpointSettings(EndpointSettings):
    # ProductionVariant.InstancePools: 1 to 5 pools, priorities 1..5 (here: their order, the first gets 1).
    instance_pools: Annotated[tuple[_checked(_gpu_pool, str), ...], BeforeValidator(_list_of(
        1, 5, "a list of 1 to 5 instance types in priority order"))] = DEFAULT_GPU_POOLS
    # ProductionVariant.VariantInstanceProvisionTimeoutInSeconds: 300..3600.
    provision_timeout_s: Integer(300, 3600)
    inference_ami_version: _checked(_inference_ami, str)

    @property
    def variant_instance_types(self) -> tuple[str, ...]:
        return self.instance_pools

    def _own_problems(self) -> list:
        return _repeats("instance_pools", self.instance_pools, lambda pool, first: f"{pool!r} is already pool "
                                                                                   f"{first + 1}")


class TextGenerationEndpointSettings(EndpointSettings):
    instance_type: DlcCpuInstance
    threads: Integer(1, 192)                      # SM_LLAMA_CPP_THREADS; at most the instance's physical cores
    ctx_size: Integer(512, 1_048_576)
    parallel: Integer(1, 64)                      # llama-server slots

    @property
    def variant_instance_types(self) -> tuple[str, ...]:
        return (self.instance_type,)


class EcrRepositoryRef(_Settings):
    account: str
    region: str
    name: str
    partition: str

    @property
    def arn(self) -> str:
        return f"arn:{self.partition}:ecr:{self.region}:{self.account}:repository/{self.name}"

    @property
    def uri(self) -> str:
        suffix = ".amazonaws.com.cn" if self.partition == "aws-cn" else ".amazonaws.com"
        return f"{self.account}.dkr.ecr.{self.region}{suffix}/{self.name}"


class ImagePin(_Settings):
    """An image pinned by digest: in the project's ECR repository (``repository`` None) or a private ECR URI."""
    digest: str
    repository: EcrRepositoryRef | None = None


def _image_pin(value: Any) -> Any:
    if value is None or isinstance(value, ImagePin):
        return value
    if not isinstance(value, str):
        raise _problem(f"expected 'sha256:<64 hex>' or '<private ECR URI>@sha256:<64 hex>', got {_describe(value)}")
    if _DIGEST.match(value):
        return ImagePin(digest=value)
    match = _PRIVATE_ECR_IMAGE.match(value)
    if match:
        partition = "aws-cn" if match["cn"] else "aws-us-gov" if match["region"].startswith("us-gov-") else "aws"
        return ImagePin(digest=match["digest"], repository=EcrRepositoryRef(
            account=match["account"], region=match["region"], name=match["repository"], partition=partition))
    digest = value.rsplit("@", 1)[-1]
    if digest.startswith("sha256:") and not _DIGEST.match(digest):
        raise _problem(f"{value!r} has a malformed digest: expected 'sha256:' and 64 lowercase hex characters")
    if "@" not in value:
        last = value.rsplit("/", 1)[-1]
        tag = f" by the mutable tag ':{last.split(':', 1)[1]}'" if ":" in last else " without a digest"
        raise _problem(f"{value!r} is pinned{tag}; pin the digest instead: 'sha256:<64 hex>' (the image build "
                       f"prints it) or '<repository URI>@sha256:<64 hex>'")
    if _ANY_IMAGE_BY_DIGEST.match(value):
        raise _problem(f"{value!r} is not in a private Amazon ECR registry, the only kind SageMaker pulls from; "
                       f"copy it into the project repository (the text-generation mirror build does) and pin "
                       f"'sha256:<64 hex>'")
    raise _problem(f"{value!r} is not 'sha256:<64 hex>' or '<account>.dkr.ecr.<region>.amazonaws.com/<repository>"
                   f"@sha256:<64 hex>'")


PinnedImage = Annotated[ImagePin | None, BeforeValidator(_image_pin)]


class ImagePins(_Settings):
    """One pin per image build (the async kind runs the cpu image: image_kind)."""
    cpu: PinnedImage = None
    gpu: PinnedImage = None
    text_generation: PinnedImage = None

    def of(self, kind: str) -> ImagePin | None:
        """The pin of an endpoint kind's image."""
        return getattr(self, image_kind(kind))


class ModelPin(_Settings):
    s3_key: ModelKey
    gguf_sha256: Sha256Hex
    # The bucket that holds the archive; null: this environment's own artifact bucket. An environment with
    # artifacts_from names its source's bucket here (python -m endpoint_client promote writes it).
    bucket: Text(_BUCKET_NAME, "an S3 bucket name (3 to 63 characters of a-z, 0-9, '.' and '-')") | None = None

    @model_validator(mode="after")
    def _key_names_the_gguf(self):
        in_key = _MODEL_KEY.match(self.s3_key)["sha256"]
        if in_key != self.gguf_sha256:
            # {key:gguf_sha256} becomes that key's full path in load_environment's report.
            raise _field_problems("ModelPin", [(("s3_key",), f"the key's GGUF sha256 ({in_key[:12]}...) differs "
                                                f"from {{key:gguf_sha256}} ({self.gguf_sha256[:12]}...)", self.s3_key)])
        return self


_ACCEPTANCE_KEY = re.compile(r"^acceptance/[a-z0-9_-]{1,64}/[0-9]{8}T[0-9]{6}Z\.json$")
_VERSION_ID = re.compile(r"^[A-Za-z0-9._-]{1,1024}$")


class AcceptancePin(_Settings):
    """The acceptance report an environment's pins were promoted on (artifacts_from): one run's object in the
    source's artifact bucket, by its S3 version and the sha256 of its bytes. A version is never rewritten (the bucket
    is versioned; a new write makes a new version), so ``promote --verify`` and ``preflight`` read exactly the
    report promote trusted, and find whether it still says what the pins say."""
    bucket: Text(_BUCKET_NAME, "an S3 bucket name (3 to 63 characters of a-z, 0-9, '.' and '-')")
    key: Text(_ACCEPTANCE_KEY, "a report's key, acceptance/<environment>/<UTC time>.json (promote writes it)")
    version_id: Text(_VERSION_ID, "an S3 version id (promote writes it)")
    sha256: Sha256Hex


class Pins(_Settings):
    images: ImagePins
    model: ModelPin | None = None
    # With artifacts_from: the source's acceptance report these pins were promoted on (promote writes it).
    acceptance: AcceptancePin | None = None

    @property
    def pinned(self) -> bool:
        return self.model is not None or any(self.images.of(kind) is not None for kind in ENDPOINT_KINDS)


def _model_pin_name(value: Any, info: ValidationInfo) -> str:
    value = _matching(value, _PIN_NAME, "a pin name (1 to 64 characters of a-z 0-9 . _ -)")
    model_pins = info.context["model_pins"]
    if value not in model_pins:
        raise _problem(f"{value!r} is not a pin in model_build/pins.json ({', '.join(model_pins) or 'none'})")
    return value


def _source_image(value: Any) -> str:
    if not isinstance(value, str) or not _ANY_IMAGE_BY_DIGEST.match(value):
        raise _problem(f"expected an image reference pinned by digest ('<registry>/<repository>@sha256:<64 hex>'), "
                       f"got {_describe(value)}")
    return value


class BuildSettings(_Settings):
    model_pin: _checked(_model_pin_name, str)                        # a pin name in model_build/pins.json
    text_generation_source_image: _checked(_source_image, str)      # what the mirror project copies
    log_retention_days: _checked(_log_retention, int)


class ArtifactSettings(_Settings):
    removal_policy: RemovalPolicy
    noncurrent_version_expiration_days: Integer(1, 3650)
    access_log_expiration_days: Integer(1, 3650)
    images_kept_per_kind: Integer(1, 1000)

    @property
    def retain(self) -> bool:
        """True: bucket, access-log bucket and repository survive cdk destroy."""
        return self.removal_policy == "retain"


class MonitoringSettings(_Settings):
    # Addresses subscribed to the environment's alarm topic; each confirms its subscription by email.
    alarm_emails: Annotated[tuple[EmailAddress, ...], BeforeValidator(_list_of(
        0, 100, "a list of email addresses"))] = ()


_GITHUB_REPOSITORY = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}$")
_GITHUB_ENVIRONMENT = re.compile(r"^[A-Za-z0-9._-]{1,255}$")


class ReviewSettings(_Settings):
    """The pull-request diff role (stacks/review_stack.py): which repository's workflow jobs, in which GitHub
    environment, may assume it through GitHub's OIDC provider."""
    # OWNER/REPO; null leaves the role out (synthesis warns), so that a fresh clone still synthesizes.
    github_repository: Text(_GITHUB_REPOSITORY, "a GitHub repository as OWNER/REPO") | None = None
    # The workflow's job runs in this GitHub environment (prod's has required reviewers); its OIDC token's sub is
    # repo:OWNER/REPO:environment:NAME, the only one the role trusts.
    github_environment: Text(_GITHUB_ENVIRONMENT, "a GitHub environment name")
    # The account's IAM OIDC provider for token.actions.githubusercontent.com: created by this stack, or (false) one
    # that exists already (an account has at most one per URL). Unset: created by the first environment of cdk.json
    # located in this account that leaves it unset, where none sets it true (load_environment decides; it refuses
    # two environments of one account that both set it true).
    create_oidc_provider: _checked(_boolean_or_unset, bool | None) = None
    # The existing provider's ARN where create_oidc_provider is false; null: the account's provider for GitHub's URL
    # (arn:<partition>:iam::<account>:oidc-provider/token.actions.githubusercontent.com).
    oidc_provider_arn: Text(_OIDC_PROVIDER_ARN, "the ARN of an IAM OIDC provider for "
                            "token.actions.githubusercontent.com (arn:aws:iam::<account>:oidc-provider/"
                            "token.actions.githubusercontent.com)") | None = None

    @model_validator(mode="after")
    def _provider_created_or_named(self):
        if self.create_oidc_provider and self.oidc_provider_arn is not None:
            raise _field_problems(type(self).__name__, [(("oidc_provider_arn",), "names an existing provider, but "
                                  "{key:create_oidc_provider} is true (this stack would create a second one for the "
                                  "same URL): set it to false", self.oidc_provider_arn)])
        return self


class BootstrapSettings(_Settings):
    """What `cdk bootstrap` set up that the stacks must know: the key of its asset bucket, where it is a customer
    managed key (`cdk bootstrap --bootstrap-kms-key-id` or `--bootstrap-customer-key`); null: S3-managed (the
    default), for which reading the CodeBuild source assets needs no KMS rights."""
    kms_key_arn: Text(_KMS_KEY_ARN, "a KMS key ARN (arn:aws:kms:<region>:<account>:key/<key id>)") | None = None


def execution_role_name(name_prefix: str, kind: str) -> str:
    """The fixed name of an environment's endpoint execution role: what its endpoint stack names the role, its
    operator policy passes and its artifact source's repository and bucket policies admit."""
    return f"{name_prefix}-{kind.replace('_', '-')}-execution"


_SUBNET_ID = re.compile(r"^subnet-(?:[0-9a-f]{8}|[0-9a-f]{17})$")
_SECURITY_GROUP_ID = re.compile(r"^sg-(?:[0-9a-f]{8}|[0-9a-f]{17})$")
_VPC_ID = re.compile(r"^vpc-(?:[0-9a-f]{8}|[0-9a-f]{17})$")
_ROUTE_TABLE_ID = re.compile(r"^rtb-(?:[0-9a-f]{8}|[0-9a-f]{17})$")
# The interface endpoints (AWS PrivateLink) that an endpoint in subnets without internet access needs, by the
# service names' last part (com.amazonaws.<region>.<service>): the image pull (ECR's API and registry), the
# container logs and STS; and S3's gateway endpoint (the model archive, the image's layers, Batch Transform).
INTERFACE_ENDPOINT_SERVICES = ("ecr.api", "ecr.dkr", "logs", "sts")


class VpcEndpointSettings(_Settings):
    """``vpc.create_endpoints``: the environment's network stack creates the VPC endpoints its endpoints need, in this
    VPC (the one the subnets are in), the interface endpoints in ``subnet_ids`` and S3's gateway endpoint on these
    route tables (those of the subnets). Absent: the VPC has them already (docs/deploy.md, "VPC")."""
    vpc_id: Text(_VPC_ID, "a VPC id (vpc-<8 or 17 hex>)")
    route_table_ids: Annotated[tuple[Text(_ROUTE_TABLE_ID, "a route table id (rtb-<8 or 17 hex>)"), ...],
                               BeforeValidator(_list_of(1, 255, "a list of the subnets' route table ids"))]

    @model_validator(mode="after")
    def _once_each(self):
        problems = _repeats("route_table_ids", self.route_table_ids,
                            lambda table, first: f"{table!r} is already route table {first + 1}")
        if problems:
            raise _field_problems(type(self).__name__, problems)
        return self
# SageMaker's VpcConfig: 1 to 16 subnets, 1 to 5 security groups.
MAX_SUBNETS, MAX_SECURITY_GROUPS = 16, 5
# Fewer subnets than this are allowed, with a synth warning: SageMaker spreads an endpoint's instances over the
# subnets' Availability Zones, so one subnet puts them all in one zone (docs/deploy.md, "VPC").
RECOMMENDED_SUBNETS = 2


class VpcSettings(_Settings):
    """``vpc``: the subnets and security groups every Model of the environment runs in (its VpcConfig), for an
    account whose endpoints must not leave its own network. The execution roles get what SageMaker's elastic network
    interfaces need in exactly these subnets (stacks/endpoint_stack.py). The VPC endpoints a subnet without internet
    access needs (S3, ECR, CloudWatch Logs, STS) are the VPC's own, or, with ``create_endpoints``, the environment's
    network stack creates them (stacks/network_stack.py; docs/deploy.md, "VPC")."""
    subnet_ids: Annotated[tuple[Text(_SUBNET_ID, "a subnet id (subnet-<8 or 17 hex>)"), ...], BeforeValidator(
        _list_of(1, MAX_SUBNETS, f"a list of 1 to {MAX_SUBNETS} subnet ids ({RECOMMENDED_SUBNETS} or more, in "
                 f"different Availability Zones, recommended)"))]
    # Required with subnet_ids; the default only lets its absence be reported in words of its own (below).
    security_group_ids: Annotated[tuple[Text(_SECURITY_GROUP_ID, "a security group id (sg-<8 or 17 hex>)"), ...],
                                  BeforeValidator(_list_of(0, MAX_SECURITY_GROUPS,
                                                           f"a list of 1 to {MAX_SECURITY_GROUPS} security group "
                                                           f"ids"))] = ()
    create_endpoints: VpcEndpointSettings | None = None

    @model_validator(mode="after")
    def _placed_whole(self):
        problems = _repeats("subnet_ids", self.subnet_ids, lambda subnet, first: f"{subnet!r} is already subnet "
                                                                               f"{first + 1}")
        problems += _repeats("security_group_ids", self.security_group_ids,
                             lambda group, first: f"{group!r} is already security group {first + 1}")
        if not self.security_group_ids:
            problems.append((("security_group_ids",), f"is required with {{key:subnet_ids}}: SageMaker attaches 1 "
                             f"to {MAX_SECURITY_GROUPS} security groups to the network interfaces it creates in "
                             f"those subnets (their rules must allow HTTPS to the VPC endpoints of S3, ECR, "
                             f"CloudWatch Logs and STS; docs/deploy.md, VPC)", None))
        if problems:
            raise _field_problems(type(self).__name__, problems)
        return self


class ArtifactSource(_Settings):
    """The environment named by ``artifacts_from``, as far as its consumer needs it (read by load_environment)."""
    name: str
    # Its account and region as cdk.json names them; None where it leaves them to the caller's credentials, which
    # need not be those it was deployed with, so nothing is compared with them.
    account: str | None
    region: str | None
    model_pin: str               # its build.model_pin: what an unpinned consumer's endpoints are sized for
    name_prefix: str = ""        # whose operator policy (<prefix>-operator) reads its artifacts and reports


class ArtifactConsumer(_Settings):
    """An environment whose ``artifacts_from`` names this one: its endpoints pull this environment's images and
    read its model archive, so this environment's repository and bucket policies name its execution roles."""
    name: str
    account: str | None          # its cdk.json account, else this environment's; None: this stack's own account
    region: str | None
    name_prefix: str
    endpoint_kinds: tuple[str, ...]

    def execution_role_name(self, kind: str) -> str:
        return execution_role_name(self.name_prefix, kind)

    @property
    def execution_role_names(self) -> tuple[str, ...]:
        return tuple(self.execution_role_name(kind) for kind in self.endpoint_kinds)


def _environment_name(value: Any, info: ValidationInfo) -> str:
    """artifacts_from: another environment of cdk.json, which builds its own artifacts."""
    environments, me = info.context["environments"], info.context["name"]
    names = ", ".join(sorted(name for name in environments if name != me)) or "none"
    if not isinstance(value, str) or value not in environments:
        raise _problem(f"{value!r} is not an environment in cdk.json (one of: {names})")
    if value == me:
        raise _problem(f"names this environment itself: name the environment whose builds it deploys "
                       f"(one of: {names})")
    source = environments[value]
    chained = _get(source, "artifacts_from")
    if chained is not None:
        raise _problem(f"{value!r} takes its artifacts from {chained!r} itself; name the environment that builds "
                       f"them ({chained!r}): an environment promotes from the one that built, with no chains")
    if not isinstance(source, Mapping) or "build" not in source:
        raise _problem(f"{value!r} has no build section, so it builds nothing to take")
    return value


class EnvironmentConfig(_Settings):
    """``environments.<name>``; ``name`` is the chosen environment, account and region default to the CLI's."""
    name: str
    account: AccountId | None = None
    region: RegionName | None = None
    name_prefix: NamePrefix
    endpoints: Annotated[tuple[_checked(_endpoint_kind, str), ...], BeforeValidator(_list_of(
        0, 1000, f"a list of endpoint kinds ({', '.join(ENDPOINT_KINDS)})"))]
    cpu: CpuEndpointSettings
    gpu: GpuEndpointSettings
    text_generation: TextGenerationEndpointSettings
    # `async` is a Python keyword: the field is async_, cdk.json's key "async". Absent: no async endpoint can be
    # listed (endpoint_settings refuses it).
    async_: AsyncEndpointSettings | None = Field(default=None, alias="async")
    pins: Pins
    # Another environment of cdk.json whose images and model archive this one deploys (build once, promote by
    # digest); null: this environment builds its own (build). Exactly one of the two is set.
    artifacts_from: _checked(_environment_name, str) | None = None
    build: BuildSettings | None = None
    artifacts: ArtifactSettings
    endpoint_log_retention_days: _checked(_log_retention, int)
    monitoring: MonitoringSettings = MonitoringSettings()
    review: ReviewSettings
    bootstrap: BootstrapSettings = BootstrapSettings()
    # null: the endpoints run in SageMaker's own network (the default); else the subnets and security groups of
    # every Model (VpcConfig).
    vpc: VpcSettings | None = None
    # SageMaker's one log group for every transform job of the account and region, /aws/sagemaker/TransformJobs:
    # created (with retention and the logs key) by this environment's artifacts stack, or (false) left to another
    # environment of the same account and region. Unset: as create_oidc_provider, per account and region.
    create_transform_log_group: _checked(_boolean_or_unset, bool | None) = None
    # CloudFormation termination protection on every stack of the environment (cdk destroy refuses them).
    termination_protection: _checked(_boolean, bool) = False
    # Read by load_environment from the other environments (cdk.json may not set them): the environment named by
    # artifacts_from, and every environment whose artifacts_from names this one.
    artifact_source: ArtifactSource | None = None
    artifact_consumers: tuple[ArtifactConsumer, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _from_context(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, Mapping):
            return data
        supplied = [key for key in sorted(_FROM_CONTEXT) if key in data]
        if supplied:
            raise _field_problems(cls.__name__, [((key,), "unknown key", data[key]) for key in supplied])
        context = info.context
        required = _required_location(data)
        return {**data, "name": context["name"],
                "account": data.get("account") or required.get("account") or context["default_account"],
                "region": data.get("region") or required.get("region") or context["default_region"]}

    @model_validator(mode="after")
    def _cross_field_checks(self):
        problems = _repeats("endpoints", self.endpoints, lambda kind, first: f"{kind!r} is listed twice")
        problems += [(("endpoints", index), f"{kind!r} is listed, but this environment has no {kind!r} settings "
                      f"(instance type, prefixes, scaling: docs/deploy.md, Asynchronous inference and dev at zero)",
                      kind) for index, kind in enumerate(self.endpoints) if kind == "async" and self.async_ is None]
        problems += self._artifact_problems()
        for kind in IMAGE_KINDS:
            pin = getattr(self.pins.images, kind)
            if pin is not None and pin.repository is not None and self.region is not None \
                    and pin.repository.region != self.region:
                # SageMaker pulls an endpoint's or a transform job's image from ECR in its own region only.
                problems.append((("pins", "images", kind), f"{pin.repository.uri}@{pin.digest} is in "
                                 f"{pin.repository.region}, but this environment deploys to {self.region}: SageMaker "
                                 f"pulls images only from ECR in the endpoint's region (copy the image into "
                                 f"{self.region}, e.g. with the text-generation mirror build, and pin that)",
                                 f"{pin.repository.uri}@{pin.digest}"))
        review = self.review
        if review.oidc_provider_arn is not None and self.account is not None:
            provider_account = _OIDC_PROVIDER_ARN.match(review.oidc_provider_arn)["account"]
            if provider_account != self.account:
                problems.append((("review", "oidc_provider_arn"), f"{review.oidc_provider_arn!r} is in account "
                                 f"{provider_account}, not this environment's {self.account}: a role trusts only its "
                                 f"own account's OIDC providers", review.oidc_provider_arn))
        key_arn = self.bootstrap.kms_key_arn
        if key_arn is not None:
            key = _KMS_KEY_ARN.match(key_arn)
            for field in ("account", "region"):
                mine = getattr(self, field)
                if mine is not None and key[field] != mine:
                    problems.append((("bootstrap", "kms_key_arn"), f"{key_arn!r} is in {field} {key[field]}, not "
                                     f"this environment's {mine}: it must be the key of the bootstrap this "
                                     f"environment deploys with", key_arn))
        if problems:
            raise _field_problems(type(self).__name__, problems)
        return self

    def _artifact_problems(self) -> list:
        """Build here, or deploy another environment's builds (artifacts_from) by their full references."""
        if self.artifacts_from is None:
            return self._acceptance_problems() + ([] if self.build is not None else [(
                ("build",), f"is required unless {self.key('artifacts_from')} names the environment whose builds "
                f"this one deploys", None)])
        source, source_key = self.artifacts_from, self.key("artifacts_from")
        problems = []
        if self.build is not None:
            problems.append((("build",), f"is set, but {source_key} is {source!r}: an environment either "
                             f"builds its artifacts (build) or deploys {source}'s (artifacts_from), not both; remove "
                             f"one of the two keys", None))
        how = f"pin {source}'s artifacts as `python -m endpoint_client promote --from {source} --to {self.name}` " \
              f"writes them"
        for kind in IMAGE_KINDS:
            pin = getattr(self.pins.images, kind)
            if pin is not None and pin.repository is None:
                problems.append((("pins", "images", kind), f"{pin.digest} names no repository, but this environment "
                                 f"has no repository of its own to pull from ({source_key} is {source!r}): "
                                 f"{how}, '<account>.dkr.ecr.<region>.amazonaws.com/<{source}'s repository>"
                                 f"@sha256:<64 hex>'", pin.digest))
        if self.pins.model is not None and self.pins.model.bucket is None:
            problems.append((("pins", "model", "bucket"), f"is required because {source_key} is "
                             f"{source!r} (this environment builds no model archive): {how}, {source}'s artifact "
                             f"bucket beside s3_key", None))
        problems += self._acceptance_problems()
        return problems

    def _acceptance_problems(self) -> list:
        """Pins taken from another environment come with the acceptance report they were promoted on."""
        if self.artifacts_from is None:
            return [] if self.pins.acceptance is None else [(("pins", "acceptance"), "is set, but this environment "
                                                            "builds its own artifacts: only pins promoted from "
                                                            "another environment (artifacts_from) have one", None)]
        if self.pins.pinned and self.pins.acceptance is None:
            return [(("pins", "acceptance"), f"is required because these pins name {self.artifacts_from}'s "
                     f"artifacts: `python -m endpoint_client promote --from {self.artifacts_from} --to {self.name}` "
                     f"writes the pins with the acceptance report (its S3 version and sha256) that accepted them, "
                     f"which preflight and promote --verify check again before a deploy", None)]
        return []

    @property
    def model_pin_name(self) -> str:
        """The model_build/pins.json pin this environment's endpoints are sized for until its model is pinned:
        its build's, or its artifact source's."""
        return self.build.model_pin if self.build is not None else self.artifact_source.model_pin

    @property
    def retain_logs(self) -> bool:
        """True: log groups (and the key that encrypts them) survive cdk destroy; follows artifacts.removal_policy,
        so an environment whose artifacts are retained (prod) keeps its logs too."""
        return self.artifacts.retain

    def endpoint_settings(self, kind: str) -> EndpointSettings:
        """An endpoint kind's cdk.json settings (the async kind's key is "async", its field async_)."""
        return getattr(self, FIELD_OF_KIND.get(kind, kind))

    def key(self, *parts: str) -> str:
        """The cdk.json key path of a setting of this environment, for messages."""
        return ".".join(("environments", self.name) + parts)

    def endpoint_name(self, kind: str) -> str:
        return f"{self.name_prefix}-{kind.replace('_', '-')}"

    def endpoint_stack_name(self, kind: str) -> str:
        return f"{self.name_prefix}-endpoint-{kind.replace('_', '-')}"

    def execution_role_name(self, kind: str) -> str:
        return execution_role_name(self.name_prefix, kind)

    @property
    def review_stack_name(self) -> str:
        return f"{self.name_prefix}-review"

    @property
    def artifacts_stack_name(self) -> str:
        return f"{self.name_prefix}-artifacts"


def _required_location(data: Mapping[str, Any]) -> dict[str, _LocationRequired]:
    """An environment whose stacks refuse deletion, or leave resources behind, is deployed to the account and
    region cdk.json names, never to wherever the caller's credentials and region happen to point: for each of the
    two that cdk.json leaves out, the reason to report at its key."""
    artifacts = data.get("artifacts")
    retained = isinstance(artifacts, Mapping) and artifacts.get("removal_policy") == "retain"
    protected = data.get("termination_protection") is True
    if not (retained or protected):
        return {}
    why = " and ".join(([] if not protected else ["termination_protection is true"]) +
                       ([] if not retained else ["artifacts.removal_policy is retain"]))
    return {key: _LocationRequired(f"is required because {why}: this environment deploys only to the {key} named "
                                   f"here, not to the caller's (set {example})")
            for key, example in (("account", "the 12-digit account id"), ("region", 'e.g. "eu-west-1"'))
            if not data.get(key)}


# The keys load_environment supplies itself; cdk.json may not set them.
_FROM_CONTEXT = {"name", "artifact_source", "artifact_consumers"}


def load_environment(environments: Any, env_name: Any, *, model_pins: Sequence[str],
                     default_account: str | None = None, default_region: str | None = None) -> EnvironmentConfig:
    """Parse ``environments[env_name]``; raise ConfigError listing every problem by key path.

    ``model_pins`` are the pin names model_build/pins.json defines; ``default_account``/``default_region`` are
    the CDK CLI's (CDK_DEFAULT_ACCOUNT/REGION), used where the environment leaves account/region null.
    """
    if not isinstance(environments, Mapping) or not environments:
        raise ConfigError([f"environments: cdk.json context must map environment names to their settings, got "
                           f"{_describe(environments)}"])
    names = ", ".join(sorted(environments))
    if env_name is None:
        raise ConfigError([f"env: choose an environment with -c env=NAME (one of: {names})"])
    if env_name not in environments:
        raise ConfigError([f"env: {env_name!r} is not an environment in cdk.json (one of: {names})"])
    root = f"environments.{env_name}"
    shared, creates = _shared_resources(environments, env_name, default_account, default_region)
    try:
        config = EnvironmentConfig.model_validate(environments[env_name], context={
            "name": str(env_name), "model_pins": tuple(model_pins), "default_account": default_account,
            "default_region": default_region, "environments": environments})
    except ValidationError as error:
        raise ConfigError([_message(root, problem) for problem in error.errors()] + shared) from None
    source, source_problems = _artifact_source(environments, config)
    consumers, consumer_problems = _artifact_consumers(environments, config)
    problems = shared + source_problems + consumer_problems + _vpc_endpoint_problems(environments, config)
    if problems:
        raise ConfigError(problems)
    # Every setting below reads a decided true or false.
    return config.model_copy(update={
        "review": config.review.model_copy(update={"create_oidc_provider": creates["review.create_oidc_provider"]}),
        "create_transform_log_group": creates["create_transform_log_group"], "artifact_source": source,
        "artifact_consumers": consumers})


def _named(environments: Mapping[str, Any], name: str, key: str) -> str | None:
    """An environment's account or region as cdk.json names it; None where it leaves it to the caller's."""
    value = _get(environments[name], key)
    return value if isinstance(value, str) and value else None


def _artifact_source(environments: Mapping[str, Any],
                     config: EnvironmentConfig) -> tuple[ArtifactSource | None, list[str]]:
    """The environment that artifacts_from names (already checked to build), and the problems of the pair: it must
    deploy to the same region, and image pins must name its account (where cdk.json names them)."""
    if config.artifacts_from is None:
        return None, []
    name = config.artifacts_from
    source = ArtifactSource(
        name=name, account=_named(environments, name, "account"), region=_named(environments, name, "region"),
        model_pin=str(_get(environments[name], "build", "model_pin")),
        name_prefix=str(_get(environments[name], "name_prefix", default="")))
    problems = []
    if config.pins.pinned and not _retains(environments[name]):
        problems.append(_destroyable(name, config.name))
    if source.region is not None and config.region is not None and source.region != config.region:
        # SageMaker pulls an image from ECR in the endpoint's region only. A model archive could be read across
        # regions, but one source region for both keeps the pull simple (and free of inter-region transfer).
        problems.append(f"{config.key('artifacts_from')}: {name!r} deploys to {source.region}, this environment to "
                        f"{config.region}: SageMaker pulls images only from ECR in the endpoint's own region, so an "
                        f"environment takes its artifacts from one in the same region (build there, or replicate "
                        f"the repository and pin the copies)")
    for kind in IMAGE_KINDS:
        pin = getattr(config.pins.images, kind)
        if pin is not None and pin.repository is not None and source.account is not None \
                and pin.repository.account != source.account:
            problems.append(f"{config.key('pins', 'images', kind)}: {pin.repository.uri}@{pin.digest} is in account "
                            f"{pin.repository.account}, but artifacts_from {name!r} builds in account "
                            f"{source.account}: only its repository allows this environment's pull")
    return source, problems


def _artifact_consumers(environments: Mapping[str, Any],
                        config: EnvironmentConfig) -> tuple[tuple[ArtifactConsumer, ...], list[str]]:
    """Every environment whose artifacts_from names this one, with what this environment's repository and bucket
    policies name of it; its settings that those need are checked here, since a wrong one would grant a pull to the
    wrong roles."""
    consumers, problems = [], []
    for name, data in environments.items():
        if name == config.name or not isinstance(data, Mapping) or data.get("artifacts_from") != config.name:
            continue
        found = {}
        for key, pattern, what in (("name_prefix", _NAME_PREFIX, "a name prefix"),
                                   ("account", _ACCOUNT, "a 12-digit AWS account id"),
                                   ("region", _REGION, "an AWS region name")):
            value = data.get(key)
            if value is not None and not (isinstance(value, str) and pattern.match(value)):
                problems.append(f"environments.{name}.{key}: {value!r} is not {what} (its artifacts_from names "
                                f"{config.name}, whose policies name its execution roles)")
            found[key] = value
        kinds = data.get("endpoints")
        if not isinstance(kinds, list) or not all(kind in ENDPOINT_KINDS for kind in kinds):
            problems.append(f"environments.{name}.endpoints: expected a list of endpoint kinds "
                            f"({', '.join(ENDPOINT_KINDS)}), got {_describe(kinds)} (its artifacts_from names "
                            f"{config.name}, whose policies name its execution roles)")
            kinds = []
        if found["name_prefix"] is None:
            problems.append(f"environments.{name}.name_prefix: is required (its artifacts_from names {config.name})")
        if _pins_something(data) and not config.artifacts.retain:
            problems.append(_destroyable(config.name, name))
        if problems:
            continue
        consumers.append(ArtifactConsumer(
            name=name, account=found["account"] or config.account, region=found["region"] or config.region,
            name_prefix=found["name_prefix"], endpoint_kinds=tuple(dict.fromkeys(kinds))))
    return tuple(consumers), problems


def _vpc_endpoint_problems(environments: Mapping[str, Any], config: EnvironmentConfig) -> list[str]:
    """Two environments that both create the VPC endpoints of one VPC collide: private DNS allows one interface
    endpoint per service and VPC, so the second network stack fails to deploy."""
    if config.vpc is None or config.vpc.create_endpoints is None:
        return []
    vpc_id = config.vpc.create_endpoints.vpc_id
    others = [name for name, data in environments.items()
              if name != config.name and _get(data, "vpc", "create_endpoints", "vpc_id") == vpc_id]
    if not others:
        return []
    also = ", ".join(f"environments.{name}.vpc.create_endpoints" for name in others)
    return [f"{config.key('vpc', 'create_endpoints', 'vpc_id')}: {vpc_id} is also {also}'s VPC: a VPC has one "
            f"interface endpoint per service with private DNS, so one environment creates them and the others use "
            f"them (remove create_endpoints from every environment of that VPC but one)"]


def _retains(data: Any) -> bool:
    return _get(data, "artifacts", "removal_policy") == "retain"


def _pins_something(data: Any) -> bool:
    """Whether an environment's cdk.json pins name any image or model (raw: before validation)."""
    pins = _get(data, "pins", default={})
    images = _get(pins, "images", default={})
    return _get(pins, "model") is not None or (isinstance(images, Mapping) and
                                               any(value is not None for value in images.values()))


def _destroyable(source: str, consumer: str) -> str:
    """The problem of a source whose artifacts a consumer pins while `cdk destroy` of the source would delete them
    (the repository's lifecycle is not one: its first rule never expires an image tagged pinned-<digest>, and
    promote tags what it promotes)."""
    return (f"environments.{source}.artifacts.removal_policy: is not 'retain', but environments.{consumer}.pins "
            f"name {source}'s images and model archive (its artifacts_from is {source!r}): `cdk destroy -c "
            f"env={source}` would delete them from under {consumer} (a scale-out, an instance replacement or a "
            f"rollback could no longer pull). Set it to 'retain' (with {source}'s account and region) and deploy "
            f"{source}'s artifacts stack before promoting")


def _get(data: Any, *keys: str, default: Any = None) -> Any:
    for key in keys:
        if not isinstance(data, Mapping) or key not in data:
            return default
        data = data[key]
    return data


def _shared_resources(environments: Mapping[str, Any], env_name: str, default_account: str | None,
                      default_region: str | None) -> tuple[list[str], dict[str, bool]]:
    """Resources an account (and region) has at most one of, which an environment may create: GitHub's OIDC provider
    (one per account and URL) and SageMaker's transform log group (one per account and region). Whether the chosen
    environment creates each, and the problems: two environments located in the same place that both set it true
    collide (the second deploy fails: "already exists"). Unset, it is created by the first environment of cdk.json
    in that place that leaves it unset, where none there sets it true; so dev and prod in one account need no
    setting. An environment's location is its cdk.json account and region, else the CLI's; where that is unknown
    (offline, no account), an unset one is created."""
    def located(name: str, key: str, default: str | None) -> str | None:
        value = _get(environments[name], key)
        if isinstance(value, str) and value:
            return value
        # An environment that must name its location and does not is refused for that, deploying nowhere.
        return None if key in _required_location(environments[name]) else default

    def where(name: str, with_region: bool) -> tuple | None:
        place = (located(name, "account", default_account),) + (
            (located(name, "region", default_region),) if with_region else ())
        return None if None in place else place

    def has_repository(data: Mapping[str, Any]) -> bool:
        return bool(_get(data, "review", "github_repository"))

    resources = (
        # (key, its path, per region too, may this environment create it at all, may it when unset, advice)
        ("review.create_oidc_provider", ("review", "create_oidc_provider"), False, has_repository,
         lambda data: has_repository(data) and _get(data, "review", "oidc_provider_arn") is None,
         "an account has one IAM OIDC provider for token.actions.githubusercontent.com: set it to false in every "
         "environment of the account but one (their review roles then trust that provider; review.oidc_provider_arn "
         "names it if it is not the account's default ARN), or leave it unset everywhere (the first environment of "
         "the account creates it)"),
        ("create_transform_log_group", ("create_transform_log_group",), True, lambda data: True, lambda data: True,
         "an account and region have one /aws/sagemaker/TransformJobs log group: set it to false in every "
         "environment of that account and region but one, or leave it unset everywhere (the first environment of "
         "the account and region creates it)"),
    )
    def choice(name: str, path: tuple[str, ...], can: Callable[..., bool], unset_can: Callable[..., bool]) -> bool | None:
        """True, False, or None: unset where it may create."""
        data = environments[name]
        if not isinstance(data, Mapping) or not can(data):
            return False
        value = _get(data, *path)
        if value is None:
            return None if unset_can(data) else False
        return value is True

    problems, creates = [], {}
    for key, path, with_region, can, unset_can, advice in resources:
        mine, here = choice(env_name, path, can, unset_can), where(env_name, with_region)
        if here is None:
            creates[key] = mine is not False
            continue
        peers = [name for name in environments if isinstance(environments[name], Mapping)
                 and where(name, with_region) == here]  # in cdk.json's order
        choices = {name: choice(name, path, can, unset_can) for name in peers}
        set_true = [name for name in peers if choices[name] is True]
        others = [name for name in set_true if name != env_name]
        if mine is True and others:
            place = " ".join(f"{what} {value}" for what, value in zip(("account", "region"), here))
            also = ", ".join(f"environments.{name}.{key}" for name in others)
            problems.append(f"environments.{env_name}.{key}: is true here and in {also}, in the same {place}; "
                            f"{advice}")
        unset = [name for name in peers if choices[name] is None]
        creates[key] = mine if mine is not None else not set_true and unset[0] == env_name
    return problems, creates


def _path(root: str, loc: Sequence[str | int]) -> str:
    """Dotted key path; list indexes and map keys that hold dots (instance types) in brackets."""
    return root + "".join(f"[{part}]" if isinstance(part, int) else f"[{part!r}]" if "." in part else f".{part}"
                          for part in loc)


def _message(root: str, problem: Mapping[str, Any]) -> str:
    loc, kind = problem["loc"], problem["type"]
    if kind == "missing":
        text = "is required"
    elif kind in ("extra_forbidden", "unknown key") or problem["msg"] == "unknown key":
        model = _model_at(EnvironmentConfig, loc[:-1])
        # A model's own keys first, then those it shares with its siblings (EndpointSettings).
        names = [*model.__annotations__, *model.model_fields]
        expected = [model.model_fields[name].alias or name for name in dict.fromkeys(names)
                    if name in model.model_fields and name not in _FROM_CONTEXT]
        text = f"unknown key (expected one of: {', '.join(expected)})"
    elif kind in ("model_type", "dict_type", "model_attributes_type"):
        text = f"expected an object, got {_describe(problem['input'])}"
    else:
        # Cross-field messages name a sibling key as {key:NAME}: the report gives its full path.
        text = re.sub(r"\{key:(\w+)\}", lambda m: _path(root, (*loc[:-1], m[1])), problem["msg"])
    return f"{_path(root, loc)}: {text}"


def _model_at(model: type[BaseModel], loc: Sequence[str | int]) -> type[BaseModel]:
    """The model class that validates the object at loc (list indexes pass through to the item type)."""
    for part in loc:
        if isinstance(part, str):
            model = _model_in(model.model_fields[FIELD_OF_KIND.get(part, part)].annotation)
    return model


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in get_args(annotation):
        found = _model_in(argument)
        if found is not None:
            return found
    return None
