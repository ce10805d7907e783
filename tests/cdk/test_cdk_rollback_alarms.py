"""The rollback alarms as synthesized: each fires on a broken release, not on load or request shape, can reach its
threshold, and decides within the bake SageMaker watches it for.

Everything is read from the synthesized templates (the Endpoint's DeploymentConfig, the alarms' metrics, periods
and thresholds, the Model's environment) and checked against the definitions the stacks build them from
(stacks/endpoint_specs.py: each alarm's attainable ceiling, the namespaces' publishing delays; metric_logs: the
fewest tokens the slow-release metric counts), never against numbers copied here.
"""

from __future__ import annotations

from typing import Any

import re

import pytest

import alarm_math
import cdk_testkit
from cdk_testkit import ENDPOINT_STACKS
from stacks import endpoint_specs, sizing
from stacks.adapter_logs import metric_logs
from stacks.config import ADAPTER_KINDS, load_environment

# Metrics that load or the request's shape move: a rollback on them rolls back healthy releases under load.
LOAD_METRICS = {("AWS/SageMaker", name) for name in ("ModelLatency", "OverheadLatency", "ModelSetupTime")} | {
    ("/aws/sagemaker/Endpoints", name) for name in ("CPUUtilization", "GPUUtilization", "GPUMemoryUtilization")}


def specs_for(synth) -> dict[str, endpoint_specs.EndpointSpec]:
    context = cdk_testkit.context_for(synth.env)
    config = load_environment(context["environments"], synth.env, model_pins=["qwen3.5-4b"])
    return {spec.kind: spec for spec in endpoint_specs.endpoint_specs(config)}


def one_of(synth, kind, resource_type):
    (resource,) = synth.resources(ENDPOINT_STACKS[kind], resource_type).values()
    return resource


def bake_s(deployment: dict) -> int:
    if "RollingUpdatePolicy" in deployment:
        return deployment["RollingUpdatePolicy"]["WaitIntervalInSeconds"]
    return deployment["BlueGreenUpdatePolicy"]["TrafficRoutingConfiguration"]["WaitIntervalInSeconds"]


def metrics_of(properties: dict) -> list[tuple[str, str, int]]:
    """(namespace, metric name, period) of every metric an alarm reads, plain or in metric math."""
    if "Metrics" not in properties:
        return [(properties["Namespace"], properties["MetricName"], properties["Period"])]
    return [(m["MetricStat"]["Metric"]["Namespace"], m["MetricStat"]["Metric"]["MetricName"], m["MetricStat"]["Period"])
            for m in properties["Metrics"] if "MetricStat" in m]


def delay_of(namespace: str) -> int:
    family = namespace.split("/", 1)[0] if namespace.startswith("DecisionAdapter/") else namespace
    return endpoint_specs.PUBLISHING_DELAY_S[family]


def rollback_alarms(synth, kind) -> tuple[int, dict[str, dict]]:
    """The bake and {alarm name: properties} of every alarm the endpoint's AutoRollbackConfiguration names."""
    deployment = one_of(synth, kind, "AWS::SageMaker::Endpoint")["Properties"]["DeploymentConfig"]
    named = {a["AlarmName"]["Ref"] for a in deployment["AutoRollbackConfiguration"]["Alarms"]}
    alarms = synth.resources(ENDPOINT_STACKS[kind], "AWS::CloudWatch::Alarm")
    return bake_s(deployment), {alarms[lid]["Properties"]["AlarmName"]: alarms[lid]["Properties"] for lid in named}


@pytest.mark.parametrize("kind", ENDPOINT_STACKS)
def test_every_rollback_alarm_decides_within_the_bake(pinned, kind):
    bake, alarms = rollback_alarms(pinned, kind)
    assert alarms
    for name, properties in alarms.items():
        metrics = metrics_of(properties)
        window = (properties["EvaluationPeriods"] * max(period for _, _, period in metrics)
                  + max(delay_of(namespace) for namespace, _, _ in metrics) + endpoint_specs.ALARM_EVALUATION_S)
        assert window <= bake, f"{name}: {window} s to fire, the bake is {bake} s"
        assert properties["DatapointsToAlarm"] <= properties["EvaluationPeriods"]


@pytest.mark.parametrize("kind", ENDPOINT_STACKS)
def test_no_rollback_alarm_reads_a_metric_that_load_or_request_shape_moves(pinned, kind):
    _, alarms = rollback_alarms(pinned, kind)
    for name, properties in alarms.items():
        read = {(namespace, metric) for namespace, metric, _ in metrics_of(properties)}
        assert not read & LOAD_METRICS, name
        assert not any("Latency" in metric for _, metric in read), name
        # The busy 503 is load: it may only be subtracted from the fault count, never alarmed on.
        if any(metric == metric_logs.BUSY_RESPONSES.metric_name for _, metric in read):
            (expression,) = [m["Expression"] for m in properties["Metrics"] if "Expression" in m]
            # subtracted from the 5xx (the variant's series, or a pooled variant's MAX over its series)
            assert re.search(r"(\berrors|\]\)) - FILL\(busy, 0\)", expression), name
            assert expression.count("busy") == expression.count("FILL(busy, 0)"), name


@pytest.mark.parametrize("kind", ENDPOINT_STACKS)
def test_every_alarm_can_reach_its_threshold(pinned, kind):
    spec = specs_for(pinned)[kind]
    by_name = {spec.alarm_name(alarm): alarm for alarm in spec.alarms}
    environment = one_of(pinned, kind, "AWS::SageMaker::Model")["Properties"]["PrimaryContainer"]["Environment"]
    for alarm in pinned.resources(ENDPOINT_STACKS[kind], "AWS::CloudWatch::Alarm").values():
        properties = alarm["Properties"]
        definition = by_name[properties["AlarmName"]]
        assert properties["Threshold"] == definition.threshold
        if definition.ceiling is not None:
            assert properties["Threshold"] < definition.ceiling, properties["AlarmName"]
        if definition.construct_id == "SlowCompute":
            # A request of the fewest tokens the metric counts, computed at the threshold, still succeeds before
            # the adapter's deadline: a release that slow answers 200s the alarm sees, not busy 503s.
            deadline = float(environment["ADAPTER_REQUEST_TIMEOUT_S"])
            assert properties["Threshold"] * metric_logs.MIN_TIMED_TOKENS / 1000 < deadline
            assert deadline < 60   # SageMaker's invocation timeout


def test_the_slow_release_metric_counts_every_job_with_enough_tokens_deadline_misses_included(pinned):
    for kind in ADAPTER_KINDS:
        filters = {f["Properties"]["MetricTransformations"][0]["MetricName"]: f["Properties"]["FilterPattern"]
                   for f in pinned.resources(ENDPOINT_STACKS[kind], "AWS::Logs::MetricFilter").values()}
        for metric in (metric_logs.COMPUTE_SECONDS, metric_logs.EVALUATED_TOKENS):
            assert "$.status" not in filters[metric.metric_name]
            assert f"$.evaluated_tokens >= {metric_logs.MIN_TIMED_TOKENS}" in filters[metric.metric_name]


def test_a_bake_too_short_for_an_alarm_is_a_config_error(monkeypatch):
    monkeypatch.setattr(endpoint_specs, "BAKE_S", 300)
    context = cdk_testkit.context_for("dev")
    with pytest.raises(Exception, match=r"environments\.dev\.cpu: the rollback alarm Invocation5xxRate needs up to "
                                        r"420 s to fire, more than the 300 s bake"):
        endpoint_specs.endpoint_specs(load_environment(context["environments"], "dev", model_pins=["qwen3.5-4b"]))


# --- The alarms as synthesized, fed what a release or load would make them read (alarm_math evaluates them). ---

def endpoint_view(synth, kind) -> dict[str, Any]:
    """What a scenario needs of one synthesized endpoint: its name, pools, instance types, the pinned model's size,
    the bake and the alarms (rollback or not)."""
    deployment = one_of(synth, kind, "AWS::SageMaker::Endpoint")["Properties"]["DeploymentConfig"]
    (variant,) = one_of(synth, kind, "AWS::SageMaker::EndpointConfig")["Properties"]["ProductionVariants"]
    rolls_back = {a["AlarmName"]["Ref"] for a in deployment["AutoRollbackConfiguration"]["Alarms"]}
    alarms = synth.resources(ENDPOINT_STACKS[kind], "AWS::CloudWatch::Alarm")
    return {"name": f"{synth.prefix}-{kind.replace('_', '-')}",
            "pools": [p["InstanceType"] for p in variant.get("InstancePools", [])],
            "types": cdk_testkit.variant_instance_types(variant), "bake": bake_s(deployment),
            "gguf": sizing.model_bytes("qwen3.5-4b", cdk_testkit.MODEL_SHA256),
            "rollback": {alarms[lid]["Properties"]["AlarmName"].rsplit("-", 1)[1]: alarms[lid]["Properties"]
                         for lid in rolls_back},
            "alarms": {a["Properties"]["AlarmName"].rsplit("-", 1)[1]: a["Properties"] for a in alarms.values()}}


def minute(view, *, requests=0.0, busy=0.0, misses=0.0, failed=0.0, unlogged=0.0, ms_per_token=0.0, memory=40.0,
           disk=20.0, utilization=10.0, publish=("variant",)) -> alarm_math.Series:
    """One minute of an adapter endpoint. ``requests`` reach the adapter (each logs one line): ``busy`` are refused
    at admission, ``misses`` run into their deadline, ``failed`` fail scoring (500), the rest answer 200; SageMaker
    counts every 503 and 500 as Invocation5XXErrors. Every job that ran (answered or stopped at its deadline)
    evaluates a measured decision's tokens at ``ms_per_token``. ``unlogged`` are 5xx that SageMaker answers without
    the adapter logging them (a crashed container). ``publish`` says which SageMaker series exist: the
    variant's ("variant") and/or each pool's ("pools", dimension InstanceType; counts split evenly)."""
    tokens = sizing.tokens_per_decision()
    assert tokens >= metric_logs.MIN_TIMED_TOKENS
    jobs = requests - busy - failed
    logged = requests > 0   # a metric filter publishes (its default 0) only for minutes with log events
    adapter = {metric_logs.REQUESTS.metric_name: requests, metric_logs.BUSY_RESPONSES.metric_name: busy,
               metric_logs.DEADLINE_MISSES.metric_name: misses, metric_logs.SCORING_FAILURES.metric_name: failed,
               metric_logs.FAILED_REQUESTS.metric_name: failed,
               metric_logs.COMPUTE_SECONDS.metric_name: jobs * tokens * ms_per_token / 1000,
               metric_logs.EVALUATED_TOKENS.metric_name: jobs * tokens}
    counts = {"Invocations": requests + unlogged, "Invocation5XXErrors": busy + misses + failed + unlogged}
    gauges = {"MemoryUtilization": memory, "DiskUtilization": disk, "CPUUtilization": utilization,
              "GPUUtilization": utilization}

    def series(namespace: str, metric: str, dimensions) -> alarm_math.Value:
        if namespace.startswith("DecisionAdapter/"):
            assert namespace == f"DecisionAdapter/{view['name']}"
            return adapter[metric] if logged else None
        assert dimensions["EndpointName"] == view["name"] and dimensions["VariantName"] == "AllTraffic"
        pool = dimensions.get("InstanceType")
        if ("pools" if pool else "variant") not in publish or (pool and pool not in view["pools"]):
            return None
        if namespace == "AWS/SageMaker":
            return counts[metric] / (len(view["pools"]) if pool else 1)
        return gauges[metric]

    return series


def fired(view, minutes, alarms="rollback") -> dict[str, int]:
    """{alarm: the minute it reached ALARM} over the scenario, for the rollback alarms (or all)."""
    found = {name: alarm_math.first_alarm(properties, minutes) for name, properties in view[alarms].items()}
    return {name: at for name, at in found.items() if at is not None}


def within_bake(view, name: str, at: int) -> bool:
    """The alarm, breaching from the first minute, is in ALARM after ``at`` periods, its metrics' publishing delay
    and one evaluation: within the bake SageMaker watches it for."""
    properties = view["rollback"][name]
    metrics = metrics_of(properties)
    window = (at * max(period for _, _, period in metrics) + max(delay_of(namespace) for namespace, _, _ in metrics)
              + endpoint_specs.ALARM_EVALUATION_S)
    return window <= view["bake"]


BAKE_MINUTES = 10


PUBLISHED = [("variant",), ("pools",), ("variant", "pools")]
# What each adapter kind's variant can publish: the GPU variant has instance pools (its series may be the pools'
# only); the CPU variant runs one instance type, whose series are the variant's (checked in the test).
KIND_PUBLISHES = [(kind, publish) for kind in ADAPTER_KINDS
                  for publish in (PUBLISHED if kind == "gpu" else [("variant",)])]


@pytest.mark.parametrize("kind, publish", KIND_PUBLISHES)
def test_a_release_twice_as_slow_per_token_rolls_back_within_the_bake(pinned, kind, publish):
    """Derived from the alarms and the sizing: on every instance type the variant runs on, a release that computes
    at half the derived speed (stacks/sizing.py) rolls back, whether its jobs still answer or run into their
    deadline (a fault, not load: metric_logs)."""
    view = endpoint_view(pinned, kind)
    assert bool(view["pools"]) == (kind == "gpu"), "the kinds' pools are as KIND_PUBLISHES assumes"
    for instance_type in view["types"]:
        slow = 2 * sizing.ms_per_token(instance_type, view["gguf"])
        answered = fired(view, [minute(view, requests=20, ms_per_token=slow, publish=publish)] * BAKE_MINUTES)
        assert "SlowCompute" in answered and within_bake(view, "SlowCompute", answered["SlowCompute"]), answered
        late = fired(view, [minute(view, requests=20, misses=20, ms_per_token=slow, publish=publish)] * BAKE_MINUTES)
        assert {"SlowCompute", "Invocation5xxRate"} <= set(late), late
        assert all(within_bake(view, name, at) for name, at in late.items())


@pytest.mark.parametrize("kind", ADAPTER_KINDS)
@pytest.mark.parametrize("refused", [0.0, 0.5, 0.9, 0.99])
def test_load_alone_rolls_nothing_back(pinned, kind, refused):
    """Load at the configured concurrency: the adapter admits what it can finish by the deadline at the measured
    speed and refuses the rest with its busy 503 (which SageMaker counts as 5xx); queueing adds nothing to a job's
    own compute (one job at a time: docs/benchmarks.md, Concurrency, 1.00x). However much is refused, no rollback
    alarm fires; BusyRate (which notifies, never rolls back) does above its threshold."""
    view = endpoint_view(pinned, kind)
    publish = ("variant", "pools") if view["pools"] else ("variant",)
    requests = 16 * 10   # the adapter's queue depth (settings.py, ADAPTER_QUEUE_DEPTH) times 10 rounds a minute
    for instance_type in view["types"]:
        speed = sizing.ms_per_token(instance_type, view["gguf"])
        load = minute(view, requests=requests, busy=requests * refused, ms_per_token=speed, utilization=95 * 8,
                      publish=publish)
        assert fired(view, [load] * BAKE_MINUTES) == {}
        alerts = fired(view, [load] * BAKE_MINUTES, alarms="alarms")
        assert ("BusyRate" in alerts) == (100 * refused > view["alarms"]["BusyRate"]["Threshold"]), alerts


@pytest.mark.parametrize("kind", ADAPTER_KINDS)
@pytest.mark.parametrize("traffic", [0, 1, 20])
def test_a_single_scoring_failure_rolls_nothing_back(pinned, kind, traffic):
    """One bad request (a 500 'scoring failed') in a bake, alone in its minute or among healthy requests, on a
    quiet endpoint or a busy one: at worst one minute above the rate, never the 3 in a row that roll back."""
    view = endpoint_view(pinned, kind)
    speed = sizing.ms_per_token(view["types"][0], view["gguf"])
    healthy = minute(view, requests=traffic, ms_per_token=speed)
    bad = minute(view, requests=traffic + 1, failed=1, ms_per_token=speed)
    for at in range(BAKE_MINUTES):
        assert fired(view, [healthy] * at + [bad] + [healthy] * (BAKE_MINUTES - at - 1)) == {}
    # A release that fails more than the rate for 3 minutes does roll back.
    failing = minute(view, requests=20, failed=2, ms_per_token=speed)
    assert set(fired(view, [failing] * BAKE_MINUTES)) == {"ScoringFailures", "Invocation5xxRate"}


@pytest.mark.parametrize("publish", PUBLISHED)
def test_gpu_rollback_alarms_see_per_instance_type_series(pinned, publish):
    """A pooled variant may publish only per-InstanceType series: faults, memory growth and a full disk still roll
    back, and a healthy release still does not."""
    view = endpoint_view(pinned, "gpu")
    assert len(view["pools"]) >= 2
    speed = sizing.ms_per_token(view["types"][0], view["gguf"])

    def scenario(**kwargs):
        return fired(view, [minute(view, requests=20, ms_per_token=speed, publish=publish, **kwargs)] * BAKE_MINUTES)

    assert scenario() == {}
    assert set(scenario(misses=10)) == {"Invocation5xxRate"}
    assert set(scenario(memory=95)) == {"MemoryUtilization"}
    assert set(scenario(disk=90)) == {"DiskUtilization"}
    # 5xx that the adapter never logged (SageMaker answers them: the container crashed) count too.
    crashed = fired(view, [minute(view, requests=0, unlogged=10, publish=publish)] * BAKE_MINUTES)
    assert set(crashed) == {"Invocation5xxRate"}


def test_the_scenarios_read_only_what_the_alarms_define(pinned):
    """alarm_math refuses an id an expression reads but no query defines: every synthesized expression parses."""
    for kind in ENDPOINT_STACKS:
        for alarm in pinned.resources(ENDPOINT_STACKS[kind], "AWS::CloudWatch::Alarm").values():
            properties = alarm["Properties"]
            value = alarm_math.alarm_value(properties, lambda namespace, metric, dimensions: 1.0)
            assert value is not None, properties["AlarmName"]
