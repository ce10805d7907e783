"""python -m endpoint_client promote --from dev --to prod against moto on loopback: dev deployed (its endpoints'
Models pin images in its repository and the archive in its bucket), acceptance run for real (--emulator moto), then
promote writes prod's pins in cdk.json, byte for byte what is expected, or refuses and leaves cdk.json as it was."""

from __future__ import annotations

import difflib
import hashlib
import json
from types import SimpleNamespace

import botocore.session
import pytest

from endpoint_client import acceptance, cli, promote
from endpoint_client.deployment import CommandError, Served, served_by
from registry_testkit import ACCOUNT, REGION, manifest, push


def promotable(deployment, indent=2, edit=None) -> str:
    """cdk.json as the repository lays it out, dev pinned and deployed, prod taking its artifacts from dev."""
    cdk_json = json.loads(deployment.cdk_json.read_text())
    prod = cdk_json["context"]["environments"]["prod"]
    # dev retains its artifacts, as it must once prod pins them (stacks/config.py), and so names its account.
    dev = cdk_json["context"]["environments"]["dev"]
    dev["artifacts"]["removal_policy"], dev["account"] = "retain", ACCOUNT
    prod["artifacts_from"] = "dev"
    # prod is retained and protected, so it names where it deploys (app.py refuses it otherwise): dev's account here.
    prod["account"], prod["region"] = ACCOUNT, REGION
    prod.pop("build", None)  # cdk.json ships prod so; a copy of an older one may still build
    if edit is not None:
        edit(prod)
    text = json.dumps(cdk_json, indent=indent) + "\n"
    deployment.cdk_json.write_text(text)
    return text


def accept(deployment, capsys) -> int:
    code = acceptance.main(deployment.args("--emulator", "moto", "--wait", "0"))
    capsys.readouterr()
    return code


def run_promote(deployment, capsys, *extra: str) -> tuple[int, str, str]:
    """python -m endpoint_client promote --from dev --to prod, as the command line dispatches it, on moto (its
    acceptance reports are moto's)."""
    code = cli.main(["promote", "--from", "dev", "--to", "prod", "--cdk-json", str(deployment.cdk_json),
                     "--endpoint-url", deployment.url, *(extra or ("--emulator", "moto"))])
    out = capsys.readouterr()
    return code, out.out, out.err


def expected_pins(deployment) -> dict:
    registry = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/{deployment.repository}"
    return {"images": {kind: f"{registry}@{digest}" for kind, digest in deployment.digests.items()},
            "model": {"bucket": deployment.bucket, "s3_key": deployment.model_key,
                      "gguf_sha256": deployment.model_sha256},
            "acceptance": recorded_report(deployment)}


def recorded_report(deployment) -> dict:
    """What promote records of dev's latest acceptance report: its run's object (of which latest.json is a copy) by
    its only S3 version, and the sha256 of its bytes."""
    s3 = deployment.client("s3")
    latest = s3.get_object(Bucket=deployment.bucket, Key="acceptance/dev/latest.json")["Body"].read()
    runs = [v for v in s3.list_object_versions(Bucket=deployment.bucket, Prefix="acceptance/dev/")["Versions"]
            if not v["Key"].endswith("latest.json") and
            s3.get_object(Bucket=deployment.bucket, Key=v["Key"], VersionId=v["VersionId"])["Body"].read() == latest]
    (run,) = runs
    return {"bucket": deployment.bucket, "key": run["Key"], "version_id": run["VersionId"],
            "sha256": hashlib.sha256(latest).hexdigest()}


@pytest.mark.parametrize("indent", [2, 4])
def test_promote_writes_exactly_prods_pins_and_nothing_else(serving, capsys, indent):
    deployment = serving.deployment
    before = promotable(deployment, indent)
    assert accept(deployment, capsys) == 0
    code, out, err = run_promote(deployment, capsys)
    assert code == 0, err
    expected = json.loads(before)
    assert expected["context"]["environments"]["prod"]["pins"] == {
        "images": {"cpu": None, "gpu": None, "text_generation": None}, "model": None}
    expected["context"]["environments"]["prod"]["pins"] = expected_pins(deployment)
    after = deployment.cdk_json.read_text()
    assert after == json.dumps(expected, indent=indent) + "\n"
    # Only lines of prod's pins changed: the diff's every change lies between prod's "pins" and its "model".
    lines = before.splitlines()
    start = [i for i, line in enumerate(lines) if line.strip() == '"pins": {'][1]
    end = start + next(i for i, line in enumerate(lines[start:]) if line.strip() == '"model": null')
    changed = [op for op in difflib.SequenceMatcher(a=lines, b=after.splitlines(), autojunk=False).get_opcodes()
               if op[0] != "equal"]
    assert changed and all(start < i1 and i2 <= end + 1 for _, i1, i2, _, _ in changed), changed
    pins = expected_pins(deployment)
    assert out.splitlines() == [f"environments.prod.pins.images.{kind}: null -> \"{pins['images'][kind]}\""
                                for kind in ("cpu", "gpu", "text_generation")] + \
        [f"environments.prod.pins.model: null -> {json.dumps(pins['model'])}",
         f"environments.prod.pins.acceptance: null -> {json.dumps(pins['acceptance'])}"]
    assert "make diff BASE=main ENV=prod" in err
    # Promoting again changes nothing.
    code, out, err = run_promote(deployment, capsys)
    assert (code, out, deployment.cdk_json.read_text()) == (0, "", after) and "nothing to change" in err


def test_a_target_listing_fewer_endpoints_gets_only_their_image_pins(serving, capsys):
    deployment = serving.deployment
    before = promotable(deployment, edit=lambda prod: prod.update(endpoints=["cpu"]))
    assert accept(deployment, capsys) == 0
    code, out, err = run_promote(deployment, capsys)
    assert code == 0, err
    expected = json.loads(before)
    pins = expected_pins(deployment)
    expected["context"]["environments"]["prod"]["pins"] = {
        "images": {"cpu": pins["images"]["cpu"], "gpu": None, "text_generation": None}, "model": pins["model"],
        "acceptance": pins["acceptance"]}
    assert deployment.cdk_json.read_text() == json.dumps(expected, indent=2) + "\n"


def refused(deployment, capsys, before: str) -> str:
    code, out, err = run_promote(deployment, capsys)
    assert code == 1 and out == "", err
    assert deployment.cdk_json.read_text() == before
    assert err.startswith("endpoint_client promote: refused: ")
    return err


def test_refused_when_the_latest_report_failed(serving, capsys):
    deployment = serving.deployment
    before = promotable(deployment)
    serving.cloudwatch.delete_alarms(AlarmNames=["decision-dev-gpu-DiskUtilization"])
    assert accept(deployment, capsys) == 1
    err = refused(deployment, capsys, before)
    assert "dev's latest acceptance report (s3://" in err and "did not pass (metrics decision-dev-gpu" in err
    for kind, digest in deployment.digests.items():
        assert f"{kind} {serving.image(digest)}" in err


def test_refused_when_an_image_was_deployed_after_acceptance(serving, capsys):
    deployment = serving.deployment
    before = promotable(deployment)
    assert accept(deployment, capsys) == 0
    newer = push(deployment.client("ecr"), deployment.repository, manifest("9"), "cpu-20260102T000000Z")
    # A new cpu pin deploys both endpoints of the cpu image (the asynchronous one shares its pin).
    serving.deploy("cpu", digest=newer)
    serving.deploy("async", digest=newer)
    err = refused(deployment, capsys, before)
    assert "is not for what it serves now" in err
    assert f"cpu: decision-dev-cpu serves {serving.image(newer)} with {serving.model_data_url}, but the report " \
           f"proved {serving.image(deployment.digests['cpu'])} with {serving.model_data_url}" in err
    assert "gpu:" not in err and "text_generation:" not in err
    # Accepting what it serves now makes it promotable.
    assert accept(deployment, capsys) == 0
    code, _, err = run_promote(deployment, capsys)
    assert code == 0, err
    pins = json.loads(deployment.cdk_json.read_text())["context"]["environments"]["prod"]["pins"]
    assert pins["images"]["cpu"] == serving.image(newer)


def test_refused_when_there_is_no_report(serving, capsys):
    deployment = serving.deployment
    before = promotable(deployment)
    err = refused(deployment, capsys, before)
    assert f"dev has no acceptance report (s3://{deployment.bucket}/acceptance/dev/latest.json)" in err
    assert f"cpu {serving.image(deployment.digests['cpu'])}" in err


def test_an_emulators_report_accepts_nothing_on_aws(serving, capsys):
    deployment = serving.deployment
    before = promotable(deployment)
    assert accept(deployment, capsys) == 0
    code, out, err = run_promote(deployment, capsys, "--region", REGION)   # no --emulator: as on AWS
    assert (code, out, deployment.cdk_json.read_text()) == (1, "", before)
    assert "was made on moto, but promote runs on AWS: a run on an emulator proves nothing on AWS" in err
    assert f"cpu {serving.image(deployment.digests['cpu'])}" in err


@pytest.mark.parametrize("status", ["Updating", "RollingBack", "Failed"])
def test_refused_when_an_endpoint_is_not_in_service(serving, capsys, status):
    deployment = serving.deployment
    before = promotable(deployment)
    assert accept(deployment, capsys) == 0
    serving.set_status("gpu", status)
    err = refused(deployment, capsys, before)
    assert f"gpu: decision-dev-gpu is {status}" in err and "cpu:" not in err


def test_refused_when_an_endpoint_is_missing(serving, capsys):
    deployment = serving.deployment
    before = promotable(deployment)
    assert accept(deployment, capsys) == 0
    serving.remove("text_generation")
    err = refused(deployment, capsys, before)
    assert "decision-dev-text-generation: ValidationException" in err


@pytest.mark.parametrize("artifacts_from", [None, "staging"])
def test_refused_unless_the_target_takes_its_artifacts_from_the_source(serving, capsys, artifacts_from):
    deployment = serving.deployment
    before = promotable(deployment, edit=lambda prod: prod.update(artifacts_from=artifacts_from))
    code, out, err = run_promote(deployment, capsys)
    assert (code, out, deployment.cdk_json.read_text()) == (2, "", before)
    assert f"environments.prod.artifacts_from is {json.dumps(artifacts_from)}, not \"dev\"" in err


def test_refused_when_the_pins_written_would_not_deploy(serving, capsys):
    """The target is validated as the CDK app validates it, new pins in, before anything is written: here prod
    deploys to another region than the one dev's images are in, which SageMaker cannot pull from."""
    deployment = serving.deployment
    before = promotable(deployment, edit=lambda prod: prod.update(region="ap-southeast-2"))
    assert accept(deployment, capsys) == 0
    code, out, err = run_promote(deployment, capsys)
    assert (code, out, deployment.cdk_json.read_text()) == (2, "", before)
    assert "environments.prod.pins.images.cpu" in err and "ap-southeast-2" in err, err


def test_refused_when_cdk_json_is_not_laid_out_as_json_dumps_writes_it(serving, capsys):
    deployment = serving.deployment
    before = promotable(deployment).replace('"context": {', '"context":   {', 1)
    deployment.cdk_json.write_text(before)
    assert accept(deployment, capsys) == 0
    code, out, err = run_promote(deployment, capsys)
    assert (code, out, deployment.cdk_json.read_text()) == (2, "", before)
    assert "cdk.json is not laid out as json.dumps writes it" in err


def test_the_model_pin_carries_its_bucket_and_the_key_names_the_gguf():
    served = {kind: Served(endpoint_name=f"decision-dev-{kind}", status="InService", endpoint_config_name="c",
                                   model_name="m", image="i", model_data_url=url)
              for kind, url in (("cpu", "s3://b/models/p/" + "a" * 64 + "/model.tar.gz"),)}
    config = SimpleNamespace(name="dev")
    assert promote._model_pin(config, served) == {"bucket": "b", "s3_key": "models/p/" + "a" * 64 + "/model.tar.gz",
                                                  "gguf_sha256": "a" * 64}
    served["gpu"] = Served(endpoint_name="decision-dev-gpu", status="InService", endpoint_config_name="c",
                                   model_name="m", image="i", model_data_url="s3://b/other/model.tar.gz")
    with pytest.raises(CommandError, match="serve different model archives"):
        promote._model_pin(config, served)
    with pytest.raises(CommandError, match="cannot be pinned"):
        promote._model_pin(config, {"gpu": served["gpu"]})


class DescribingSageMaker:
    """DescribeEndpoint, DescribeEndpointConfig and DescribeModel answers in botocore's shapes, with what AWS (not
    moto) adds: the images SageMaker resolved (DeployedImages)."""

    def __init__(self, resolved: str, model: dict):
        self.resolved, self.model = resolved, model

    def describe_endpoint(self, EndpointName):
        return {"EndpointName": EndpointName, "EndpointConfigName": "c", "EndpointStatus": "InService",
                "ProductionVariants": [{"VariantName": "AllTraffic", "DeployedImages": [
                    {"SpecifiedImage": self.model["Image"], "ResolvedImage": self.resolved}]}]}

    def describe_endpoint_config(self, EndpointConfigName):
        return {"EndpointConfigName": EndpointConfigName, "ProductionVariants": [{"VariantName": "AllTraffic",
                                                                                   "ModelName": "m"}]}

    def describe_model(self, ModelName):
        return {"ModelName": ModelName, "PrimaryContainer": self.model}


def test_what_is_served_is_the_models_image_as_sagemaker_resolved_it_and_its_s3_model_data():
    model = botocore.session.get_session().get_service_model("sagemaker")
    assert "ResolvedImage" in model.shape_for("DeployedImage").members
    assert "S3Uri" in model.shape_for("S3ModelDataSource").members
    image = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/images@sha256:" + "a" * 64
    source = {"Image": image, "ModelDataSource": {"S3DataSource": {"S3Uri": "s3://b/models/p/k/model.tar.gz",
                                                                   "S3DataType": "S3Object", "CompressionType": "Gzip"}}}
    served = served_by(DescribingSageMaker(image, source), "decision-dev-cpu")
    assert (served.image, served.model_data_url) == (image, "s3://b/models/p/k/model.tar.gz")
    other = image.replace("a" * 64, "b" * 64)
    with pytest.raises(CommandError, match=f"decision-dev-cpu: runs {other}, not its Model's {image}"):
        served_by(DescribingSageMaker(other, source), "decision-dev-cpu")


def test_refused_when_aws_refuses_a_read(serving, capsys):
    """Any error AWS answers (AccessDenied, a bucket gone) refuses on one line: it never reads as no report."""
    deployment = serving.deployment
    before = promotable(deployment)
    assert accept(deployment, capsys) == 0
    s3 = deployment.client("s3")
    listed = s3.list_object_versions(Bucket=deployment.bucket)
    for item in listed.get("Versions", []) + listed.get("DeleteMarkers", []):
        s3.delete_object(Bucket=deployment.bucket, Key=item["Key"], VersionId=item["VersionId"])
    s3.delete_bucket(Bucket=deployment.bucket)
    err = refused(deployment, capsys, before)
    assert err.startswith("endpoint_client promote: refused: NoSuchBucket: ")


# --- issue 47: what promote protects and records, and --verify before a deploy ------------------------------------

def tags_of(deployment, digest) -> list[str]:
    (details,) = deployment.client("ecr").describe_images(repositoryName=deployment.repository,
                                                          imageIds=[{"imageDigest": digest}])["imageDetails"]
    return details.get("imageTags", [])


def test_promote_tags_what_it_promotes_so_that_devs_lifecycle_keeps_it(serving, capsys):
    deployment = serving.deployment
    promotable(deployment)
    assert all(not any(t.startswith("pinned-") for t in tags_of(deployment, d)) for d in deployment.digests.values())
    assert accept(deployment, capsys) == 0
    code, _, err = run_promote(deployment, capsys)
    assert code == 0, err
    for digest in deployment.digests.values():
        assert f"pinned-{digest.removeprefix('sha256:')}" in tags_of(deployment, digest)


def test_refused_while_dev_would_destroy_what_prod_pins(serving, capsys):
    deployment = serving.deployment
    before = promotable(deployment)
    cdk_json = json.loads(before)
    cdk_json["context"]["environments"]["dev"]["artifacts"]["removal_policy"] = "destroy"
    before = json.dumps(cdk_json, indent=2) + "\n"
    deployment.cdk_json.write_text(before)
    assert accept(deployment, capsys) == 0
    err = refused(deployment, capsys, before)
    assert "environments.dev.artifacts.removal_policy is destroy: `cdk destroy -c env=dev` would delete" in err
    assert not any(t.startswith("pinned-") for t in tags_of(deployment, deployment.digests["cpu"]))


def test_refused_for_an_image_it_cannot_protect(serving, capsys):
    """An image dev serves from another repository than its own: dev's lifecycle is not what keeps it, and promote
    cannot tag it there."""
    deployment = serving.deployment
    before = promotable(deployment)
    ecr = deployment.client("ecr")
    other = f"{deployment.repository}-elsewhere"
    ecr.create_repository(repositoryName=other)
    digest = push(ecr, other, manifest("7"), "cpu-x")
    # deploy() names dev's repository in the Model: point it at the other one (moto's server runs in this process).
    # Both endpoints of the cpu image (the asynchronous one shares its pin).
    from moto.sagemaker.models import sagemaker_backends
    backend = sagemaker_backends[ACCOUNT][REGION]
    for kind in ("cpu", "async"):
        serving.deploy(kind, digest=digest)
        config = backend.endpoint_configs[backend.endpoints[serving.endpoint_name(kind)].endpoint_config_name]
        model = backend._models[config.production_variants[0]["ModelName"]]
        model.primary_container["Image"] = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/{other}@{digest}"
    assert accept(deployment, capsys) == 0
    err = refused(deployment, capsys, before)
    assert f"cpu: {ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/{other}@{digest} is not in " in err
    assert "only images the source's lifecycle keeps are promoted" in err


def test_verify_checks_prods_pins_against_the_very_report_they_were_promoted_on(serving, capsys):
    deployment = serving.deployment
    promotable(deployment)
    assert accept(deployment, capsys) == 0
    assert run_promote(deployment, capsys)[0] == 0
    code, out, err = run_promote(deployment, capsys, "--verify", "--emulator", "moto")
    assert code == 0 and "prod's pins are what s3://" in out, err
    # A later run rewrites latest.json (and writes a new object): the recorded version still reads the same.
    assert accept(deployment, capsys) == 0
    assert run_promote(deployment, capsys, "--verify", "--emulator", "moto")[0] == 0
    promoted = deployment.cdk_json.read_text()
    # Pins edited by hand, or a record that is not the report's bytes: refused, naming what differs.
    for edit, message in (
            (lambda pins: pins["images"].update(cpu=pins["images"]["cpu"].replace(
                deployment.digests["cpu"], deployment.digests["gpu"])),
             "environments.prod.pins.images.cpu is"),
            (lambda pins: pins["acceptance"].update(sha256="0" * 64),
             "the report was changed after promote recorded it")):
        cdk_json = json.loads(promoted)
        edit(cdk_json["context"]["environments"]["prod"]["pins"])
        deployment.cdk_json.write_text(json.dumps(cdk_json, indent=2) + "\n")
        code, out, err = run_promote(deployment, capsys, "--verify", "--emulator", "moto")
        assert code == 1 and out == "" and message in err, err


def test_refused_when_the_cpu_and_async_endpoints_serve_different_images(serving, capsys):
    """The asynchronous endpoint runs the cpu image (pins.images.cpu, one pin for both): dev serving two cpu digests
    at once (one endpoint updated, the other not) has no one pin to promote."""
    deployment = serving.deployment
    before = promotable(deployment)
    newer = push(deployment.client("ecr"), deployment.repository, manifest("8"), "cpu-20260103T000000Z")
    serving.deploy("cpu", digest=newer)
    assert accept(deployment, capsys) == 0
    err = refused(deployment, capsys, before)
    assert "they share one pin (pins.images.cpu)" in err and "decision-dev-async serves" in err
