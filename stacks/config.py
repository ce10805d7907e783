"""The deployment configuration: cdk.json's named environments, parsed and validated once into frozen dataclasses.

``app.py`` is the only reader of CDK context (``-c env=NAME``); it calls :func:`load_environment` and hands
the result to the stacks, which never read context or ``os.environ`` themselves. Every problem in the chosen
environment is reported at once, each under its key path, e.g.
``environments.prod.gpu.instance_pools[2]: 'ml.p3.2xlarge' has an NVIDIA V100 (sm_70) ...``. Unknown keys
are errors, so a typo never passes silently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from stacks import instance_types

# Where the model packaging writes (model_build/buildspec.yml OUTPUT_PREFIX) and what the key must look like:
# models/<pin>/<gguf sha256>/model.tar.gz (model_build/README.md, "Outputs").
MODEL_PREFIX = "models/"
# Where the image builds record pushed digests (container/buildspec.yml DIGEST_PREFIX).
IMAGE_DIGEST_PREFIX = "image-digests/"

ENDPOINT_KINDS = ("cpu", "gpu", "text_generation")
GPU_INFERENCE_AMI_VERSIONS = (
    "al2-ami-sagemaker-inference-gpu-2",
    "al2-ami-sagemaker-inference-gpu-2-1",
    "al2-ami-sagemaker-inference-gpu-3-1",
    "al2023-ami-sagemaker-inference-gpu-4-1",
)
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
_ACCOUNT = re.compile(r"^[0-9]{12}$")
_REGION = re.compile(r"^[a-z]{2}(?:-[a-z]+)+-[0-9]$")


class ConfigError(ValueError):
    """The configuration has one or more invalid values; each line of the message names its key path."""

    def __init__(self, problems: Sequence[str]):
        self.problems = tuple(problems)
        super().__init__("invalid cdk.json configuration:\n  " + "\n  ".join(self.problems))


@dataclass(frozen=True)
class Scaling:
    """Instance counts and the target-tracking policy (SageMakerVariantInvocationsPerInstance)."""
    initial_instance_count: int
    max_instance_count: int
    target_invocations_per_instance: int
    scale_in_cooldown_s: int
    scale_out_cooldown_s: int


@dataclass(frozen=True)
class ContainerTimeouts:
    startup_health_check_s: int
    model_download_s: int


@dataclass(frozen=True)
class CpuEndpointSettings:
    instance_type: str
    threads: int
    scaling: Scaling
    timeouts: ContainerTimeouts


@dataclass(frozen=True)
class GpuEndpointSettings:
    instance_pools: tuple[str, ...]      # in priority order: the first gets Priority 1
    provision_timeout_s: int
    inference_ami_version: str
    scaling: Scaling
    timeouts: ContainerTimeouts


@dataclass(frozen=True)
class TextGenerationEndpointSettings:
    instance_type: str
    threads: int
    ctx_size: int
    parallel: int
    scaling: Scaling
    timeouts: ContainerTimeouts


@dataclass(frozen=True)
class ImagePin:
    """An image pinned by digest: in the project's ECR repository (``repository`` None) or a private ECR URI."""
    digest: str
    repository: "EcrRepositoryRef | None" = None


@dataclass(frozen=True)
class EcrRepositoryRef:
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


@dataclass(frozen=True)
class ModelPin:
    s3_key: str
    gguf_sha256: str


@dataclass(frozen=True)
class Pins:
    cpu_image: ImagePin | None
    gpu_image: ImagePin | None
    text_generation_image: ImagePin | None
    model: ModelPin | None


@dataclass(frozen=True)
class BuildSettings:
    model_pin: str                       # a pin name in model_build/pins.json
    text_generation_source_image: str    # what the mirror project copies into the project repository
    log_retention_days: int


@dataclass(frozen=True)
class ArtifactSettings:
    retain: bool                         # True: bucket, access-log bucket and repository survive cdk destroy
    noncurrent_version_expiration_days: int
    access_log_expiration_days: int
    images_kept_per_kind: int


@dataclass(frozen=True)
class EnvironmentConfig:
    name: str
    account: str | None
    region: str | None
    name_prefix: str
    endpoints: tuple[str, ...]
    cpu: CpuEndpointSettings
    gpu: GpuEndpointSettings
    text_generation: TextGenerationEndpointSettings
    pins: Pins
    build: BuildSettings
    artifacts: ArtifactSettings
    endpoint_log_retention_days: int

    def key(self, *parts: str) -> str:
        """The cdk.json key path of a setting of this environment, for messages."""
        return ".".join(("environments", self.name) + parts)

    def missing_pins(self, kind: str) -> tuple[str, ...]:
        """Key paths that must be set before the endpoint of this kind can be created."""
        image = {"cpu": self.pins.cpu_image, "gpu": self.pins.gpu_image,
                 "text_generation": self.pins.text_generation_image}[kind]
        missing = []
        if image is None:
            missing.append(self.key("pins", "images", kind))
        if self.pins.model is None:
            missing.append(self.key("pins", "model"))
        return tuple(missing)


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
    problems: list[str] = []
    config = _parse_environment(str(env_name), environments[env_name], problems, tuple(model_pins),
                                default_account, default_region)
    if problems:
        raise ConfigError(problems)
    return config


# --- parsing ---------------------------------------------------------------------------------------------

class _Invalid(Exception):
    pass


class _Fields:
    """Reads one JSON object: each take() records the key as known; done() reports the unknown ones."""

    def __init__(self, value: Any, path: str, problems: list[str]):
        self.path, self.problems, self.known = path, problems, []
        if not isinstance(value, Mapping):
            problems.append(f"{path}: expected an object, got {_describe(value)}")
            value = {}
        self.values = value

    def take(self, key: str, check: Callable[[Any, str, list[str]], Any], *, nullable: bool = False) -> Any:
        """The checked value of key; a nullable key may also be missing, because CDK context (passed through
        jsii) drops null values, so null and absent cannot be told apart."""
        self.known.append(key)
        path = f"{self.path}.{key}"
        if key not in self.values or (nullable and self.values[key] is None):
            if not nullable:
                self.problems.append(f"{path}: is required")
            return None
        try:
            return check(self.values[key], path, self.problems)
        except _Invalid as error:
            self.problems.append(f"{path}: {error}")
            return None

    def done(self) -> None:
        for key in sorted(set(self.values) - set(self.known)):
            self.problems.append(f"{self.path}.{key}: unknown key (expected one of: {', '.join(self.known)})")


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__) + f" ({value!r})"[:80]


def _integer(low: int, high: int) -> Callable[[Any, str, list[str]], int]:
    def check(value: Any, path: str, problems: list[str]) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Invalid(f"expected an integer from {low} to {high}, got {_describe(value)}")
        if not low <= value <= high:
            raise _Invalid(f"{value} is outside {low}..{high}")
        return value
    return check


def _string(pattern: re.Pattern[str], what: str) -> Callable[[Any, str, list[str]], str]:
    def check(value: Any, path: str, problems: list[str]) -> str:
        if not isinstance(value, str):
            raise _Invalid(f"expected {what}, got {_describe(value)}")
        if not pattern.match(value):
            raise _Invalid(f"{value!r} is not {what}")
        return value
    return check


def _choice(choices: Sequence[Any]) -> Callable[[Any, str, list[str]], Any]:
    def check(value: Any, path: str, problems: list[str]) -> Any:
        if not isinstance(value, str) or value not in choices:
            raise _Invalid(f"{value!r} is not one of {', '.join(map(str, choices))}")
        return value
    return check


def _parse_environment(name: str, value: Any, problems: list[str], model_pins: tuple[str, ...],
                       default_account: str | None, default_region: str | None) -> EnvironmentConfig:
    env = _Fields(value, f"environments.{name}", problems)
    account = env.take("account", _string(_ACCOUNT, "a 12-digit AWS account id"), nullable=True)
    region = env.take("region", _string(_REGION, "an AWS region name such as us-east-1"), nullable=True)
    name_prefix = env.take("name_prefix", _string(
        _NAME_PREFIX, "3 to 24 characters of a-z, 0-9 and '-', starting with a letter (stack names and tags)"))
    endpoints = env.take("endpoints", _endpoint_kinds)
    cpu = env.take("cpu", _cpu_settings)
    gpu = env.take("gpu", _gpu_settings)
    text_generation = env.take("text_generation", _text_generation_settings)
    pins = env.take("pins", _pins)
    build = env.take("build", lambda v, p, probs: _build_settings(v, p, probs, model_pins))
    artifacts = env.take("artifacts", _artifact_settings)
    endpoint_log_retention_days = env.take("endpoint_log_retention_days", _log_retention)
    env.done()
    return EnvironmentConfig(
        name=name, account=account or default_account, region=region or default_region,
        name_prefix=name_prefix, endpoints=endpoints, cpu=cpu, gpu=gpu, text_generation=text_generation,
        pins=pins, build=build, artifacts=artifacts, endpoint_log_retention_days=endpoint_log_retention_days)


def _endpoint_kinds(value: Any, path: str, problems: list[str]) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise _Invalid(f"expected a list of endpoint kinds ({', '.join(ENDPOINT_KINDS)}), got {_describe(value)}")
    kinds = []
    for index, kind in enumerate(value):
        if kind not in ENDPOINT_KINDS:
            problems.append(f"{path}[{index}]: {kind!r} is not one of {', '.join(ENDPOINT_KINDS)}")
        elif kind in kinds:
            problems.append(f"{path}[{index}]: {kind!r} is listed twice")
        else:
            kinds.append(kind)
    return tuple(kinds)


def _log_retention(value: Any, path: str, problems: list[str]) -> int:
    if isinstance(value, bool) or value not in LOG_RETENTION_DAYS:
        raise _Invalid(f"{value!r} is not a CloudWatch Logs retention ({', '.join(map(str, LOG_RETENTION_DAYS))})")
    return value


def _x86_cpu_instance(image: str) -> Callable[[Any, str, list[str]], str]:
    def check(value: Any, path: str, problems: list[str]) -> str:
        value = _string(instance_types.INSTANCE_TYPE, "an ML instance type such as ml.c7i.xlarge")(value, path, problems)
        if instance_types.is_accelerated(value):
            raise _Invalid(f"{value!r} is an accelerated instance; {image} runs on the CPU only")
        if instance_types.is_graviton(value):
            raise _Invalid(f"{value!r} is a Graviton (arm64) instance; {image} is built for x86-64")
        return value
    return check


def _threads_within(instance_type: str | None, threads: int | None, path: str, problems: list[str]) -> None:
    if instance_type is None or threads is None:
        return
    available = instance_types.vcpus(instance_type)
    if threads > available:
        problems.append(f"{path}: {threads} threads exceed the {available} vCPUs of {instance_type}")


def _scaling(fields: _Fields) -> Scaling:
    initial = fields.take("initial_instance_count", _integer(1, 100))
    maximum = fields.take("max_instance_count", _integer(1, 100))
    if initial is not None and maximum is not None and initial > maximum:
        fields.problems.append(f"{fields.path}.initial_instance_count: {initial} is above "
                               f"max_instance_count ({maximum})")
    return Scaling(
        initial_instance_count=initial, max_instance_count=maximum,
        target_invocations_per_instance=fields.take("target_invocations_per_instance", _integer(1, 100_000)),
        scale_in_cooldown_s=fields.take("scale_in_cooldown_s", _integer(0, 3600)),
        scale_out_cooldown_s=fields.take("scale_out_cooldown_s", _integer(0, 3600)))


def _timeouts(fields: _Fields) -> ContainerTimeouts:
    # ProductionVariant ContainerStartupHealthCheckTimeoutInSeconds / ModelDataDownloadTimeoutInSeconds: 60..3600.
    return ContainerTimeouts(
        startup_health_check_s=fields.take("startup_health_check_timeout_s", _integer(60, 3600)),
        model_download_s=fields.take("model_download_timeout_s", _integer(60, 3600)))


def _cpu_settings(value: Any, path: str, problems: list[str]) -> CpuEndpointSettings:
    fields = _Fields(value, path, problems)
    instance_type = fields.take("instance_type", _x86_cpu_instance("the CPU adapter image"))
    threads = fields.take("threads", _integer(1, 192))
    _threads_within(instance_type, threads, f"{path}.threads", problems)
    settings = CpuEndpointSettings(instance_type=instance_type, threads=threads, scaling=_scaling(fields),
                                   timeouts=_timeouts(fields))
    fields.done()
    return settings


def _gpu_pool(value: Any, path: str, problems: list[str]) -> str:
    value = _string(instance_types.INSTANCE_TYPE, "an ML instance type such as ml.g6.xlarge")(value, path, problems)
    gpu = instance_types.nvidia_gpu(value)
    if gpu is None:
        supported = sorted(f for f, (_, sm) in instance_types.NVIDIA_FAMILIES.items()
                           if sm in instance_types.GPU_IMAGE_CUDA_ARCHITECTURES)
        raise _Invalid(f"{value!r} is not an NVIDIA GPU instance family (supported: {', '.join(supported)})")
    gpu_name, compute_capability = gpu
    if compute_capability not in instance_types.GPU_IMAGE_CUDA_ARCHITECTURES:
        built = ";".join(map(str, instance_types.GPU_IMAGE_CUDA_ARCHITECTURES))
        raise _Invalid(f"{value!r} has an NVIDIA {gpu_name} (sm_{compute_capability}), which the GPU image is not "
                       f"compiled for (container/Dockerfile.gpu CUDA_ARCHITECTURES={built})")
    return value


def _gpu_pools(value: Any, path: str, problems: list[str]) -> tuple[str, ...]:
    # ProductionVariant.InstancePools: 1 to 5 pools, priorities 1..5 (here: their order).
    if not isinstance(value, list) or not 1 <= len(value) <= 5:
        raise _Invalid(f"expected a list of 1 to 5 instance types in priority order, got {_describe(value)}")
    pools: list[str] = []
    for index, item in enumerate(value):
        item_path = f"{path}[{index}]"
        try:
            pool = _gpu_pool(item, item_path, problems)
        except _Invalid as error:
            problems.append(f"{item_path}: {error}")
            continue
        if pool in pools:
            problems.append(f"{item_path}: {pool!r} is already pool {pools.index(pool) + 1}")
        pools.append(pool)
    return tuple(pools)


def _gpu_settings(value: Any, path: str, problems: list[str]) -> GpuEndpointSettings:
    fields = _Fields(value, path, problems)
    settings = GpuEndpointSettings(
        instance_pools=fields.take("instance_pools", _gpu_pools),
        # ProductionVariant.VariantInstanceProvisionTimeoutInSeconds: 300..3600.
        provision_timeout_s=fields.take("provision_timeout_s", _integer(300, 3600)),
        inference_ami_version=fields.take("inference_ami_version", _choice(GPU_INFERENCE_AMI_VERSIONS)),
        scaling=_scaling(fields), timeouts=_timeouts(fields))
    fields.done()
    return settings


def _text_generation_settings(value: Any, path: str, problems: list[str]) -> TextGenerationEndpointSettings:
    fields = _Fields(value, path, problems)
    instance_type = fields.take("instance_type", _x86_cpu_instance("the llama.cpp DLC CPU image"))
    threads = fields.take("threads", _integer(1, 192))
    _threads_within(instance_type, threads, f"{path}.threads", problems)
    settings = TextGenerationEndpointSettings(
        instance_type=instance_type, threads=threads,
        ctx_size=fields.take("ctx_size", _integer(512, 1_048_576)),
        parallel=fields.take("parallel", _integer(1, 64)),
        scaling=_scaling(fields), timeouts=_timeouts(fields))
    fields.done()
    return settings


def _image_pin(value: Any, path: str, problems: list[str]) -> ImagePin:
    if not isinstance(value, str):
        raise _Invalid(f"expected 'sha256:<64 hex>' or '<private ECR URI>@sha256:<64 hex>', got {_describe(value)}")
    if _DIGEST.match(value):
        return ImagePin(digest=value)
    match = _PRIVATE_ECR_IMAGE.match(value)
    if match:
        partition = "aws-cn" if match["cn"] else "aws-us-gov" if match["region"].startswith("us-gov-") else "aws"
        return ImagePin(digest=match["digest"], repository=EcrRepositoryRef(
            account=match["account"], region=match["region"], name=match["repository"], partition=partition))
    digest = value.rsplit("@", 1)[-1]
    if digest.startswith("sha256:") and not _DIGEST.match(digest):
        raise _Invalid(f"{value!r} has a malformed digest: expected 'sha256:' and 64 lowercase hex characters")
    if "@" not in value:
        last = value.rsplit("/", 1)[-1]
        tag = f" by the mutable tag ':{last.split(':', 1)[1]}'" if ":" in last else " without a digest"
        raise _Invalid(f"{value!r} is pinned{tag}; pin the digest instead: 'sha256:<64 hex>' (the image build "
                       f"prints it) or '<repository URI>@sha256:<64 hex>'")
    if _ANY_IMAGE_BY_DIGEST.match(value):
        raise _Invalid(f"{value!r} is not in a private Amazon ECR registry, the only kind SageMaker pulls from; "
                       f"copy it into the project repository (the text-generation mirror build does) and pin "
                       f"'sha256:<64 hex>'")
    raise _Invalid(f"{value!r} is not 'sha256:<64 hex>' or '<account>.dkr.ecr.<region>.amazonaws.com/<repository>"
                   f"@sha256:<64 hex>'")


def _model_pin(value: Any, path: str, problems: list[str]) -> ModelPin:
    fields = _Fields(value, path, problems)
    s3_key = fields.take("s3_key", _string(_MODEL_KEY, "a key of the form models/<pin>/<gguf sha256>/model.tar.gz "
                                                       "(printed by the model build as s3_uri)"))
    gguf_sha256 = fields.take("gguf_sha256", _string(_HEX64, "64 lowercase hex characters"))
    fields.done()
    if s3_key and gguf_sha256:
        in_key = _MODEL_KEY.match(s3_key)["sha256"]
        if in_key != gguf_sha256:
            problems.append(f"{path}.s3_key: the key's GGUF sha256 ({in_key[:12]}...) differs from "
                            f"{path}.gguf_sha256 ({gguf_sha256[:12]}...)")
    return ModelPin(s3_key=s3_key, gguf_sha256=gguf_sha256)


def _pins(value: Any, path: str, problems: list[str]) -> Pins:
    fields = _Fields(value, path, problems)
    images = fields.take("images", _image_pins) or {}
    model = fields.take("model", _model_pin, nullable=True)
    fields.done()
    return Pins(cpu_image=images.get("cpu"), gpu_image=images.get("gpu"),
                text_generation_image=images.get("text_generation"), model=model)


def _image_pins(value: Any, path: str, problems: list[str]) -> dict[str, ImagePin | None]:
    fields = _Fields(value, path, problems)
    images = {kind: fields.take(kind, _image_pin, nullable=True) for kind in ENDPOINT_KINDS}
    fields.done()
    return images


def _build_settings(value: Any, path: str, problems: list[str], model_pins: tuple[str, ...]) -> BuildSettings:
    fields = _Fields(value, path, problems)

    def pin_name(v: Any, p: str, probs: list[str]) -> str:
        v = _string(_PIN_NAME, "a pin name (1 to 64 characters of a-z 0-9 . _ -)")(v, p, probs)
        if v not in model_pins:
            raise _Invalid(f"{v!r} is not a pin in model_build/pins.json ({', '.join(model_pins) or 'none'})")
        return v

    def source_image(v: Any, p: str, probs: list[str]) -> str:
        if not isinstance(v, str) or not _ANY_IMAGE_BY_DIGEST.match(v):
            raise _Invalid(f"expected an image reference pinned by digest ('<registry>/<repository>@sha256:<64 hex>'), "
                           f"got {_describe(v)}")
        return v

    settings = BuildSettings(model_pin=fields.take("model_pin", pin_name),
                             text_generation_source_image=fields.take("text_generation_source_image", source_image),
                             log_retention_days=fields.take("log_retention_days", _log_retention))
    fields.done()
    return settings


def _artifact_settings(value: Any, path: str, problems: list[str]) -> ArtifactSettings:
    fields = _Fields(value, path, problems)
    removal = fields.take("removal_policy", _choice(("destroy", "retain")))
    settings = ArtifactSettings(
        retain=removal == "retain",
        noncurrent_version_expiration_days=fields.take("noncurrent_version_expiration_days", _integer(1, 3650)),
        access_log_expiration_days=fields.take("access_log_expiration_days", _integer(1, 3650)),
        images_kept_per_kind=fields.take("images_kept_per_kind", _integer(1, 1000)))
    fields.done()
    return settings
