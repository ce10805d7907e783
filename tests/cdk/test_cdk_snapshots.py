"""Snapshots of every environment's templates (with the test pins), so that any change is a reviewable diff.

Refresh after an intended change, then review and commit tests/cdk/snapshots/:

    make cdk-snapshots        # = UPDATE_CDK_SNAPSHOTS=1 python -m pytest -q tests/cdk/test_cdk_snapshots.py

Asset hashes (the zip names of the CodeBuild sources and CDK's own provider code) and the CDKMetadata
resource (CDK version telemetry) are normalised away; everything else, logical ids included, is compared.
"""

from __future__ import annotations

import copy
import difflib
import json
import os
import re

import pytest

import cdk_testkit

SNAPSHOTS = cdk_testkit.REPOSITORY_ROOT / "tests" / "cdk" / "snapshots"
UPDATE = os.environ.get("UPDATE_CDK_SNAPSHOTS") == "1"
ASSET_HASH = re.compile(r"\b[0-9a-f]{64}(?=\.zip\b)")


def normalise(template: dict) -> str:
    template = copy.deepcopy(template)
    template.get("Resources", {}).pop("CDKMetadata", None)
    conditions = template.get("Conditions", {})
    conditions.pop("CDKMetadataAvailable", None)
    if not conditions:
        template.pop("Conditions", None)
    text = json.dumps(template, indent=1, sort_keys=True) + "\n"
    return ASSET_HASH.sub("<asset-hash>", text)


@pytest.mark.parametrize("env, kind", cdk_testkit.ENVIRONMENT_STACKS)
def test_templates_match_their_snapshots(env, kind):
    pinned = cdk_testkit.synthesized(env, pinned=True)
    path = SNAPSHOTS / pinned.env / f"{kind}.json"
    actual = normalise(pinned.template(kind))
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
        return
    assert path.exists(), f"no snapshot {path.relative_to(cdk_testkit.REPOSITORY_ROOT)}; run make cdk-snapshots"
    expected = path.read_text()
    if actual != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True),
                                            f"snapshot {pinned.env}/{kind}.json", "synthesized", n=2))
        pytest.fail(f"{pinned.stack_name(kind)} differs from its snapshot (review, then make cdk-snapshots):\n"
                    f"{diff[:6000]}")


def test_every_snapshot_is_of_a_stack_synthesized():
    """A stack that is gone (prod's build stack, since prod takes dev's artifacts) leaves no stale snapshot."""
    on_disk = {(path.parent.name, path.stem) for path in SNAPSHOTS.glob("*/*.json")}
    assert on_disk == set(cdk_testkit.ENVIRONMENT_STACKS)


def test_normalisation_keeps_what_matters(dev):
    """Only asset hashes and CDK telemetry are replaced: pins, instance types and logical ids stay."""
    text = normalise(dev.template("endpoint-gpu"))
    assert cdk_testkit.TEST_PINS["images"]["gpu"] in text and "ml.g6e.xlarge" in text and "EndpointModel" in text
    assert "<asset-hash>" in normalise(dev.template("build"))
    assert "CDKMetadata" not in normalise(dev.template("build"))
