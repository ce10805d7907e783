"""The rollback alarms as synthesized: each fires on a broken release, not on load or request shape, can reach its
threshold, and decides within the bake SageMaker watches it for.

Everything is read from the synthesized templates (the Endpoint's DeploymentConfig, the alarms' metrics, periods
and thresholds, the Model's environment) and checked against the definitions the stacks build them from
(stacks/endpoint_specs.py: each alarm's attainable ceiling, the namespaces' publishing delays; metric_logs: the
fewest tokens the slow-release metric counts), never against numbers copied here.
"""

from __future__ import annotations

import pytest

import cdk_testkit
from cdk_testkit import ENDPOINT_STACKS
from stacks import endpoint_specs
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
            assert ") - FILL(busy, 0)" in expression, name


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
