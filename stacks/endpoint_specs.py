"""One spec per endpoint kind: what differs between the CPU, GPU and text-generation endpoints, in one place.

A spec holds everything an endpoint stack and the monitoring dashboard need to know about a kind: the
endpoint's name, its image and model pins, the production variant (one instance type, or ordered GPU pools)
and its routing, the container environment, the scaling target, the update strategy, the metric filters on
the container's log lines and the alarms. :func:`endpoint_specs` builds them from the configuration; every
stack is a loop over them, so no other module dispatches on a kind's name.

Update strategy (SageMaker deployment guardrails, ``DeploymentConfig``; README "Deploy"): blue/green keeps the
whole old fleet until the new one has baked, which needs a second fleet for the update; rolling replaces the
fleet in batches of at most half its instances (SageMaker requires 5 to 50 % of the variant's count), needing
only one batch more. The GPU variant rolls, because GPU capacity and quota are scarce, when it has at least two
instances; with one, a rolling batch would be the whole fleet, so it goes blue/green too. The CPU variants go
blue/green, one canary instance first when the fleet has two or more. Either way, if an alarm marked
``rolls_back`` fires during a bake, SageMaker shifts the traffic back to the old fleet.

Rollback alarms watch faults, never load: answers that are the server's fault (5xx other than the adapter's busy
503), scoring failures, latency beyond what the slowest instance type was measured to need (stacks/sizing.py),
memory and disk. Busy 503s and utilization mean load; they notify, and scaling reacts to them. SageMaker's metrics
cannot tell the new fleet from the old during an update (both are the variant AllTraffic; the InstanceType
dimension only separates pools), so the alarms watch the variant: with all traffic shifted at once that is the new
fleet, and a canary's share of the traffic is at least 1/max_instance_count, which is why the fault-rate threshold
must stay below it (checked here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch

from stacks import instance_types, updates
from stacks.adapter_logs import metric_logs
from stacks.config import ADAPTER_KINDS, ConfigError, EndpointSettings, EnvironmentConfig, ImagePin, ModelPin

VARIANT_NAME = "AllTraffic"
# How long SageMaker watches the alarms after each traffic shift (and before it terminates the old fleet):
# longer than the slowest rollback alarm needs to fire (5 one-minute periods).
BAKE_S = 600
# Where the adapter's log-line metrics go: one namespace per endpoint, because a metric filter cannot add a
# dimension of constant value (the log lines do not name the endpoint).
ADAPTER_METRICS_NAMESPACE = "DecisionAdapter"
# SageMaker's namespaces: invocation metrics, and the instances' CPU/GPU/memory/disk metrics (which the
# execution role publishes, hence its cloudwatch:PutMetricData on this namespace alone).
INVOCATIONS_NAMESPACE = "AWS/SageMaker"
INSTANCE_NAMESPACE = "/aws/sagemaker/Endpoints"
TRANSFORM_INSTANCE_NAMESPACE = "/aws/sagemaker/TransformJobs"

# Alarm thresholds that do not depend on the endpoint (the latency threshold does: cdk.json model_latency_p99_ms).
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

    def __post_init__(self) -> None:
        if (self.instance_type is None) == (not self.instance_pools):
            raise ValueError("a variant has either an instance type or instance pools")
        if self.provision_timeout_s is not None and not self.instance_pools:
            raise ValueError("a provisioning timeout applies to instance pools only")

    @property
    def instance_types(self) -> tuple[str, ...]:
        return (self.instance_type,) if self.instance_type else self.instance_pools

    @property
    def has_instance_storage(self) -> bool:
        """Local NVMe on any instance type: SageMaker encrypts it in hardware and refuses a volume KMS key."""
        return any(map(instance_types.has_instance_storage, self.instance_types))


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


@dataclass(frozen=True)
class AlarmSpec:
    construct_id: str
    description: str
    metric: cloudwatch.IMetric
    threshold: float
    evaluation_periods: int
    datapoints_to_alarm: int
    rolls_back: bool                                   # named in AutoRollbackConfiguration
    comparison: cloudwatch.ComparisonOperator = cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD


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
    serves_batch_transform: bool       # the adapter answers application/jsonlines (Batch Transform)
    log_metrics: tuple[LogMetric, ...] = ()
    alarms: tuple[AlarmSpec, ...] = field(default=())

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
    return (_cpu_spec(config), _gpu_spec(config), _text_generation_spec(config))


# --- the kinds ------------------------------------------------------------------------------------------------

def _cpu_spec(config: EnvironmentConfig) -> EndpointSpec:
    settings = config.cpu
    variant = Variant(instance_type=settings.instance_type, routing_strategy="LEAST_OUTSTANDING_REQUESTS")
    # container/decision_adapter/settings.py; the CPU image reads the model from /opt/ml/model.
    environment = {"ADAPTER_THREADS": str(settings.threads), "ADAPTER_GPU_LAYERS": "0"}
    return _spec(config, "cpu", "CPU decision adapter", settings, variant, environment,
                 utilization=_cpu_utilization(variant), scarce_capacity=False)


def _gpu_spec(config: EnvironmentConfig) -> EndpointSpec:
    settings = config.gpu
    variant = Variant(instance_pools=settings.instance_pools, provision_timeout_s=settings.provision_timeout_s,
                      inference_ami_version=settings.inference_ami_version,
                      routing_strategy="LEAST_OUTSTANDING_REQUESTS")
    # The GPU image also defaults to -1; stating it keeps the Model's intent in the template.
    environment = {"ADAPTER_GPU_LAYERS": "-1"}
    gpus = min(map(instance_types.gpus, variant.instance_types))
    utilization = ("GpuUtilization", "GPUUtilization", UTILIZATION_PERCENT * gpus,
                   f"GPU utilization above {UTILIZATION_PERCENT} % of {gpus} GPU(s) for 15 minutes")
    return _spec(config, "gpu", "GPU decision adapter", settings, variant, environment,
                 utilization=utilization, scarce_capacity=True)


def _text_generation_spec(config: EnvironmentConfig) -> EndpointSpec:
    settings = config.text_generation
    # llama-server keeps its own queue behind its slots; SageMaker's default routing stays.
    variant = Variant(instance_type=settings.instance_type)
    pin_name = config.pins.model.s3_key.split("/")[1] if config.pins.model else ""
    # The DLC entrypoint turns SM_LLAMA_CPP_FOO_BAR=v into llama-server --foo-bar v; it finds the GGUF in
    # SM_LLAMA_CPP_MODEL_DIR.
    environment = {"SM_LLAMA_CPP_MODEL_DIR": "/opt/ml/model", "SM_LLAMA_CPP_CTX_SIZE": str(settings.ctx_size),
                   "SM_LLAMA_CPP_THREADS": str(settings.threads), "SM_LLAMA_CPP_PARALLEL": str(settings.parallel),
                   "SM_LLAMA_CPP_ALIAS": pin_name}
    return _spec(config, "text_generation", "text generation (llama-server)", settings, variant, environment,
                 utilization=_cpu_utilization(variant), scarce_capacity=False)


def _cpu_utilization(variant: Variant) -> tuple[str, str, float, str]:
    # CPUUtilization sums the cores: 100 % per vCPU.
    vcpus = min(map(instance_types.vcpus, variant.instance_types))
    return ("CpuUtilization", "CPUUtilization", UTILIZATION_PERCENT * vcpus,
            f"CPU utilization above {UTILIZATION_PERCENT} % of {vcpus} vCPUs for 15 minutes")


def _spec(config: EnvironmentConfig, kind: str, title: str, settings: EndpointSettings, variant: Variant,
          environment: dict[str, str], *, utilization: tuple[str, str, float, str],
          scarce_capacity: bool) -> EndpointSpec:
    adapter = kind in ADAPTER_KINDS
    slug = kind.replace("_", "-")
    endpoint_name = config.endpoint_name(kind)
    image = getattr(config.pins.images, kind)
    missing = tuple(key for key, value in ((config.key("pins", "images", kind), image),
                                           (config.key("pins", "model"), config.pins.model)) if value is None)
    log_metrics = _adapter_log_metrics() if adapter else ()
    namespace = f"{ADAPTER_METRICS_NAMESPACE}/{endpoint_name}"
    return EndpointSpec(
        kind=kind, settings_key=config.key(kind), slug=slug, title=title, endpoint_name=endpoint_name,
        stack_name=config.endpoint_stack_name(kind), enabled=kind in config.endpoints, missing_pins=missing,
        image=image, model=config.pins.model, settings=settings, variant=variant, environment=environment,
        scaling_target=settings.scaling_target,
        deployment=_check_canary(config, kind, settings, _deployment(settings, variant, scarce_capacity)),
        serves_batch_transform=adapter,
        log_metrics=log_metrics,
        alarms=_alarms(endpoint_name, settings, utilization, adapter_namespace=namespace if adapter else None))


def _deployment(settings: EndpointSettings, variant: Variant, scarce_capacity: bool) -> Deployment:
    # The fleet never has fewer instances than the scaling minimum (initial_instance_count).
    update = updates.plan(scarce_capacity=scarce_capacity, initial_instance_count=settings.initial_instance_count)
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
    # The adapter's own definitions of the lines and of what each metric counts (metric_logs): one JSON line per
    # request with its HTTP status, and one more when scoring raises.
    return tuple(LogMetric(f"{metric.metric_name}Metric", metric.metric_name, metric.filter_pattern())
                 for metric in metric_logs.METRICS)


def _invocations(endpoint_name: str, metric_name: str, statistic: str = "Sum",
                 period: Duration = Duration.minutes(1)) -> cloudwatch.Metric:
    return cloudwatch.Metric(namespace=INVOCATIONS_NAMESPACE, metric_name=metric_name, statistic=statistic,
                             period=period, dimensions_map={"EndpointName": endpoint_name,
                                                            "VariantName": VARIANT_NAME})


def _instances(endpoint_name: str, metric_name: str, statistic: str) -> cloudwatch.Metric:
    return cloudwatch.Metric(namespace=INSTANCE_NAMESPACE, metric_name=metric_name, statistic=statistic,
                             period=Duration.minutes(5), dimensions_map={"EndpointName": endpoint_name,
                                                                         "VariantName": VARIANT_NAME})


def invocations_metric(endpoint_name: str) -> cloudwatch.Metric:
    return _invocations(endpoint_name, "Invocations")


def _alarms(endpoint_name: str, settings: EndpointSettings, utilization: tuple[str, str, float, str], *,
            adapter_namespace: str | None) -> tuple[AlarmSpec, ...]:
    one_minute = Duration.minutes(1)

    def adapter(metric_name: str) -> cloudwatch.Metric:
        return cloudwatch.Metric(namespace=adapter_namespace, metric_name=metric_name, statistic="Sum",
                                 period=one_minute)

    errors = {"errors": _invocations(endpoint_name, "Invocation5XXErrors"),
              "invocations": _invocations(endpoint_name, "Invocations")}
    if adapter_namespace is not None:
        # SageMaker counts every 5xx the container answers, the adapter's busy 503s included; those mean load.
        # The log metric counts the busy answers (no data in a minute without log lines: FILL with 0).
        fault_rate = cloudwatch.MathExpression(
            expression="IF(invocations > 0 AND errors > FILL(busy, 0), 100 * (errors - FILL(busy, 0)) / invocations, 0)",
            label="5xx but busy 503 per invocation (%)", period=one_minute,
            using_metrics={**errors, "busy": adapter(metric_logs.BUSY_RESPONSES.metric_name)})
        faults = "5xx other than the adapter's busy 503"
    else:
        fault_rate = cloudwatch.MathExpression(
            expression="IF(invocations > 0, 100 * errors / invocations, 0)", label="5xx per invocation (%)",
            period=one_minute, using_metrics=errors)
        faults = "5xx"
    # ModelLatency is in microseconds. The threshold is the slowest instance type's (stacks/sizing.py).
    latency = _invocations(endpoint_name, "ModelLatency", statistic="p99")
    threshold_ms = settings.latency_threshold_ms
    utilization_id, utilization_metric, utilization_threshold, utilization_text = utilization
    alarms = [
        AlarmSpec("Invocation5xxRate", f"{endpoint_name}: more than {ERROR_RATE_PERCENT} % of invocations answered "
                  f"{faults} in 3 consecutive minutes", fault_rate, ERROR_RATE_PERCENT, 3, 3, rolls_back=True),
        AlarmSpec("ModelLatencyP99", f"{endpoint_name}: ModelLatency p99 above {threshold_ms} ms in 3 of 5 minutes "
                  "(cdk.json model_latency_p99_ms of the slowest instance type)", latency,
                  threshold_ms * 1000, 5, 3, rolls_back=True),
    ]
    if adapter_namespace is not None:
        busy_rate = cloudwatch.MathExpression(
            expression="IF(requests > 0, 100 * busy / requests, 0)", label="busy 503 per request (%)",
            period=one_minute, using_metrics={"busy": adapter(metric_logs.BUSY_RESPONSES.metric_name),
                                              "requests": adapter(metric_logs.REQUESTS.metric_name)})
        alarms += [
            # Load, not a fault of a new version: it alerts, it never rolls an update back.
            AlarmSpec("BusyRate", f"{endpoint_name}: the adapter answered more than {BUSY_RATE_PERCENT} % of requests "
                      "with its busy 503 for 5 minutes (scaling does not keep up)", busy_rate,
                      BUSY_RATE_PERCENT, 5, 5, rolls_back=False),
            AlarmSpec("ScoringFailures", f"{endpoint_name}: the adapter logged 'scoring failed' (a 500)",
                      adapter(metric_logs.SCORING_FAILURES.metric_name), 1, 1, 1, rolls_back=True,
                      comparison=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD),
        ]
    alarms += [
        # Load, not a fault of a new version: it alerts, it does not roll an update back.
        AlarmSpec(utilization_id, f"{endpoint_name}: {utilization_text}",
                  _instances(endpoint_name, utilization_metric, "Average"), utilization_threshold, 3, 3,
                  rolls_back=False),
        AlarmSpec("MemoryUtilization", f"{endpoint_name}: an instance's memory more than {MEMORY_PERCENT} % used for "
                  "10 minutes", _instances(endpoint_name, "MemoryUtilization", "Maximum"), MEMORY_PERCENT, 2, 2,
                  rolls_back=True),
        AlarmSpec("DiskUtilization", f"{endpoint_name}: an instance's disk is more than {DISK_PERCENT} % full",
                  _instances(endpoint_name, "DiskUtilization", "Maximum"), DISK_PERCENT, 1, 1, rolls_back=True),
    ]
    return tuple(alarms)
