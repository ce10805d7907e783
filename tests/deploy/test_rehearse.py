"""make rehearse (deploy/rehearse.py) as part of make test: README's deploy path through the real CDK CLI against
moto on loopback. It asserts every stack's status after each step, the cross-stack exports, the endpoints' images
before and after a pin change, the alarms, which resource types moto skipped, prod's termination protection and
the destroy. A few minutes."""

from __future__ import annotations

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
    assert [s for s in steps if s[:2] in ("1.", "2.", "3.", "4.", "5.")] == [
        "1. bootstrap", "2. deploy dev --all", "3. a pin change: diff, then deploy dev --all",
        "4. prod: termination protection refuses a destroy", "5. destroy dev --all"]
    assert any(s.startswith("  npx cdk destroy -c env=prod decision-prod-monitoring") and "exit 1" in s
               for s in steps)
    assert steps[-1].startswith("rehearsal passed in ")


def test_readme_lists_what_moto_lacks():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Deploy rehearsal (`make rehearse`)", 1)[1].split("\n### ", 1)[0]
    for resource_type, what in rehearse.MOTO_LACKS.items():
        assert f"| `{resource_type}` | {what} |" in section
