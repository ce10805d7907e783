"""``python -m endpoint_client check-pins -c env=NAME [--protect]``: are the pins of cdk.json there to deploy?

Before ``npx cdk deploy``, for every endpoint the environment lists: the pinned image digest exists in its
repository (the project repository from the artifacts stack's outputs, or the private ECR repository of a pinned
URI, e.g. the artifact source's) as a Docker image manifest (schema 2, the only kind SageMaker pulls: an OCI
manifest or an index is refused with "Unsupported manifest media type"), and the pinned model archive exists in the
artifact bucket, or in the bucket the pin names (the artifact source's). An image in the project repository must also
carry its protective tag ``pinned-<digest hex>``, which the repository's first lifecycle rule never expires
(stacks/artifacts_stack.py); ``--protect`` adds the tags that are missing (ECR PutImage of the same manifest
under one more tag: the repository's tags are immutable, the digest stays).

Prints one line per pin; exit codes: 0 every pin exists (as a Docker manifest, and protected), 1 a pin is missing,
of a media type SageMaker refuses, or unprotected, 2 bad arguments or cdk.json, 4 no region or credentials.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Sequence

from botocore.exceptions import ClientError

from endpoint_client.deployment import (EXIT_FAILED, Aws, CommandError, add_common_arguments, error_code,
                                        report_checks, stack_outputs)
from stacks.config import PINNED_TAG_PREFIX, EnvironmentConfig, image_kind


# The one image manifest media type SageMaker accepts (container/buildspec.yml and the mirror build check it too).
DOCKER_V2_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


def protective_tag(digest: str) -> str:
    """The tag that keeps an image from lifecycle expiry: pinned-<64 hex> (71 characters; ECR allows 128)."""
    return PINNED_TAG_PREFIX + digest.removeprefix("sha256:")


@dataclass(frozen=True)
class PinStatus:
    key: str                 # the cdk.json key path of the pin
    target: str              # what it names (an image, an S3 object)
    exists: bool
    protected: bool | None   # None where protection does not apply (the model, other repositories)
    note: str = ""
    media_type: str | None = None   # images only: the manifest's media type as ECR reports it

    @property
    def accepted(self) -> bool:
        """Not an image, or an image SageMaker can pull."""
        return not self.exists or not self.is_image or self.media_type == DOCKER_V2_MANIFEST

    @property
    def is_image(self) -> bool:
        return self.target.count("@sha256:") == 1

    @property
    def ok(self) -> bool:
        return self.exists and self.accepted and self.protected is not False

    @property
    def state(self) -> str:
        if not self.exists:
            return "missing"
        if not self.accepted:
            return "unsupported"
        return "unprotected" if self.protected is False else "ok"

    def line(self) -> str:
        note = self.note
        if not self.accepted:
            note = (f"{self.media_type or 'no media type'}: SageMaker pulls only {DOCKER_V2_MANIFEST}"
                    + (f"; {note}" if note else ""))
        return f"{self.state:11} {self.key}: {self.target}" + (f" ({note})" if note else "")


def check_pins(config: EnvironmentConfig, aws: Aws, *, protect: bool) -> list[PinStatus]:
    ecr, own = aws.client("ecr"), _OwnArtifacts(config, aws)
    statuses = []
    # One check per image: the async kind runs the cpu image (image_kind).
    for kind in dict.fromkeys(image_kind(kind) for kind in config.endpoints):
        image = getattr(config.pins.images, kind)
        key = config.key("pins", "images", kind)
        if image is None:
            statuses.append(PinStatus(key, "not pinned", exists=True, protected=None,
                                      note=f"the {kind} endpoint stays out of the deployment"))
        elif image.repository is None:
            registry, _, repository = own.outputs["ImageRepositoryUri"].partition("/")
            statuses.append(protect_project_image(ecr, key, registry.split(".")[0], repository, image.digest,
                                                  protect))
        else:
            target = f"{image.repository.uri}@{image.digest}"
            details = _readable(config, target, lambda: _image_details(ecr, image.repository.account,
                                                                       image.repository.name, image.digest))
            if config.artifacts_from is not None:
                # The source's repository keeps an image its consumers pin only while it is tagged so (promote
                # tags what it promotes): its lifecycle would expire it otherwise.
                protected = details is not None and protective_tag(image.digest) in details.get("imageTags", [])
                note = "" if protected or details is None else f"not tagged {protective_tag(image.digest)} in " \
                    f"{config.artifacts_from}'s repository, whose lifecycle can expire it (promote tags what it " \
                    f"promotes)"
            else:
                protected, note = None, "another repository: its own lifecycle rules apply"
            statuses.append(PinStatus(key, target, exists=details is not None, protected=protected, note=note,
                                      media_type=details and details.get("imageManifestMediaType")))
    if config.pins.model is not None:
        # The pin's own bucket where it names one (the artifact source's, artifacts_from), else this environment's.
        bucket = config.pins.model.bucket or own.outputs["ArtifactBucketName"]
        target = f"s3://{bucket}/{config.pins.model.s3_key}"
        object_key = config.pins.model.s3_key
        exists = _readable(config, target, lambda: _object_exists(aws.client("s3"), bucket, object_key))
        statuses.append(PinStatus(config.key("pins", "model"), target, exists=exists, protected=None))
    return statuses


class _OwnArtifacts:
    """The environment's own artifacts stack's outputs, read only when a pin names its repository or bucket: an
    environment whose pins all name another's (artifacts_from) can be checked with the other's credentials."""

    def __init__(self, config: EnvironmentConfig, aws: Aws):
        self.config, self.aws, self._outputs = config, aws, None

    @property
    def outputs(self) -> dict[str, str]:
        if self._outputs is None:
            self._outputs = stack_outputs(self.aws.client("cloudformation"), self.config.artifacts_stack_name,
                                          ["ArtifactBucketName", "ImageRepositoryUri"])
        return self._outputs


DENIED = ("AccessDenied", "AccessDeniedException", "403", "UnauthorizedOperation")


def source_operator(config: EnvironmentConfig) -> str:
    """The operator policy that reads an environment's artifact source (its <prefix>-operator)."""
    source = config.artifact_source
    return f"{source.name_prefix}-operator" if source is not None and source.name_prefix else \
        f"{config.artifacts_from}'s operator policy"


def denied(error: ClientError) -> bool:
    return error_code(error) in DENIED


def _readable(config: EnvironmentConfig, target: str, read: Any) -> Any:
    """``read()``; CommandError (EXIT_FAILED), one line naming the operator to use, when these credentials may not
    read ``target`` (another account's artifacts admit only its consumers' execution roles)."""
    try:
        return read()
    except ClientError as error:
        if not denied(error) or config.artifacts_from is None:
            raise
        raise CommandError(f"{target}: {error_code(error)} with these credentials: {config.artifacts_from}'s "
                           f"artifacts admit {config.name}'s execution roles, not its operator, where "
                           f"{config.artifacts_from} is in another account; check them with {source_operator(config)} "
                           f"(python -m endpoint_client check-pins -c env={config.name} with {config.artifacts_from}'s "
                           f"credentials)", EXIT_FAILED) from None


def protect_project_image(ecr: Any, key: str, registry_id: str, repository: str, digest: str,
                          protect: bool) -> PinStatus:
    target = f"{repository}@{digest}"
    details = _image_details(ecr, registry_id, repository, digest)
    if details is None:
        return PinStatus(key, target, exists=False, protected=None)
    tags, media_type = details.get("imageTags", []), details.get("imageManifestMediaType")
    tag = protective_tag(digest)
    if tag in tags:
        return PinStatus(key, target, exists=True, protected=True, media_type=media_type)
    if media_type != DOCKER_V2_MANIFEST:
        # Not worth keeping: SageMaker cannot pull it.
        return PinStatus(key, target, exists=True, protected=False, media_type=media_type)
    if not protect:
        return PinStatus(key, target, exists=True, protected=False, note=f"run with --protect to tag it {tag}",
                         media_type=media_type)
    (image,) = ecr.batch_get_image(registryId=registry_id, repositoryName=repository,
                                   imageIds=[{"imageDigest": digest}])["images"]
    try:
        ecr.put_image(registryId=registry_id, repositoryName=repository, imageManifest=image["imageManifest"],
                      imageManifestMediaType=image["imageManifestMediaType"], imageTag=tag, imageDigest=digest)
    except ClientError as error:
        if error_code(error) != "ImageAlreadyExistsException":   # tagged meanwhile
            raise
    return PinStatus(key, target, exists=True, protected=True, note=f"tagged {tag} now", media_type=media_type)


def _image_details(ecr: Any, registry_id: str, repository: str, digest: str) -> dict[str, Any] | None:
    """ECR's imageDetails of the digest (tags, manifest media type), None when it is not there."""
    try:
        (details,) = ecr.describe_images(registryId=registry_id, repositoryName=repository,
                                         imageIds=[{"imageDigest": digest}])["imageDetails"]
    except ClientError as error:
        if error_code(error) in ("ImageNotFoundException", "RepositoryNotFoundException"):
            return None
        raise
    return details


def _object_exists(s3: Any, bucket: str, key: str) -> bool:
    try:
        s3.head_object(Bucket=bucket, Key=key)
    except ClientError as error:
        if error_code(error) in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    return True


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m endpoint_client check-pins",
        description="Check that every image digest and model archive cdk.json pins exists, images as Docker "
                    "schema 2 manifests (before a deploy); --protect tags pinned images so that the repository's "
                    "lifecycle rules never expire them.")
    add_common_arguments(parser)
    parser.add_argument("--protect", action="store_true",
                        help=f"tag each pinned image of the project repository {PINNED_TAG_PREFIX}<digest hex>")
    args = parser.parse_args(argv)
    return report_checks("check-pins", args, lambda config, aws: check_pins(config, aws, protect=args.protect),
                         lambda status: status.ok)
