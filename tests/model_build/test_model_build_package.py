"""End to end: `package` downloads from the loopback origin, verifies, archives and uploads to moto S3."""

from __future__ import annotations

import hashlib
import json
import math
import tarfile
from datetime import datetime

import pytest
from boto3.s3.transfer import TransferConfig

from model_build import __version__
from model_build.cli import main
from model_build.errors import BuildError, ExitCode
from model_build.upload import make_s3_client, upload_archive
from packaging_testkit import (EMBEDDED_MODEL_FILE, MEBIBYTE, TEST_REPOSITORY, TEST_REVISION, calibration_document,
                               keys_in, parse_results, unfinished_uploads, url_pin)

# The manifest's keys for a pin without calibration: those before calibration.json existed, plus `calibration`.
MANIFEST_KEYS = {"manifest_version", "pin", "source", "revision", "file", "bytes", "sha256", "download_url",
                 "built_at", "tool_versions", "calibration"}

# --------------------------------------------------------------------------------------------------------
# The happy path, from the session's one packaged model


def test_archive_holds_exactly_the_gguf_and_the_manifest_at_its_root(packaged_model):
    members = {member.name: member for member in packaged_model.archive_members}
    assert sorted(members) == sorted([EMBEDDED_MODEL_FILE, "model-manifest.json"])
    assert all(member.isfile() for member in members.values())
    assert sorted(path.name for path in packaged_model.model_dir.iterdir()) == sorted(members)


def test_unpacked_gguf_is_byte_identical_to_the_source(packaged_model, embedded_gguf):
    unpacked = (packaged_model.model_dir / EMBEDDED_MODEL_FILE).read_bytes()
    assert hashlib.sha256(unpacked).hexdigest() == embedded_gguf.sha256
    assert len(unpacked) == embedded_gguf.size


def test_manifest_describes_the_pin_and_the_build(packaged_model, embedded_gguf):
    manifest = packaged_model.manifest
    assert manifest["source"] == TEST_REPOSITORY
    assert manifest["revision"] == TEST_REVISION
    assert manifest["file"] == EMBEDDED_MODEL_FILE
    assert manifest["bytes"] == embedded_gguf.size
    assert manifest["sha256"] == embedded_gguf.sha256
    assert manifest["pin"] == "smollm2-135m"
    assert manifest["download_url"] == packaged_model.resolve_route.url
    built_at = datetime.fromisoformat(manifest["built_at"])
    assert manifest["built_at"].endswith("Z") and built_at.utcoffset().total_seconds() == 0
    # Second resolution: the build time lies within the run, give or take the truncated fraction.
    assert packaged_model.started_at - 1 <= built_at.timestamp() <= packaged_model.finished_at
    versions = manifest["tool_versions"]
    assert versions["model_build"] == __version__
    assert {"python", "boto3", "botocore", "requests", "tqdm"} <= set(versions)


def test_pin_without_calibration_builds_as_before(packaged_model):
    # The archive's members are checked above; the manifest gains one key, null, and keeps its version.
    manifest = packaged_model.manifest
    assert set(manifest) == MANIFEST_KEYS
    assert manifest["manifest_version"] == 1
    assert manifest["calibration"] is None
    assert not (packaged_model.model_dir / "calibration.json").exists()
    assert "calibration_sha256" not in packaged_model.results


def test_package_prints_the_s3_uri_and_both_hashes(packaged_model, embedded_gguf):
    results = packaged_model.results
    assert results["s3_uri"] == f"s3://{packaged_model.bucket}/{packaged_model.key}"
    assert results["gguf_sha256"] == embedded_gguf.sha256
    archive_bytes = packaged_model.archive_path.read_bytes()
    assert results["archive_sha256"] == hashlib.sha256(archive_bytes).hexdigest()
    assert int(results["archive_bytes"]) == len(archive_bytes)


def test_buildspec_exports_the_uri_and_both_hashes(packaged_model):
    assert packaged_model.exported == {
        "MODEL_S3_URI": packaged_model.results["s3_uri"],
        "MODEL_GGUF_SHA256": packaged_model.results["gguf_sha256"],
        "MODEL_ARCHIVE_SHA256": packaged_model.results["archive_sha256"],
    }


def test_archive_key_is_prefix_pin_and_gguf_sha256(packaged_model, s3, embedded_gguf):
    assert keys_in(s3, packaged_model.bucket) == [f"models/smollm2-135m/{embedded_gguf.sha256}/model.tar.gz"]


def test_large_archive_went_up_in_64_mib_parts(packaged_model):
    # S3 gives a multipart object the ETag "<md5 of the part md5s>-<part count>".
    archive_size = packaged_model.archive_path.stat().st_size
    assert archive_size > 64 * MEBIBYTE
    assert packaged_model.etag.endswith(f"-{math.ceil(archive_size / (64 * MEBIBYTE))}")


def test_hugging_face_pin_follows_the_resolve_redirect(packaged_model, embedded_gguf):
    assert [request.status for request in packaged_model.resolve_route.seen] == [302]
    assert [(request.status, request.range, request.body_bytes_sent)
            for request in packaged_model.content_route.seen] == [(200, None, embedded_gguf.size)]


def test_scratch_archive_is_removed_and_the_verified_download_kept(packaged_model, embedded_gguf):
    assert list((packaged_model.work_dir / "tmp").iterdir()) == []
    downloads = packaged_model.work_dir / "downloads"
    assert [path.name for path in downloads.iterdir()] == [f"{embedded_gguf.sha256}.gguf"]


def test_unpacked_model_dir_is_what_the_adapter_reads(unpacked_model_dir, embedded_gguf):
    manifest = json.loads((unpacked_model_dir / "model-manifest.json").read_text())
    gguf = unpacked_model_dir / manifest["file"]
    assert hashlib.sha256(gguf.read_bytes()).hexdigest() == manifest["sha256"] == embedded_gguf.sha256


# --------------------------------------------------------------------------------------------------------
# Local archives


def test_no_upload_keeps_the_archive_under_output(origin, embedded_gguf, write_pins, tmp_path, capsys):
    route = origin.serve("model.gguf", embedded_gguf.data)
    pins = write_pins({"local": url_pin(route.url, embedded_gguf)})
    output = tmp_path / "out"

    exit_code = main(["package", "--pins", str(pins), "--work-dir", str(tmp_path / "work"), "--no-upload",
                      "--output", str(output)])

    assert exit_code == ExitCode.OK
    results = parse_results(capsys.readouterr().out)
    archive = output / "local" / embedded_gguf.sha256 / "model.tar.gz"
    assert results["archive"] == str(archive)
    assert "s3_uri" not in results
    assert results["archive_sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    with tarfile.open(archive, "r:gz") as opened:
        manifest = json.load(opened.extractfile("model-manifest.json"))
        gguf_sha256 = hashlib.sha256(opened.extractfile("model.gguf").read()).hexdigest()
    assert manifest["source"] == route.url and manifest["revision"] is None
    assert gguf_sha256 == manifest["sha256"] == embedded_gguf.sha256
    # Only the archive, no leftover temporary file beside it.
    assert [path.name for path in archive.parent.iterdir()] == ["model.tar.gz"]


# --------------------------------------------------------------------------------------------------------
# Calibration


def test_calibration_is_archived_beside_the_gguf_byte_for_byte(origin, embedded_gguf, write_pins,
                                                                write_calibration, tmp_path, capsys):
    route = origin.serve("model.gguf", embedded_gguf.data)
    # Indented and ended unlike json.dumps' default, so that a re-encoded file would not pass for the original.
    calibration_text = json.dumps(calibration_document(embedded_gguf.sha256, prompt_version="v-test"), indent=3)
    calibration_bytes = f"{calibration_text}\n\n".encode("utf-8")
    pins = write_pins({"calibrated": url_pin(route.url, embedded_gguf,
                                             calibration=write_calibration(calibration_bytes))})
    output = tmp_path / "out"

    exit_code = main(["package", "--pins", str(pins), "--work-dir", str(tmp_path / "work"), "--no-upload",
                      "--output", str(output)])

    assert exit_code == ExitCode.OK
    results = parse_results(capsys.readouterr().out)
    calibration_sha256 = hashlib.sha256(calibration_bytes).hexdigest()
    assert results["calibration_sha256"] == calibration_sha256
    with tarfile.open(output / "calibrated" / embedded_gguf.sha256 / "model.tar.gz", "r:gz") as opened:
        members = opened.getmembers()
        manifest = json.load(opened.extractfile("model-manifest.json"))
        archived_calibration = opened.extractfile("calibration.json").read()
        gguf_sha256 = hashlib.sha256(opened.extractfile("model.gguf").read()).hexdigest()
    assert [member.name for member in members] == ["model-manifest.json", "calibration.json", "model.gguf"]
    for member in members:
        assert member.isfile() and (member.uid, member.gid, member.mode) == (0, 0, 0o644)
    assert archived_calibration == calibration_bytes
    assert manifest["calibration"] == {"file": "calibration.json", "sha256": calibration_sha256,
                                       "prompt_version": "v-test"}
    assert set(manifest) == MANIFEST_KEYS
    assert gguf_sha256 == manifest["sha256"] == embedded_gguf.sha256


def test_calibration_for_another_gguf_stops_package_before_downloading(origin, embedded_gguf, write_pins,
                                                                       write_calibration, tmp_path, capsys):
    other_sha256 = hashlib.sha256(b"some other model").hexdigest()
    route = origin.serve("model.gguf", embedded_gguf.data)
    pins = write_pins({"mismatched": url_pin(route.url, embedded_gguf,
                                             calibration=write_calibration(calibration_document(other_sha256)))})

    exit_code = main(["package", "--pins", str(pins), "--work-dir", str(tmp_path / "work"), "--no-upload",
                      "--output", str(tmp_path / "out")])

    assert exit_code == ExitCode.BAD_INPUT
    error = capsys.readouterr().err
    assert "pins.mismatched.calibration: " in error
    assert f"fitted for the GGUF with sha256 {other_sha256}, not this pin's ({embedded_gguf.sha256})" in error
    assert route.seen == []
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------------------------------------
# Failures: nothing uploaded, nothing overwritten


def test_wrong_pin_uploads_nothing_and_names_both_hashes(origin, embedded_gguf, write_pins, tmp_path, s3,
                                                          s3_endpoint, bucket, capsys):
    wrong_sha256 = hashlib.sha256(b"some other model").hexdigest()
    route = origin.serve("model.gguf", embedded_gguf.data)
    pins = write_pins({"wrong": url_pin(route.url, embedded_gguf, sha256=wrong_sha256)})

    exit_code = main(["package", "--pins", str(pins), "--work-dir", str(tmp_path / "work"),
                      "--bucket", bucket, "--s3-endpoint-url", s3_endpoint])

    assert exit_code == ExitCode.VERIFICATION_FAILED
    error = capsys.readouterr().err
    assert "sha256 mismatch for pin 'wrong'" in error
    assert wrong_sha256 in error and embedded_gguf.sha256 in error
    assert "nothing was uploaded" in error and "Traceback" not in error
    assert keys_in(s3, bucket) == [] and unfinished_uploads(s3, bucket) == []
    assert list((tmp_path / "work" / "downloads").iterdir()) == []


def test_existing_local_archive_is_refused_before_downloading(origin, embedded_gguf, write_pins, tmp_path,
                                                              capsys):
    route = origin.serve("model.gguf", embedded_gguf.data)
    pins = write_pins({"local": url_pin(route.url, embedded_gguf)})
    existing = tmp_path / "out" / "local" / embedded_gguf.sha256 / "model.tar.gz"
    existing.parent.mkdir(parents=True)
    existing.write_bytes(b"an earlier archive")

    exit_code = main(["package", "--pins", str(pins), "--work-dir", str(tmp_path / "work"), "--no-upload",
                      "--output", str(tmp_path / "out")])

    assert exit_code == ExitCode.OUTPUT_EXISTS
    assert f"{existing} already exists" in capsys.readouterr().err
    assert existing.read_bytes() == b"an earlier archive"
    assert route.seen == []


def test_existing_s3_archive_is_refused_before_downloading(origin, embedded_gguf, write_pins, tmp_path, s3,
                                                           s3_endpoint, bucket, capsys):
    route = origin.serve("model.gguf", embedded_gguf.data)
    pins = write_pins({"remote": url_pin(route.url, embedded_gguf)})
    key = f"models/remote/{embedded_gguf.sha256}/model.tar.gz"
    s3.put_object(Bucket=bucket, Key=key, Body=b"an earlier archive")

    exit_code = main(["package", "--pins", str(pins), "--work-dir", str(tmp_path / "work"),
                      "--bucket", bucket, "--prefix", "models", "--s3-endpoint-url", s3_endpoint])

    assert exit_code == ExitCode.OUTPUT_EXISTS
    assert f"s3://{bucket}/{key} already exists" in capsys.readouterr().err
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"an earlier archive"
    assert route.seen == []


@pytest.mark.parametrize("archive_size, transfer_config", [
    pytest.param(1 * MEBIBYTE, TransferConfig(), id="single-part"),
    pytest.param(11 * MEBIBYTE, TransferConfig(multipart_threshold=5 * MEBIBYTE,
                                               multipart_chunksize=5 * MEBIBYTE), id="multipart"),
])
def test_upload_does_not_replace_a_key_created_after_the_early_check(archive_size, transfer_config, tmp_path, s3,
                                                                     s3_endpoint, bucket):
    # The key appears between ensure_absent and the upload; the conditional write must still refuse.
    key = "models/raced/model.tar.gz"
    s3.put_object(Bucket=bucket, Key=key, Body=b"the winner")
    archive = tmp_path / "model.tar.gz"
    archive.write_bytes(b"x" * archive_size)

    with pytest.raises(BuildError) as raised:
        upload_archive(make_s3_client(s3_endpoint), archive, bucket, key, transfer_config)

    assert raised.value.exit_code == ExitCode.OUTPUT_EXISTS
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"the winner"
    assert unfinished_uploads(s3, bucket) == []


def test_upload_to_a_missing_bucket_is_a_transfer_failure(tmp_path, s3_endpoint):
    archive = tmp_path / "model.tar.gz"
    archive.write_bytes(b"x")
    with pytest.raises(BuildError) as raised:
        upload_archive(make_s3_client(s3_endpoint), archive, "no-such-bucket-here", "models/k/model.tar.gz")
    assert raised.value.exit_code == ExitCode.TRANSFER_FAILED
    assert "NoSuchBucket" in str(raised.value)


def test_archive_members_are_plain_files_owned_by_root(packaged_model):
    # SageMaker unpacks the archive as root; no build machine user or odd mode should come along.
    assert packaged_model.archive_path.read_bytes()[:2] == b"\x1f\x8b"  # gzip magic
    for member in packaged_model.archive_members:
        assert (member.uid, member.gid, member.uname, member.gname, member.mode) == (0, 0, "", "", 0o644)
