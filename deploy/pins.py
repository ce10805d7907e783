"""Pins in the formats the builds print them, for synthesizing and rehearsing without real artifacts.

The image digests are sha256 digests of made-up manifests and the model key is the one ``python -m model_build``
writes for the environment's ``build.model_pin`` (``models/<pin>/<gguf sha256>/model.tar.gz`` with the pin's real
GGUF sha256, from model_build/pins.json), so that everything that checks a pin's format checks these too. An
environment whose ``artifacts_from`` names another gets that one's pins as full references to its repository and
bucket (:func:`promoted_pins`), under names made up as CloudFormation generates them.
Environments that cdk.json requires an account and region for (termination protection, retained artifacts) get
the example account and region below, as a user's cdk.json would name theirs; a source whose artifacts another's
pins name retains them (stacks/config.py requires it), as a user's cdk.json must before promote writes such pins.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
MODEL_PINS = REPOSITORY_ROOT / "model_build" / "pins.json"
# AWS's documentation account and a region other than us-east-1 (the CLI's fallback), so that a template that
# assumed either would show.
EXAMPLE_ACCOUNT = "111122223333"
EXAMPLE_REGION = "eu-west-1"
# The repository whose pull requests the review stack's role trusts, where cdk.json names none yet.
EXAMPLE_REPOSITORY = "example-org/decision-models"
IMAGE_KINDS = ("cpu", "gpu", "text_generation")


def image_manifest(kind: str, generation: int = 1) -> str:
    """A Docker image manifest (schema 2) standing for the image a build pushed; its sha256 is the digest."""
    config = hashlib.sha256(f"decision-models {kind} image, build {generation}".encode()).hexdigest()
    return json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                       "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": 1024,
                                  "digest": f"sha256:{config}"},
                       "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                                   "size": 4096, "digest": f"sha256:{hashlib.sha256(config.encode()).hexdigest()}"}]},
                      separators=(",", ":"))


def image_digest(kind: str, generation: int = 1) -> str:
    return "sha256:" + hashlib.sha256(image_manifest(kind, generation).encode()).hexdigest()


def model_pin(pin_name: str) -> dict[str, str]:
    """What the model build prints for a pin of model_build/pins.json, as cdk.json takes it."""
    sha256 = json.loads(MODEL_PINS.read_text())["pins"][pin_name]["sha256"]
    return {"s3_key": f"models/{pin_name}/{sha256}/model.tar.gz", "gguf_sha256": sha256}


def pins_for(environment: dict[str, Any], generation: int = 1) -> dict[str, Any]:
    """Pins of an environment that builds: digests in its own repository, the key in its own bucket."""
    return {"images": {kind: image_digest(kind, generation) for kind in IMAGE_KINDS},
            "model": model_pin(environment["build"]["model_pin"])}


def example_artifact_names(name_prefix: str) -> tuple[str, str]:
    """(repository, bucket) names of an environment's artifacts stack as CloudFormation generates them
    (``<stack>-<logical id>-<suffix>``, lower case), made up for templates that are synthesized but never deployed."""
    suffix = hashlib.sha256(name_prefix.encode()).hexdigest()
    stack = f"{name_prefix}-artifacts"
    return (f"{stack}-imagerepository{suffix[:8]}-{suffix[8:20]}",
            f"{stack}-artifactbucket{suffix[20:28]}-{suffix[28:40]}")


def example_acceptance_pin(source_name: str, bucket: str) -> dict[str, str]:
    """A made-up record of the source's acceptance report, in the form promote writes it (stacks/config.py,
    AcceptancePin)."""
    key = f"acceptance/{source_name}/20270101T000000Z.json"
    return {"bucket": bucket, "key": key, "version_id": hashlib.sha256(key.encode()).hexdigest()[:32],
            "sha256": hashlib.sha256(f"report {key}".encode()).hexdigest()}


def promoted_pins(source_pins: dict[str, Any], *, account: str, region: str, repository: str,
                  bucket: str, source_name: str = "dev") -> dict[str, Any]:
    """The pins of an environment whose artifacts_from names the source: the source's digests as full references to
    its repository, the source's model key with its bucket, and the acceptance report they were promoted on (what
    ``endpoint_client promote`` writes)."""
    registry = f"{account}.dkr.ecr.{region}.amazonaws.com/{repository}"
    images = {kind: None if digest is None else f"{registry}@{digest.rsplit('@', 1)[-1]}"
              for kind, digest in source_pins["images"].items()}
    model = source_pins["model"] and {**source_pins["model"], "bucket": bucket}
    return {"images": images, "model": model, "acceptance": example_acceptance_pin(source_name, bucket)}


def pins_in(environments: dict[str, Any], name: str, generation: int = 1, *, account: str = EXAMPLE_ACCOUNT,
            region: str = EXAMPLE_REGION) -> dict[str, Any]:
    """Test pins of environments[name]: its own builds' (pins_for), or, where artifacts_from names a source, the
    source's builds named by full reference in the source's (made-up) repository and bucket, in the source's account
    and region where cdk.json names them, else ``account`` and ``region``."""
    environment = environments[name]
    source_name = environment.get("artifacts_from")
    if not source_name:
        return pins_for(environment, generation)
    source = environments[source_name]
    repository, bucket = example_artifact_names(source["name_prefix"])
    return promoted_pins(pins_for(source, generation), account=source.get("account") or account,
                         region=source.get("region") or environment.get("region") or region, repository=repository,
                         bucket=bucket, source_name=source_name)


def promote_into(environments: dict[str, Any], name: str, generation: int = 1, *, account: str = EXAMPLE_ACCOUNT,
                 region: str = EXAMPLE_REGION, locate: bool = True) -> None:
    """environments[name] pinned to its source's builds (pins_in), and the source made to retain them, located in
    ``account`` and ``region`` where cdk.json leaves that to the caller (``locate``: a synthesis of environments[name]
    alone does not validate its source, so it need not): what a user's cdk.json holds once promote has written such
    pins (stacks/config.py refuses a source that would destroy them). Edited in place."""
    source = environments[name].get("artifacts_from")
    if not source:
        environments[name]["pins"] = pins_for(environments[name], generation)
        return
    retained = environments[source]
    retained["artifacts"] = {**retained.get("artifacts", {}), "removal_policy": "retain"}
    if locate:
        retained["account"] = retained.get("account") or account
        retained["region"] = retained.get("region") or region
    environments[name]["pins"] = pins_in(environments, name, generation, account=account, region=region)


def retaining_sources(environments: dict[str, Any]) -> None:
    """The environments whose artifacts another's pins name keep them on `cdk destroy` (removal_policy retain), as
    stacks/config.py requires before promote writes such pins; edited in place."""
    for environment in environments.values():
        source = environment.get("artifacts_from")
        pins = environment.get("pins") or {}
        if source in environments and (pins.get("model") or any((pins.get("images") or {}).values())):
            environments[source]["artifacts"] = {**environments[source].get("artifacts", {}),
                                                 "removal_policy": "retain"}


def needs_location(environment: dict[str, Any]) -> bool:
    """cdk.json requires account and region for these (stacks/config.py): protected or retained resources."""
    return bool(environment.get("termination_protection")) or \
        environment.get("artifacts", {}).get("removal_policy") == "retain"


def pinned_context(context: dict[str, Any], *, generation: int = 1, account: str = EXAMPLE_ACCOUNT,
                   region: str = EXAMPLE_REGION, one_account: bool = False) -> dict[str, Any]:
    """cdk.json's context with every environment pinned, located where cdk.json must name a location, and given the
    example repository where its review settings name none. ``one_account``: every environment deploys to the same
    account and region (the rehearsal's), so, as a user's cdk.json would, only the first one creates what an
    account has once (GitHub's OIDC provider, the transform log group; stacks/config.py refuses two)."""
    context = copy.deepcopy(context)
    environments = context["environments"]
    pins = {name: pins_in(environments, name, generation, account=account, region=region) for name in environments}
    for name, environment in environments.items():
        environment["pins"] = pins[name]
    retaining_sources(environments)
    for index, (name, environment) in enumerate(environments.items()):
        if one_account and index > 0:
            environment["review"] = {**environment.get("review", {}), "create_oidc_provider": False}
            environment["create_transform_log_group"] = False
        review = environment.get("review", {})
        if not review.get("github_repository"):
            environment["review"] = {**review, "github_repository": EXAMPLE_REPOSITORY}
        if needs_location(environment):
            environment["account"] = environment.get("account") or account
            environment["region"] = environment.get("region") or region
    return context


def completed_contexts(base: dict[str, Any], head: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two revisions' cdk.json contexts as ``make diff`` synthesizes them: each side keeps the pins it has, a pin that
    neither side has gets the same synthetic one on both (so that their stacks can be compared at all), and a pin
    that only one side has stays missing on the other, so that a first pin shows as the endpoint it creates. Both
    are located and given the example repository as :func:`pinned_context` does."""
    sides = [copy.deepcopy(base), copy.deepcopy(head)]
    synthetic = [pinned_context(side) for side in sides]
    for name in set(base.get("environments", {})) | set(head.get("environments", {})):
        present = [side["environments"].get(name) for side in sides]
        values = [pin_values(environment) if environment else {} for environment in present]
        for environment, filled in zip(present, (s["environments"].get(name) for s in synthetic)):
            if environment is None:
                continue
            pins = copy.deepcopy(environment.get("pins") or {})
            pins.setdefault("images", {})
            for key in (f"pins.images.{kind}" for kind in IMAGE_KINDS):
                kind = key.rsplit(".", 1)[1]
                if all(v.get(key) is None for v in values):
                    pins["images"][kind] = filled["pins"]["images"][kind]
            if all(v.get("pins.model") is None for v in values):
                pins["model"] = filled["pins"]["model"]
            if "acceptance" in filled["pins"] and not pins.get("acceptance"):
                pins["acceptance"] = filled["pins"]["acceptance"]
            environment["pins"] = pins
            for key in ("account", "region", "review"):
                environment[key] = filled.get(key)
        source = next((e.get("artifacts_from") for e in present if e), None)
        if source and all(value is None for v in values for value in v.values()):
            # Pins made up on both sides for a consumer: its source retains its artifacts, as it must once real
            # pins name them (real pins of a source that does not are left for synthesis to refuse).
            for side in sides:
                if source in side.get("environments", {}):
                    retaining_sources({source: side["environments"][source], name: {
                        "artifacts_from": source, "pins": {"model": True}}})
    return sides[0], sides[1]


def pin_values(environment: dict[str, Any]) -> dict[str, Any]:
    """{cdk.json key under pins: value or None} of one environment, for printing what a change does to them."""
    pins = environment.get("pins") or {}
    values = {f"pins.images.{kind}": (pins.get("images") or {}).get(kind) for kind in IMAGE_KINDS}
    values["pins.model"] = pins.get("model")
    return values


def pinned_cdk_json(cdk_json: dict[str, Any], **options: Any) -> dict[str, Any]:
    """A whole cdk.json (app command and context) with :func:`pinned_context` applied."""
    return {**cdk_json, "context": pinned_context(cdk_json["context"], **options)}
