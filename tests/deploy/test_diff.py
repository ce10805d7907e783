"""make diff BASE=REV (deploy/diff.py): both revisions synthesized by the pinned CLI with the same pins, and the
difference printed per stack by npx cdk diff --template, offline. Run on a scratch repository made from this
working tree, with one change in its working tree."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest

from deploy import diff

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
    assert sorted(sections) == [f"decision-dev-{s}" for s in ("artifacts", "build", "endpoint-cpu", "endpoint-gpu",
                                                              "endpoint-text-generation", "monitoring")]
    cpu = sections.pop("decision-dev-endpoint-cpu")
    assert "[~] AWS::ApplicationAutoScaling::ScalableTarget" in cpu and "MaxCapacity" in cpu
    assert "[-] 2" in cpu and "[+] 3" in cpu
    for stack, section in sections.items():
        assert "There were no differences" in section, stack
    assert text.strip().endswith("1 stack(s) differ")


def test_an_unknown_revision_is_a_clear_error(scratch_repo, capsys):
    assert diff.main(["--base", "no-such-branch", "--repo", str(scratch_repo), "--env", "dev"]) == 2
    assert "git rev-parse --verify no-such-branch^{commit}" in capsys.readouterr().err
