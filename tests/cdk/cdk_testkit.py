"""Synthesizes the CDK app the way app.py does, for the tests in tests/cdk.

Each (environment, pinned) combination is synthesized once per test session into a temporary cloud assembly,
with cdk-nag applied as in app.py (a finding that is not acknowledged fails the synthesis). ``pinned`` supplies
pins in the formats the builds print them (deploy/pins.py), so that the endpoint stacks have their endpoints; the
image digests are test values. An environment that cdk.json must locate (prod: termination protection, retained
artifacts) gets the example account and region, as a user's cdk.json names theirs; dev is synthesized without
either, as the CLI does when it finds no credentials.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import aws_cdk as cdk
from aws_cdk import assertions

import app as cdk_app
from deploy import pins as test_pins

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
CDK_JSON = REPOSITORY_ROOT / "cdk.json"
ENVIRONMENTS = ("dev", "prod")
ENDPOINT_STACKS = {"cpu": "endpoint-cpu", "gpu": "endpoint-gpu", "text_generation": "endpoint-text-generation",
                   "async": "endpoint-async"}
STACK_KINDS = ("artifacts", "build", "monitoring", "review", "access", *ENDPOINT_STACKS.values())

TEST_PINS = test_pins.pins_for({"build": {"model_pin": "qwen3.5-4b"}})
MODEL_SHA256 = TEST_PINS["model"]["gguf_sha256"]
EXAMPLE_ACCOUNT, EXAMPLE_REGION = test_pins.EXAMPLE_ACCOUNT, test_pins.EXAMPLE_REGION


def cdk_json_context() -> dict[str, Any]:
    return json.loads(CDK_JSON.read_text())["context"]


def builds(env: str) -> bool:
    """Whether cdk.json's environment builds its own artifacts (has a build stack), or takes another's."""
    return not cdk_json_context()["environments"][env].get("artifacts_from")


def stack_kinds(env: str) -> tuple[str, ...]:
    """The stacks cdk.json's environment has: every kind but build where it takes its artifacts from another."""
    return tuple(kind for kind in STACK_KINDS if kind != "build" or builds(env))


BUILDERS = tuple(env for env in ENVIRONMENTS if builds(env))


def rebuilding(environment: dict[str, Any]) -> None:
    """An edit: the environment builds its own artifacts again (docs/deploy.md: rebuilding for prod): dev's build
    section (prod's 90 days of build logs) instead of artifacts_from, pins in its own repository and bucket."""
    environment.pop("artifacts_from", None)
    environment["build"] = {**cdk_json_context()["environments"]["dev"]["build"], "log_retention_days": 90}
    environment["pins"] = copy.deepcopy(TEST_PINS)
# (environment, stack kind) of every stack cdk.json's environments have, for tests parametrized over both.
ENVIRONMENT_STACKS = tuple((env, kind) for env in ENVIRONMENTS for kind in stack_kinds(env))


def context_for(env: str, *, pinned: bool = True, edit=None) -> dict[str, Any]:
    """cdk.json's context with -c env=<env>; pins supplied when ``pinned``; ``edit(environment_dict)`` applied last."""
    context = copy.deepcopy(cdk_json_context())
    environment = context["environments"][env]
    if pinned:
        # An environment with artifacts_from (prod) gets the source's pins by full reference (deploy/pins.py), and
        # its source retains them, as stacks/config.py requires once they are pinned.
        if environment.get("artifacts_from"):
            test_pins.promote_into(context["environments"], env, locate=False)
        else:
            environment["pins"] = test_pins.pins_in(context["environments"], env)
        environment["review"]["github_repository"] = environment["review"]["github_repository"] or \
            test_pins.EXAMPLE_REPOSITORY
    if test_pins.needs_location(environment):
        environment["account"] = environment.get("account") or EXAMPLE_ACCOUNT
        environment["region"] = environment.get("region") or EXAMPLE_REGION
    if edit is not None:
        edit(environment)
    context["env"] = env
    return context


def pins_of(env: str) -> dict[str, Any]:
    """The pins the pinned synthesis of env has: its own builds' (TEST_PINS), or its artifact source's by full
    reference (prod: dev's repository and bucket, deploy/pins.py)."""
    return context_for(env)["environments"][env]["pins"]


@dataclass
class Synthesized:
    env: str
    outdir: Path
    prefix: str

    def stack_name(self, kind: str) -> str:
        return f"{self.prefix}-{kind}"

    def template(self, kind: str) -> dict[str, Any]:
        return json.loads((self.outdir / f"{self.stack_name(kind)}.template.json").read_text())

    @property
    def stack_kinds(self) -> tuple[str, ...]:
        """The kinds of STACK_KINDS this assembly has (no build stack where artifacts_from is set)."""
        return tuple(kind for kind in STACK_KINDS
                     if (self.outdir / f"{self.stack_name(kind)}.template.json").exists())

    def templates(self) -> Iterator[tuple[str, dict[str, Any]]]:
        for kind in self.stack_kinds:
            yield kind, self.template(kind)

    def assertions(self, kind: str) -> assertions.Template:
        return assertions.Template.from_json(self.template(kind))

    def resources(self, kind: str, resource_type: str) -> dict[str, dict[str, Any]]:
        return {logical_id: resource for logical_id, resource in self.template(kind)["Resources"].items()
                if resource["Type"] == resource_type}

    def resource(self, kind: str, resource_type: str, logical_id_prefix: str) -> dict[str, Any]:
        matches = [r for lid, r in self.resources(kind, resource_type).items() if lid.startswith(logical_id_prefix)]
        assert len(matches) == 1, f"expected one {resource_type} {logical_id_prefix}*, found {len(matches)}"
        return matches[0]

    def warnings(self) -> list[str]:
        """Warning annotations of all stacks, without CDK's ' [ack: id]' suffix."""
        manifest = json.loads((self.outdir / "manifest.json").read_text())
        found = []
        for artifact in manifest["artifacts"].values():
            metadata = dict(artifact.get("metadata", {}))
            if "additionalMetadataFile" in artifact:
                metadata.update(json.loads((self.outdir / artifact["additionalMetadataFile"]).read_text()))
            found += [re.sub(r" \[ack: [^]]+\]$", "", entry["data"]) for entries in metadata.values()
                      for entry in entries if entry["type"] == "aws:cdk:warning"]
        return found

    def manifest(self) -> dict[str, Any]:
        return json.loads((self.outdir / "manifest.json").read_text())

    def asset_manifest(self, kind: str) -> dict[str, Any]:
        return json.loads((self.outdir / f"{self.stack_name(kind)}.assets.json").read_text())


def synthesize(context: dict[str, Any], outdir: Path, cli_environment: dict[str, str] | None = None) -> cdk.App:
    app = cdk_app.build_app(context=context, outdir=str(outdir), cli_environment=cli_environment or {})
    app.synth()
    return app


_OUTDIRS: list[Path] = []


@functools.lru_cache(maxsize=None)
def synthesized(env: str, pinned: bool = True) -> Synthesized:
    outdir = Path(tempfile.mkdtemp(prefix=f"cdk-{env}-{'pinned' if pinned else 'fresh'}-"))
    _OUTDIRS.append(outdir)
    synthesize(context_for(env, pinned=pinned), outdir)
    prefix = cdk_json_context()["environments"][env]["name_prefix"]
    return Synthesized(env=env, outdir=outdir, prefix=prefix)


def synthesized_with(env: str, edit, *, pinned: bool = True) -> Synthesized:
    """A one-off synthesis of env with ``edit(environment_dict)`` applied to its cdk.json settings."""
    context = context_for(env, pinned=pinned, edit=edit)
    outdir = Path(tempfile.mkdtemp(prefix=f"cdk-{env}-edited-"))
    _OUTDIRS.append(outdir)
    synthesize(context, outdir)
    return Synthesized(env=env, outdir=outdir, prefix=context["environments"][env]["name_prefix"])


def remove_outdirs() -> None:
    for outdir in _OUTDIRS:
        shutil.rmtree(outdir, ignore_errors=True)


def statements(template: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(policy logical id, statement) for every IAM policy statement of a template."""
    for logical_id, resource in template["Resources"].items():
        if resource["Type"] == "AWS::IAM::Policy":
            for statement in resource["Properties"]["PolicyDocument"]["Statement"]:
                yield logical_id, statement


def variant_instance_types(production_variant: dict[str, Any]) -> list[str]:
    """The instance types a synthesized ProductionVariant runs on: its type, or its pools'."""
    pools = production_variant.get("InstancePools")
    return [pool["InstanceType"] for pool in pools] if pools else [production_variant["InstanceType"]]


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def flatten(value: Any) -> str:
    """A CloudFormation value as one readable string (refs as <LogicalId>, imports as their export name)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return ",".join(map(flatten, value))
    if "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(map(flatten, parts))
    if "Fn::ImportValue" in value:
        return flatten(value["Fn::ImportValue"])
    if "Fn::GetAtt" in value:
        return "<" + ".".join(value["Fn::GetAtt"]) + ">"
    if "Ref" in value:
        return f"<{value['Ref']}>"
    if "Fn::Sub" in value:
        return re.sub(r"\$\{([^}]+)\}", r"<\1>", value["Fn::Sub"])
    return json.dumps(value, sort_keys=True)
