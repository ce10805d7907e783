"""The pull-request diff workflow (.github/workflows/cdk-diff.yml) cannot run here (no GitHub runner, no AWS
account); this checks what it is made of: each environment diffed by the pinned CLI with the review stack's role
only (stacks/review_stack.py), inside its own GitHub environment (the one the role trusts; prod's gated by
reviewers), with no fallback to another role, no token left in the checkout, and the comment posted by a job that
runs none of the pull request's code."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from deploy.pins import pinned_context
from stacks.config import load_environment

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = yaml.safe_load((ROOT / ".github" / "workflows" / "cdk-diff.yml").read_text())
# The first major version of each action that runs on Node 24 (GitHub removes Node 20 from its runners).
NODE24_MAJORS = {"actions/checkout": 5, "actions/setup-python": 6, "actions/setup-node": 5,
                 "actions/github-script": 8, "actions/upload-artifact": 6, "actions/download-artifact": 6,
                 "aws-actions/configure-aws-credentials": 5}


def steps(job="diff"):
    return WORKFLOW["jobs"][job]["steps"]


def uses(job, action):
    (step,) = [s for s in steps(job) if s.get("uses", "").startswith(action + "@")]
    return step


def test_it_runs_on_pull_requests_that_touch_the_app():
    triggers = WORKFLOW[True] if True in WORKFLOW else WORKFLOW["on"]     # YAML 1.1 reads `on` as true
    assert {"cdk.json", "stacks/**", "app.py"} <= set(triggers["pull_request"]["paths"])


def test_each_environment_runs_in_the_github_environment_its_review_role_trusts():
    diff = WORKFLOW["jobs"]["diff"]
    assert diff["strategy"]["matrix"]["env"] == ["dev", "prod"]
    assert diff["environment"] == "cdk-diff-${{ matrix.env }}"
    context = pinned_context(json.loads((ROOT / "cdk.json").read_text())["context"])
    for env in diff["strategy"]["matrix"]["env"]:
        config = load_environment(context["environments"], env, model_pins=["qwen3.5-4b"])
        # The OIDC token's sub is repo:OWNER/REPO:environment:<this>, the only one stacks/review_stack.py trusts.
        assert config.review.github_environment == diff["environment"].replace("${{ matrix.env }}", env)


def test_credentials_are_the_environments_review_role_with_no_fallback_and_no_stored_keys():
    assert WORKFLOW["permissions"] == {}
    assert WORKFLOW["jobs"]["diff"]["permissions"] == {"contents": "read", "id-token": "write"}
    credentials = uses("diff", "aws-actions/configure-aws-credentials")
    assert credentials["with"]["role-to-assume"] == "${{ vars.CDK_DIFF_ROLE }}"   # the environment's own variable
    assert not any(key in credentials["with"] for key in ("aws-access-key-id", "aws-secret-access-key"))
    text = (ROOT / ".github" / "workflows" / "cdk-diff.yml").read_text()
    expressions = re.findall(r"\$\{\{(.*?)\}\}", text)
    assert not [e for e in expressions if "||" in e or "&&" in e], "no expression may fall back to another role"
    assert "lookup-role" not in text
    (check,) = [s for s in steps() if s.get("name") == "This environment's review role"]
    assert steps().index(check) < steps().index(credentials) and "exit 1" in check["run"]


def test_the_checkout_keeps_no_token_and_the_caches_are_used():
    assert uses("diff", "actions/checkout")["with"]["persist-credentials"] is False
    python = uses("diff", "actions/setup-python")["with"]
    assert python["cache"] == "pip" and "tests/cdk/requirements.txt" in python["cache-dependency-path"]
    assert uses("diff", "actions/setup-node")["with"]["cache"] == "npm"


def test_every_action_is_on_a_node24_release():
    for job in WORKFLOW["jobs"]:
        for step in steps(job):
            if "uses" in step:
                name, version = step["uses"].split("@")
                assert int(re.fullmatch(r"v(\d+)", version)[1]) >= NODE24_MAJORS[name], step["uses"]


def test_the_runner_node_is_the_lts_line_package_json_pins():
    """npx runs the CLI (and its app's jsii) on node_modules/.bin/node, the binary package.json pins; the runner's
    own Node, which runs npm and npx, is the same supported LTS line, never an end-of-life one."""
    from deploy import node
    setup = uses("diff", "actions/setup-node")["with"]
    assert str(setup["node-version"]) == node.pinned_version().split(".")[0]


def test_each_environment_is_diffed_by_the_pinned_cli_against_the_deployed_templates():
    (setup,) = [s for s in steps() if s.get("name") == "The CDK app's packages and the pinned CLI"]
    assert setup["run"] == "make .venv/.cdk node_modules/.installed"     # npm ci of package-lock.json
    (run,) = [s for s in steps() if s.get("id") == "diff"]
    assert 'npx cdk diff -c "env=$ENVIRONMENT" --all --method template' in run["run"]


def test_the_comment_is_posted_by_a_job_that_runs_no_code_of_the_pull_request():
    comment = WORKFLOW["jobs"]["comment"]
    assert comment["permissions"] == {"pull-requests": "write"}
    assert comment["needs"] == "diff" and comment["if"] == "always()"
    assert not [s for s in comment["steps"] if s.get("uses", "").startswith("actions/checkout") or "run" in s]
    script = uses("comment", "actions/github-script")["with"]["script"]
    assert "updateComment" in script and "createComment" in script
    assert uses("diff", "actions/upload-artifact")["with"]["name"] == "cdk-diff-${{ matrix.env }}"
