"""python -m endpoint_client acceptance: how it reads what AWS answers. Against moto the deploy rehearsal runs it end
to end (every check unprovable there, each with its reason: tests/deploy/test_rehearse.py); here the answers a
real account gives (CloudWatch's alarm history, ListMetrics' series, DiskUtilization datapoints), in the response
shapes of botocore's models, decide proved or failed."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import botocore.session
import pytest

from deploy.pins import pinned_context
from endpoint_client import acceptance
from stacks.config import load_environment

ROOT = Path(__file__).resolve().parents[2]
TOPIC = "arn:aws:sns:eu-west-1:111122223333:decision-dev-alarms"
CLOUDWATCH = botocore.session.get_session().get_service_model("cloudwatch")


def config():
    context = pinned_context(json.loads((ROOT / "cdk.json").read_text())["context"])
    return load_environment(context["environments"], "dev", model_pins=["qwen3.5-4b"])


class FakeCloudWatch:
    def __init__(self, history=(), metrics=(), datapoints=()):
        self.history, self.metrics, self.datapoints, self.states = list(history), list(metrics), list(datapoints), []

    def set_alarm_state(self, AlarmName, StateValue, StateReason):
        self.states.append((AlarmName, StateValue))

    def describe_alarms(self, AlarmNames):
        return {"MetricAlarms": [{"AlarmName": AlarmNames[0], "StateValue": self.states[-1][1]}]}

    def describe_alarm_history(self, **kwargs):
        assert kwargs["HistoryItemType"] == "Action"
        return {"AlarmHistoryItems": [{"AlarmName": kwargs["AlarmName"], "HistoryItemType": "Action",
                                       "HistorySummary": summary} for summary in self.history]}

    def list_metrics(self, **kwargs):
        return {"Metrics": self.metrics}

    def get_metric_statistics(self, **kwargs):
        return {"Datapoints": self.datapoints}


def checker(cloudwatch, emulator=None):
    aws = SimpleNamespace(client=lambda service: cloudwatch)
    return acceptance.Acceptance(config(), aws, emulator=emulator, wait_s=0, examples=ROOT / "examples",
                                 sleep=lambda s: None)


def test_the_response_shapes_read_here_are_cloudwatchs():
    history = CLOUDWATCH.operation_model("DescribeAlarmHistory").output_shape.members["AlarmHistoryItems"].member
    assert {"AlarmName", "HistoryItemType", "HistorySummary"} <= set(history.members)
    assert "Action" in CLOUDWATCH.shape_for("HistoryItemType").enum
    metric = CLOUDWATCH.operation_model("ListMetrics").output_shape.members["Metrics"].member
    assert {"Namespace", "MetricName", "Dimensions"} <= set(metric.members)


@pytest.mark.parametrize("summary, state", [
    (f"Successfully executed action {TOPIC}", "proved"),
    (f"Failed to execute action {TOPIC}. Received error: \"CloudWatch Alarms does not have authorization to access "
     "the SNS topic encryption key.\"", "failed"),
])
def test_alarm_delivery_is_what_cloudwatch_recorded_and_the_alarm_goes_back_to_ok(summary, state):
    cloudwatch = FakeCloudWatch(history=[summary])
    result = checker(cloudwatch).deliver(cloudwatch, "decision-dev-cpu-DiskUtilization", TOPIC)
    assert (result.state, result.detail) == (state, summary)
    assert cloudwatch.states == [("decision-dev-cpu-DiskUtilization", "ALARM"), ("decision-dev-cpu-DiskUtilization", "OK")]


def test_no_recorded_notification_fails_on_aws_and_is_unprovable_on_moto():
    assert checker(FakeCloudWatch()).deliver(FakeCloudWatch(), "a", TOPIC).state == "failed"
    moto = checker(FakeCloudWatch(), emulator="moto").deliver(FakeCloudWatch(), "a", TOPIC)
    assert moto.state == "unprovable" and "runs no alarm actions" in moto.detail


ALARM = {"AlarmName": "decision-dev-gpu-MemoryUtilization", "Namespace": "/aws/sagemaker/Endpoints",
         "MetricName": "MemoryUtilization", "Threshold": 90,
         "Dimensions": [{"Name": "EndpointName", "Value": "decision-dev-gpu"}, {"Name": "VariantName", "Value": "AllTraffic"}]}


def test_an_alarm_whose_series_exists_is_proved():
    series = {"Namespace": ALARM["Namespace"], "MetricName": ALARM["MetricName"], "Dimensions": ALARM["Dimensions"]}
    (result,) = checker(FakeCloudWatch(metrics=[series])).metric_checks("gpu", [ALARM])
    assert result.state == "proved"


def test_an_alarm_on_the_variant_alone_reads_nothing_where_only_per_instance_type_series_exist():
    series = {"Namespace": ALARM["Namespace"], "MetricName": ALARM["MetricName"],
              "Dimensions": ALARM["Dimensions"] + [{"Name": "InstanceType", "Value": "ml.g6e.xlarge"}]}
    (result,) = checker(FakeCloudWatch(metrics=[series])).metric_checks("gpu", [ALARM])
    assert result.state == "failed" and "only series with other dimensions (InstanceType) exist" in result.detail


def pooled_alarm(name: str, metric: str) -> dict:
    """A GPU alarm as stacks/endpoint_specs.py builds it (DescribeAlarms' shape): metric math over the variant's
    series and every pool's."""
    pools = config().gpu.instance_pools
    variant = ALARM["Dimensions"]
    queries = [{"Id": "m" + (str(i) if pool else ""), "ReturnData": False, "MetricStat": {
        "Metric": {"Namespace": ALARM["Namespace"], "MetricName": metric,
                   "Dimensions": variant + ([{"Name": "InstanceType", "Value": pool}] if pool else [])},
        "Period": 60, "Stat": "Maximum"}} for i, pool in [(None, None), *enumerate(pools)]]
    return {"AlarmName": f"decision-dev-gpu-{name}", "Threshold": 85,
            "Metrics": [{"Id": "expr_1", "Expression": "MAX([...])", "ReturnData": True}, *queries]}


def series_of(alarm: dict) -> list[dict]:
    return [q["MetricStat"]["Metric"] for q in alarm["Metrics"] if "MetricStat" in q]


def test_a_pooled_alarm_is_proved_by_the_pools_series_alone_or_the_variants():
    alarm = pooled_alarm("MemoryUtilization", "MemoryUtilization")
    variant, *pools = series_of(alarm)
    assert len(pools) == len(config().gpu.instance_pools) >= 2
    for published in ([pools[0]], pools, [variant]):
        (result,) = checker(FakeCloudWatch(metrics=published)).metric_checks("gpu", [alarm])
        assert result.state == "proved", published
        assert f"{len(published)} of the {1 + len(pools)} series the alarm reads exist" in result.detail
    (result,) = checker(FakeCloudWatch()).metric_checks("gpu", [alarm])
    assert result.state == "failed" and "no data" in result.detail
    other = {**variant, "Dimensions": variant["Dimensions"] + [{"Name": "InstanceType", "Value": "ml.p5.48xlarge"}]}
    (result,) = checker(FakeCloudWatch(metrics=[other])).metric_checks("gpu", [alarm])
    assert result.state == "failed" and "reads no data" in result.detail


def test_storage_reads_every_series_the_disk_alarm_reads():
    class PerSeries(FakeCloudWatch):
        def get_metric_statistics(self, **kwargs):
            self.asked.append({d["Name"]: d["Value"] for d in kwargs["Dimensions"]})
            return {"Datapoints": [{"Maximum": 91.0}] if "InstanceType" in self.asked[-1] else []}

    cloudwatch = PerSeries()
    cloudwatch.asked = []
    disk = pooled_alarm("DiskUtilization", "DiskUtilization")
    result = checker(cloudwatch).storage("gpu", [disk])
    assert result.state == "failed" and "91.0 %" in result.detail   # a pool's series only, above 85 %
    assert cloudwatch.asked == [{d["Name"]: d["Value"] for d in m["Dimensions"]} for m in series_of(disk)]


@pytest.mark.parametrize("used, state", [(31.0, "proved"), (86.0, "failed")])
def test_storage_is_measured_against_the_disk_alarm(used, state):
    disk = {**ALARM, "AlarmName": "decision-dev-cpu-DiskUtilization", "Threshold": 85}
    result = checker(FakeCloudWatch(datapoints=[{"Maximum": used}, {"Maximum": 12.0}])).storage("cpu", [disk])
    assert result.state == state and f"{used:.1f} %" in result.detail


def test_a_drill_needs_something_that_makes_the_release_fail(capsys):
    code = acceptance.main(["-c", "env=dev", "--cdk-json", str(ROOT / "cdk.json"), "--rollback-drill", "cpu"])
    assert code == 2 and "--rollback-drill needs --drill-fault (or --drill-environment, --drill-image)" in \
        capsys.readouterr().err
    code = acceptance.main(["-c", "env=dev", "--cdk-json", str(ROOT / "cdk.json"), "--rollback-drill",
                            "text_generation", "--drill-fault", "fail"])
    assert code == 2 and "the text_generation endpoint is not the adapter (no ADAPTER_DRILL)" in \
        capsys.readouterr().err


# --- the rollback drill, against SageMaker's and CloudWatch's answers (botocore's shapes) ---------------------------

STARTED = datetime(2027, 1, 1, 12, 0, tzinfo=timezone.utc)


class DrillAccount:
    """An endpoint that a drill updates, and what SageMaker and CloudWatch then answer: ``outcome`` is rolled_back
    (back on the stack's config, with SageMaker's FailureReason) or completed (on the drill's config); ``history`` the
    rollback alarms' StateUpdate items."""

    def __init__(self, outcome, reason=None, history=()):
        self.outcome, self.reason, self.history = outcome, reason, list(history)
        self.calls, self.status, self.config, self.sent = [], "InService", "stack-config", []
        self.endpoint_url = None
        self.session = SimpleNamespace(client=lambda service, **_: self)

    def client(self, service):
        return self

    # sagemaker
    def describe_endpoint(self, EndpointName):
        if self.status == "Updating":
            self.status = "InService"
            if self.outcome == "rolled_back":
                self.config = "stack-config"
            return {"EndpointStatus": "Updating", "EndpointConfigName": self.config}
        answer = {"EndpointStatus": self.status, "EndpointConfigName": self.config, "LastDeploymentConfig": {
            "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": f"{EndpointName}-ScoringFailures"},
                                                     {"AlarmName": f"{EndpointName}-SlowCompute"}]}}}
        if self.reason and self.config == "stack-config" and self.calls:
            answer["FailureReason"] = self.reason
        return answer

    def describe_endpoint_config(self, EndpointConfigName):
        return {"ProductionVariants": [{"VariantName": "AllTraffic", "ModelName": "stack-model",
                                        "InstanceType": "ml.c7i.xlarge", "InitialInstanceCount": 1}],
                "KmsKeyId": "arn:aws:kms:eu-west-1:111122223333:key/k"}

    def describe_model(self, ModelName):
        return {"ModelName": ModelName, "ExecutionRoleArn": "arn:aws:iam::111122223333:role/decision-dev-cpu-execution",
                "EnableNetworkIsolation": True, "PrimaryContainer": {"Image": "img@sha256:" + "a" * 64,
                                                                     "Environment": {"ADAPTER_THREADS": "2"}}}

    def create_model(self, **kwargs):
        self.calls.append(("CreateModel", kwargs))

    def create_endpoint_config(self, **kwargs):
        self.calls.append(("CreateEndpointConfig", kwargs))

    def update_endpoint(self, **kwargs):
        self.calls.append(("UpdateEndpoint", kwargs))
        if kwargs["EndpointConfigName"] != "stack-config":
            self.status, self.config = "Updating", kwargs["EndpointConfigName"]
        else:
            self.config = "stack-config"

    def delete_endpoint_config(self, **kwargs):
        self.calls.append(("DeleteEndpointConfig", kwargs))

    def delete_model(self, **kwargs):
        self.calls.append(("DeleteModel", kwargs))

    # runtime
    def invoke_endpoint(self, **kwargs):
        self.sent.append(json.loads(kwargs["Body"]))

    # cloudformation
    def describe_stacks(self, StackName):
        return {"Stacks": [{"StackStatus": "UPDATE_COMPLETE"}]}

    # cloudwatch
    def get_paginator(self, name):
        assert name == "describe_alarm_history"
        account = self

        class Pages:
            def paginate(self, **kwargs):
                assert kwargs["HistoryItemType"] == "StateUpdate"
                yield {"AlarmHistoryItems": [i for i in account.history if i["AlarmName"] == kwargs["AlarmName"]]}
        return Pages()


def state_update(alarm, new, reason="Threshold Crossed: 3 out of the last 6 datapoints were greater than 5.0"):
    return {"AlarmName": alarm, "HistoryItemType": "StateUpdate", "Timestamp": STARTED,
            "HistorySummary": f"Alarm updated from OK to {new}",
            "HistoryData": json.dumps({"version": "1.0", "oldState": {"stateValue": "OK"},
                                       "newState": {"stateValue": new, "stateReason": reason}})}


def drill(account):
    checker = acceptance.Acceptance(config(), account, emulator=None, wait_s=0, examples=ROOT / "examples",
                                    sleep=lambda s: None)
    return checker.rollback_drill("cpu", {"ADAPTER_DRILL": "fail"}, None)


def test_the_history_items_read_are_cloudwatchs():
    item = CLOUDWATCH.operation_model("DescribeAlarmHistory").output_shape.members["AlarmHistoryItems"].member
    assert {"AlarmName", "Timestamp", "HistoryItemType", "HistoryData"} <= set(item.members)
    assert "StateUpdate" in CLOUDWATCH.shape_for("HistoryItemType").enum


def test_a_drill_is_proved_only_by_a_rollback_alarm_in_alarm_and_the_old_config():
    account = DrillAccount("rolled_back", reason="Rolled back: an alarm went off",
                           history=[state_update("decision-dev-cpu-ScoringFailures", "ALARM")])
    result = drill(account)
    assert result.state == "proved" and "decision-dev-cpu-ScoringFailures went to ALARM" in result.detail
    (_, model), = [call for call in account.calls if call[0] == "CreateModel"]
    assert model["PrimaryContainer"]["Environment"] == {"ADAPTER_THREADS": "2", "ADAPTER_DRILL": "fail"}
    assert [c[0] for c in account.calls if c[0] == "UpdateEndpoint"] == ["UpdateEndpoint"], "no undo"
    # Every request differs, so the cache answers none of them: each makes a job the fault affects.
    states = [body["decision"]["state"] for body in account.sent]
    assert states and len(set(states)) == len(states)
    assert {c[0] for c in account.calls} >= {"DeleteEndpointConfig", "DeleteModel"}


@pytest.mark.parametrize("history", [
    [],                                                          # no alarm fired: the health check, say
    [state_update("decision-dev-cpu-ScoringFailures", "OK")],    # only other transitions
    [state_update("decision-dev-cpu-ScoringFailures", "ALARM",   # acceptance's own test of the notification
                  reason="python -m endpoint_client acceptance: a test of the notification")],
])
def test_a_rollback_without_an_alarm_fails_and_says_why_it_rolled_back(history):
    reason = "The container failed the ping health check"
    result = drill(DrillAccount("rolled_back", reason=reason, history=history))
    assert result.state == "failed"
    assert result.detail.startswith(f"rolled back for another reason ({reason}): none of decision-dev-cpu-"
                                    f"ScoringFailures, decision-dev-cpu-SlowCompute went to ALARM")


def test_an_update_that_is_not_rolled_back_is_undone_and_fails():
    account = DrillAccount("completed")
    result = drill(account)
    assert result.state == "failed" and result.detail.startswith("not rolled back")
    updates = [kwargs["EndpointConfigName"] for name, kwargs in account.calls if name == "UpdateEndpoint"]
    assert len(updates) == 2 and "-drill-" in updates[0] and updates[1] == "stack-config"
