"""The build stack: four CodeBuild projects, each with its own least-privilege role, sources as CDK assets."""

from __future__ import annotations

import pytest
import yaml
from aws_cdk.assertions import Match

import cdk_testkit
from cdk_testkit import REPOSITORY_ROOT, as_list, flatten, statements

PROJECTS = ("ModelBuild", "CpuImageBuild", "GpuImageBuild", "TextGenerationMirror")
# The only actions that may have Resource "*": none of them supports resource-level permissions.
SERVICE_WIDE_ACTIONS = {"ecr:GetAuthorizationToken", "ecr-public:GetAuthorizationToken", "sts:GetServiceBearerToken"}


def project(synth, name):
    return synth.resource("build", "AWS::CodeBuild::Project", name)


def environment_variables(synth, name):
    return {v["Name"]: flatten(v["Value"]) for v in project(synth, name)["Properties"]["Environment"]
            ["EnvironmentVariables"]}


def role_statements(synth, project_name):
    """The statements of the role that project_name runs with."""
    template = synth.template("build")
    role = flatten(project(synth, project_name)["Properties"]["ServiceRole"])
    policies = [lid for lid, r in template["Resources"].items() if r["Type"] == "AWS::IAM::Policy"
                and [flatten(x) for x in r["Properties"]["Roles"]] == [role.replace(".Arn", "")]]
    assert len(policies) == 1, policies
    return [s for lid, s in statements(template) if lid == policies[0]]


def grants(statement_list):
    """{action: [resources]} over a list of statements."""
    result = {}
    for statement in statement_list:
        assert statement["Effect"] == "Allow"
        for action in as_list(statement["Action"]):
            result.setdefault(action, []).extend(flatten(r) for r in as_list(statement["Resource"]))
    return result


def test_four_projects_one_role_each(builder):
    projects = builder.resources("build", "AWS::CodeBuild::Project")
    assert len(projects) == 4
    roles = [flatten(p["Properties"]["ServiceRole"]) for p in projects.values()]
    assert len(set(roles)) == 4
    assert len(builder.resources("build", "AWS::IAM::Role")) == 4


def test_only_the_image_builds_are_privileged(builder):
    privileged = {name: project(builder, name)["Properties"]["Environment"].get("PrivilegedMode", False)
                  for name in PROJECTS}
    assert privileged == {"ModelBuild": False, "CpuImageBuild": True, "GpuImageBuild": True,
                          "TextGenerationMirror": False}


def test_privileged_mode_and_images_with_cdk_assertions(builder):
    template = builder.assertions("build")
    template.resource_count_is("AWS::CodeBuild::Project", 4)
    template.resource_properties_count_is("AWS::CodeBuild::Project", {
        "Environment": Match.object_like({"PrivilegedMode": True})}, 2)
    template.all_resources_properties("AWS::CodeBuild::Project", {
        "Environment": Match.object_like({"Image": "aws/codebuild/standard:7.0", "Type": "LINUX_CONTAINER"}),
        "Artifacts": {"Type": "NO_ARTIFACTS"}})
    template.has_resource_properties("AWS::CodeBuild::Project", {
        "Source": Match.object_like({"Type": "S3", "BuildSpec": "model_build/buildspec.yml"}),
        "Environment": Match.object_like({"PrivilegedMode": False, "EnvironmentVariables": Match.array_with([
            {"Name": "MODEL_PIN", "Type": "PLAINTEXT", "Value": "qwen3.5-4b"},
            {"Name": "OUTPUT_PREFIX", "Type": "PLAINTEXT", "Value": "models/"}])})})


def test_projects_log_to_their_own_log_group_with_retention(builder):
    log_groups = builder.resources("build", "AWS::Logs::LogGroup")
    assert len(log_groups) == 4
    days = {"dev": 30, "prod": 90}[builder.env]
    assert {g["Properties"]["RetentionInDays"] for g in log_groups.values()} == {days}
    # prod retains its logs (artifacts.removal_policy: retain), dev destroys them with the stack.
    expected = {"dev": "Delete", "prod": "Retain"}[builder.env]
    assert all(g["DeletionPolicy"] == expected for g in log_groups.values())
    for name in PROJECTS:
        logs = project(builder, name)["Properties"]["LogsConfig"]["CloudWatchLogs"]
        assert logs["Status"] == "ENABLED" and flatten(logs["GroupName"]).startswith(f"<{name}Logs")


def test_projects_encrypt_with_the_rotated_build_key(builder):
    key = builder.resource("build", "AWS::KMS::Key", "BuildEncryptionKey")
    assert key["Properties"]["EnableKeyRotation"] is True
    for name in PROJECTS:
        assert flatten(project(builder, name)["Properties"]["EncryptionKey"]).startswith("<BuildEncryptionKey")


def test_environment_variables_match_the_buildspecs(builder):
    bucket = f"{builder.prefix}-artifacts:ExportsOutputRefArtifactBucket"
    model = environment_variables(builder, "ModelBuild")
    assert model["MODEL_PIN"] == "qwen3.5-4b" and model["OUTPUT_PREFIX"] == "models/"
    assert model["ARTIFACT_BUCKET"].startswith(bucket)
    for flavor in ("cpu", "gpu"):
        image = environment_variables(builder, f"{flavor.capitalize()}ImageBuild")
        assert image["IMAGE_FLAVOR"] == flavor and image["DIGEST_PREFIX"] == "image-digests/"
        assert image["ARTIFACT_BUCKET"].startswith(bucket)
        assert "ImageRepository" in image["REPOSITORY_URI"]
    mirror = environment_variables(builder, "TextGenerationMirror")
    assert mirror["SOURCE_IMAGE"] == ("public.ecr.aws/deep-learning-containers/llama-cpp@sha256:"
                                      "1f19c220f5f169228f20cdddca00f4838be22a3a1ce9002bc444006adc3d6d43")
    assert mirror["TAG_PREFIX"] == "textgen-"


def test_buildspecs_come_from_the_sources(builder):
    assert project(builder, "ModelBuild")["Properties"]["Source"]["BuildSpec"] == "model_build/buildspec.yml"
    for name in ("CpuImageBuild", "GpuImageBuild"):
        assert project(builder, name)["Properties"]["Source"]["BuildSpec"] == "buildspec.yml"
    mirror = project(builder, "TextGenerationMirror")["Properties"]["Source"]
    assert mirror["Type"] == "NO_SOURCE" and "skopeo copy --retry-times 3" in mirror["BuildSpec"]


SKOPEO = """#!/usr/bin/env bash
echo "skopeo $*" >> "$CALLS"
case "$1" in
  login) cat > /dev/null ;;
  inspect) printf '%s' "$SOURCE_MANIFEST" ;;
  copy) touch "$PUSHED_MARK" ;;
esac
"""
AWS = """#!/usr/bin/env bash
echo "aws $*" >> "$CALLS"
case "$1 $2" in
  "ecr get-login-password") echo token ;;
  "ecr describe-images")
    [ -e "$PUSHED_MARK" ] || exit 254
    case "$*" in *--query*) printf '%s\\t%s\\n' "$PUSHED_TYPE" "$PUSHED_DIGEST" ;; esac ;;
esac
"""
DOCKER_V2 = "application/vnd.docker.distribution.manifest.v2+json"
SOURCE = "public.ecr.aws/deep-learning-containers/llama-cpp@sha256:" + "1f" * 32


def run_mirror(builder, tmp_path, source_manifest: dict, pushed_type: str, pushed_digest: str):
    """The mirror project's build commands, as CodeBuild runs them, with skopeo and aws standing in."""
    import json
    import os
    import subprocess
    spec = yaml.safe_load(project(builder, "TextGenerationMirror")["Properties"]["Source"]["BuildSpec"])
    assert spec["env"]["shell"] == "bash"
    (bin_dir := tmp_path / "bin").mkdir()
    for name, text in (("skopeo", SKOPEO), ("aws", AWS)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o700)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(tmp_path / "calls"),
           "PUSHED_MARK": str(tmp_path / "pushed"), "SOURCE_MANIFEST": json.dumps(source_manifest),
           "PUSHED_TYPE": pushed_type, "PUSHED_DIGEST": pushed_digest, "AWS_REGION": "eu-west-1",
           "SOURCE_IMAGE": SOURCE, "REPOSITORY_URI": "111122223333.dkr.ecr.eu-west-1.amazonaws.com/images",
           "REPOSITORY_NAME": "images", "TAG_PREFIX": "textgen-"}
    done = subprocess.run(["bash", "-c", "\n".join(spec["phases"]["build"]["commands"])], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    copies = [c for c in (tmp_path / "calls").read_text().splitlines() if c.startswith("skopeo copy")]
    return done, copies


def test_a_docker_v2_source_is_mirrored_byte_for_byte_keeping_its_digest(builder, tmp_path):
    done, copies = run_mirror(builder, tmp_path, {"schemaVersion": 2, "mediaType": DOCKER_V2}, DOCKER_V2,
                              "sha256:" + "1f" * 32)
    assert done.returncode == 0, done.stderr
    assert copies == [f"skopeo copy --retry-times 3 docker://{SOURCE} docker://111122223333.dkr.ecr.eu-west-1."
                      f"amazonaws.com/images:textgen-{'1f' * 32}"]
    assert f'"text_generation": "sha256:{"1f" * 32}"' in done.stdout


@pytest.mark.parametrize("source_type", ["application/vnd.oci.image.index.v1+json",
                                         "application/vnd.docker.distribution.manifest.list.v2+json", None])
def test_an_oci_or_multi_platform_source_is_converted_to_docker_v2_and_its_new_digest_printed(
        builder, tmp_path, source_type):
    manifest = {"schemaVersion": 2, **({"mediaType": source_type} if source_type else {})}
    done, copies = run_mirror(builder, tmp_path, manifest, DOCKER_V2, "sha256:" + "ab" * 32)
    assert done.returncode == 0, done.stderr
    assert len(copies) == 1 and "--override-os linux --override-arch amd64 --format v2s2" in copies[0]
    assert f'"text_generation": "sha256:{"ab" * 32}"' in done.stdout


def test_the_mirror_fails_unless_ecr_holds_a_docker_v2_manifest(builder, tmp_path):
    done, _ = run_mirror(builder, tmp_path, {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json"},
                         "application/vnd.oci.image.index.v1+json", "sha256:" + "ab" * 32)
    assert done.returncode == 1 and f"SageMaker accepts only {DOCKER_V2}" in done.stderr
    assert "Pin it" not in done.stdout


def test_a_byte_for_byte_copy_whose_digest_changed_fails(builder, tmp_path):
    done, _ = run_mirror(builder, tmp_path, {"schemaVersion": 2, "mediaType": DOCKER_V2}, DOCKER_V2,
                         "sha256:" + "ab" * 32)
    assert done.returncode == 1 and "digest changed" in done.stderr


def asset_zip_names(synth, asset_path: str) -> list[str]:
    """The files the asset would upload, as CDK stages them (the zip is made from this folder)."""
    root = synth.outdir / asset_path
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def source_asset(synth, name):
    location = project(synth, name)["Properties"]["Source"]["Location"]
    key = flatten(location).rsplit("/", 1)[1]
    files = synth.asset_manifest("build")["files"]
    return files[key.removesuffix(".zip")]["source"]


def test_the_model_build_source_is_only_model_build(builder):
    source = source_asset(builder, "ModelBuild")
    assert source["packaging"] == "zip"
    names = asset_zip_names(builder, source["path"])
    expected = sorted(str(p.relative_to(REPOSITORY_ROOT)) for p in (REPOSITORY_ROOT / "model_build").rglob("*")
                      if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    assert names == expected
    assert "model_build/buildspec.yml" in names and "model_build/pins.json" in names


def test_the_image_source_is_the_container_folder(builder):
    source = source_asset(builder, "CpuImageBuild")
    assert source == source_asset(builder, "GpuImageBuild")
    names = asset_zip_names(builder, source["path"])
    assert {"buildspec.yml", "Dockerfile", "Dockerfile.gpu", "requirements.txt"} <= set(names)
    assert not [n for n in names if n.endswith((".whl", ".pyc"))]


def test_the_same_sources_give_the_same_asset_hashes(dev):
    # The assets depend on the source files only, not on the environment or the synthesis.
    prod = cdk_testkit.synthesized_with("prod", cdk_testkit.rebuilding)
    assert source_asset(dev, "ModelBuild")["path"] == source_asset(prod, "ModelBuild")["path"]
    assert source_asset(dev, "CpuImageBuild")["path"] == source_asset(prod, "CpuImageBuild")["path"]
    # Rebuilt, prod's logs are kept 90 days and retained with its artifacts.
    (log_group, *_) = prod.resources("build", "AWS::Logs::LogGroup").values()
    assert log_group["Properties"]["RetentionInDays"] == 90 and log_group["DeletionPolicy"] == "Retain"


@pytest.mark.parametrize("name", PROJECTS)
def test_roles_have_no_wildcard_actions_and_star_only_where_required(builder, name):
    for action, resources in grants(role_statements(builder, name)).items():
        assert "*" not in action, action
        if "*" in resources:
            assert action in SERVICE_WIDE_ACTIONS, action


def test_model_build_role_writes_the_model_prefix_only(builder):
    export = f"{builder.prefix}-artifacts:ArtifactBucketArn"
    found = grants(role_statements(builder, "ModelBuild"))
    on_bucket = {a: [r for r in rs if export in r] for a, rs in found.items()}
    assert {a: rs for a, rs in on_bucket.items() if rs} == {
        "s3:PutObject": [f"{export}/models/*"], "s3:GetObject": [f"{export}/models/*"],
        "s3:AbortMultipartUpload": [f"{export}/models/*"], "s3:ListBucket": [export]}
    list_statement = [s for s in role_statements(builder, "ModelBuild") if s["Action"] == "s3:ListBucket"][0]
    assert list_statement["Condition"] == {"StringLike": {"s3:prefix": ["models/*"]}}
    assert not any(a.startswith("ecr") for a in found)


@pytest.mark.parametrize("flavor", ["cpu", "gpu"])
def test_image_build_roles_push_to_the_one_repository(builder, flavor):
    found = grants(role_statements(builder, f"{flavor.capitalize()}ImageBuild"))
    repository = [r for a, r in found.items() if a == "ecr:PutImage"][0]
    assert len(repository) == 1 and "ImageRepository" in repository[0]
    assert found["s3:PutObject"] == [f"{builder.prefix}-artifacts:ArtifactBucketArn/image-digests/{flavor}/*"]
    assert not any(a.startswith("s3:") and a not in ("s3:PutObject", "s3:GetObject", "s3:GetObjectVersion",
                                                      "s3:GetBucketLocation", "s3:GetBucketAcl") for a in found)


@pytest.mark.parametrize("name", PROJECTS)
def test_each_role_reads_only_its_own_source_and_writes_its_own_logs(builder, name):
    found = grants(role_statements(builder, name))
    assert found["logs:PutLogEvents"] == [f"<{name}Logs" + found["logs:PutLogEvents"][0].split(f"<{name}Logs")[1]]
    if name == "TextGenerationMirror":
        assert "s3:GetObject" not in found
        return
    source_key = flatten(project(builder, name)["Properties"]["Source"]["Location"]).rsplit("/", 1)[1]
    sources = [r for r in found["s3:GetObject"] if "cdk-hnb659fds-assets" in r]
    assert len(sources) == 1 and sources[0].endswith("/" + source_key)


BUILDSPEC_VARIABLES = {"model_build/buildspec.yml": ("ModelBuild", ["ARTIFACT_BUCKET", "MODEL_PIN", "OUTPUT_PREFIX"]),
                       "container/buildspec.yml": ("CpuImageBuild", ["REPOSITORY_URI", "IMAGE_FLAVOR",
                                                                     "ARTIFACT_BUCKET", "DIGEST_PREFIX"])}


@pytest.mark.parametrize("path", BUILDSPEC_VARIABLES)
def test_projects_set_every_variable_their_buildspec_requires(builder, path):
    text = (REPOSITORY_ROOT / path).read_text()
    project_name, required = BUILDSPEC_VARIABLES[path]
    for name in required:
        assert name in text  # the buildspec still checks it
    assert set(required) <= set(environment_variables(builder, project_name))


@pytest.mark.parametrize("path", [
    "model_build/buildspec.yml",
    "container/buildspec.yml",
])
def test_the_buildspecs_are_valid_yaml(path):
    spec = yaml.safe_load((REPOSITORY_ROOT / path).read_text())
    assert spec["version"] == 0.2
    assert all(isinstance(command, str) for phase in spec["phases"].values() for command in phase["commands"])
