"""python -m endpoint_client acceptance writes its report (endpoint_client.acceptance_report) against moto on
loopback: what each endpoint served (DescribeEndpoint -> EndpointConfig -> Model), every check, and whether it
passed, to the artifact bucket's acceptance/<environment>/ and to --report PATH, for a passing and a failing run."""

from __future__ import annotations

import argparse
import json
import re

from endpoint_client import acceptance
from endpoint_client.deployment import aws_for, load_config
from stacks.config import image_kind

RUN_KEY = re.compile(r"^acceptance/dev/[0-9]{8}T[0-9]{6}Z\.json$")


def stored_reports(deployment) -> dict[str, dict]:
    s3 = deployment.client("s3")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=deployment.bucket, Prefix="acceptance/").get("Contents", [])]
    return {key: json.loads(s3.get_object(Bucket=deployment.bucket, Key=key)["Body"].read()) for key in keys}


def run_acceptance(deployment, tmp_path, capsys):
    local = tmp_path / "report.json"
    code = acceptance.main(deployment.args("--emulator", "moto", "--wait", "0", "--report", str(local)))
    out = capsys.readouterr()
    return code, json.loads(local.read_text()), out


def test_a_passing_run_records_what_each_endpoint_served(serving, tmp_path, capsys):
    deployment = serving.deployment
    code, report, out = run_acceptance(deployment, tmp_path, capsys)
    assert code == 0, out
    assert report["passed"] is True and report["environment"] == "dev" and report["emulator"] == "moto"
    assert report["endpoints"].keys() == {"cpu", "gpu", "text_generation", "async"}
    for kind, served in report["endpoints"].items():
        name = serving.endpoint_name(kind)
        assert served["endpoint_name"] == name
        assert served["image"] == serving.image(deployment.digests[image_kind(kind)])    # async: the cpu image
        assert served["model_data_url"] == f"s3://{deployment.bucket}/{deployment.model_key}"
        assert served["model_name"].startswith("EndpointModel-")
        assert served["endpoint_config_name"].startswith("EndpointConfig-")
        assert {"state": "proved", "check": "served", "subject": name,
                "detail": f"{served['image']} with {served['model_data_url']} ({served['endpoint_config_name']}) "
                          "throughout the checks"} in report["checks"]
    # What moto cannot show is listed, and does not fail the report.
    states = {check["state"] for check in report["checks"]}
    assert "failed" not in states and "unprovable" in states
    assert "invoke decision-dev-cpu" in report["unprovable"]
    # What only an account proves of the asynchronous endpoint: its answer, the scale from zero, the notification.
    assert {"invoke decision-dev-async", "scale from zero decision-dev-async",
            "notifications decision-dev-async"} <= set(report["unprovable"])
    assert len(report["unprovable"]) == sum(check["state"] == "unprovable" for check in report["checks"])
    # The bucket holds the same report as the run's and as latest.json.
    stored = stored_reports(deployment)
    (run_key,) = [key for key in stored if key != "acceptance/dev/latest.json"]
    assert RUN_KEY.match(run_key)
    assert stored == {run_key: report, "acceptance/dev/latest.json": report}
    assert f"s3://{deployment.bucket}/acceptance/dev/latest.json" in out.err


def test_a_failing_run_writes_its_report_not_passed(serving, tmp_path, capsys):
    deployment = serving.deployment
    serving.cloudwatch.delete_alarms(AlarmNames=[f"{serving.endpoint_name('gpu')}-DiskUtilization"])
    code, report, out = run_acceptance(deployment, tmp_path, capsys)
    assert code == 1
    assert report["passed"] is False
    failed = [(c["check"], c["subject"]) for c in report["checks"] if c["state"] == "failed"]
    assert ("metrics", "decision-dev-gpu") in failed and ("storage", "decision-dev-gpu") in failed
    # It still records what was served, for every endpoint.
    assert report["endpoints"]["gpu"]["image"] == serving.image(deployment.digests["gpu"])
    assert stored_reports(deployment)["acceptance/dev/latest.json"] == report


def test_an_endpoint_that_is_not_there_fails_the_report(serving, tmp_path, capsys):
    serving.remove("text_generation")
    code, report, _ = run_acceptance(serving.deployment, tmp_path, capsys)
    assert code == 1 and report["passed"] is False
    assert report["endpoints"].keys() == {"cpu", "gpu", "async"}
    (served,) = [c for c in report["checks"] if c["check"] == "served" and c["state"] == "failed"]
    assert served["subject"] == "decision-dev-text-generation" and "ValidationException" in served["detail"]


def test_an_endpoint_changed_during_the_checks_fails_the_report(serving, tmp_path):
    """A deploy while acceptance runs: the report would name artifacts the checks did not all see."""
    deployment = serving.deployment
    args = argparse.Namespace(context=["env=dev"], cdk_json=deployment.cdk_json, region=None,
                              endpoint_url=deployment.url)
    config = load_config(args)
    checker = acceptance.Acceptance(config, aws_for(args, config), emulator="moto", wait_s=0,
                                    examples=deployment.root, sleep=lambda s: None)
    checker.served, _ = checker.served_now()
    before = checker.served["cpu"]
    serving.deploy("cpu", digest=deployment.digests["gpu"])
    after, _ = checker.served_now()
    result = checker.unchanged(before, after["cpu"])
    assert result.state == "failed" and before.image in result.detail and after["cpu"].image in result.detail
    assert checker.unchanged(after["gpu"], after["gpu"]).state == "proved"


def test_no_artifact_bucket_output_fails_the_run_but_the_local_report_is_written(serving, tmp_path, capsys):
    deployment = serving.deployment
    deployment.client("cloudformation").delete_stack(StackName=f"{deployment.prefix}-artifacts")
    code, report, out = run_acceptance(deployment, tmp_path, capsys)
    assert code == 1 and report["passed"] is True
    assert "the report was not written to the artifact bucket: stack decision-dev-artifacts is not deployed" in out.err


def test_a_run_that_stops_part_way_writes_a_report_that_did_not_pass(serving, tmp_path, capsys):
    """No monitoring stack: the alarm delivery checks cannot start. The report still replaces latest.json, so that
    an earlier passing report is not taken for this run's."""
    deployment = serving.deployment
    assert run_acceptance(deployment, tmp_path, capsys)[1]["passed"] is True
    deployment.client("cloudformation").delete_stack(StackName=f"{deployment.prefix}-monitoring")
    code, report, out = run_acceptance(deployment, tmp_path, capsys)
    assert code == 1 and report["passed"] is False
    assert report["checks"] == [{"state": "failed", "check": "acceptance", "subject": "dev", "detail":
                                 "the checks stopped: stack decision-dev-monitoring is not deployed "
                                 "(npx cdk deploy decision-dev-monitoring)"}]
    assert report["endpoints"]["cpu"]["image"] == serving.image(deployment.digests["cpu"])
    assert stored_reports(deployment)["acceptance/dev/latest.json"] == report
