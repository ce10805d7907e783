"""container/buildspec.yml run as CodeBuild runs it: every phase's commands in one bash, in order.

`docker` and `aws` are stand-ins on PATH that record their arguments and answer as the real tools would
(a pushed image's RepoDigests, ECR's record of the pushed manifest, a copied S3 object), so the script's own logic
runs for real: the checks of its variables, the build flags, the tag, the manifest media type check, the digest
record, where it is uploaded and the pin line it prints. The stand-ins answer whatever the role may do; whether the
project's role allows each of these calls is tests/cdk/test_cdk_role_calls.py's question, which runs this
buildspec against the synthesized policies.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BUILDSPEC = REPO / "container" / "buildspec.yml"
REPOSITORY_URI = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/decision-adapter-abc"
DIGEST = "sha256:" + "ab" * 32

DOCKER = f"""#!/usr/bin/env bash
echo "docker $*" >> "$CALLS"
case "$1" in
  login) cat > /dev/null ;;
  inspect) echo "{REPOSITORY_URI}@{DIGEST}" ;;
esac
"""
AWS = """#!/usr/bin/env bash
echo "aws $*" >> "$CALLS"
case "$1 $2" in
  "ecr get-login-password"|"ecr-public get-login-password") echo token ;;
  "ecr describe-images") printf '%s\\t%s\\n' "$PUSHED_MEDIA_TYPE" "${PUSHED_DIGEST:-@DIGEST@}" ;;
  "s3 cp") mkdir -p "$S3/$(dirname "${4#s3://}")" && cp "$3" "$S3/${4#s3://}" ;;
esac
""".replace("@DIGEST@", DIGEST)
DOCKER_V2 = "application/vnd.docker.distribution.manifest.v2+json"


def script() -> str:
    spec = yaml.safe_load(BUILDSPEC.read_text())
    assert spec["env"]["shell"] == "bash"
    commands = [c for phase in ("pre_build", "build", "post_build") for c in spec["phases"][phase]["commands"]]
    return "\n".join(commands)


def run(tmp_path: Path, **overrides: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("docker", DOCKER), ("aws", AWS)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(tmp_path / "calls"), "S3": str(tmp_path / "s3"),
           "AWS_REGION": "eu-west-1", "REPOSITORY_URI": REPOSITORY_URI, "IMAGE_FLAVOR": "cpu",
           "ARTIFACT_BUCKET": "artifacts-bucket", "DIGEST_PREFIX": "image-digests/",
           "CODEBUILD_BUILD_SUCCEEDING": "1", "CODEBUILD_BUILD_ID": "cpu-image:0001",
           "PUSHED_MEDIA_TYPE": DOCKER_V2, **overrides}
    env = {k: v for k, v in env.items() if v is not None}
    return subprocess.run(["bash", "-c", script()], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)


def test_the_image_is_built_pushed_and_its_digest_recorded_and_printed(tmp_path):
    done = run(tmp_path, CODEBUILD_RESOLVED_SOURCE_VERSION="0123456789abcdef0123")
    assert done.returncode == 0, done.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    tag = re.fullmatch(rf"docker buildx build --pull --provenance=false --sbom=false --output type=docker "
                       rf"-f Dockerfile -t {re.escape(REPOSITORY_URI)}:(\S+) \.",
                       next(c for c in calls if c.startswith("docker buildx build"))).group(1)
    assert re.fullmatch(r"cpu-\d{8}T\d{6}Z-0123456789ab", tag)
    assert f"docker push {REPOSITORY_URI}:{tag}" in calls
    assert (f"aws ecr describe-images --repository-name decision-adapter-abc --image-ids imageTag={tag} --query "
            f"imageDetails[0].[imageManifestMediaType,imageDigest] --output text") in calls
    record = {"flavor": "cpu", "image": f"{REPOSITORY_URI}@{DIGEST}", "tag": tag, "digest": DIGEST,
              "build": "cpu-image:0001"}
    assert json.loads((tmp_path / "image-digest.json").read_text()) == record
    for key in (f"{tag}.json", "latest.json"):
        assert json.loads((tmp_path / "s3" / "artifacts-bucket" / "image-digests" / "cpu" / key).read_text()) == record
    assert f'  "cpu": "{DIGEST}"' in done.stdout.splitlines()


def test_the_gpu_flavour_builds_dockerfile_gpu_and_a_source_without_version_still_gets_a_unique_tag(tmp_path):
    done = run(tmp_path, IMAGE_FLAVOR="gpu")
    assert done.returncode == 0, done.stderr
    build = next(c for c in (tmp_path / "calls").read_text().splitlines() if c.startswith("docker buildx build"))
    assert re.search(r"-f Dockerfile\.gpu -t \S+:gpu-\d{8}T\d{6}Z \.$", build), build


@pytest.mark.parametrize("overrides, message", [
    ({"ARTIFACT_BUCKET": None}, "buildspec: ARTIFACT_BUCKET is not set"),
    ({"IMAGE_FLAVOR": "tpu"}, "buildspec: IMAGE_FLAVOR must be cpu or gpu, not tpu"),
])
def test_a_missing_or_wrong_variable_stops_before_anything_is_built(tmp_path, overrides, message):
    done = run(tmp_path, **overrides)
    assert done.returncode == 2 and message in done.stderr
    assert not (tmp_path / "calls").exists()


def test_a_failed_build_pushes_nothing(tmp_path):
    done = run(tmp_path, CODEBUILD_BUILD_SUCCEEDING="0")
    assert done.returncode == 1 and "nothing is pushed" in done.stdout
    assert not any(c.startswith("docker push") for c in (tmp_path / "calls").read_text().splitlines())


@pytest.mark.parametrize("media_type", ["application/vnd.oci.image.manifest.v1+json",
                                        "application/vnd.oci.image.index.v1+json", "None"])
def test_a_pushed_manifest_sagemaker_refuses_fails_the_build_before_the_digest_is_recorded(tmp_path, media_type):
    done = run(tmp_path, PUSHED_MEDIA_TYPE=media_type)
    assert done.returncode == 1
    assert f"was pushed as {media_type}; SageMaker accepts only application/vnd.docker.distribution.manifest.v2+json" \
        in done.stderr
    assert not (tmp_path / "s3").exists() and "Pin it" not in done.stdout


def test_a_digest_other_than_the_pushed_one_fails_the_build(tmp_path):
    done = run(tmp_path, PUSHED_DIGEST="sha256:" + "cd" * 32)
    assert done.returncode == 1 and "not " + DIGEST in done.stderr
    assert not (tmp_path / "s3").exists()
