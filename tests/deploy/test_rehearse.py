"""make rehearse (deploy/rehearse.py) as part of make test: docs/deploy.md's path through the real CDK CLI against
moto on loopback. It asserts every stack's status after each step, the cross-stack exports, the endpoints' images
before and after a pin change, that the review role allows the diff's recorded calls and the deployer policy the
calls the diff and deploy make with the caller's own credentials, the acceptance report, the alarms, which resource
types moto skipped, promote refused before acceptance and prod deployed from dev's artifacts after it (no build
stack, dev's digests and model archive), prod's termination protection and the destroy. A few minutes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from deploy import rehearse

ROOT = Path(__file__).resolve().parents[2]


def test_the_rehearsal_passes():
    """As make rehearse runs it, in a process of its own (the emulator's changes to moto stay there)."""
    done = subprocess.run([sys.executable, "-m", "deploy.rehearse"], cwd=ROOT, capture_output=True, text=True,
                          timeout=1200)
    assert done.returncode == 0, (done.stdout + done.stderr)[-8000:]
    steps = done.stdout.splitlines()
    assert [s for s in steps if s[:2] in ("1.", "2.", "3.", "4.", "5.", "6.")] == [
        "1. bootstrap", "2. deploy dev --all", "3. a pin change: diff, then deploy dev --all",
        "4. acceptance -c env=dev (moto)",
        "5. prod from dev's artifacts: deploy prod --all, then termination protection refuses a destroy",
        "6. destroy dev --all"]
    # prod deployed from dev's artifacts: no build stack, its Models naming dev's digests and archive.
    assert any(s.startswith("  npx cdk deploy -c env=prod --all") and "exit 0" in s for s in steps)
    assert "  prod's 4 endpoints run dev's image digests and model archive; no prod build stack" in steps
    assert any(s.startswith("  npx cdk destroy -c env=prod decision-prod-monitoring") and "exit 1" in s
               for s in steps)
    # prod's copy in another account is placed in a VPC made there: its Models in the subnets, its network stack's
    # five VPC endpoints in the VPC (cdk.json's vpc with create_endpoints).
    assert "  prod-elsewhere is placed in a VPC: every Model in its 2 subnets, its network stack's 5 VPC endpoints " \
           "there" in steps
    assert "  prod-elsewhere's cpu endpoint captures its requests and responses into its own artifact bucket " \
           "(data-capture/); the others capture nothing" in steps
    # The review role allows every call the CLI made for the diff (moto's recording, evaluated by iam-simulate).
    assert any(s.startswith("  the diff's ") and "are allowed by decision-dev-cdk-diff" in s for s in steps)
    # With the caller's own credentials the CLI only assumes bootstrap roles, which the deployer policy allows.
    assert any(s.startswith("  cdk diff and deploy made ") and "sts:AssumeRole: cdk-hnb659fds-deploy-role-" in s
               and s.endswith("all are allowed by decision-dev-deployer") for s in steps)
    # It ends with the acceptance report: every check proved or, on moto, unprovable with its reason; none failed.
    report = steps[steps.index("acceptance report (step 4; python -m endpoint_client acceptance -c env=dev --emulator "
                               "moto):") + 1:-1]
    checks = {line.split()[1] for line in report[:-1]}
    assert {"invoke", "log", "metrics", "storage", "alarm", "rollback"} <= checks, report
    for line in report[:-1]:
        state = line.split()[0]
        assert state in ("proved", "unprovable", "warn"), line
        assert state != "unprovable" or ": on moto: " in line, line
    assert report[-1].strip().endswith("skipped") and " 0 failed" in report[-1]
    assert steps[-1].startswith("rehearsal passed in ")


def test_docs_deploy_lists_what_moto_lacks():
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    section = deploy.split("\n## Deploy rehearsal (`make rehearse`)\n", 1)[1].split("\n## ", 1)[0]
    for resource_type, what in rehearse.MOTO_LACKS.items():
        assert f"| `{resource_type}` | {what} |" in section


def test_a_recording_with_two_requests_on_a_line_is_read_as_two():
    """moto's threaded server can write two records before their newlines (the deploy's parallel calls)."""
    first = {"headers": {"Authorization": "AWS4-HMAC-SHA256 Credential=rehearsal/20270101/eu-west-1/sts/aws4_request"},
             "body": "Action=AssumeRole&RoleArn=arn%3Aaws%3Aiam%3A%3A123456789012%3Arole%2Fcdk-x", "url": "/"}
    second = {"headers": {}, "body": "{\"a\": \"}{\"}", "url": "/"}
    lines = rehearse.one_request_a_line(json.dumps(first) + json.dumps(second) + "\n\n").splitlines()
    assert [json.loads(line) for line in lines] == [first, second]
    requests = rehearse.caller_requests("\n".join(lines), "rehearsal", {}, "123456789012", "eu-west-1")
    assert [(r.action, r.resource) for r in requests] == [("sts:AssumeRole",
                                                           "arn:aws:iam::123456789012:role/cdk-x")]
