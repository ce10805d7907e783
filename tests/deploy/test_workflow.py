"""The pull-request diff workflow (.github/workflows/cdk-diff.yml) cannot run here (no GitHub runner, no AWS
account); this checks what it is made of: each environment diffed by the pinned CLI with a read-only OIDC role,
--method template (a change set would need the deploy role), and the result posted on the pull request."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = yaml.safe_load((ROOT / ".github" / "workflows" / "cdk-diff.yml").read_text())


def steps():
    return WORKFLOW["jobs"]["diff"]["steps"]


def test_it_runs_on_pull_requests_that_touch_the_app():
    triggers = WORKFLOW[True] if True in WORKFLOW else WORKFLOW["on"]     # YAML 1.1 reads `on` as true
    assert {"cdk.json", "stacks/**", "app.py"} <= set(triggers["pull_request"]["paths"])


def test_credentials_come_from_oidc_with_no_stored_keys():
    assert WORKFLOW["permissions"] == {"contents": "read", "id-token": "write", "pull-requests": "write"}
    (credentials,) = [s for s in steps() if s.get("uses", "").startswith("aws-actions/configure-aws-credentials")]
    assert "role-to-assume" in credentials["with"] and "vars.CDK_DIFF_ROLE_PROD" in credentials["with"]["role-to-assume"]
    assert not any(key in credentials["with"] for key in ("aws-access-key-id", "aws-secret-access-key"))


def test_each_environment_is_diffed_by_the_pinned_cli_against_the_deployed_templates():
    assert WORKFLOW["jobs"]["diff"]["strategy"]["matrix"]["env"] == ["dev", "prod"]
    (setup,) = [s for s in steps() if s.get("name") == "The CDK app's packages and the pinned CLI"]
    assert setup["run"] == "make .venv/.cdk node_modules/.installed"     # npm ci of package-lock.json
    (run,) = [s for s in steps() if s.get("id") == "diff"]
    assert "npx cdk diff -c env=${{ matrix.env }} --all --method template" in run["run"]


def test_the_result_is_posted_and_updated_on_the_pull_request():
    (post,) = [s for s in steps() if s.get("uses", "").startswith("actions/github-script")]
    assert post["if"] == "always() && steps.diff.outcome != 'skipped'"
    assert "updateComment" in post["with"]["script"] and "createComment" in post["with"]["script"]
