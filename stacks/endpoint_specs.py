"""One spec per endpoint kind: what differs between the CPU, GPU and text-generation endpoints, in one place.

A spec holds everything an endpoint stack and the monitoring dashboard need to know about a kind: the
endpoint's name, its image and model pins, the production variant (one instance type, or ordered GPU pools)
and its routing, the container environment, the scaling target, the update strategy, the metric filters on
the container's log lines and the alarms. :func:`endpoint_specs` builds them from the configuration; every
stack is a loop over them, so no other module dispatches on a kind's name.

Update strategy (SageMaker deployment guardrails, ``DeploymentConfig``; docs/deploy.md, "Updates and rollback"):
blue/green keeps the whole old fleet until the new one has baked, which needs a second fleet for the update;
rolling replaces the fleet in batches of at most half its instances (SageMaker requires 5 to 50 % of the
variant's count), needing only one batch more. The GPU variant rolls, because GPU capacity and quota are scarce,
when it has at least two instances; with one, a rolling batch would be the whole fleet, so it goes blue/green too.
The CPU variants go blue/green, one canary instance first when the fleet has two or more. Either way, if an alarm
marked ``rolls_back`` fires during a bake, SageMaker shifts the traffic back to the old fleet.

Rollback alarms watch faults, never load or request shape: answers that are the server's fault (5xx other than
the adapter's busy 503), scoring failures, the adapter's compute time per evaluated token (a slow release: its own
log line, which load does not move, against a threshold derived from the measured speed, stacks/sizing.py), memory
and disk. There is no rollback on SageMaker's ModelLatency: the adapter refuses (busy 503) what it cannot answer by
its deadline, so under load successful latencies pile up just under it, and a threshold at or under the deadline
trips on load while one above it can never fire; the text-generation endpoint's latency follows the requested
max_tokens, and it logs nothing per output token. Busy 503s and utilization mean load; they notify, and scaling
reacts to them. Every rollback alarm decides within the bake (its periods, CloudWatch's publishing delay of its
metrics and one evaluation, checked here), and its threshold is one the metric can reach (``ceiling``).

Under CloudWatch's publishing delay the newest minutes of a metric are missing when an alarm is evaluated. So no
alarm fills missing data into a datapoint (``FILL``: the newest minute would always read the filler, and a
"3 of 3" alarm could never see three breaches in a row; plain arithmetic and comparisons between series already
read a missing value as 0 where the other series has one), and each alarm is M out of N, its N covering the periods
that may not be published yet (``AlarmSpec.unpublished_periods``): CloudWatch evaluates the newest N datapoints that
exist, so M published breaches always lie among them. An alarm that compares namespaces which lag differently
(SageMaker's 5xx against the adapter's busy count) can read a breach in the newest minutes while one namespace is
in and the other is not: its M exceeds those minutes by two, so neither load alone nor one bad minute fires it.
SageMaker's metrics cannot tell the new fleet from the old during an update (both are the variant AllTraffic; the
InstanceType dimension only separates pools), so the alarms watch the variant: with all traffic shifted at once
that is the new fleet, and a canary's share of the traffic is at least 1/max_instance_count, which is why the
fault-rate threshold must stay below it (checked here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch

from stacks import instance_types, sizing, updates
from stacks.adapter_logs import metric_logs
from stacks.config import (ADAPTER_KINDS, TRANSFORM_KINDS, AsyncEndpointSettings, ConfigError, EndpointSettings,
                           EnvironmentConfig, ImagePin, ModelPin, VpcSettings, image_kind)

VARIANT_NAME = "AllTraffic"
# How long SageMaker watches the alarms after each traffic shift (and before it terminates the old fleet): every
# rollback alarm's window (alarm_window_s) fits in it, checked for each spec.
BAKE_S = 600
# Where the adapter's log-line metrics go: one namespace per endpoint, because a metric filter cannot add a
# dimension of constant value (the log lines do not name the endpoint).
ADAPTER_METRICS_NAMESPACE = "DecisionAdapter"
# SageMaker's namespaces: invocation metrics, and the instances' CPU/GPU/memory/disk metrics (which the
# execution role publishes, hence its cloudwatch:PutMetricData on this namespace alone).
INVOCATIONS_NAMESPACE = "AWS/SageMaker"
INSTANCE_NAMESPACE = "/aws/sagemaker/Endpoints"
TRANSFORM_INSTANCE_NAMESPACE = "/aws/sagemaker/TransformJobs"

# How long after a minute its datapoint can be in CloudWatch, per namespace (assumed, generously: SageMaker sends
# invocation and instance metrics every minute, CloudWatch Logs turns log events into metric-filter datapoints as
# they arrive; `python -m endpoint_client acceptance` measures the log metric's delay on a real endpoint), and how
# often CloudWatch evaluates an alarm.
PUBLISHING_DELAY_S = {"AWS/SageMaker": 120, "/aws/sagemaker/Endpoints": 180, "DecisionAdapter": 180}
ALARM_EVALUATION_S = 60
# The adapter's deadline for a request (ADAPTER_REQUEST_TIMEOUT_S, set in the model's environment): below
# SageMaker's 60 s invocation timeout, so the adapter answers a busy 503 before SageMaker gives up.
REQUEST_DEADLINE_S = 55

# Alarm thresholds that do not depend on the endpoint (the slow-release threshold does: stacks/sizing.py).
ERROR_RATE_PERCENT = 5          # fault answers (5xx but the adapter's busy 503) per invocation
BUSY_RATE_PERCENT = 10          # the adapter's busy 503s per request: scaling does not keep up
UTILIZATION_PERCENT = 90        # of every vCPU or GPU, sustained: at max_instance_count, or scaling too slowly
MEMORY_PERCENT = 90             # of the instance's memory: the model and caches are fixed in size, so growth is a leak
DISK_PERCENT = 85


@dataclass(frozen=True)
class Variant:
    """Where the endpoint runs: exactly one of instance_type and instance_pools (priority = order)."""
    instance_type: str | None = None
    instance_pools: tuple[str, ...] = ()
    provision_timeout_s: int | None = None
    inference_ami_version: str | None = None
    routing_strategy: str | None = None            # ProductionVariant.RoutingConfig; None: SageMaker's RANDOM
    volume_size_gib: int | None = None             # ProductionVariant.VolumeSizeInGB: EBS-backed types only

    def __post_init__(self) -> None:
        if (self.instance_type is None) == (not self.instance_pools):
            raise ValueError("a variant has either an instance type or instance pools")
        if self.provision_timeout_s is not None and not self.instance_pools:
            raise ValueError("a provisioning timeout applies to instance pools only")
        if self.volume_size_gib is not None and self.has_instance_storage:
            raise ValueError("SageMaker refuses VolumeSizeInGB for instance types with local NVMe storage")

    @property
    def instance_types(self) -> tuple[str, ...]:
        return (self.instance_type,) if self.instance_type else self.instance_pools

    @property
    def has_instance_storage(self) -> bool:
        """Local NVMe on any instance type: SageMaker encrypts it in hardware and refuses a volume KMS key."""
        return any(map(instance_types.has_instance_storage, self.instance_types))


@dataclass(frozen=True)
class AsyncInference:
    """SageMaker Asynchronous Inference (the EndpointConfig's AsyncInferenceConfig): key prefixes of the artifact
    bucket for requests, answers and failures, the requests SageMaker sends an instance at once, and how scaling
    reads the queue (target tracking on the backlog per instance; a step out from 0 instances on
    HasBacklogWithoutCapacity, which target tracking cannot do: AWS's pattern for scaling to zero)."""
    input_prefix: str
    output_prefix: str
    failure_prefix: str
    max_concurrent_invocations_per_instance: int
    invocation_timeout_s: int


@dataclass(frozen=True)
class Deployment:
    """DeploymentConfig: the update strategy (rollback alarms are the spec's alarms marked rolls_back)."""
    strategy: Literal["blue_green", "rolling"]
    traffic: Literal["ALL_AT_ONCE", "CANARY"] | None     # blue/green only
    bake_s: int
    maximum_execution_timeout_s: int


@dataclass(frozen=True)
class LogMetric:
    """A metric filter on the container's JSON log lines (the adapter's request log, a stable contract)."""
    construct_id: str
    metric_name: str
    pattern: str                                       # CloudWatch Logs JSON filter pattern
    value: str = "1"                                   # MetricValue: 1 per line, or $.<numeric field>


@dataclass(frozen=True)
class AlarmSpec:
    construct_id: str
    description: str
    metric: cloudwatch.IMetric
    threshold: float
    evaluation_periods: int
    datapoints_to_alarm: int
    rolls_back: bool                                   # named in AutoRollbackConfiguration
    ceiling: float | None                              # the most the metric can reach; None: unbounded
    comparison: cloudwatch.ComparisonOperator = cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD

    @property
    def period_s(self) -> int:
        return max(int(m.period.to_seconds()) for m in _metrics_of(self.metric))

    @property
    def delay_s(self) -> int:
        """The publishing delay of its slowest metric."""
        return max(PUBLISHING_DELAY_S[_namespace_family(m.namespace)] for m in _metrics_of(self.metric))

    @property
    def unpublished_periods(self) -> int:
        """The newest periods that may still be missing (or partly published) when the alarm is evaluated."""
        return math.ceil(self.delay_s / self.period_s)

    @property
    def skewed_periods(self) -> int:
        """The newest periods in which one namespace's data may be in and another's not (an alarm reading several
        namespace families: either may be published at once, the other up to its delay later)."""
        families = {_namespace_family(m.namespace) for m in _metrics_of(self.metric)}
        return self.unpublished_periods if len(families) > 1 else 0

    @property
    def window_s(self) -> int:
        """The longest a breach can take to put the alarm in ALARM: up to one period until the first whole period
        of the fault, its DatapointsToAlarm periods, the publishing delay of its slowest metric, and one evaluation
        (its N periods cover the unpublished ones, so those M published breaches are among the datapoints CloudWatch
        evaluates)."""
        return self.period_s + self.datapoints_to_alarm * self.period_s + self.delay_s + ALARM_EVALUATION_S


def _metrics_of(metric: cloudwatch.IMetric) -> list[cloudwatch.Metric]:
    if isinstance(metric, cloudwatch.MathExpression):
        return [m for used in metric.using_metrics.values() for m in _metrics_of(used)]
    return [metric]


def _namespace_family(namespace: str) -> str:
    """PUBLISHING_DELAY_S's key of a namespace (the adapter's are DecisionAdapter/<endpoint>)."""
    return namespace.split("/", 1)[0] if namespace.startswith(ADAPTER_METRICS_NAMESPACE + "/") else namespace


@dataclass(frozen=True)
class EndpointSpec:
    kind: str                          # the cdk.json name: cpu, gpu, text_generation
    settings_key: str                  # its settings' key path in cdk.json, for messages
    slug: str                          # in stack and endpoint names: cpu, gpu, text-generation
    title: str
    endpoint_name: str
    stack_name: str
    enabled: bool                      # listed in cdk.json's endpoints
    missing_pins: tuple[str, ...]      # key paths still to set before it can be created
    image: ImagePin | None
    model: ModelPin | None
    settings: EndpointSettings
    variant: Variant
    environment: dict[str, str]
    scaling_target: int                # invocations per instance and minute, the lowest of the variant's types
    deployment: Deployment
    serves_batch_transform: bool       # its Model takes Batch Transform jobs (config.TRANSFORM_KINDS)
    # The scalable target's MinCapacity: initial_instance_count, or (asynchronous inference) cdk.json's
    # min_instance_count, down to 0.
    min_instance_count: int
    # None: a real-time endpoint, scaling on invocations per instance.
    async_inference: AsyncInference | None = None
    log_metrics: tuple[LogMetric, ...] = ()
    alarms: tuple[AlarmSpec, ...] = field(default=())
    vpc: VpcSettings | None = None     # the environment's subnets and security groups (the Model's VpcConfig)

    @property
    def deployable(self) -> bool:
        return self.enabled and not self.missing_pins

    @property
    def rollback_alarms(self) -> tuple[AlarmSpec, ...]:
        return tuple(alarm for alarm in self.alarms if alarm.rolls_back)

    @property
    def log_metrics_namespace(self) -> str:
        return f"{ADAPTER_METRICS_NAMESPACE}/{self.endpoint_name}"

    def alarm_name(self, alarm: AlarmSpec) -> str:
        """Alarms have fixed names (<endpoint>-<alarm>): the monitoring stack's topic policy lets CloudWatch publish
        for exactly these alarms, without depending on the endpoint stacks."""
        return f"{self.endpoint_name}-{alarm.construct_id}"

    @property
    def alarm_names(self) -> tuple[str, ...]:
        return tuple(self.alarm_name(alarm) for alarm in self.alarms)


def endpoint_specs(config: EnvironmentConfig) -> tuple[EndpointSpec, ...]:
    """Every endpoint kind, enabled or not (a disabled or unpinned one gets an empty stack)."""
    gguf_bytes = _model_bytes(config)
    specs = (_cpu_spec(config, gguf_bytes), _gpu_spec(config, gguf_bytes), _text_generation_spec(config, gguf_bytes))
    # The async kind exists where cdk.json has its settings (it may be listed only then: EnvironmentConfig).
    return specs + (() if config.async_ is None else (_async_spec(config, gguf_bytes),))


def _model_bytes(config: EnvironmentConfig) -> int:
    """The GGUF's size of the pinned model (model_build/pins.json), else of the build's pin, or the artifact
    source's (nothing is deployed then, but the alarms exist by name)."""
    model = config.pins.model
    try:
        if model is None:
            return sizing.model_bytes(config.model_pin_name)
        return sizing.model_bytes(model.s3_key.split("/")[1], model.gguf_sha256)
    except KeyError as error:
        raise ConfigError([f"{config.key('pins', 'model')}: {error.args[0]}: the endpoints' storage and "
                           f"slow-release threshold are sized from the pin's bytes"]) from None


def _storage(instance_type_list: tuple[str, ...], gguf_bytes: int) -> int | None:
    """VolumeSizeInGB where every instance type is EBS-backed; None where SageMaker uses local NVMe."""
    if any(map(instance_types.has_instance_storage, instance_type_list)):
        return None
    return sizing.storage_gib(gguf_bytes)


# --- the kinds ------------------------------------------------------------------------------------------------

def _cpu_spec(config: EnvironmentConfig, gguf_bytes: int) -> EndpointSpec:
    settings = config.cpu
    variant = Variant(instance_type=settings.instance_type, routing_strategy="LEAST_OUTSTANDING_REQUESTS",
                      volume_size_gib=_storage((settings.instance_type,), gguf_bytes))
    # container/decision_adapter/settings.py; the CPU image reads the model from /opt/ml/model.
    environment = {"ADAPTER_THREADS": str(settings.threads), "ADAPTER_GPU_LAYERS": "0",
                   "ADAPTER_REQUEST_TIMEOUT_S": str(REQUEST_DEADLINE_S)}
    return _spec(config, "cpu", "CPU decision adapter", settings, variant, environment, gguf_bytes,
                 utilization=_cpu_utilization(variant), scarce_capacity=False)


def _gpu_spec(config: EnvironmentConfig, gguf_bytes: int) -> EndpointSpec:
    settings = config.gpu
    variant = Variant(instance_pools=settings.instance_pools, provision_timeout_s=settings.provision_timeout_s,
                      inference_ami_version=settings.inference_ami_version,
                      routing_strategy="LEAST_OUTSTANDING_REQUESTS",
                      volume_size_gib=_storage(settings.instance_pools, gguf_bytes))
    # The GPU image also defaults to -1; stating it keeps the Model's intent in the template. Its CPU threads are
    # the adapter's default, one per physical core.
    environment = {"ADAPTER_GPU_LAYERS": "-1", "ADAPTER_REQUEST_TIMEOUT_S": str(REQUEST_DEADLINE_S)}
    gpus = min(map(instance_types.gpus, variant.instance_types))
    utilization = ("GpuUtilization", "GPUUtilization", UTILIZATION_PERCENT * gpus, 100 * gpus,
                   f"GPU utilization above {UTILIZATION_PERCENT} % of {gpus} GPU(s) for 15 minutes")
    return _spec(config, "gpu", "GPU decision adapter", settings, variant, environment, gguf_bytes,
                 utilization=utilization, scarce_capacity=True)


def _text_generation_spec(config: EnvironmentConfig, gguf_bytes: int) -> EndpointSpec:
    settings = config.text_generation
    # llama-server keeps its own queue behind its slots; SageMaker's default routing stays.
    variant = Variant(instance_type=settings.instance_type,
                      volume_size_gib=_storage((settings.instance_type,), gguf_bytes))
    pin_name = config.pins.model.s3_key.split("/")[1] if config.pins.model else ""
    # The DLC entrypoint turns SM_LLAMA_CPP_FOO_BAR=v into llama-server --foo-bar v; it finds the GGUF in
    # SM_LLAMA_CPP_MODEL_DIR.
    environment = {"SM_LLAMA_CPP_MODEL_DIR": "/opt/ml/model", "SM_LLAMA_CPP_CTX_SIZE": str(settings.ctx_size),
                   "SM_LLAMA_CPP_THREADS": str(settings.threads), "SM_LLAMA_CPP_PARALLEL": str(settings.parallel),
                   "SM_LLAMA_CPP_ALIAS": pin_name}
    return _spec(config, "text_generation", "text generation (llama-server)", settings, variant, environment,
                 gguf_bytes, utilization=_cpu_utilization(variant), scarce_capacity=False)


def _async_spec(config: EnvironmentConfig, gguf_bytes: int) -> EndpointSpec:
    """The CPU adapter image behind SageMaker's queue (pins.images.cpu: config.image_kind)."""
    settings: AsyncEndpointSettings = config.async_
    # One request per instance at a time from SageMaker's queue (MaxConcurrentInvocationsPerInstance), so no routing.
    variant = Variant(instance_type=settings.instance_type,
                      volume_size_gib=_storage((settings.instance_type,), gguf_bytes))
    # container/decision_adapter/settings.py: ADAPTER_DEPLOYMENT=async answers each request within 90 % of
    # ADAPTER_ASYNC_TIMEOUT_S, the InvocationTimeoutSeconds the client gives InvokeEndpointAsync.
    environment = {"ADAPTER_THREADS": str(settings.threads), "ADAPTER_GPU_LAYERS": "0",
                   "ADAPTER_DEPLOYMENT": "async", "ADAPTER_ASYNC_TIMEOUT_S": str(settings.invocation_timeout_s)}
    asynchronous = AsyncInference(
        input_prefix=settings.input_prefix, output_prefix=settings.output_prefix,
        failure_prefix=settings.failure_prefix,
        max_concurrent_invocations_per_instance=settings.max_concurrent_invocations_per_instance,
        invocation_timeout_s=settings.invocation_timeout_s)
    return _spec(config, "async", "asynchronous CPU decision adapter", settings, variant, environment, gguf_bytes,
                 utilization=_cpu_utilization(variant), scarce_capacity=False, async_inference=asynchronous)


def _cpu_utilization(variant: Variant) -> tuple[str, str, float, float, str]:
    # CPUUtilization sums the cores: 100 % per vCPU.
    vcpus = min(map(instance_types.vcpus, variant.instance_types))
    return ("CpuUtilization", "CPUUtilization", UTILIZATION_PERCENT * vcpus, 100 * vcpus,
            f"CPU utilization above {UTILIZATION_PERCENT} % of {vcpus} vCPUs for 15 minutes")


def _spec(config: EnvironmentConfig, kind: str, title: str, settings: EndpointSettings, variant: Variant,
          environment: dict[str, str], gguf_bytes: int, *, utilization: tuple[str, str, float, float, str],
          scarce_capacity: bool, async_inference: AsyncInference | None = None) -> EndpointSpec:
    adapter = kind in ADAPTER_KINDS
    slug = kind.replace("_", "-")
    endpoint_name = config.endpoint_name(kind)
    image = config.pins.images.of(kind)
    missing = tuple(key for key, value in ((config.key("pins", "images", image_kind(kind)), image),
                                           (config.key("pins", "model"), config.pins.model)) if value is None)
    log_metrics = _adapter_log_metrics() if adapter else ()
    namespace = f"{ADAPTER_METRICS_NAMESPACE}/{endpoint_name}"
    # The slowest instance type's threshold: a fallback to it during an update must not roll the update back.
    slow_release = max(sizing.slow_release_ms_per_token(t, gguf_bytes) for t in variant.instance_types) \
        if adapter else None
    deployment = _check_canary(config, kind, settings, _deployment(settings, variant, scarce_capacity))
    alarms = _alarms(endpoint_name, variant, utilization, adapter_namespace=namespace if adapter else None,
                     slow_release_ms_per_token=slow_release)
    if async_inference is not None:
        alarms += (_oldest_request_alarm(endpoint_name, settings, async_inference),)
    _check_rollback_windows(config, kind, alarms, deployment)
    if adapter and image is not None:
        # The adapter names its image in every answer's x_request (a captured record says which release answered).
        environment = {**environment, "ADAPTER_IMAGE_DIGEST": image.digest}
    return EndpointSpec(
        kind=kind, settings_key=config.key(kind), slug=slug, title=title, endpoint_name=endpoint_name,
        stack_name=config.endpoint_stack_name(kind), enabled=kind in config.endpoints, missing_pins=missing,
        image=image, model=config.pins.model, settings=settings, variant=variant, environment=environment,
        scaling_target=settings.scaling_target, deployment=deployment,
        serves_batch_transform=kind in TRANSFORM_KINDS,
        min_instance_count=getattr(settings, "min_instance_count", settings.initial_instance_count),
        async_inference=async_inference, log_metrics=log_metrics, alarms=alarms, vpc=config.vpc)


def async_metric(endpoint_name: str, metric_name: str, statistic: str = "Average",
                 period: Duration = Duration.minutes(1)) -> cloudwatch.Metric:
    """An asynchronous endpoint's queue metric (ApproximateBacklogSize, ApproximateBacklogSizePerInstance,
    ApproximateAgeOfOldestRequest, HasBacklogWithoutCapacity): AWS/SageMaker, dimension EndpointName alone."""
    return cloudwatch.Metric(namespace=INVOCATIONS_NAMESPACE, metric_name=metric_name, statistic=statistic,
                             period=period, dimensions_map={"EndpointName": endpoint_name})


def oldest_request_threshold_s(settings: EndpointSettings, asynchronous: AsyncInference) -> int:
    """The age of the oldest queued request that no healthy queue reaches: an instance started from zero (download
    and start-up, each within its timeout) and one whole invocation."""
    return settings.model_download_timeout_s + settings.startup_health_check_timeout_s + \
        asynchronous.invocation_timeout_s


def _oldest_request_alarm(endpoint_name: str, settings: EndpointSettings, asynchronous: AsyncInference) -> AlarmSpec:
    # Load (or no capacity), not a fault of a release: it notifies and never rolls an update back.
    threshold = oldest_request_threshold_s(settings, asynchronous)
    metric = async_metric(endpoint_name, "ApproximateAgeOfOldestRequest", statistic="Maximum")
    periods = _m_of_n(metric, 3)
    return _alarm("OldestRequestAge", f"{endpoint_name}: the oldest queued request was older than {threshold} s "
                  f"(an instance's download and start-up timeouts and one invocation's timeout) in {periods[1]} of "
                  f"{periods[0]} minutes: the queue is not drained (max_instance_count reached, or no instance "
                  "starts)", metric, threshold, 3, rolls_back=False, ceiling=None)


def _check_rollback_windows(config: EnvironmentConfig, kind: str, alarms: tuple[AlarmSpec, ...],
                            deployment: Deployment) -> None:
    """A rollback alarm that cannot reach ALARM within the bake lets a broken release through; one whose threshold
    is above what its metric can reach never fires."""
    problems = [f"{config.key(kind)}: the rollback alarm {a.construct_id} needs up to {a.window_s} s to fire, more "
                f"than the {deployment.bake_s} s bake" for a in alarms if a.rolls_back and a.window_s > deployment.bake_s]
    problems += [f"{config.key(kind)}: the alarm {a.construct_id} evaluates {a.evaluation_periods} periods for "
                 f"{a.datapoints_to_alarm} breaches, fewer than those plus the {a.unpublished_periods} its metrics may "
                 f"not have published yet: it could miss its breaches" for a in alarms
                 if a.evaluation_periods < a.datapoints_to_alarm + a.unpublished_periods]
    problems += [f"{config.key(kind)}: the rollback alarm {a.construct_id} fires on {a.datapoints_to_alarm} breaches, "
                 f"but its namespaces can disagree in {a.skewed_periods} periods: load alone, or one bad minute, could "
                 f"fire it" for a in alarms if a.rolls_back and a.skewed_periods
                 and a.datapoints_to_alarm < a.skewed_periods + 2]
    problems += [f"{config.key(kind)}: the alarm {a.construct_id}'s threshold {a.threshold:g} is not below the most "
                 f"its metric can reach ({a.ceiling:g})" for a in alarms if a.ceiling is not None
                 and a.threshold >= a.ceiling]
    if problems:
        raise ConfigError(problems)


def _deployment(settings: EndpointSettings, variant: Variant, scarce_capacity: bool) -> Deployment:
    # The fleet never has fewer instances than the scaling minimum: initial_instance_count, or an asynchronous
    # endpoint's min_instance_count (0: one instance at a time, all at once, is all an update can count on).
    minimum = getattr(settings, "min_instance_count", settings.initial_instance_count)
    update = updates.plan(scarce_capacity=scarce_capacity, initial_instance_count=minimum)
    # One step: provision (pools fall back within provision_timeout_s), download, health check, bake. Rolling
    # at 50 % takes two steps; blue/green a canary step and the final bake; with rollback time beside them.
    step_s = (variant.provision_timeout_s or 0) + settings.model_download_timeout_s + \
        settings.startup_health_check_timeout_s + BAKE_S
    steps = 2 if update.strategy == "rolling" or update.traffic == "CANARY" else 1
    timeout = min(28_800, max(600, (steps + 1) * step_s + BAKE_S))   # DeploymentConfig's range: 600..28800
    return Deployment(strategy=update.strategy, traffic=update.traffic, bake_s=BAKE_S,
                      maximum_execution_timeout_s=timeout)


def _check_canary(config: EnvironmentConfig, kind: str, settings: EndpointSettings,
                  deployment: Deployment) -> Deployment:
    """A one-instance canary gets 1/N of the traffic at a fleet of N: if it failed every request, the fault rate
    would be 100/N %, which must be above the alarm's threshold for the rollback to happen."""
    if deployment.traffic == "CANARY" and 100 / settings.max_instance_count <= ERROR_RATE_PERCENT:
        raise ConfigError([f"{config.key(kind, 'max_instance_count')}: {settings.max_instance_count} instances: a "
                           f"canary of one instance would carry {100 / settings.max_instance_count:.1f} % of the "
                           f"traffic, not more than the {ERROR_RATE_PERCENT} % fault rate that rolls an update back "
                           f"(at most {math.ceil(100 / ERROR_RATE_PERCENT) - 1})"])
    return deployment


def _adapter_log_metrics() -> tuple[LogMetric, ...]:
    # The adapter's own definitions of the lines and of what each metric counts or sums (metric_logs): one JSON line
    # per request with its HTTP status and compute, and one more when scoring raises.
    return tuple(LogMetric(f"{metric.metric_name}Metric", metric.metric_name, metric.filter_pattern(),
                           metric.metric_value()) for metric in metric_logs.METRICS)


def _invocations(endpoint_name: str, metric_name: str, statistic: str = "Sum",
                 period: Duration = Duration.minutes(1), instance_type: str | None = None) -> cloudwatch.Metric:
    return cloudwatch.Metric(namespace=INVOCATIONS_NAMESPACE, metric_name=metric_name, statistic=statistic,
                             period=period, dimensions_map=_dimensions(endpoint_name, instance_type))


def _instances(endpoint_name: str, metric_name: str, statistic: str, period: Duration,
               instance_type: str | None = None) -> cloudwatch.Metric:
    return cloudwatch.Metric(namespace=INSTANCE_NAMESPACE, metric_name=metric_name, statistic=statistic,
                             period=period, dimensions_map=_dimensions(endpoint_name, instance_type))


def _dimensions(endpoint_name: str, instance_type: str | None) -> dict[str, str]:
    dimensions = {"EndpointName": endpoint_name, "VariantName": VARIANT_NAME}
    return dimensions if instance_type is None else {**dimensions, "InstanceType": instance_type}


@dataclass(frozen=True)
class VariantSeries:
    """A SageMaker metric of the variant as metric math: the variant's series, and for a variant with instance
    pools each pool's own series too (dimension InstanceType), because a pooled variant may publish only those.
    ``expression`` reads whichever exist: for a sum (counts), the larger of the variant's and the pools' total
    (equal where both are published); for a maximum or an average, the largest of them all. Minutes without any
    series read nothing (an alarm treats them as not breaching; no FILL, see the module's text). It is one term (a
    name or a MAX), so it needs no parentheses inside a larger expression."""
    prefix: str
    metrics: dict[str, cloudwatch.Metric]
    pooled: bool
    statistic: str

    @property
    def expression(self) -> str:
        if not self.pooled:
            return self.prefix
        pools = [name for name in self.metrics if name != self.prefix]
        if self.statistic == "Sum":   # a sum of series reads a missing one as 0 where another has a value
            return f"MAX([{self.prefix}, {' + '.join(pools)}])"
        return f"MAX([{', '.join(self.metrics)}])"


def _variant_series(prefix: str, variant: Variant, make) -> VariantSeries:
    """``make(instance_type)`` builds the metric of one dimension set (None: the variant's)."""
    metrics = {prefix: make(None)}
    if variant.instance_pools:
        metrics.update({f"{prefix}{i}": make(t) for i, t in enumerate(variant.instance_pools)})
    return VariantSeries(prefix, metrics, bool(variant.instance_pools), metrics[prefix].statistic)


def _instance_metric(endpoint_name: str, variant: Variant, metric_name: str, statistic: str,
                     period: Duration) -> cloudwatch.IMetric:
    """An instance metric of the variant: the metric itself, or metric math over the pools' series too."""
    series = _variant_series("m", variant, lambda t: _instances(endpoint_name, metric_name, statistic, period, t))
    if not series.pooled:
        return series.metrics["m"]
    return cloudwatch.MathExpression(expression=series.expression, using_metrics=series.metrics, period=period,
                                     label=f"{metric_name} ({statistic}), the variant's or its pools' series")


def invocations_metric(endpoint_name: str) -> cloudwatch.Metric:
    return _invocations(endpoint_name, "Invocations")


def latency_metric(endpoint_name: str) -> cloudwatch.Metric:
    """ModelLatency p99 (microseconds), for the dashboard only: no alarm reads it (see the module's docstring)."""
    return _invocations(endpoint_name, "ModelLatency", statistic="p99")


def _m_of_n(metric: cloudwatch.IMetric, breaches: int) -> tuple[int, int]:
    """(EvaluationPeriods, DatapointsToAlarm) of an alarm on ``metric`` that needs ``breaches`` breaching periods:
    N covers the periods its metrics may not have published yet; where its namespaces can disagree in the newest
    periods (they lag differently), at least two breaches beyond those (module's text)."""
    probe = AlarmSpec("probe", "", metric, 0, 1, 1, rolls_back=False, ceiling=None)
    m = max(breaches, probe.skewed_periods + 2) if probe.skewed_periods else breaches
    return m + probe.unpublished_periods, m


def _alarm(construct_id: str, description: str, metric: cloudwatch.IMetric, threshold: float, breaches: int, *,
           rolls_back: bool, ceiling: float | None) -> AlarmSpec:
    evaluation_periods, datapoints = _m_of_n(metric, breaches)
    return AlarmSpec(construct_id, description, metric, threshold, evaluation_periods, datapoints,
                     rolls_back=rolls_back, ceiling=ceiling)


def _alarms(endpoint_name: str, variant: Variant, utilization: tuple[str, str, float, float, str], *,
            adapter_namespace: str | None, slow_release_ms_per_token: int | None) -> tuple[AlarmSpec, ...]:
    one_minute, five_minutes = Duration.minutes(1), Duration.minutes(5)

    def adapter(metric: metric_logs.LogMetric) -> cloudwatch.Metric:
        return cloudwatch.Metric(namespace=adapter_namespace, metric_name=metric.metric_name, statistic="Sum",
                                 period=one_minute)

    errors = _variant_series("errors", variant,
                             lambda t: _invocations(endpoint_name, "Invocation5XXErrors", instance_type=t))
    if adapter_namespace is not None:
        # SageMaker counts every 5xx the container answers, the adapter's busy 503s included: its admission
        # refusals mean load and are subtracted (the BusyResponses log metric), its deadline misses are faults of
        # the release and stay counted (metric_logs). The requests the adapter logged are the denominator, or the
        # 5xx where more (SageMaker answers 5xx the container never saw): one series instead of the invocations of
        # every dimension set keeps a pooled variant's expression within CloudWatch's 10 metrics. No FILL: a
        # comparison or a difference between series reads the one missing as 0, and a minute with neither reads
        # nothing. While SageMaker's minute is in and the log metrics' not yet, the busy 503s read as faults: the
        # alarm's M exceeds those minutes (_m_of_n).
        errors_sum = errors.expression
        fault_rate = cloudwatch.MathExpression(
            expression=f"IF({errors_sum} > busy, 100 * ({errors_sum} - busy) / MAX([requests, {errors_sum}]), 0)",
            label="5xx but busy 503 per request (%)", period=one_minute,
            using_metrics={**errors.metrics, "busy": adapter(metric_logs.BUSY_RESPONSES),
                           "requests": adapter(metric_logs.REQUESTS)})
        faults = "5xx other than the adapter's admission refusals (busy 503)"
    else:
        invocations = _variant_series("invocations", variant,
                                      lambda t: _invocations(endpoint_name, "Invocations", instance_type=t))
        fault_rate = cloudwatch.MathExpression(
            expression=f"IF({invocations.expression} > 0, 100 * {errors.expression} / {invocations.expression}, 0)",
            label="5xx per invocation (%)", period=one_minute, using_metrics={**errors.metrics, **invocations.metrics})
        faults = "5xx"
    utilization_id, utilization_metric, utilization_threshold, utilization_ceiling, utilization_text = utilization
    rate_periods = _m_of_n(fault_rate, 3)
    alarms = [
        _alarm("Invocation5xxRate", f"{endpoint_name}: more than {ERROR_RATE_PERCENT} % of invocations answered "
               f"{faults} in {rate_periods[1]} of {rate_periods[0]} minutes", fault_rate, ERROR_RATE_PERCENT, 3,
               rolls_back=True, ceiling=100),
    ]
    if adapter_namespace is not None:
        # The log metrics exist (0 where no line matched) in every minute with any log line: no FILL (see above).
        busy_rate = cloudwatch.MathExpression(
            expression="IF(requests > 0, 100 * busy / requests, 0)", label="busy 503 per request (%)",
            period=one_minute, using_metrics={"busy": adapter(metric_logs.BUSY_RESPONSES),
                                              "requests": adapter(metric_logs.REQUESTS)})
        # Requests with a scoring failure per request: one bad request fails one minute, never three.
        failure_rate = cloudwatch.MathExpression(
            expression="IF(requests > 0, 100 * failed / requests, 0)",
            label="requests with a scoring failure per request (%)", period=one_minute,
            using_metrics={"failed": adapter(metric_logs.FAILED_REQUESTS), "requests": adapter(metric_logs.REQUESTS)})
        # Every job's own compute per evaluated token (milliseconds), summed per minute, deadline misses included:
        # what the release computes at, whatever the load (metric_logs); minutes without such jobs read 0.
        compute = cloudwatch.MathExpression(
            expression="IF(tokens > 0, 1000 * compute / tokens, 0)",
            label="compute per evaluated token (ms)", period=one_minute,
            using_metrics={"compute": adapter(metric_logs.COMPUTE_SECONDS),
                           "tokens": adapter(metric_logs.EVALUATED_TOKENS)})
        busy_periods, failure_periods, compute_periods = (_m_of_n(m, n) for m, n in
                                                          ((busy_rate, 5), (failure_rate, 3), (compute, 3)))
        alarms += [
            # Load, not a fault of a new version: it alerts, it never rolls an update back.
            _alarm("BusyRate", f"{endpoint_name}: the adapter refused more than {BUSY_RATE_PERCENT} % of requests at "
                   f"admission (busy 503) in {busy_periods[1]} of {busy_periods[0]} minutes (scaling does not keep "
                   "up)", busy_rate, BUSY_RATE_PERCENT, 5, rolls_back=False, ceiling=100),
            _alarm("ScoringFailures", f"{endpoint_name}: more than {ERROR_RATE_PERCENT} % of requests had a "
                   f"'scoring failed' (a 500) in {failure_periods[1]} of {failure_periods[0]} minutes", failure_rate,
                   ERROR_RATE_PERCENT, 3, rolls_back=True, ceiling=100),
            _alarm("SlowCompute", f"{endpoint_name}: jobs computed more than {slow_release_ms_per_token} ms per "
                   f"evaluated token in {compute_periods[1]} of {compute_periods[0]} minutes "
                   f"({sizing.SLOW_RELEASE_FACTOR:g}x the speed derived for the slowest instance type, "
                   "stacks/sizing.py): a slow release", compute, slow_release_ms_per_token, 3, rolls_back=True,
                   ceiling=None),
        ]
    utilization_metric = _instance_metric(endpoint_name, variant, utilization_metric, "Average", five_minutes)
    memory = _instance_metric(endpoint_name, variant, "MemoryUtilization", "Maximum", one_minute)
    disk = _instance_metric(endpoint_name, variant, "DiskUtilization", "Maximum", one_minute)
    memory_periods, disk_periods = _m_of_n(memory, 3), _m_of_n(disk, 1)
    alarms += [
        # Load, not a fault of a new version: it alerts, it does not roll an update back.
        _alarm(utilization_id, f"{endpoint_name}: {utilization_text}", utilization_metric, utilization_threshold, 3,
               rolls_back=False, ceiling=utilization_ceiling),
        # One-minute periods: the rollback copies of the instance metrics must decide within the bake.
        _alarm("MemoryUtilization", f"{endpoint_name}: an instance's memory more than {MEMORY_PERCENT} % used in "
               f"{memory_periods[1]} of {memory_periods[0]} minutes", memory, MEMORY_PERCENT, 3, rolls_back=True,
               ceiling=100),
        _alarm("DiskUtilization", f"{endpoint_name}: an instance's disk more than {DISK_PERCENT} % full in "
               f"{disk_periods[1]} of {disk_periods[0]} minutes", disk, DISK_PERCENT, 1, rolls_back=True, ceiling=100),
    ]
    return tuple(alarms)
