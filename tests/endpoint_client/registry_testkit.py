"""Plain helpers shared by the endpoint-client tests: fake credentials and ECR image pushes as docker does them.
Kept out of conftest.py so tests import them by a name no other test folder uses."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
REGION, ACCOUNT = "us-east-1", "123456789012"
FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": REGION}


DOCKER_V2 = "application/vnd.docker.distribution.manifest.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def manifest(seed: str, media_type: str = DOCKER_V2) -> str:
    """A distinct image manifest per seed (moto derives the digest from the manifest's bytes); a Docker schema 2
    manifest as docker push writes it, or an OCI one as BuildKit's default (attestations aside) writes it."""
    config_type = "application/vnd.docker.container.image.v1+json" if media_type == DOCKER_V2 else \
        "application/vnd.oci.image.config.v1+json"
    return json.dumps({"schemaVersion": 2, "mediaType": media_type,
                       "config": {"mediaType": config_type, "size": 7, "digest": "sha256:" + seed * 64},
                       "layers": []})


def push(ecr, repository: str, image_manifest: str, tag: str) -> str:
    """PutImage as docker push does it; the digest is the manifest's sha256, as in ECR."""
    digest = "sha256:" + hashlib.sha256(image_manifest.encode()).hexdigest()
    ecr.put_image(repositoryName=repository, imageManifest=image_manifest, imageTag=tag, imageDigest=digest)
    return digest
