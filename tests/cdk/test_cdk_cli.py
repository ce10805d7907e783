"""The pinned aws-cdk CLI (package.json, installed by make's node_modules/.installed) synthesizes each environment
offline, exactly as README's Deploy section runs it: npx cdk synth -c env=NAME."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import cdk_testkit

ROOT = cdk_testkit.REPOSITORY_ROOT
CLI = ROOT / "node_modules" / ".bin" / "cdk"


def run_cdk(*args: str, cwd=ROOT, timeout: int = 300) -> subprocess.CompletedProcess:
    assert CLI.exists(), "the aws-cdk CLI is not installed: run make node_modules/.installed (npm ci)"
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CDK_"))}
    # No AWS here: no credentials to look up and no instance metadata service to wait for.
    environment.update(JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20", AWS_EC2_METADATA_DISABLED="true")
    # The app runs with this interpreter (under make test that is .venv/bin/python, as cdk.json says).
    return subprocess.run([str(CLI), *args, "--app", f"{sys.executable} app.py", "--no-notices"],
                          cwd=cwd, env=environment, capture_output=True, text=True, timeout=timeout)


def test_package_json_pins_the_cli_exactly():
    package = json.loads((ROOT / "package.json").read_text())
    lock = json.loads((ROOT / "package-lock.json").read_text())
    version = package["devDependencies"]["aws-cdk"]
    assert version[0].isdigit(), "pin an exact version, not a range"
    assert lock["packages"]["node_modules/aws-cdk"]["version"] == version
    assert json.loads((ROOT / "cdk.json").read_text())["app"] == ".venv/bin/python app.py"


@pytest.mark.parametrize("env", cdk_testkit.ENVIRONMENTS)
def test_npx_cdk_synth_succeeds_for_each_environment(env, tmp_path):
    completed = run_cdk("synth", "-c", f"env={env}", "--output", str(tmp_path / "cdk.out"), "--quiet")
    assert completed.returncode == 0, completed.stdout + completed.stderr
    prefix = cdk_testkit.cdk_json_context()["environments"][env]["name_prefix"]
    for kind in cdk_testkit.STACK_KINDS:
        assert (tmp_path / "cdk.out" / f"{prefix}-{kind}.template.json").exists()
    # A fresh clone pins nothing: the endpoints are left out, saying which keys to set.
    for kind in ("cpu", "gpu", "text_generation"):
        assert f"environments.{env}.pins.images.{kind} and environments.{env}.pins.model are set" in completed.stderr
    assert "AwsSolutions" not in completed.stderr
    shutil.rmtree(tmp_path / "cdk.out")


def test_an_unknown_environment_fails_with_the_key_named(tmp_path):
    completed = run_cdk("synth", "-c", "env=staging", "--output", str(tmp_path / "cdk.out"), "--quiet")
    assert completed.returncode != 0
    assert "env: 'staging' is not an environment in cdk.json (one of: dev, prod)" in completed.stderr


def test_an_invalid_value_fails_synth_naming_its_key(tmp_path):
    """An edited cdk.json in a copy of the app (the configuration fails before any asset is read)."""
    checkout = tmp_path / "checkout"
    (checkout / "model_build").mkdir(parents=True)
    shutil.copy(ROOT / "app.py", checkout)
    shutil.copy(ROOT / "model_build" / "pins.json", checkout / "model_build")
    shutil.copytree(ROOT / "stacks", checkout / "stacks", ignore=shutil.ignore_patterns("__pycache__"))
    cdk_json = json.loads((ROOT / "cdk.json").read_text())
    cdk_json["context"]["environments"]["prod"]["gpu"]["provision_timeout_s"] = 120
    cdk_json["context"]["environments"]["prod"]["pins"]["images"]["cpu"] = "decision-images:latest"
    (checkout / "cdk.json").write_text(json.dumps(cdk_json))
    completed = run_cdk("synth", "-c", "env=prod", "--output", str(tmp_path / "cdk.out"), "--quiet", cwd=checkout)
    assert completed.returncode != 0
    assert "environments.prod.gpu.provision_timeout_s: 120 is outside 300..3600" in completed.stderr
    assert "environments.prod.pins.images.cpu: 'decision-images:latest' is pinned by the mutable tag ':latest'" \
        in completed.stderr
