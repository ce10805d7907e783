"""make diff BASE=REV (deploy/diff.py): both revisions synthesized by the pinned CLI, each with its own pins, the
pins that differ and the difference per stack printed by npx cdk diff --template, offline. Run on a scratch
repository made from this working tree, with one change in its working tree."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest

from deploy import diff
from deploy.pins import image_digest, model_pin

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def scratch_repo(tmp_path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    diff.export_working_tree(ROOT, repo)
    for args in (["init", "-q", "-b", "main"], ["add", "-A"],
                 ["-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "base"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
    return repo


def test_a_change_shows_in_its_stack_and_nowhere_else(scratch_repo):
    cdk_json = scratch_repo / "cdk.json"
    content = json.loads(cdk_json.read_text())
    content["context"]["environments"]["dev"]["cpu"]["max_instance_count"] = 3
    cdk_json.write_text(json.dumps(content, indent=2))
    out = io.StringIO()
    differing = diff.diff(scratch_repo, "main", ["dev"], out=out)
    text = out.getvalue()
    assert differing == 1, text
    sections = {chunk.split("\n", 1)[0]: chunk for chunk in text.split("Stack ")[1:]}
    assert sorted(sections) == [f"decision-dev-{s}" for s in ("access", "artifacts", "build", "endpoint-async",
                                                              "endpoint-cpu", "endpoint-gpu",
                                                              "endpoint-text-generation", "monitoring", "review")]
    assert "pins unchanged" in text
    cpu = sections.pop("decision-dev-endpoint-cpu")
    assert "[~] AWS::ApplicationAutoScaling::ScalableTarget" in cpu and "MaxCapacity" in cpu
    assert "[-] 2" in cpu and "[+] 3" in cpu
    for stack, section in sections.items():
        assert "There were no differences" in section, stack
    assert text.strip().endswith("1 stack(s) differ")


def test_a_pin_change_shows_in_the_pins_and_in_the_stacks_it_changes(scratch_repo):
    """The most common deploy change: the base's real pins against the working tree's new ones, and a first pin of
    the GPU image, which creates that endpoint (the base's GPU stack is its placeholder)."""
    cdk_json = scratch_repo / "cdk.json"
    content = json.loads(cdk_json.read_text())
    dev = content["context"]["environments"]["dev"]
    dev["pins"] = {"images": {"cpu": image_digest("cpu", 1), "gpu": None, "text_generation": None},
                   "model": model_pin("qwen3.5-4b")}
    cdk_json.write_text(json.dumps(content, indent=2))
    subprocess.run(["git", "-C", str(scratch_repo), "-c", "user.name=t", "-c", "user.email=t@example.com", "commit",
                    "-q", "-am", "pinned"], check=True, capture_output=True)
    dev["pins"]["images"].update(cpu=image_digest("cpu", 2), gpu=image_digest("gpu", 2))
    cdk_json.write_text(json.dumps(content, indent=2))
    out = io.StringIO()
    differing = diff.diff(scratch_repo, "HEAD", ["dev"], out=out)
    text = out.getvalue()
    assert f'  pins.images.cpu: "{image_digest("cpu", 1)}" -> "{image_digest("cpu", 2)}"' in text
    assert f'  pins.images.gpu: unpinned -> "{image_digest("gpu", 2)}"' in text
    assert "pins.model" not in text and "pins.images.text_generation" not in text.split("Stack ", 1)[0]
    sections = {chunk.split("\n", 1)[0]: chunk for chunk in text.split("Stack ")[1:]}
    assert image_digest("cpu", 2) in sections["decision-dev-endpoint-cpu"]
    # The async endpoint runs the CPU image (one pin): its Model changes with it.
    assert image_digest("cpu", 2) in sections["decision-dev-endpoint-async"]
    gpu = sections["decision-dev-endpoint-gpu"]
    for created in ("AWS::SageMaker::Model", "AWS::SageMaker::EndpointConfig", "AWS::SageMaker::Endpoint",
                    "AWS::CloudWatch::Alarm", "AWS::ApplicationAutoScaling::ScalableTarget"):
        assert f"[+] {created}" in gpu, created
    # The dashboard gains the GPU endpoint's row: the fourth stack that differs.
    assert "decision-dev-gpu" in sections["decision-dev-monitoring"].split("There were no differences")[0]
    assert differing == 4 and text.strip().endswith("4 stack(s) differ"), text


def test_an_unknown_revision_is_a_clear_error(scratch_repo, capsys):
    assert diff.main(["--base", "no-such-branch", "--repo", str(scratch_repo), "--env", "dev"]) == 2
    assert "git rev-parse --verify no-such-branch^{commit}" in capsys.readouterr().err
