"""Pins in the formats the builds print them, for synthesizing and rehearsing without real artifacts.

The image digests are sha256 digests of made-up manifests and the model key is the one ``python -m model_build``
writes for the environment's ``build.model_pin`` (``models/<pin>/<gguf sha256>/model.tar.gz`` with the pin's real
GGUF sha256, from model_build/pins.json), so that everything that checks a pin's format checks these too.
Environments that cdk.json requires an account and region for (termination protection, retained artifacts) get
the example account and region below, as a user's cdk.json would name theirs.
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
    return {"images": {kind: image_digest(kind, generation) for kind in IMAGE_KINDS},
            "model": model_pin(environment["build"]["model_pin"])}


def needs_location(environment: dict[str, Any]) -> bool:
    """cdk.json requires account and region for these (stacks/config.py): protected or retained resources."""
    return bool(environment.get("termination_protection")) or \
        environment.get("artifacts", {}).get("removal_policy") == "retain"


def pinned_context(context: dict[str, Any], *, generation: int = 1, account: str = EXAMPLE_ACCOUNT,
                   region: str = EXAMPLE_REGION) -> dict[str, Any]:
    """cdk.json's context with every environment pinned, and located where cdk.json must name a location."""
    context = copy.deepcopy(context)
    for environment in context["environments"].values():
        environment["pins"] = pins_for(environment, generation)
        if needs_location(environment):
            environment["account"] = environment.get("account") or account
            environment["region"] = environment.get("region") or region
    return context


def pinned_cdk_json(cdk_json: dict[str, Any], **options: Any) -> dict[str, Any]:
    """A whole cdk.json (app command and context) with :func:`pinned_context` applied."""
    return {**cdk_json, "context": pinned_context(cdk_json["context"], **options)}
