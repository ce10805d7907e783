"""``python -m endpoint_client acceptance -c env=NAME``: the checks only a real account can make, after a deploy.

Run it after the first deploy of an environment and after every later one (docs/deploy.md, "4. Acceptance: what
still needs a real account"). Each line is one check:

1. **invoke**: each deployed endpoint answers a request through the client's retry policy (the example decision,
   or a short chat completion on the text-generation endpoint);
2. **log line** and **log metric** (the adapter's endpoints): that request's JSON line in
   ``/aws/sagemaker/Endpoints/<endpoint>`` (the Requests metric's own filter pattern, metric_logs), and the metric
   filter's count of it in ``DecisionAdapter/<endpoint>``, with how long CloudWatch took to show it (the publishing
   delay the rollback windows assume, stacks/endpoint_specs.py);
3. **metrics**: every metric an alarm reads exists with one of the dimension sets the alarm names for it
   (ListMetrics): an alarm reading no data can never fire. A GPU endpoint with instance pools may publish per-pool
   series (an InstanceType dimension) instead of the variant's; its alarms read both (metric math), so either
   proves the metric, and the line says which exist;
4. **storage**: the instances' DiskUtilization over the last hour (every series the DiskUtilization alarm reads),
   against that alarm's threshold;
5. **alarm delivery**: each alarm set to ALARM (``set-alarm-state``) and back to OK, and CloudWatch's own record of
   the notification (its alarm history's Action item: "Successfully executed action arn:aws:sns:..."): the topic's
   policy and key let CloudWatch publish. It notifies the topic's subscribers twice per alarm; the topic's
   subscriptions must be confirmed. Endpoints that are updating are skipped (a rollback alarm in ALARM would roll the
   update back);
6. **rollback drill** (``--rollback-drill KIND`` only): the endpoint updated to a copy of its Model made faulty
   (``--drill-fault fail|slow``: the adapter's ``ADAPTER_DRILL``, a release that starts and passes its health check,
   then fails every request or computes at half speed; or ``--drill-environment`` / ``--drill-image``), under its
   own DeploymentConfig while requests are sent, each different so that the cache answers none. Proved only when
   SageMaker rolled back to the stack's EndpointConfig *and* the history of one of the rollback alarms
   (DescribeAlarmHistory) shows it going to ALARM during the drill; a rollback without one (the health check, say)
   fails the check, naming SageMaker's reason. An update that is not rolled back is undone (UpdateEndpoint to the
   stack's EndpointConfig) and fails the check; the drill's Model and EndpointConfig are deleted.

7. **served**: each endpoint served the same EndpointConfig, image and model archive at the end of the checks as
   at their start (DescribeEndpoint -> EndpointConfig -> Model), so the report names what the checks saw.

States: ``proved``, ``failed``, ``warn``, ``skipped``, and, with ``--emulator moto`` (the deploy rehearsal), ``unprovable``:
moto has no containers, metric data, metric filters, alarm actions or DeploymentConfig, so each check that needs one
says which.

Every run writes its report (endpoint_client.acceptance_report: what each endpoint served, every check, and
``passed``: no check failed) to the artifact bucket under ``acceptance/<environment>/<UTC timestamp>.json`` and
``acceptance/<environment>/latest.json``, and with ``--report PATH`` to that file; ``promote`` reads the latest.
Exit 0 when no check failed and the report was written, 1 otherwise, 2 bad arguments or cdk.json, 4 no region or
credentials.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError

from endpoint_client import acceptance_report
from endpoint_client.deployment import (EXIT_CONFIGURATION, EXIT_FAILED, EXIT_OK, Aws, CommandError, Served,
                                        add_common_arguments, aws_for, error_code, load_config, served_by,
                                        stack_outputs)
from endpoint_client.invoke import InvokeFailed, RetryPolicy, invoke
from endpoint_client.preflight import deployed_kinds
from stacks.adapter_logs import metric_logs
from stacks.config import ADAPTER_KINDS, EnvironmentConfig

CHAT_BODY = {"messages": [{"role": "user", "content": "Answer with one word: ready?"}], "max_tokens": 8}
# The adapter's setting that makes a release faulty once it has started (container/decision_adapter/settings.py,
# drill.py), and its faults.
DRILL_SETTING, DRILL_FAULTS = "ADAPTER_DRILL", ("fail", "slow")
# What moto cannot show, per check: the reason an emulator run reports instead of a verdict.
ON_MOTO = {
    "invoke": "moto answers InvokeEndpoint with a canned body and runs no container",
    "log line": "moto runs no container, so nothing writes the adapter's log lines",
    "log metric": "moto creates no metric filters (AWS::Logs::MetricFilter is recorded, not created)",
    "metrics": "moto holds no metric data but what a test puts",
    "storage": "moto has no instances, so no DiskUtilization",
    "alarm delivery": "moto's CloudWatch runs no alarm actions and keeps no alarm history",
    "rollback drill": "moto implements no UpdateEndpoint, so no DeploymentConfig runs",
    "scale from zero": "moto runs no Application Auto Scaling policy and no instance, so nothing scales",
    "notifications": "moto runs no asynchronous inference, so SageMaker publishes nothing to the success and error "
                     "topics",
}
# The endpoint kinds behind SageMaker's queue (their settings name the async prefixes).
ASYNC_KINDS = ("async",)
# The reason acceptance's alarm delivery check gives set-alarm-state: its ALARM is no alarm's evaluation.
OWN_REASON = "python -m endpoint_client acceptance"


@dataclass(frozen=True)
class Result:
    state: str          # proved | failed | warn | skipped | unprovable
    check: str
    subject: str
    detail: str

    def line(self) -> str:
        return f"{self.state:10} {self.check} {self.subject}: {self.detail}"


class Acceptance:
    def __init__(self, config: EnvironmentConfig, aws: Aws, *, emulator: str | None, wait_s: float,
                 examples: Path, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic, log: Callable[[str], None] = lambda _: None):
        self.config, self.aws, self.emulator, self.wait_s = config, aws, emulator, wait_s
        self.examples, self.sleep, self.clock, self.log = examples, sleep, clock, log
        self.kinds = deployed_kinds(config)
        self.started = datetime.now(timezone.utc) - timedelta(seconds=5)
        # What each endpoint served when the checks began (the report's "endpoints"), filled by run().
        self.served: dict[str, Served] = {}

    # --- how a missing piece of evidence is reported ------------------------------------------------------------

    def missing(self, check: str, subject: str, detail: str, kind: str | None = None) -> Result:
        """Evidence only AWS produces is absent: a failure on AWS, unprovable on an emulator. An asynchronous
        endpoint may be at 0 instances (min_instance_count 0), which publish no instance or log metrics: a warning
        there."""
        if self.emulator:
            return Result("unprovable", check, subject, f"on {self.emulator}: {ON_MOTO[check]}")
        if kind in ASYNC_KINDS:
            return Result("warn", check, subject, f"{detail} (an asynchronous endpoint at 0 instances publishes none "
                                                  f"until a request starts one)")
        return Result("failed", check, subject, detail)

    def async_checks(self, kind: str) -> list[Result]:
        """What only a real account proves of an asynchronous endpoint: an answer under the output prefix, the
        scale-out from 0 instances (HasBacklogWithoutCapacity's step policy) and the success topic's
        notification. On an emulator each is unprovable; on AWS, until acceptance invokes it (through
        endpoint_client/invoke_async.py), each is a warning naming the command that proves it by hand."""
        name = self.config.endpoint_name(kind)
        checks = {"invoke": "an answer under the output prefix",
                  "scale from zero": "an instance started for a request queued at 0 instances",
                  "notifications": "the success topic's notification of the answer"}
        if self.emulator:
            return [Result("unprovable", check, name, f"on {self.emulator}: "
                           f"{ON_MOTO['invoke'] if check == 'invoke' else ON_MOTO[check]}") for check in checks]
        return [Result("warn", check, name, f"not checked by acceptance yet: {what} (python -m endpoint_client "
                       f"invoke --async, docs/deploy.md, Asynchronous inference and dev at zero)")
                for check, what in checks.items()]

    def poll(self, probe: Callable[[], Any]) -> tuple[Any, float]:
        """probe() until it returns something truthy or wait_s passes (at once on an emulator: nothing will come)."""
        started = self.clock()
        while True:
            found = probe()
            elapsed = self.clock() - started
            if found or self.emulator or elapsed >= self.wait_s:
                return found, elapsed
            self.sleep(min(15.0, max(1.0, self.wait_s / 20)))

    # --- the checks ---------------------------------------------------------------------------------------------

    def run(self, drill: tuple[str, dict[str, str], str | None] | None) -> list[Result]:
        if not self.kinds:
            return [Result("failed", "deployment", self.config.name,
                           "no endpoint is listed and pinned in cdk.json: nothing to accept")]
        self.served, results = self.served_now()
        results += [r for kind in self.kinds for r in
                    (self.async_checks(kind) if kind in ASYNC_KINDS else self.invoke(kind))]
        # An asynchronous endpoint's request line exists only once acceptance invokes it (async_checks).
        results += [r for kind in self.kinds if kind in ADAPTER_KINDS and kind not in ASYNC_KINDS
                    for r in self.log_checks(kind)]
        alarms = {kind: self.alarms_of(kind) for kind in self.kinds}
        results += [r for kind in self.kinds for r in self.metric_checks(kind, alarms[kind])]
        results += [self.storage(kind, alarms[kind]) for kind in self.kinds]
        results += self.delivery_checks(alarms)
        results.append(self.rollback_drill(*drill) if drill else
                       Result("skipped", "rollback drill", "-", "not requested (--rollback-drill KIND)"))
        after, _ = self.served_now()
        results += [self.unchanged(found, after.get(kind)) for kind, found in self.served.items()]
        return results

    def served_now(self) -> tuple[dict[str, Served], list[Result]]:
        """What each endpoint serves now, and a failed "served" check for each whose chain cannot be read."""
        sagemaker, served, problems = self.aws.client("sagemaker"), {}, []
        for kind in self.kinds:
            try:
                served[kind] = served_by(sagemaker, self.config.endpoint_name(kind))
            except CommandError as error:
                problems.append(Result("failed", "served", self.config.endpoint_name(kind), str(error)))
        return served, problems

    def unchanged(self, before: Served, after: Served | None) -> Result:
        """The checks prove what the endpoint served only if it served the same throughout (a deploy during the
        run, or a drill that was not undone, would make the report name artifacts the checks did not see)."""
        what = f"{before.image} with {before.model_data_url} ({before.endpoint_config_name})"
        if after is not None and after.artifacts() == before.artifacts():
            return Result("proved", "served", before.endpoint_name, f"{what} throughout the checks")
        now = "cannot be read" if after is None else \
            f"{after.image} with {after.model_data_url} ({after.endpoint_config_name})"
        return Result("failed", "served", before.endpoint_name, f"changed during the checks: {what} at the start, "
                                                                f"now {now}")

    def invoke(self, kind: str) -> list[Result]:
        name = self.config.endpoint_name(kind)
        if kind in ADAPTER_KINDS:
            body = (self.examples / "support-route.json").read_bytes()
        else:
            body = json.dumps(CHAT_BODY).encode()
        client = self.aws.session.client("sagemaker-runtime", endpoint_url=self.aws.endpoint_url)
        try:
            answer = invoke(client, endpoint_name=name, body=body, content_type="application/json",
                            accept="application/json", policy=RetryPolicy(max_attempts=4), sleep=self.sleep)
        except InvokeFailed as failure:
            return [Result("failed", "invoke", name, str(failure))]
        try:
            payload = json.loads(answer.body)
        except ValueError:
            payload = None
        expected = "result" if kind in ADAPTER_KINDS else "choices"
        if isinstance(payload, dict) and expected in payload:
            what = payload["result"].get("label", "a decision") if kind in ADAPTER_KINDS else "a chat completion"
            return [Result("proved", "invoke", name, f"answered {what} in {answer.attempts} attempt(s)")]
        return [self.missing("invoke", name, f"answered without '{expected}': {answer.body[:120]!r}")]

    def log_checks(self, kind: str) -> list[Result]:
        name = self.config.endpoint_name(kind)
        logs, cloudwatch = self.aws.client("logs"), self.aws.client("cloudwatch")
        group = f"/aws/sagemaker/Endpoints/{name}"
        start_ms = int(self.started.timestamp() * 1000)

        def request_lines():
            try:
                return logs.filter_log_events(logGroupName=group, startTime=start_ms,
                                              filterPattern=metric_logs.REQUESTS.filter_pattern()).get("events")
            except ClientError as error:
                self.log(f"FilterLogEvents {group}: {error_code(error)}")
                return None
        events, elapsed = self.poll(request_lines)
        results = [Result("proved", "log line", name, f"the request's line is in {group} ({len(events)} line(s))")
                   if events else self.missing("log line", name, f"no request line in {group} after {elapsed:.0f} s")]
        namespace = f"DecisionAdapter/{name}"

        def counted():
            datapoints = cloudwatch.get_metric_statistics(
                Namespace=namespace, MetricName=metric_logs.REQUESTS.metric_name, Statistics=["Sum"], Period=60,
                StartTime=self.started - timedelta(minutes=1), EndTime=datetime.now(timezone.utc) + timedelta(minutes=1)
            ).get("Datapoints", [])
            return sum(d["Sum"] for d in datapoints)
        total, elapsed = self.poll(counted)
        results.append(Result("proved", "log metric", name, f"{namespace} {metric_logs.REQUESTS.metric_name} counted "
                              f"{total:g} request(s), {elapsed:.0f} s after the request") if total else
                       self.missing("log metric", name, f"{namespace} {metric_logs.REQUESTS.metric_name} counted "
                                    f"nothing within {elapsed:.0f} s"))
        return results

    def alarms_of(self, kind: str) -> list[dict[str, Any]]:
        name = self.config.endpoint_name(kind)
        pages = self.aws.client("cloudwatch").get_paginator("describe_alarms").paginate(AlarmNamePrefix=f"{name}-")
        return [alarm for page in pages for alarm in page.get("MetricAlarms", [])]

    def metric_checks(self, kind: str, alarms: list[dict[str, Any]]) -> list[Result]:
        cloudwatch = self.aws.client("cloudwatch")
        if not alarms:
            return [Result("failed", "metrics", self.config.endpoint_name(kind), "the endpoint has no alarms")]
        results = []
        for alarm in alarms:
            for (namespace, metric), alternatives in _alternatives(_metrics_of(alarm)).items():
                # ListMetrics answers every series with at least these dimensions: the fewest the alarm names.
                fewest = min(alternatives, key=len)
                found = cloudwatch.list_metrics(Namespace=namespace, MetricName=metric,
                                                Dimensions=[{"Name": k, "Value": v} for k, v in fewest.items()])
                series = [{d["Name"]: d["Value"] for d in m.get("Dimensions", [])} for m in found.get("Metrics", [])]
                subject = f"{alarm['AlarmName']} {namespace} {metric}"
                read = [dimensions for dimensions in alternatives if dimensions in series]
                if read:
                    results.append(Result("proved", "metrics", subject, "the series the alarm reads exists" if
                                          len(alternatives) == 1 else f"{len(read)} of the {len(alternatives)} "
                                          f"series the alarm reads exist ({'; '.join(map(_dimensions_text, read))})"))
                elif series:
                    extra = sorted({k for s in series for k in s} - {k for a in alternatives for k in a})
                    results.append(Result("failed", "metrics", subject, f"only series with other dimensions "
                                          f"({', '.join(extra) or 'other values'}) exist: the alarm, which names "
                                          f"{' or '.join(_dimensions_text(a) for a in alternatives)}, reads no data"))
                else:
                    results.append(self.missing("metrics", subject, "no data: the alarm reads nothing (run again "
                                                "once the endpoint has served for a few minutes)", kind))
        return results

    def storage(self, kind: str, alarms: list[dict[str, Any]]) -> Result:
        name = self.config.endpoint_name(kind)
        (disk,) = [a for a in alarms if a["AlarmName"] == f"{name}-DiskUtilization"] or [None]
        if disk is None:
            return Result("failed", "storage", name, "no DiskUtilization alarm")
        now = datetime.now(timezone.utc)
        cloudwatch = self.aws.client("cloudwatch")
        # The variant's series, or a pooled variant's per-instance-type ones: whichever the alarm reads and exist.
        datapoints = [point for namespace, metric, dimensions in _metrics_of(disk)
                      for point in cloudwatch.get_metric_statistics(
                          Namespace=namespace, MetricName=metric, Statistics=["Maximum"], Period=300,
                          StartTime=now - timedelta(hours=1), EndTime=now,
                          Dimensions=[{"Name": k, "Value": v} for k, v in dimensions.items()]).get("Datapoints", [])]
        if not datapoints:
            return self.missing("storage", name, "no DiskUtilization in the last hour", kind)
        used = max(d["Maximum"] for d in datapoints)
        state = "proved" if used < disk["Threshold"] else "failed"
        return Result(state, "storage", name, f"at most {used:.1f} % of an instance's disk used in the last hour "
                                              f"(the rollback alarm fires above {disk['Threshold']:g} %)")

    def delivery_checks(self, alarms: dict[str, list[dict[str, Any]]]) -> list[Result]:
        cloudwatch, sns = self.aws.client("cloudwatch"), self.aws.client("sns")
        monitoring = f"{self.config.name_prefix}-monitoring"
        topic = stack_outputs(self.aws.client("cloudformation"), monitoring, ["AlarmTopicArn"])["AlarmTopicArn"]
        subscriptions = sns.list_subscriptions_by_topic(TopicArn=topic).get("Subscriptions", [])
        pending = [s["Endpoint"] for s in subscriptions if s["SubscriptionArn"] == "PendingConfirmation"]
        results = [Result("warn" if not subscriptions or pending else "proved", "alarm delivery", topic,
                          "nobody is subscribed (monitoring.alarm_emails)" if not subscriptions else
                          f"not confirmed: {', '.join(pending)}" if pending else
                          f"{len(subscriptions)} confirmed subscription(s)")]
        sagemaker = self.aws.client("sagemaker")
        for kind, kind_alarms in alarms.items():
            name = self.config.endpoint_name(kind)
            try:
                status = sagemaker.describe_endpoint(EndpointName=name)["EndpointStatus"]
            except ClientError as error:
                results.append(Result("skipped", "alarm delivery", name, f"the endpoint cannot be described "
                                      f"({error_code(error)}; its served check says why)"))
                continue
            if status != "InService":
                results.append(Result("skipped", "alarm delivery", name, f"the endpoint is {status}: an alarm set "
                                      "to ALARM now could roll its update back"))
                continue
            for alarm in kind_alarms:
                results.append(self.deliver(cloudwatch, alarm["AlarmName"], topic))
        return results

    def deliver(self, cloudwatch: Any, alarm: str, topic: str) -> Result:
        set_at = datetime.now(timezone.utc) - timedelta(seconds=5)
        cloudwatch.set_alarm_state(AlarmName=alarm, StateValue="ALARM",
                                   StateReason=f"{OWN_REASON}: a test of the notification")
        try:
            (state,) = cloudwatch.describe_alarms(AlarmNames=[alarm])["MetricAlarms"]
            if state["StateValue"] != "ALARM":
                return Result("failed", "alarm delivery", alarm, f"set-alarm-state left it {state['StateValue']}")

            def actions():
                try:
                    items = cloudwatch.describe_alarm_history(AlarmName=alarm, HistoryItemType="Action",
                                                              StartDate=set_at).get("AlarmHistoryItems", [])
                except (ClientError, BotoCoreError, NotImplementedError) as error:
                    self.log(f"DescribeAlarmHistory {alarm}: {error}")
                    return None
                return [i["HistorySummary"] for i in items if topic in i.get("HistorySummary", "")]
            summaries, elapsed = self.poll(actions)
        finally:
            cloudwatch.set_alarm_state(AlarmName=alarm, StateValue="OK", StateReason=f"{OWN_REASON}: the test is over")
        if not summaries:
            return self.missing("alarm delivery", alarm, f"no notification recorded within {elapsed:.0f} s")
        failed = [s for s in summaries if not s.startswith("Successfully")]
        return Result("failed" if failed else "proved", "alarm delivery", alarm, (failed or summaries)[0])

    def rollback_drill(self, kind: str, environment: dict[str, str], image: str | None) -> Result:
        """Update the endpoint to a faulty copy of its Model under its own DeploymentConfig while requests are sent,
        and judge what happened: proved only when SageMaker rolled back to the stack's EndpointConfig *and* one of
        the rollback alarms went to ALARM during the drill (its history says so), so that a rollback on the health
        check, or for any other reason, proves nothing about the alarms."""
        name = self.config.endpoint_name(kind)
        sagemaker = self.aws.client("sagemaker")
        endpoint = sagemaker.describe_endpoint(EndpointName=name)
        if endpoint["EndpointStatus"] != "InService":
            return Result("failed", "rollback drill", name, f"the endpoint is {endpoint['EndpointStatus']}")
        original = endpoint["EndpointConfigName"]
        config = sagemaker.describe_endpoint_config(EndpointConfigName=original)
        (variant,) = config["ProductionVariants"]
        model = sagemaker.describe_model(ModelName=variant["ModelName"])
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d%H%M%S")
        drill = f"{name}-drill-{stamp}"[:63]
        container = {key: value for key, value in model["PrimaryContainer"].items() if key != "ModelDataSource"}
        container["Environment"] = {**container.get("Environment", {}), **environment}
        if image:
            container["Image"] = image
        fault = ", ".join([*(f"{k}={v}" for k, v in environment.items()), *([f"image {image}"] if image else [])])
        sagemaker.create_model(ModelName=drill, PrimaryContainer=container, ExecutionRoleArn=model["ExecutionRoleArn"],
                               EnableNetworkIsolation=model.get("EnableNetworkIsolation", False))
        copied = {key: config[key] for key in ("KmsKeyId",) if config.get(key)}
        sagemaker.create_endpoint_config(EndpointConfigName=drill, ProductionVariants=[{**_variant_input(variant),
                                         "ModelName": drill}], **copied)
        deployment = endpoint.get("LastDeploymentConfig")
        rollback_alarms = [a["AlarmName"] for a in (deployment or {}).get("AutoRollbackConfiguration", {})
                           .get("Alarms", [])] or [a["AlarmName"] for a in self.alarms_of(kind)]
        began = datetime.now(timezone.utc) - timedelta(seconds=5)
        try:
            try:
                sagemaker.update_endpoint(EndpointName=name, EndpointConfigName=drill, RetainAllVariantProperties=True,
                                          **({"DeploymentConfig": deployment} if deployment else {}))
            except (ClientError, NotImplementedError) as error:
                if self.emulator:
                    why = error_code(error) if isinstance(error, ClientError) else type(error).__name__
                    return Result("unprovable", "rollback drill", name,
                                  f"on {self.emulator}: {ON_MOTO['rollback drill']} (UpdateEndpoint: {why}); the "
                                  f"drill's Model {drill} ({fault}) and EndpointConfig were created")
                raise
            final, answers = self._drive_update(name, kind)
            ended = datetime.now(timezone.utc) + timedelta(seconds=5)
            stack = self.aws.client("cloudformation").describe_stacks(
                StackName=self.config.endpoint_stack_name(kind))["Stacks"][0]["StackStatus"]
            state = f"endpoint {final['EndpointStatus']} on {final['EndpointConfigName']}, stack {stack}; " \
                    f"{answers} request(s) sent during the update of {fault}"
            if final["EndpointConfigName"] != original:
                sagemaker.update_endpoint(EndpointName=name, EndpointConfigName=original,
                                          RetainAllVariantProperties=True)
                return Result("failed", "rollback drill", name, f"not rolled back: {state}; UpdateEndpoint to "
                                                                f"{original} restores the stack's configuration "
                                                                f"(started)")
            reason = final.get("FailureReason") or "no reason given"
            try:
                fired = self._alarms_fired(rollback_alarms, began, ended)
            except (ClientError, BotoCoreError, NotImplementedError) as error:
                why = error_code(error) if isinstance(error, ClientError) else type(error).__name__
                if self.emulator:
                    return Result("unprovable", "rollback drill", name, f"on {self.emulator}: rolled back ({reason}),"
                                  f" but moto keeps no alarm history (DescribeAlarmHistory: {why}): {state}")
                return Result("failed", "rollback drill", name, f"rolled back ({reason}), but the rollback alarms' "
                                                                f"history cannot be read ({why}): {state}")
            if fired:
                alarm, at = fired[0]
                return Result("proved", "rollback drill", name, f"SageMaker rolled back on the alarms: {alarm} went "
                                                                f"to ALARM at {at} ({reason}): {state}")
            return Result("failed", "rollback drill", name, f"rolled back for another reason ({reason}): none of "
                          f"{', '.join(rollback_alarms)} went to ALARM between {began:%H:%M:%S} and {ended:%H:%M:%S} "
                          f"UTC, so the drill proves nothing of the alarms (a release that fails its health check is "
                          f"abandoned before traffic shifts): {state}")
        finally:
            self._delete_when_unused(sagemaker, name, drill)

    def _alarms_fired(self, alarms: list[str], began: datetime, ended: datetime) -> list[tuple[str, str]]:
        """(alarm, when) of each transition to ALARM in the alarms' history between ``began`` and ``ended``, set by
        CloudWatch (not by acceptance's own set-alarm-state)."""
        cloudwatch, fired = self.aws.client("cloudwatch"), []
        for alarm in alarms:
            pages = cloudwatch.get_paginator("describe_alarm_history").paginate(
                AlarmName=alarm, HistoryItemType="StateUpdate", StartDate=began, EndDate=ended)
            for item in (i for page in pages for i in page.get("AlarmHistoryItems", [])):
                try:
                    new = json.loads(item.get("HistoryData") or "{}").get("newState", {})
                except ValueError:
                    continue
                if new.get("stateValue") == "ALARM" and not str(new.get("stateReason", "")).startswith(OWN_REASON):
                    fired.append((alarm, item["Timestamp"].isoformat() if hasattr(item["Timestamp"], "isoformat")
                                  else str(item["Timestamp"])))
        return sorted(fired, key=lambda found: found[1])

    def _drive_update(self, name: str, kind: str) -> tuple[dict[str, Any], int]:
        """Send requests while the endpoint updates, so that the drill's errors reach the rollback alarms. Each one
        differs (a counter in its state or message), so that no answer comes from the state cache: every request
        makes a job, which the drill's fault affects."""
        sagemaker = self.aws.client("sagemaker")
        runtime = self.aws.session.client("sagemaker-runtime", endpoint_url=self.aws.endpoint_url)
        answers, deadline = 0, self.clock() + 4 * 3600
        while self.clock() < deadline:
            description = sagemaker.describe_endpoint(EndpointName=name)
            if description["EndpointStatus"] not in ("Updating", "RollingBack", "SystemUpdating"):
                return description, answers
            try:
                runtime.invoke_endpoint(EndpointName=name, Body=self.drill_body(kind, answers),
                                        ContentType="application/json")
            except (ClientError, BotoCoreError):
                pass
            answers += 1
            self.sleep(2)
        return sagemaker.describe_endpoint(EndpointName=name), answers

    def drill_body(self, kind: str, n: int) -> bytes:
        """The drill's n-th request: the example decision (a chat completion on text generation), its state (its
        message) ending with ``(drill request n)``."""
        if kind in ADAPTER_KINDS:
            body = json.loads((self.examples / "support-route.json").read_text())
            body["decision"]["state"] = f"{body['decision']['state']} (drill request {n})"
            return json.dumps(body).encode()
        chat = json.loads(json.dumps(CHAT_BODY))
        chat["messages"][0]["content"] += f" (drill request {n})"
        return json.dumps(chat).encode()

    def _delete_when_unused(self, sagemaker: Any, name: str, drill: str) -> None:
        try:
            if sagemaker.describe_endpoint(EndpointName=name)["EndpointConfigName"] != drill:
                sagemaker.delete_endpoint_config(EndpointConfigName=drill)
                sagemaker.delete_model(ModelName=drill)
        except ClientError as error:
            self.log(f"cleaning up {drill}: {error_code(error)}")


def _metrics_of(alarm: dict[str, Any]) -> list[tuple[str, str, dict[str, str]]]:
    """(namespace, metric, {dimension: value}) of every metric an alarm reads, plain or in metric math."""
    if alarm.get("MetricName"):
        return [(alarm["Namespace"], alarm["MetricName"], {d["Name"]: d["Value"] for d in alarm.get("Dimensions", [])})]
    return [(q["MetricStat"]["Metric"]["Namespace"], q["MetricStat"]["Metric"]["MetricName"],
             {d["Name"]: d["Value"] for d in q["MetricStat"]["Metric"].get("Dimensions", [])})
            for q in alarm.get("Metrics", []) if "MetricStat" in q]


def _alternatives(metrics: list[tuple[str, str, dict[str, str]]]) -> dict[tuple[str, str], list[dict[str, str]]]:
    """{(namespace, metric): the dimension sets an alarm reads it with}: a pooled variant's alarm reads the variant's
    series and every pool's (endpoint_specs.VariantSeries), any of which gives it data."""
    grouped: dict[tuple[str, str], list[dict[str, str]]] = {}
    for namespace, metric, dimensions in metrics:
        grouped.setdefault((namespace, metric), []).append(dimensions)
    return grouped


def _dimensions_text(dimensions: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(dimensions.items())) or "no dimensions"


_VARIANT_INPUT_KEYS = ("VariantName", "InitialInstanceCount", "InstanceType", "InitialVariantWeight",
                       "VolumeSizeInGB", "ModelDataDownloadTimeoutInSeconds",
                       "ContainerStartupHealthCheckTimeoutInSeconds", "InferenceAmiVersion", "RoutingConfig",
                       "InstancePools", "VariantInstanceProvisionTimeoutInSeconds")


def _variant_input(variant: dict[str, Any]) -> dict[str, Any]:
    return {key: variant[key] for key in _VARIANT_INPUT_KEYS if key in variant}


def _pairs(values: Sequence[str]) -> dict[str, str]:
    found = {}
    for value in values:
        key, sep, item = value.partition("=")
        if not sep or not key:
            raise CommandError(f"--drill-environment {value}: expected KEY=VALUE")
        found[key] = item
    return found


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m endpoint_client acceptance",
        description="After a deploy: each endpoint answers, its log line and log metric appear, every alarm's metric "
                    "exists, storage is below its alarm, every alarm's notification reaches the topic, and (on "
                    "request) the rollback alarms roll back a release that fails once it has started.")
    add_common_arguments(parser)
    parser.add_argument("--emulator", choices=["moto"], help="report what the emulator cannot show as unprovable "
                                                              "(the deploy rehearsal)")
    parser.add_argument("--wait", type=float, default=300.0, metavar="SECONDS",
                        help="how long to wait for a log line, a metric or a notification (default 300)")
    parser.add_argument("--rollback-drill", choices=["cpu", "gpu", "text_generation"], metavar="KIND",
                        help="update this endpoint to a faulty copy of its model and watch the rollback alarms roll "
                             "it back")
    parser.add_argument("--drill-fault", choices=DRILL_FAULTS, help="the adapter's drill fault (ADAPTER_DRILL): "
                        "after a healthy start, fail every request (fail) or compute at half speed (slow)")
    parser.add_argument("--drill-environment", action="append", default=[], metavar="KEY=VALUE",
                        help="other changes to the drill model's environment")
    parser.add_argument("--drill-image", help="the drill model's image (default: the deployed one)")
    parser.add_argument("--report", type=Path, metavar="PATH",
                        help="also write the acceptance report (JSON) here; it always goes to the artifact bucket's "
                             "acceptance/<environment>/")
    args = parser.parse_args(argv)
    report = lambda message: print(f"endpoint_client acceptance: {message}", file=sys.stderr)  # noqa: E731
    try:
        drill = None
        if args.rollback_drill:
            environment = _pairs(args.drill_environment)
            if args.drill_fault:
                if args.rollback_drill not in ADAPTER_KINDS:
                    raise CommandError(f"--drill-fault: the {args.rollback_drill} endpoint is not the adapter (no "
                                       f"{DRILL_SETTING}); make its release faulty with --drill-image or "
                                       f"--drill-environment")
                environment[DRILL_SETTING] = args.drill_fault
            if not environment and not args.drill_image:
                raise CommandError("--rollback-drill needs --drill-fault (or --drill-environment, --drill-image): what "
                                   "makes the release faulty once it has started")
            drill = (args.rollback_drill, environment, args.drill_image)
        config = load_config(args)
        aws = aws_for(args, config)
    except CommandError as error:
        report(str(error))
        return error.exit_code
    examples = args.cdk_json.resolve().parent / "examples"
    started_at = datetime.now(timezone.utc)
    checker = Acceptance(config, aws, emulator=args.emulator, wait_s=args.wait, examples=examples, log=report)
    try:
        results = checker.run(drill)
    except (NoCredentialsError, PartialCredentialsError) as error:
        report(f"no AWS credentials: {error}")
        return EXIT_CONFIGURATION
    except (CommandError, ClientError) as error:
        # The run stopped part way: its report says so (not passed), so that an earlier passing report of the same
        # digests is no longer the latest.
        report(f"the checks stopped: {error}")
        results = [Result("failed", "acceptance", config.name, f"the checks stopped: {error}")]
    for result in results:
        print(result.line())
    counts = {state: sum(r.state == state for r in results) for state in
              ("proved", "failed", "warn", "unprovable", "skipped")}
    print(", ".join(f"{n} {state}" for state, n in counts.items()))
    finished_at = datetime.now(timezone.utc)
    document = acceptance_report.build(config, region=aws.session.region_name, emulator=args.emulator,
                                       started_at=started_at, finished_at=finished_at, served=checker.served,
                                       results=results)
    written = _write_report(config, aws, document, finished_at, args.report, report)
    return EXIT_FAILED if counts["failed"] or not written else EXIT_OK


def _write_report(config: EnvironmentConfig, aws: Aws, document: dict[str, Any], finished_at: datetime,
                  local: Path | None, report: Callable[[str], None]) -> bool:
    """The report to ``local`` (if given) and to the artifact bucket; False (the run fails) when either could not
    be written: promote trusts only a report in the bucket."""
    written = True
    if local is not None:
        try:
            acceptance_report.write_local(local, document)
            report(f"report written to {local}")
        except OSError as error:
            report(f"cannot write the report to {local}: {error}")
            written = False
    try:
        bucket = stack_outputs(aws.client("cloudformation"), config.artifacts_stack_name,
                               ["ArtifactBucketName"])["ArtifactBucketName"]
        urls = acceptance_report.write(aws.client("s3"), bucket, document, finished_at)
        report(f"report ({'passed' if document['passed'] else 'not passed'}) written to {' and '.join(urls)}")
    except CommandError as error:
        report(f"the report was not written to the artifact bucket: {error}")
        written = False
    except ClientError as error:
        report(f"the report was not written to the artifact bucket: {error_code(error)}: {error}")
        written = False
    return written
