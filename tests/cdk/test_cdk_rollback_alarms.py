"""The rollback alarms as synthesized: each fires on a broken release, not on load or request shape, can reach its
threshold, and decides within the bake SageMaker watches it for, under CloudWatch's publishing delay.

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
    """Its DatapointsToAlarm periods, after up to one period until the fault's first whole one, then its metrics'
    publishing delay and one evaluation, fit in the bake; and its EvaluationPeriods cover the periods not yet
    published besides, so that CloudWatch's newest N existing datapoints hold the M breaches."""
    bake, alarms = rollback_alarms(pinned, kind)
    assert alarms
    for name, properties in alarms.items():
        metrics = metrics_of(properties)
        period = max(p for _, _, p in metrics)
        delay = max(delay_of(namespace) for namespace, _, _ in metrics)
        window = period + properties["DatapointsToAlarm"] * period + delay + endpoint_specs.ALARM_EVALUATION_S
        assert window <= bake, f"{name}: {window} s to fire, the bake is {bake} s"
        unpublished = -(-delay // period)
        assert properties["EvaluationPeriods"] >= properties["DatapointsToAlarm"] + unpublished, name


@pytest.mark.parametrize("kind", ENDPOINT_STACKS)
def test_no_alarm_fills_missing_data(pinned, kind):
    """FILL in an alarm reads the filler in the newest minutes, which the publishing delay keeps unpublished: the
    alarm would be stuck (AWS's metric math page, FILL)."""
    for alarm in pinned.resources(ENDPOINT_STACKS[kind], "AWS::CloudWatch::Alarm").values():
        for query in alarm["Properties"].get("Metrics", []):
            assert "FILL" not in query.get("Expression", ""), alarm["Properties"]["AlarmName"]


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
            # subtracted from the 5xx (the variant's series, or a pooled variant's MAX over its series), and
            # compared with them, nothing else
            assert re.search(r"(\berrors|\]\)) - busy\b", expression), name
            assert expression.count("busy") == 2 and re.search(r"(\berrors|\]\)) > busy\b", expression), name


@pytest.mark.parametrize("kind", ENDPOINT_STACKS)
def test_every_alarm_can_reach_its_threshold(pinned, kind):
    spec = specs_for(pinned)[kind]
    by_name = {spec.alarm_name(alarm): alarm for alarm in spec.alarms}
    environment = one_of(pinned, kind, "AWS::SageMaker::Model")["Properties"]["PrimaryContainer"]["Environment"]
    for alarm in scaled_out_of(pinned.resources(ENDPOINT_STACKS[kind], "AWS::CloudWatch::Alarm")).values():
        properties = alarm["Properties"]
        definition = by_name[properties["AlarmName"]]
        assert properties["Threshold"] == definition.threshold
        if definition.ceiling is not None:
            assert properties["Threshold"] < definition.ceiling, properties["AlarmName"]
        if definition.construct_id == "SlowCompute":
            # A request of the fewest tokens the metric counts, computed at the threshold, still succeeds before
            # the adapter's deadline: a release that slow answers 200s the alarm sees, not busy 503s.
            # An asynchronous endpoint's deadline is 90 % of its invocation timeout (ADAPTER_DEPLOYMENT=async).
            deadline = float(environment["ADAPTER_REQUEST_TIMEOUT_S"]) if "ADAPTER_REQUEST_TIMEOUT_S" in environment \
                else 0.9 * float(environment["ADAPTER_ASYNC_TIMEOUT_S"])
            assert properties["Threshold"] * metric_logs.MIN_TIMED_TOKENS / 1000 < deadline
            # SageMaker's invocation timeout: 60 s real time, InvocationTimeoutSeconds (at most 3600) asynchronous.
            assert deadline < (60 if "ADAPTER_REQUEST_TIMEOUT_S" in environment else 3600)


def scaled_out_of(alarms: dict[str, Any]) -> dict[str, Any]:
    """The endpoint's alarms but the asynchronous endpoint's scale-out from 0 (no name, no notification, no rollback:
    it only runs its step scaling policy, test_cdk_async.py)."""
    return {lid: alarm for lid, alarm in alarms.items() if "AlarmName" in alarm["Properties"]}


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
                                        r"600 s to fire, more than the 300 s bake"):
        endpoint_specs.endpoint_specs(load_environment(context["environments"], "dev", model_pins=["qwen3.5-4b"]))




# --- The evaluator against AWS's own examples -------------------------------------------------------------------

def test_the_evaluator_reads_missing_data_as_awss_metric_math_page_shows():
    """The comparison and IF tables of AWS's "Using metric math" page ('-': no value at that timestamp)."""
    def column(expression, **series):
        return [alarm_math.evaluate(expression, {name: values[i] for name, values in series.items()})
                for i in range(len(next(iter(series.values()))))]
    m1, m2 = [30.0, 20.0, 0.0, 0.0], [20.0, None, 20.0, None]
    assert column("metric1 < metric2", metric1=m1, metric2=m2) == [0, 0, 1, 0]
    assert column("metric1 >= 30", metric1=m1, metric2=m2) == [1, 0, 0, 0]
    assert column("metric1 > 15 AND metric2 > 15", metric1=m1, metric2=m2) == [1, 0, 0, 0]
    c, a, b = [1.0, 1.0, 0.0, 0.0, None], [30.0, None, 0.0, 0.0, 30.0], [0.0, 0.0, 20.0, None, 20.0]
    assert column("IF(metric1, metric2, metric3)", metric1=c, metric2=a, metric3=b) == [30, 0, 20, None, None]
    assert column("IF(metric1, 5, metric3)", metric1=c, metric3=b) == [5, 5, 20, None, None]
    assert column("IF(metric1, metric2, 5)", metric1=c, metric2=a) == [30, 0, 5, 5, 5]
    # "Missing values in a time series are treated as 0"; "the data point is dropped" on a division by zero.
    assert column("a + b", a=[1.0, None, None], b=[2.0, 3.0, None]) == [3, 3, None]
    assert column("a / b", a=[1.0, 1.0, None], b=[0.0, None, 4.0]) == [None, None, 0]
    assert column("FILL(a, 0)", a=[None, 2.0]) == [0, 2]


@pytest.mark.parametrize("periods, datapoints, expected", [
    # AWS's tables of "How alarm state is evaluated when data is missing", notBreaching column (newest last;
    # 5 retrieved for 3 evaluation periods).
    (3, 3, {"0 - X - X": False, "0 - - - -": False, "- - - - -": False, "0 X X - X": True, "- - X - -": False}),
    (3, 2, {"0 - X - X": True, "0 0 X 0 X": True, "0 - X - -": False, "- - - - 0": False, "- - - X -": False}),
])
def test_the_evaluator_sets_the_states_of_awss_missing_data_tables(periods, datapoints, expected):
    properties = {"EvaluationPeriods": periods, "DatapointsToAlarm": datapoints, "Threshold": 1,
                  "ComparisonOperator": "GreaterThanThreshold", "TreatMissingData": "notBreaching"}
    points = {"0": 0.0, "X": 2.0, "-": None}
    assert {row: alarm_math.in_alarm(properties, [points[p] for p in row.split()]) for row in expected} == expected


# --- The alarms as synthesized, fed what a release or load would make them read (alarm_math evaluates them). ---

def endpoint_view(synth, kind) -> dict[str, Any]:
    """What a scenario needs of one synthesized endpoint: its name, pools, instance types, the pinned model's size,
    the bake and the alarms (rollback or not)."""
    deployment = one_of(synth, kind, "AWS::SageMaker::Endpoint")["Properties"]["DeploymentConfig"]
    (variant,) = one_of(synth, kind, "AWS::SageMaker::EndpointConfig")["Properties"]["ProductionVariants"]
    rolls_back = {a["AlarmName"]["Ref"] for a in deployment["AutoRollbackConfiguration"]["Alarms"]}
    alarms = scaled_out_of(synth.resources(ENDPOINT_STACKS[kind], "AWS::CloudWatch::Alarm"))
    return {"name": f"{synth.prefix}-{kind.replace('_', '-')}", "adapter": kind in ADAPTER_KINDS,
            "pools": [p["InstanceType"] for p in variant.get("InstancePools", [])],
            "types": cdk_testkit.variant_instance_types(variant), "bake": bake_s(deployment),
            "gguf": sizing.model_bytes("qwen3.5-4b", cdk_testkit.MODEL_SHA256),
            "rollback": {alarms[lid]["Properties"]["AlarmName"].rsplit("-", 1)[1]: alarms[lid]["Properties"]
                         for lid in rolls_back},
            "alarms": {a["Properties"]["AlarmName"].rsplit("-", 1)[1]: a["Properties"] for a in alarms.values()}}


def minute(view, *, requests=0.0, busy=0.0, misses=0.0, failed=0.0, unlogged=0.0, ms_per_token=0.0, memory=40.0,
           disk=20.0, utilization=10.0, publish=("variant",), log_lines=None,
           oldest_request_s=None) -> alarm_math.Series:
    """One minute of an endpoint. ``requests`` reach the container: on the adapter each logs one line, ``busy``
    are refused at admission, ``misses`` run into their deadline, ``failed`` fail scoring (500), the rest answer
    200; SageMaker counts every 503 and 500 as Invocation5XXErrors (text generation: ``failed`` are its 5xx). Every
    job that ran (answered or stopped at its deadline) evaluates a measured decision's tokens at ``ms_per_token``.
    ``unlogged`` are 5xx that SageMaker answers without the container logging them (a crashed container).
    ``publish`` says which SageMaker series exist: the variant's ("variant") and/or each pool's ("pools",
    dimension InstanceType; counts split evenly); none when nothing was invoked. The log metrics exist (0 where no
    line matched) in a minute with any log line (``log_lines``; default: when requests were logged). An asynchronous
    endpoint's queue metrics (dimension EndpointName alone) read ``oldest_request_s`` for the age of its oldest
    request (None: not published)."""
    tokens = sizing.tokens_per_decision()
    assert tokens >= metric_logs.MIN_TIMED_TOKENS
    jobs = requests - busy - failed
    logged = requests > 0 if log_lines is None else log_lines
    adapter = {metric_logs.REQUESTS.metric_name: requests, metric_logs.BUSY_RESPONSES.metric_name: busy,
               metric_logs.DEADLINE_MISSES.metric_name: misses, metric_logs.SCORING_FAILURES.metric_name: failed,
               metric_logs.FAILED_REQUESTS.metric_name: failed,
               metric_logs.COMPUTE_SECONDS.metric_name: jobs * tokens * ms_per_token / 1000,
               metric_logs.EVALUATED_TOKENS.metric_name: jobs * tokens}
    invoked = requests + unlogged
    counts = {"Invocations": invoked, "Invocation5XXErrors": busy + misses + failed + unlogged}
    gauges = {"MemoryUtilization": memory, "DiskUtilization": disk, "CPUUtilization": utilization,
              "GPUUtilization": utilization}

    def series(namespace: str, metric: str, dimensions) -> alarm_math.Value:
        if namespace.startswith("DecisionAdapter/"):
            assert namespace == f"DecisionAdapter/{view['name']}"
            return adapter[metric] if logged else None
        if set(dimensions) == {"EndpointName"}:     # an asynchronous endpoint's queue
            assert dimensions["EndpointName"] == view["name"] and metric == "ApproximateAgeOfOldestRequest", metric
            return oldest_request_s
        assert dimensions["EndpointName"] == view["name"] and dimensions["VariantName"] == "AllTraffic"
        pool = dimensions.get("InstanceType")
        if ("pools" if pool else "variant") not in publish or (pool and pool not in view["pools"]):
            return None
        if namespace == "AWS/SageMaker":   # SageMaker publishes invocation metrics for minutes with invocations
            return counts[metric] / (len(view["pools"]) if pool else 1) if invoked else None
        return gauges[metric]

    return series


def outcomes(view, minutes, alarms="rollback") -> dict[str, list[int | None]]:
    """{alarm: for every assignment of publishing delays up to the assumed ones (each namespace family from 0 to
    its PUBLISHING_DELAY_S, in whole minutes), the seconds after the scenario's first minute began at which the
    alarm is first in ALARM (None: never)}."""
    most = endpoint_specs.PUBLISHING_DELAY_S
    return {name: [alarm_math.first_alarm(properties, minutes, delays)
                   for delays in alarm_math.delay_choices(properties, most)]
            for name, properties in view[alarms].items()}


def fired(view, minutes, alarms="rollback") -> set[str]:
    """The alarms that reach ALARM under some assignment of delays."""
    return {name for name, at in outcomes(view, minutes, alarms).items() if any(a is not None for a in at)}


def always_within_bake(view, name: str, minutes) -> bool:
    """The rollback alarm, its fault starting with the scenario's first whole minute (up to one period after the
    traffic shifted), is in ALARM under every assignment of delays, one evaluation after the time found at the
    latest, within the bake SageMaker watches it for."""
    period = alarm_math.period_of(view["rollback"][name])
    found = outcomes(view, minutes)[name]
    return all(at is not None and period + at + endpoint_specs.ALARM_EVALUATION_S <= view["bake"] for at in found)


def bake_minutes(view) -> int:
    return view["bake"] // 60


def long_run(view) -> int:
    return 2 * bake_minutes(view)


PUBLISHED = [("variant",), ("pools",), ("variant", "pools")]
# What each adapter kind's variant can publish: the GPU variant has instance pools (its series may be the pools'
# only); the CPU variant runs one instance type, whose series are the variant's (checked in the test).
KIND_PUBLISHES = [(kind, publish) for kind in ADAPTER_KINDS
                  for publish in (PUBLISHED if kind == "gpu" else [("variant",)])]


@pytest.mark.parametrize("kind, publish", KIND_PUBLISHES)
def test_a_release_twice_as_slow_per_token_rolls_back_within_the_bake(pinned, kind, publish):
    """Derived from the alarms and the sizing: on every instance type the variant runs on, a release that computes
    at half the derived speed (stacks/sizing.py) rolls back, whether its jobs still answer or run into their
    deadline (a fault, not load: metric_logs), under any publishing delay up to the assumed ones."""
    view = endpoint_view(pinned, kind)
    assert bool(view["pools"]) == (kind == "gpu"), "the kinds' pools are as KIND_PUBLISHES assumes"
    for instance_type in view["types"]:
        slow = 2 * sizing.ms_per_token(instance_type, view["gguf"])
        answered = [minute(view, requests=20, ms_per_token=slow, publish=publish)] * bake_minutes(view)
        assert always_within_bake(view, "SlowCompute", answered)
        late = [minute(view, requests=20, misses=20, ms_per_token=slow, publish=publish)] * bake_minutes(view)
        assert always_within_bake(view, "SlowCompute", late) and always_within_bake(view, "Invocation5xxRate", late)


@pytest.mark.parametrize("kind", ADAPTER_KINDS)
def test_a_release_that_fails_scoring_rolls_back_within_the_bake(pinned, kind):
    """10 % of requests fail scoring (500s): both the failure rate and the 5xx rate roll back, under any delay."""
    view = endpoint_view(pinned, kind)
    speed = sizing.ms_per_token(view["types"][0], view["gguf"])
    failing = [minute(view, requests=20, failed=2, ms_per_token=speed)] * bake_minutes(view)
    assert always_within_bake(view, "ScoringFailures", failing)
    assert always_within_bake(view, "Invocation5xxRate", failing)


@pytest.mark.parametrize("kind", ENDPOINT_STACKS)
def test_a_release_answering_5xx_rolls_back_within_the_bake(pinned, kind):
    """5xx of every origin: the adapter's deadline misses, and 5xx SageMaker answers for a container that logs
    nothing (crashed); text generation's 5xx. And an instance's memory or disk filling up."""
    view = endpoint_view(pinned, kind)
    publish = ("pools",) if view["pools"] else ("variant",)
    scenarios = [minute(view, unlogged=10, publish=publish)]
    if view["adapter"]:
        speed = sizing.ms_per_token(view["types"][0], view["gguf"])
        scenarios.append(minute(view, requests=20, misses=10, ms_per_token=speed, publish=publish))
    else:
        scenarios.append(minute(view, requests=20, failed=5, publish=publish))
    for scenario in scenarios:
        assert always_within_bake(view, "Invocation5xxRate", [scenario] * bake_minutes(view))
    assert always_within_bake(view, "MemoryUtilization", [minute(view, requests=20, memory=95, publish=publish)]
                              * bake_minutes(view))
    assert always_within_bake(view, "DiskUtilization", [minute(view, requests=20, disk=90, publish=publish)]
                              * bake_minutes(view))


@pytest.mark.parametrize("kind", ADAPTER_KINDS)
@pytest.mark.parametrize("refused", [0.0, 0.5, 0.99])
def test_load_alone_rolls_nothing_back(pinned, kind, refused):
    """Load at the configured concurrency: the adapter admits what it can finish by the deadline at the measured
    speed and refuses the rest with its busy 503 (which SageMaker counts as 5xx); queueing adds nothing to a job's
    own compute (one job at a time: docs/benchmarks.md, Concurrency, 1.00x). However much is refused, and however
    SageMaker's and the log metrics' delays differ (SageMaker's 5xx in before the busy count that cancels them), no
    rollback alarm fires; BusyRate (which notifies, never rolls back) does above its threshold."""
    view = endpoint_view(pinned, kind)
    publish = ("variant", "pools") if view["pools"] else ("variant",)
    requests = 16 * 10   # the adapter's queue depth (settings.py, ADAPTER_QUEUE_DEPTH) times 10 rounds a minute
    for instance_type in view["types"]:
        speed = sizing.ms_per_token(instance_type, view["gguf"])
        load = [minute(view, requests=requests, busy=requests * refused, ms_per_token=speed, utilization=95 * 8,
                       publish=publish)] * long_run(view)
        assert not fired(view, load)
        busy = outcomes(view, load, alarms="alarms")["BusyRate"]
        assert all((at is not None) == (100 * refused > view["alarms"]["BusyRate"]["Threshold"]) for at in busy)


@pytest.mark.parametrize("kind", ADAPTER_KINDS)
@pytest.mark.parametrize("traffic, refused", [(0, 0.0), (1, 0.0), (20, 0.0), (160, 0.5)])
def test_a_single_scoring_failure_rolls_nothing_back(pinned, kind, traffic, refused):
    """One bad request (a 500 'scoring failed') in a run, alone in its minute or among healthy requests, on a quiet
    endpoint, a busy one, or one refusing half its load: at worst one minute above the rate (and, while SageMaker's
    minutes are in before the log metrics', the busy minutes beside it), never the breaches that roll back."""
    view = endpoint_view(pinned, kind)
    speed = sizing.ms_per_token(view["types"][0], view["gguf"])
    healthy = minute(view, requests=traffic, busy=traffic * refused, ms_per_token=speed)
    bad = minute(view, requests=traffic + 1, busy=traffic * refused, failed=1, ms_per_token=speed)
    for at in range(0, long_run(view), 3):
        assert not fired(view, [healthy] * at + [bad] + [healthy] * (long_run(view) - at - 1)), at


@pytest.mark.parametrize("kind", ENDPOINT_STACKS)
def test_a_quiet_endpoint_fires_nothing(pinned, kind):
    """No requests at all: SageMaker publishes no invocation metrics, the container logs nothing (or only lines
    that are not requests, so the log metrics read 0): no alarm fires, rollback or not."""
    view = endpoint_view(pinned, kind)
    for log_lines in (False, True):
        quiet = [minute(view, log_lines=log_lines, publish=("variant", "pools"))] * long_run(view)
        assert not fired(view, quiet, alarms="alarms"), log_lines


@pytest.mark.parametrize("publish", PUBLISHED)
def test_gpu_rollback_alarms_see_per_instance_type_series(pinned, publish):
    """A pooled variant may publish only per-InstanceType series: faults, memory growth and a full disk still roll
    back, and a healthy release still does not."""
    view = endpoint_view(pinned, "gpu")
    assert len(view["pools"]) >= 2
    speed = sizing.ms_per_token(view["types"][0], view["gguf"])

    def scenario(**kwargs):
        return set(fired(view, [minute(view, requests=20, ms_per_token=speed, publish=publish, **kwargs)]
                         * bake_minutes(view)))

    assert scenario() == set()
    assert scenario(misses=10) == {"Invocation5xxRate"}
    assert scenario(memory=95) == {"MemoryUtilization"}
    assert scenario(disk=90) == {"DiskUtilization"}
    # 5xx that the adapter never logged (SageMaker answers them: the container crashed) count too.
    crashed = fired(view, [minute(view, requests=0, unlogged=10, publish=publish)] * bake_minutes(view))
    assert set(crashed) == {"Invocation5xxRate"}


def test_the_scenarios_read_only_what_the_alarms_define(pinned):
    """alarm_math refuses an id an expression reads but no query defines: every synthesized expression parses."""
    for kind in ENDPOINT_STACKS:
        for alarm in pinned.resources(ENDPOINT_STACKS[kind], "AWS::CloudWatch::Alarm").values():
            properties = alarm["Properties"]
            value = alarm_math.alarm_value(properties, {q: 1.0 for q in alarm_math.metric_queries(properties)})
            assert value is not None, properties["AlarmName"]


def test_an_undrained_async_queue_notifies_and_rolls_nothing_back(pinned):
    """The asynchronous endpoint's OldestRequestAge: a queue whose oldest request is older than an instance's start
    from zero and one invocation fires it (to the topic); one under that does not; it never rolls an update back."""
    view = endpoint_view(pinned, "async")
    threshold = view["alarms"]["OldestRequestAge"]["Threshold"]
    assert "OldestRequestAge" not in view["rollback"]
    stuck = [minute(view, oldest_request_s=threshold + 60)] * long_run(view)
    assert "OldestRequestAge" in fired(view, stuck, alarms="alarms") and not fired(view, stuck)
    draining = [minute(view, oldest_request_s=threshold - 60)] * long_run(view)
    assert "OldestRequestAge" not in fired(view, draining, alarms="alarms")
