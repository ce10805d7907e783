"""python -m endpoint_client preflight: pins and instance-type changes against moto on loopback; the Service Quotas
arithmetic against Service Quotas' answers given with botocore's Stubber, since moto has no SageMaker quotas (it does
not implement ListServiceQuotas, and its ListAWSDefaultServiceQuotas knows the vpc service only). moto's SageMaker
also accepts only instance types of its own, older list (no ml.c7i, ml.g6e), so the account's other endpoints here
run older types."""

from __future__ import annotations

import boto3
import pytest
from botocore.stub import Stubber

from registry_testkit import ACCOUNT, REGION
from endpoint_client import pins, preflight
from endpoint_client.deployment import Aws, load_config


class StubbedQuotas(Aws):
    """The deployment's clients (moto), except Service Quotas, which answers with the quotas given."""

    def __init__(self, url: str, quotas: dict[str, float]):
        super().__init__(session=boto3.session.Session(region_name=REGION), endpoint_url=url)
        self.quotas = boto3.client("service-quotas", region_name=REGION)
        stubber = Stubber(self.quotas)
        listed = [{"QuotaName": f"{t} for endpoint usage", "Value": v, "ServiceCode": "sagemaker",
                   "QuotaCode": f"L-{i:08d}"} for i, (t, v) in enumerate(quotas.items())]
        stubber.add_response("list_service_quotas", {"Quotas": listed}, {"ServiceCode": "sagemaker"})
        stubber.activate()

    def client(self, service):
        return self.quotas if service == "service-quotas" else super().client(service)


def config_of(deployment, edit=None):
    deployment.write_cdk_json(edit)
    import argparse
    return load_config(argparse.Namespace(context=["env=dev"], cdk_json=deployment.cdk_json))


def run_endpoint(deployment, name: str, instance_type: str, count: int) -> None:
    """An endpoint of the account as SageMaker describes it (moto)."""
    sagemaker = deployment.client("sagemaker")
    sagemaker.create_model(ModelName=f"{name}-model", ExecutionRoleArn=f"arn:aws:iam::{ACCOUNT}:role/x",
                           PrimaryContainer={"Image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/x@sha256:" + "a" * 64})
    sagemaker.create_endpoint_config(EndpointConfigName=f"{name}-config", ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": f"{name}-model", "InitialInstanceCount": count,
        "InstanceType": instance_type}])
    sagemaker.create_endpoint(EndpointName=name, EndpointConfigName=f"{name}-config")


def lines(checks):
    return {check.subject: (check.state, check.detail) for check in checks}


def test_quotas_cover_the_largest_fleet_and_its_update(deployment):
    """dev: every endpoint at most 2 instances, updated blue/green all at once: 4 of each type at the peak (the CPU
    and the asynchronous endpoint both run ml.c7i.xlarge: 8)."""
    config = config_of(deployment)
    run_endpoint(deployment, f"other-{deployment.bucket}", "ml.g4dn.xlarge", 1)
    checks = lines(preflight.quota_checks(config, StubbedQuotas(deployment.url, {
        "ml.c7i.xlarge": 8, "ml.g6e.xlarge": 0, "ml.g6.xlarge": 10, "ml.g5.xlarge": 10, "ml.g4dn.xlarge": 4,
        "ml.c7i.2xlarge": 3})))
    assert checks["quota ml.c7i.xlarge for endpoint usage"] == (
        "ok", "needs 8 of 8 (decision-dev-cpu: 4 (2 at most, plus 2 during a blue/green update); decision-dev-async: "
              "4 (2 at most, plus 2 during a blue/green update))")
    # The first GPU pool must hold the fleet; a later one only warns.
    state, detail = checks["quota ml.g6e.xlarge for endpoint usage"]
    assert state == "fail" and detail.startswith("needs 4, quota 0 (decision-dev-gpu: 4")
    # The account's other endpoints count: 4 for a fallback to T4s and 1 running elsewhere exceed 4.
    state, detail = checks["quota ml.g4dn.xlarge for endpoint usage"]
    assert state == "warn" and detail.startswith("needs 5, quota 4") and "other endpoints of the account run 1" in detail
    assert "if the whole fleet falls back to it" in detail and "a fallback to this pool would fail" in detail
    assert checks["quota ml.g6.xlarge for endpoint usage"][0] == "ok"
    state, detail = checks["quota ml.c7i.2xlarge for endpoint usage"]
    assert state == "fail" and detail.startswith("needs 4, quota 3 (decision-dev-text-generation: 4")


def test_rolling_updates_need_half_the_fleet_and_unlisted_endpoints_need_nothing(deployment):
    def edit(environment):
        environment["endpoints"] = ["gpu"]
        environment["gpu"].update(initial_instance_count=2, max_instance_count=4)
    config = config_of(deployment, edit)
    checks = lines(preflight.quota_checks(config, StubbedQuotas(deployment.url, {
        "ml.g6e.xlarge": 6, "ml.g6.xlarge": 6, "ml.g5.xlarge": 6, "ml.g4dn.xlarge": 5})))
    assert set(checks) == {f"quota {t} for endpoint usage" for t in
                           ("ml.g6e.xlarge", "ml.g6.xlarge", "ml.g5.xlarge", "ml.g4dn.xlarge")}
    assert checks["quota ml.g6e.xlarge for endpoint usage"] == (
        "ok", "needs 6 of 6 (decision-dev-gpu: 6 (4 at most, plus 2 during a rolling update))")
    assert checks["quota ml.g4dn.xlarge for endpoint usage"][0] == "warn"


def test_against_moto_the_pins_pass_and_the_quotas_cannot_be_checked(deployment, capsys):
    assert pins.main(deployment.args("--protect")) == 0
    capsys.readouterr()
    code = preflight.main(deployment.args())
    out = capsys.readouterr().out.splitlines()
    assert code == 1
    states = {line.split()[1].rstrip(":"): line.split()[0] for line in out if not line.startswith(("unchecked",))}
    assert states == {"environments.dev.pins.images.cpu": "ok", "environments.dev.pins.images.gpu": "ok",
                      "environments.dev.pins.images.text_generation": "ok", "environments.dev.pins.model": "ok"}
    unchecked = [line for line in out if line.startswith("unchecked")]
    assert len(unchecked) == 6 and all("Service Quotas for sagemaker cannot be read (list_service_quotas: " in line
                                       and "list_aws_default_service_quotas: NoSuchResourceException" in line
                                       for line in unchecked)


def test_an_unprotected_pin_fails_the_preflight(deployment, capsys):
    code = preflight.main(deployment.args())
    out = capsys.readouterr().out
    assert code == 1 and "fail        environments.dev.pins.images.cpu: unprotected" in out


def test_an_instance_type_change_under_registered_scaling_is_refused(deployment):
    name = "decision-dev-cpu"
    run_endpoint(deployment, name, "ml.c5.xlarge", 1)
    scaling = deployment.client("application-autoscaling")
    resource = f"endpoint/{name}/variant/AllTraffic"
    scaling.register_scalable_target(ServiceNamespace="sagemaker", ResourceId=resource, MinCapacity=1, MaxCapacity=2,
                                     ScalableDimension="sagemaker:variant:DesiredInstanceCount")
    aws = Aws(session=boto3.session.Session(region_name=REGION), endpoint_url=deployment.url)
    try:
        checks = lines(preflight.instance_type_checks(config_of(deployment, lambda e: e.update(endpoints=["cpu"])),
                                                      aws))
        state, detail = checks[f"instance types of {name}"]
        assert state == "fail" and detail.startswith("ml.c5.xlarge -> ml.c7i.xlarge while auto scaling is registered")
        assert "environments.dev.cpu.autoscaling false first" in detail
        # Step one done (scaling deregistered): the change may go ahead.
        scaling.deregister_scalable_target(ServiceNamespace="sagemaker", ResourceId=resource,
                                           ScalableDimension="sagemaker:variant:DesiredInstanceCount")
        checks = lines(preflight.instance_type_checks(config_of(deployment, lambda e: e.update(endpoints=["cpu"])),
                                                      aws))
        assert checks[f"instance types of {name}"][0] == "ok"
    finally:
        sagemaker = deployment.client("sagemaker")
        sagemaker.delete_endpoint(EndpointName=name)


def test_the_command_is_listed(capsys):
    from endpoint_client import cli
    with pytest.raises(SystemExit):
        cli.main(["preflight", "--help"])
    assert "Service Quotas" in capsys.readouterr().out


# --- prod in another account than the dev it takes its artifacts from (issue 47) ---------------------------------

DEV_ELSEWHERE = "444455556666"


def prod_across_accounts(deployment):
    """cdk.json with dev (retaining its artifacts) in another account and prod, in this one, pinned from it by
    promote: its images in dev's repository, its archive in dev's bucket, the report it was promoted on."""
    import json

    from deploy.pins import promoted_pins
    from registry_testkit import REPOSITORY_ROOT
    cdk_json = json.loads((REPOSITORY_ROOT / "cdk.json").read_text())
    environments = cdk_json["context"]["environments"]
    dev, prod = environments["dev"], environments["prod"]
    dev.update(account=DEV_ELSEWHERE, region=REGION)
    dev["artifacts"]["removal_policy"] = "retain"
    prod.update(account=ACCOUNT, region=REGION, endpoints=["cpu"])
    prod["pins"] = promoted_pins({"images": dict(deployment.digests), "model": {
        "s3_key": deployment.model_key, "gguf_sha256": deployment.model_sha256}}, account=DEV_ELSEWHERE,
        region=REGION, repository="dev-images", bucket="dev-artifacts")
    deployment.cdk_json.write_text(json.dumps(cdk_json))
    import argparse
    return load_config(argparse.Namespace(context=["env=prod"], cdk_json=deployment.cdk_json))


class DeniedAcrossAccounts(StubbedQuotas):
    """The deployment's clients, whose reads of dev's repository and bucket (another account) get what AWS answers
    prod's operator there: AccessDenied (tests/cdk/test_cdk_crossenv.py evaluates the policies that decide it)."""

    def client(self, service):
        client = super().client(service)

        def denied(params, model, **_):
            from botocore.awsrequest import AWSResponse
            code = "AccessDeniedException" if service == "ecr" else "AccessDenied"
            return AWSResponse("https://denied.invalid/", 403, {}, None), {
                "Error": {"Code": code, "Message": f"not authorized to perform {model.name}"},
                "ResponseMetadata": {"HTTPStatusCode": 403}}
        if service in ("ecr", "s3"):
            client.meta.events.register_first(f"before-call.{service}", denied)
        return client


def test_across_accounts_preflight_names_the_operator_to_use_and_still_checks_the_quotas(deployment):
    config = prod_across_accounts(deployment)
    checks = preflight.preflight(config, DeniedAcrossAccounts(deployment.url, {"ml.c7i.2xlarge": 20}))
    found = lines(checks)
    state, detail = found["pins"]
    assert state == "fail" and "AccessDeniedException with these credentials" in detail
    assert "check them with decision-dev-operator (python -m endpoint_client check-pins -c env=prod with dev's " \
           "credentials)" in detail
    state, detail = found["environments.prod.pins.acceptance"]
    assert state == "fail" and detail.startswith("AccessDenied with these credentials: check it with "
                                                 "decision-dev-operator: python -m endpoint_client promote --verify "
                                                 "--from dev --to prod")
    assert found["quota ml.c7i.2xlarge for endpoint usage"][0] == "ok", "the quota check still runs"


def test_across_accounts_check_pins_refuses_in_one_line(deployment, capsys, monkeypatch):
    prod_across_accounts(deployment)
    from endpoint_client import deployment as commands
    monkeypatch.setattr(commands, "aws_for", lambda args, config: DeniedAcrossAccounts(deployment.url, {}))
    code = pins.main(["-c", "env=prod", "--cdk-json", str(deployment.cdk_json), "--endpoint-url", deployment.url])
    out, err = capsys.readouterr()
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "AccessDeniedException with these credentials" in err and "decision-dev-operator" in err
    assert "Traceback" not in err
