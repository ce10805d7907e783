"""``python -m endpoint_client promote --from dev --to prod [--cdk-json PATH]``: pin in the target environment what
the source environment serves, once the source's acceptance proved it (issue 33, "build once, promote by digest").

For each endpoint kind the target lists, it reads what the source's endpoint serves (DescribeEndpoint ->
EndpointConfig -> the variant's Model: the image by digest and the model archive; deployment.served_by) and the
source's latest acceptance report (``acceptance/<source>/latest.json`` in the source's artifact bucket,
endpoint_client.acceptance_report). It refuses, changing nothing, unless:

- the target takes its artifacts from the source (``"artifacts_from": "<source>"`` in cdk.json): only such an
  environment's stacks let its execution roles pull the source's repository and archive;
- every one of those endpoints exists and is InService (not updating, rolling back or failed);
- the latest report passed (no check failed) and names, for each kind, exactly the image and model data URL the
  endpoint serves now: an image deployed after acceptance, or a report that failed, is never promoted;
- the report was made on AWS, or, with ``--emulator moto`` (the deploy rehearsal), on moto: a run on an emulator,
  whose checks that need AWS are unprovable, accepts nothing on AWS.

- the source retains its artifacts (``artifacts.removal_policy`` retain: stacks/config.py refuses the pins
  otherwise), and each image can be protected in the source's repository: promote tags it ``pinned-<digest hex>``
  (the tag check-pins --protect adds), which the repository's first lifecycle rule never expires; an image in
  another repository, or one ECR refuses to tag, is refused;
- the report can be recorded: its run's object (``acceptance/<source>/<UTC time>.json``, of which latest.json is a
  copy) has an S3 version (the bucket is versioned).

Then it writes the target's ``pins`` in cdk.json: ``images.<kind>`` as the full private ECR reference
``<account>.dkr.ecr.<region>.amazonaws.com/<repository>@sha256:...``, ``model`` as ``{"bucket": ...,
"s3_key": "models/<pin>/<sha256>/model.tar.gz", "gguf_sha256": ...}`` and ``acceptance`` as the report's
``{"bucket", "key", "version_id", "sha256"}``, every other byte of the file unchanged, and prints each change: the
pull request's ``make diff`` then shows it. ``--verify`` changes nothing: it reads that very version again and
checks that its bytes, its verdict and what it proved are still what the target's pins say (before a deploy of the
target; ``preflight`` of the target does the same where its credentials can read the source's bucket). It reads
and tags only (the source account's credentials); cdk.json is local.

Exit codes: 0 the pins were written (or already named what was accepted), 1 refused, 2 bad arguments or cdk.json,
4 no region or credentials.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from botocore.exceptions import ClientError, NoCredentialsError, PartialCredentialsError
from pydantic import ValidationError

from endpoint_client import acceptance_report
from endpoint_client.deployment import (EXIT_CONFIGURATION, EXIT_FAILED, EXIT_OK, Aws, CommandError,
                                        SERVING, Served, add_aws_arguments, aws_for, environment_of, error_code,
                                        served_by, stack_outputs)
from endpoint_client.pins import protect_project_image, protective_tag
from stacks.config import ENDPOINT_KINDS, EnvironmentConfig, ImagePins, ModelPin, image_kind


def target_kinds(environments: Any, source: str, target: str) -> list[str]:
    """The endpoint kinds the target lists, once it is known to take its artifacts from the source.

    Read from the raw cdk.json, not through load_environment: the target's pins as they stand may be what promote
    replaces (a bare digest of a prod that built its own), which validation would refuse before anything is
    written. The target is validated whole, as app.py validates it, once its new pins are in (``promote``).
    """
    if not isinstance(environments, Mapping) or target not in environments:
        names = ", ".join(sorted(environments)) if isinstance(environments, Mapping) else "none"
        raise CommandError(f"--to {target}: not an environment in cdk.json (one of: {names})")
    if source == target:
        raise CommandError(f"--from and --to are both {source}")
    settings = environments[target] if isinstance(environments[target], Mapping) else {}
    artifacts_from = settings.get("artifacts_from")
    if artifacts_from != source:
        raise CommandError(
            f"environments.{target}.artifacts_from is {json.dumps(artifacts_from)}, not \"{source}\": promote writes "
            f"pins that name {source}'s images and model archive, which only an environment taking its artifacts "
            f"from {source} may pull (set \"artifacts_from\": \"{source}\" in environments.{target} and remove its "
            f"build section)")
    kinds = settings.get("endpoints")
    if not isinstance(kinds, list) or not kinds or any(kind not in ENDPOINT_KINDS for kind in kinds):
        raise CommandError(f"environments.{target}.endpoints is {json.dumps(kinds)}: expected a non-empty list of "
                           f"{', '.join(ENDPOINT_KINDS)}")
    return list(dict.fromkeys(kinds))


def accepted_pins(source: EnvironmentConfig, kinds: Sequence[str], aws: Aws, *,
                  emulator: str | None = None) -> dict[str, Any]:
    """The target's new pins, from what the source serves and its latest acceptance report proved; CommandError
    (EXIT_FAILED) naming every kind and digest that stands in the way. A report of an emulator run (where what only
    AWS shows was unprovable, not proved) counts only when promote runs on the same emulator (the rehearsal)."""
    unlisted = [kind for kind in kinds if kind not in source.endpoints]
    if unlisted:
        raise CommandError(f"{source.name} does not list {', '.join(unlisted)} (environments.{source.name}.endpoints): "
                           f"there is nothing of it to promote", EXIT_FAILED)
    sagemaker = aws.client("sagemaker")
    served = {kind: served_by(sagemaker, source.endpoint_name(kind)) for kind in kinds}
    changing = [f"{kind}: {found.endpoint_name} is {found.status}" for kind, found in served.items()
                if found.status != SERVING]
    if changing:
        raise CommandError("; ".join(changing) + f": promote only what an endpoint in service serves (once it is "
                           f"{SERVING}, run acceptance -c env={source.name} again)", EXIT_FAILED)
    outputs = stack_outputs(aws.client("cloudformation"), source.artifacts_stack_name,
                            ["ArtifactBucketName", "ImageRepositoryUri"])
    bucket = outputs["ArtifactBucketName"]
    where = f"s3://{bucket}/{acceptance_report.latest_key(source.name)}"
    latest = acceptance_report.read_latest_bytes(aws.client("s3"), bucket, source.name)
    report = None if latest is None else json.loads(latest)
    if report is None:
        raise CommandError(f"{source.name} has no acceptance report ({where}): run python -m endpoint_client "
                           f"acceptance -c env={source.name}; it serves {_serving(served)}", EXIT_FAILED)
    if report.get("emulator") != emulator:
        raise CommandError(f"{source.name}'s latest acceptance report ({where}) was made "
                           f"{'on ' + report['emulator'] if report.get('emulator') else 'on AWS'}, but promote runs "
                           f"{'on ' + emulator if emulator else 'on AWS'}: a run on an emulator proves nothing on AWS "
                           f"(its checks that need AWS are unprovable); {_serving(served)} are not accepted",
                           EXIT_FAILED)
    if report.get("passed") is not True or report.get("environment") != source.name:
        failed = [f"{c['check']} {c['subject']}" for c in report.get("checks", []) if c.get("state") == "failed"]
        raise CommandError(f"{source.name}'s latest acceptance report ({where}, {report.get('finished_at')}) did not "
                           f"pass ({'; '.join(failed[:5]) or 'no checks'}{' ...' if len(failed) > 5 else ''}): "
                           f"{_serving(served)} are not accepted", EXIT_FAILED)
    unproven = []
    for kind, found in served.items():
        proved = report.get("endpoints", {}).get(kind) or {}
        if (proved.get("image"), proved.get("model_data_url")) != (found.image, found.model_data_url):
            unproven.append(f"{kind}: {found.endpoint_name} serves {found.image} with {found.model_data_url}, but the "
                            f"report proved {proved.get('image')} with {proved.get('model_data_url')}")
    if unproven:
        raise CommandError(f"{source.name}'s latest acceptance report ({where}, {report.get('finished_at')}) is not "
                           f"for what it serves now: " + "; ".join(unproven) +
                           f" (run python -m endpoint_client acceptance -c env={source.name})", EXIT_FAILED)
    pins = {"images": _image_pins(served), "model": _model_pin(source, served)}
    if not source.artifacts.retain:
        raise CommandError(f"environments.{source.name}.artifacts.removal_policy is {source.artifacts.removal_policy}: "
                           f"`cdk destroy -c env={source.name}` would delete what the pins would name; set it to "
                           f"retain and deploy {source.artifacts_stack_name} first", EXIT_FAILED)
    _protect(aws, outputs["ImageRepositoryUri"], served)
    try:
        recorded = acceptance_report.record(aws.client("s3"), bucket, latest)
    except ValueError as error:
        raise CommandError(f"{source.name}'s latest acceptance report cannot be recorded: {error}", EXIT_FAILED) \
            from None
    return {**pins, "acceptance": recorded.pin()}


def _protect(aws: Aws, repository_uri: str, served: Mapping[str, Served]) -> None:
    """Tag each promoted image pinned-<digest hex> in the source's repository, so that its lifecycle rules never
    expire it (stacks/artifacts_stack.py); CommandError (EXIT_FAILED) for an image that cannot be protected so: in
    another repository, not a Docker manifest SageMaker pulls, or a tag ECR refuses."""
    registry, _, repository = repository_uri.partition("/")
    ecr, problems = aws.client("ecr"), []
    for kind, found in served.items():
        image_repository, _, digest = found.image.partition("@")
        if image_repository != repository_uri:
            problems.append(f"{kind}: {found.image} is not in {repository_uri}, whose lifecycle promote can make "
                            f"keep it")
            continue
        try:
            status = protect_project_image(ecr, kind, registry.split(".")[0], repository, digest, protect=True)
        except ClientError as error:
            problems.append(f"{kind}: {found.image} cannot be tagged {protective_tag(digest)}: {error_code(error)}")
            continue
        if not status.ok:
            problems.append(f"{kind}: {found.image} is {status.state} ({status.line()})")
    if problems:
        raise CommandError("; ".join(problems) + ": only images the source's lifecycle keeps are promoted",
                           EXIT_FAILED)


def _serving(served: Mapping[str, Served]) -> str:
    return ", ".join(f"{kind} {found.image}" for kind, found in served.items())


def _image_pins(served: Mapping[str, Served]) -> dict[str, str]:
    """pins.images of the served kinds, by their image (the async kind runs the cpu image: image_kind): kinds that
    share an image must serve the same one."""
    images: dict[str, str] = {}
    for kind, found in served.items():
        pin = _image_pin(image_kind(kind), found)
        if images.setdefault(image_kind(kind), pin) != pin:
            raise CommandError(f"{kind}: {found.endpoint_name} serves {pin}, but another endpoint of the "
                               f"{image_kind(kind)} image serves {images[image_kind(kind)]}: they share one pin "
                               f"(pins.images.{image_kind(kind)}); deploy both on one image first", EXIT_FAILED)
    return images


def _image_pin(kind: str, found: Served) -> str:
    """The served image as a target pin: a private ECR reference by digest, as stacks/config.py parses it."""
    try:
        ImagePins.model_validate({kind: found.image})
    except ValidationError as error:
        raise CommandError(f"{kind}: {found.endpoint_name} serves {found.image!r}, which cannot be pinned: "
                           f"{error.errors()[0]['msg']}", EXIT_FAILED) from None
    return found.image


def _model_pin(source: EnvironmentConfig, served: Mapping[str, Served]) -> dict[str, str]:
    """The one model archive every promoted endpoint serves, as a target's model pin naming the source's bucket."""
    urls = sorted({found.model_data_url for found in served.values()})
    if len(urls) != 1:
        raise CommandError(f"{source.name}'s endpoints serve different model archives ({', '.join(urls)}); the "
                           f"target pins one", EXIT_FAILED)
    bucket, _, key = urls[0].removeprefix("s3://").partition("/")
    parts = key.split("/")
    pin = {"bucket": bucket, "s3_key": key, "gguf_sha256": parts[2] if len(parts) == 4 else ""}
    try:
        ModelPin.model_validate({"s3_key": pin["s3_key"], "gguf_sha256": pin["gguf_sha256"]})
    except ValidationError as error:
        raise CommandError(f"{urls[0]} cannot be pinned: {error.errors()[0]['msg']} (expected "
                           f"s3://<bucket>/models/<pin>/<gguf sha256>/model.tar.gz)", EXIT_FAILED) from None
    return pin


def with_pins(text: str, cdk_json: dict[str, Any], target: str, pins: Mapping[str, Any]) -> tuple[str, list[str]]:
    """cdk.json's text with the target's image pins of ``pins`` and its model pin replaced, and a line per change.

    The file is rewritten as json.dumps writes it with the file's own indentation, which leaves every other byte as
    it was only if the file already is so written (cdk.json is): checked first, so nothing else ever changes.
    """
    indented = [line for line in text.splitlines() if line[:1] in (" ", "\t")]
    indent = None if not indented else indented[0][:len(indented[0]) - len(indented[0].lstrip())]

    def dumped(document: Any) -> str:
        return json.dumps(document, indent=indent, ensure_ascii=False) + ("\n" if text.endswith("\n") else "")
    if dumped(cdk_json) != text:
        raise CommandError("cdk.json is not laid out as json.dumps writes it (one key per line, its indentation "
                           "throughout), so rewriting its pins would change other lines too: reformat it first "
                           "(python -m json.tool --indent 2 --no-ensure-ascii cdk.json)")
    environment = cdk_json["context"]["environments"][target]
    current = environment.setdefault("pins", {})
    images = current.setdefault("images", {})
    changes, key = [], f"environments.{target}.pins"
    for kind, image in pins["images"].items():
        if images.get(kind) != image:
            changes.append(f"{key}.images.{kind}: {json.dumps(images.get(kind))} -> {json.dumps(image)}")
            images[kind] = image
    if current.get("model") != pins["model"]:
        changes.append(f"{key}.model: {json.dumps(current.get('model'))} -> {json.dumps(pins['model'])}")
        current["model"] = dict(pins["model"])
    if "acceptance" in pins and current.get("acceptance") != pins["acceptance"]:
        changes.append(f"{key}.acceptance: {json.dumps(current.get('acceptance'))} -> "
                       f"{json.dumps(pins['acceptance'])}")
        current["acceptance"] = dict(pins["acceptance"])
    return dumped(cdk_json), changes


def promote(cdk_json_path: Path, source_name: str, target: str, aws_for_source: Callable[[EnvironmentConfig], Aws],
            *, emulator: str | None = None) -> list[str]:
    """Write the target's pins into cdk_json_path; returns the changes. ``aws_for_source(config)`` gives the AWS
    clients of the source environment."""
    try:
        text = cdk_json_path.read_text()
        cdk_json = json.loads(text)
    except (OSError, ValueError) as error:
        raise CommandError(f"cannot read {cdk_json_path}: {error}") from None
    environments = cdk_json.get("context", {}).get("environments") if isinstance(cdk_json, dict) else None
    kinds = target_kinds(environments, source_name, target)
    source = environment_of(cdk_json, source_name, cdk_json_path)
    pins = accepted_pins(source, kinds, aws_for_source(source), emulator=emulator)
    rewritten, changes = with_pins(text, cdk_json, target, pins)
    # The target as the CDK app will read it: artifacts_from, the pins' forms (full references into the source's
    # repository, the model with its bucket) and their account and region against the source's.
    environment_of(json.loads(rewritten), target, cdk_json_path)
    if changes:
        cdk_json_path.write_text(rewritten)
    return changes


def verify_promoted(target: EnvironmentConfig, s3: Any, *, emulator: str | None = None) -> str:
    """Check a target's pins against the acceptance report promote recorded for them (pins.acceptance): exactly that
    S3 version, whose bytes still have the recorded sha256, passed, made by the source (on AWS, or on ``emulator``),
    and naming, for each endpoint the target pins, the very image and model archive pinned. Returns what was
    verified; CommandError (EXIT_FAILED) naming what differs. ClientError is the caller's to report."""
    pin, source = target.pins.acceptance, target.artifacts_from
    if source is None or pin is None:
        raise CommandError(f"{target.key('pins', 'acceptance')} is not set: nothing promoted to verify "
                           f"({target.key('artifacts_from')} is {json.dumps(source)})", EXIT_FAILED)
    where = f"s3://{pin.bucket}/{pin.key} (version {pin.version_id})"
    try:
        report = acceptance_report.read_recorded(s3, pin)
    except ValueError as error:
        raise CommandError(f"{error}: the report was changed after promote recorded it", EXIT_FAILED) from None
    problems = []
    if report.get("passed") is not True:
        problems.append("it did not pass")
    if report.get("environment") != source:
        problems.append(f"it is {report.get('environment')}'s, not {source}'s")
    if report.get("emulator") != emulator:
        problems.append(f"it was made {'on ' + report['emulator'] if report.get('emulator') else 'on AWS'}")
    model = target.pins.model
    for kind in target.endpoints:
        image = target.pins.images.of(kind)
        if image is None:
            continue
        proved = report.get("endpoints", {}).get(kind) or {}
        pinned = f"{image.repository.uri}@{image.digest}" if image.repository else image.digest
        if proved.get("image") != pinned:
            problems.append(f"{target.key('pins', 'images', image_kind(kind))} is {pinned}, but it proved {kind} with "
                            f"{proved.get('image')}")
        archive = f"s3://{model.bucket}/{model.s3_key}" if model is not None else None
        if proved.get("model_data_url") != archive:
            problems.append(f"{target.key('pins', 'model')} is {archive}, but it proved {kind} with "
                            f"{proved.get('model_data_url')}")
    if problems:
        raise CommandError(f"{target.name}'s pins do not stand on the acceptance report they were promoted on, "
                           f"{where}: " + "; ".join(problems), EXIT_FAILED)
    return f"{target.name}'s pins are what {where} accepted ({report.get('finished_at')}, sha256 {pin.sha256[:12]}...)"


def verify(cdk_json_path: Path, source_name: str, target_name: str,
           aws_for_source: Callable[[EnvironmentConfig], Aws], *, emulator: str | None = None) -> str:
    """``promote --verify``: the target's pins in cdk_json_path against the report they were promoted on, read with
    the source's credentials; changes nothing."""
    try:
        cdk_json = json.loads(cdk_json_path.read_text())
    except (OSError, ValueError) as error:
        raise CommandError(f"cannot read {cdk_json_path}: {error}") from None
    target = environment_of(cdk_json, target_name, cdk_json_path)
    if target.artifacts_from != source_name:
        raise CommandError(f"{target.key('artifacts_from')} is {json.dumps(target.artifacts_from)}, not "
                           f"\"{source_name}\"")
    source = environment_of(cdk_json, source_name, cdk_json_path)
    return verify_promoted(target, aws_for_source(source).client("s3"), emulator=emulator)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m endpoint_client promote",
        description="Pin in --to what --from's endpoints serve, if --from's latest acceptance report passed for "
                    "exactly those digests: writes the target's pins in cdk.json (then open a pull request; "
                    "make diff shows the change).")
    parser.add_argument("--from", dest="source", required=True, metavar="ENV", help="the environment that built, "
                        "serves and accepted the artifacts, e.g. dev")
    parser.add_argument("--to", dest="target", required=True, metavar="ENV",
                        help="the environment to pin them in, e.g. prod (its artifacts_from must name --from)")
    add_aws_arguments(parser)  # --region: the source's (it reads only the source)
    parser.add_argument("--emulator", choices=["moto"], help="promote on this emulator, from a report that "
                                                              "acceptance --emulator made there (the deploy rehearsal)")
    parser.add_argument("--verify", action="store_true", help="change nothing: check --to's pins against the "
                        "acceptance report they were promoted on (its recorded S3 version and sha256), before a "
                        "deploy of --to")
    args = parser.parse_args(argv)
    report = lambda message: print(f"endpoint_client promote: {message}", file=sys.stderr)  # noqa: E731
    try:
        if args.verify:
            print(verify(args.cdk_json, args.source, args.target, lambda source: aws_for(args, source),
                         emulator=args.emulator))
            return EXIT_OK
        changes = promote(args.cdk_json, args.source, args.target, lambda source: aws_for(args, source),
                          emulator=args.emulator)
    except CommandError as error:
        report(f"refused: {error}" if error.exit_code == EXIT_FAILED else str(error))
        return error.exit_code
    except (NoCredentialsError, PartialCredentialsError) as error:
        report(f"no AWS credentials: {error}")
        return EXIT_CONFIGURATION
    except ClientError as error:
        # AccessDenied included: without s3:ListBucket, S3 answers a missing report so, not NoSuchKey.
        report(f"refused: {error_code(error)}: {error}")
        return EXIT_FAILED
    for change in changes:
        print(change)
    if changes:
        report(f"wrote {len(changes)} change(s) to {args.cdk_json}: commit them in a pull request (make diff BASE=main "
               f"ENV={args.target} shows them), then deploy {args.target}")
    else:
        report(f"{args.target}'s pins already name what {args.source} serves and accepted: nothing to change")
    return EXIT_OK

