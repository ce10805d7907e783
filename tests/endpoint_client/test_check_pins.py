"""python -m endpoint_client check-pins against moto on loopback: pins that exist, pins that do not, and the
protective tag that keeps pinned images from the repository's lifecycle expiry."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from registry_testkit import FAKE_CREDENTIALS, OCI_MANIFEST, REPOSITORY_ROOT, manifest, push
from endpoint_client import pins
from endpoint_client.pins import protective_tag


def run(deployment, *extra, capsys):
    code = pins.main(deployment.args(*extra))
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


def tags(deployment, digest):
    (details,) = deployment.client("ecr").describe_images(
        repositoryName=deployment.repository, imageIds=[{"imageDigest": digest}])["imageDetails"]
    return set(details["imageTags"])


def test_existing_pins_that_are_not_protected_fail_until_protected(deployment, capsys):
    code, lines, _ = run(deployment, capsys=capsys)
    assert code == 1
    assert [line.split()[0] for line in lines] == ["unprotected", "unprotected", "unprotected", "ok"]
    assert any("run with --protect" in line for line in lines)

    code, lines, _ = run(deployment, "--protect", capsys=capsys)
    assert code == 0, lines
    assert [line.split()[0] for line in lines] == ["ok"] * 4
    for kind, digest in deployment.digests.items():
        assert tags(deployment, digest) >= {protective_tag(digest)}
        assert any(t.startswith(("cpu-", "gpu-", "textgen-")) for t in tags(deployment, digest))  # kept

    code, lines, _ = run(deployment, capsys=capsys)          # protected now: a plain check passes
    assert code == 0 and not any("tagged" in line for line in lines)
    assert lines[-1] == (f"ok          environments.dev.pins.model: s3://{deployment.bucket}/{deployment.model_key}")


def test_protect_twice_is_harmless(deployment, capsys):
    assert run(deployment, "--protect", capsys=capsys)[0] == 0
    code, lines, _ = run(deployment, "--protect", capsys=capsys)
    assert code == 0 and not any("tagged" in line for line in lines)


def test_a_missing_digest_and_a_missing_model_are_named(deployment, capsys):
    def edit(environment):
        environment["pins"]["images"]["gpu"] = "sha256:" + "9" * 64
        environment["pins"]["model"] = {"s3_key": "models/qwen3.5-4b/" + "5" * 64 + "/model.tar.gz",
                                        "gguf_sha256": "5" * 64}
    deployment.write_cdk_json(edit)
    code, lines, _ = run(deployment, "--protect", capsys=capsys)
    assert code == 1
    by_key = {line.split()[1].rstrip(":"): line.split()[0] for line in lines}
    assert by_key == {"environments.dev.pins.images.cpu": "ok", "environments.dev.pins.images.gpu": "missing",
                      "environments.dev.pins.images.text_generation": "ok", "environments.dev.pins.model": "missing"}


def test_unpinned_and_unlisted_endpoints_do_not_fail_the_check(deployment, capsys):
    def edit(environment):
        environment["pins"]["images"]["gpu"] = None
        environment["endpoints"] = ["cpu", "gpu"]
    deployment.write_cdk_json(edit)
    code, lines, _ = run(deployment, "--protect", capsys=capsys)
    assert code == 0
    assert "environments.dev.pins.images.gpu: not pinned (the gpu endpoint stays out of the deployment)" in lines[1]
    assert len(lines) == 3       # cpu, gpu, model: text_generation is not listed


def test_a_pin_in_another_repository_is_checked_there(deployment, capsys):
    ecr = deployment.client("ecr")
    ecr.create_repository(repositoryName=f"mirror-{deployment.repository}")
    digest = push(ecr, f"mirror-{deployment.repository}", manifest("7"), "b1")
    uri = f"123456789012.dkr.ecr.us-east-1.amazonaws.com/mirror-{deployment.repository}@{digest}"
    deployment.write_cdk_json(lambda e: e["pins"]["images"].__setitem__("text_generation", uri))
    code, lines, _ = run(deployment, "--protect", capsys=capsys)
    assert code == 0, lines
    assert f"ok          environments.dev.pins.images.text_generation: {uri} (another repository" in lines[2]
    assert tags(deployment, deployment.digests["cpu"]) >= {protective_tag(deployment.digests["cpu"])}


def test_a_model_pin_naming_a_bucket_is_checked_there(deployment, capsys):
    """A model pin with bucket (an environment that takes its artifacts from another, artifacts_from) is looked up in
    that bucket, not in the environment's own."""
    s3 = deployment.client("s3")
    source = f"source-{deployment.bucket}"
    s3.create_bucket(Bucket=source)
    key = "models/qwen3.5-4b/" + "6" * 64 + "/model.tar.gz"
    s3.put_object(Bucket=source, Key=key, Body=b"archive")
    pinned = {"s3_key": key, "gguf_sha256": "6" * 64, "bucket": source}
    deployment.write_cdk_json(lambda e: e["pins"].__setitem__("model", pinned))
    code, lines, _ = run(deployment, "--protect", capsys=capsys)
    assert code == 0, lines
    assert lines[-1] == f"ok          environments.dev.pins.model: s3://{source}/{key}"
    s3.delete_object(Bucket=source, Key=key)
    code, lines, _ = run(deployment, capsys=capsys)
    assert code == 1 and lines[-1] == f"missing     environments.dev.pins.model: s3://{source}/{key}", lines


def test_an_image_pushed_as_an_oci_manifest_is_refused_and_not_protected(deployment, capsys):
    """SageMaker pulls Docker schema 2 manifests only; BuildKit's default push (OCI) would fail the deploy."""
    ecr = deployment.client("ecr")
    digest = push(ecr, deployment.repository, manifest("8", OCI_MANIFEST), "cpu-20260102T000000Z")
    deployment.write_cdk_json(lambda e: e["pins"]["images"].__setitem__("cpu", digest))
    code, lines, _ = run(deployment, "--protect", capsys=capsys)
    assert code == 1
    assert lines[0] == (f"unsupported environments.dev.pins.images.cpu: {deployment.repository}@{digest} "
                        f"({OCI_MANIFEST}: SageMaker pulls only application/vnd.docker.distribution.manifest.v2+json)")
    assert [line.split()[0] for line in lines[1:]] == ["ok", "ok", "ok"]
    assert protective_tag(digest) not in tags(deployment, digest)


def test_the_mirrored_dlc_image_is_checked_in_its_own_repository_too(deployment, capsys):
    ecr = deployment.client("ecr")
    ecr.create_repository(repositoryName=f"dlc-{deployment.repository}")
    digest = push(ecr, f"dlc-{deployment.repository}", manifest("6", OCI_MANIFEST), "server-sagemaker-cpu-v1")
    uri = f"123456789012.dkr.ecr.us-east-1.amazonaws.com/dlc-{deployment.repository}@{digest}"
    deployment.write_cdk_json(lambda e: e["pins"]["images"].__setitem__("text_generation", uri))
    code, lines, _ = run(deployment, "--protect", capsys=capsys)
    assert code == 1
    assert lines[2].startswith(f"unsupported environments.dev.pins.images.text_generation: {uri} ({OCI_MANIFEST}")


def test_an_environment_without_its_artifacts_stack_fails_clearly(deployment, capsys):
    deployment.client("cloudformation").delete_stack(StackName="decision-dev-artifacts")
    code, lines, err = run(deployment, capsys=capsys)
    assert code == 1 and lines == []
    assert "stack decision-dev-artifacts is not deployed (npx cdk deploy decision-dev-artifacts)" in err


@pytest.mark.parametrize("args, message", [
    (["-c", "env=staging"], "env: 'staging' is not an environment in cdk.json (one of: dev, prod)"),
    ([], "env: choose an environment with -c env=NAME"),
    (["-c", "env"], "-c env: expected KEY=VALUE"),
])
def test_bad_arguments_exit_2_naming_the_problem(deployment, capsys, args, message):
    code = pins.main([*args, "--cdk-json", str(deployment.cdk_json), "--endpoint-url", deployment.url])
    assert code == 2 and message in capsys.readouterr().err


def test_an_invalid_pin_in_cdk_json_is_named_by_its_key(deployment, capsys):
    deployment.write_cdk_json(lambda e: e["pins"]["images"].__setitem__("cpu", "decision:latest"))
    code, _, err = run(deployment, capsys=capsys)
    assert code == 2 and "environments.dev.pins.images.cpu: 'decision:latest' is pinned by the mutable tag" in err


def test_the_command_line_runs_it(deployment):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    environment.update(FAKE_CREDENTIALS, PYTHONPATH=str(REPOSITORY_ROOT))
    completed = subprocess.run([sys.executable, "-m", "endpoint_client", "check-pins", *deployment.args("--protect")],
                               capture_output=True, text=True, env=environment, cwd=REPOSITORY_ROOT, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert len(completed.stdout.splitlines()) == 4 and "tagged pinned-" in completed.stdout
