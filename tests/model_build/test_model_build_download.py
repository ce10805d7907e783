"""`fetch`: streaming download with resume over HTTP Range, checked against the pin's size and sha256."""

from __future__ import annotations

import hashlib

import pytest

from model_build.cli import main
from model_build.errors import ExitCode
from packaging_testkit import EMBEDDED_MODEL_FILE, hugging_face_pin, parse_results, url_pin

# Not a multiple of the 1 MiB read size, so a resume that re-read or skipped a block would show.
CUT_AT = 40_000_123


def fetch(pins, work_dir, *extra: str) -> int:
    return main(["fetch", "--pins", str(pins), "--work-dir", str(work_dir), *extra])


def test_fetch_downloads_and_verifies(origin, embedded_gguf, write_pins, tmp_path, capsys):
    route = origin.serve("model.gguf", embedded_gguf.data)
    pins = write_pins({"plain": url_pin(route.url, embedded_gguf)})

    assert fetch(pins, tmp_path) == ExitCode.OK

    results = parse_results(capsys.readouterr().out)
    downloaded = tmp_path / "downloads" / f"{embedded_gguf.sha256}.gguf"
    assert results == {"gguf": str(downloaded), "gguf_sha256": embedded_gguf.sha256}
    assert hashlib.sha256(downloaded.read_bytes()).hexdigest() == embedded_gguf.sha256
    assert [request.range for request in route.seen] == [None]


def test_interrupted_download_resumes_on_rerun_from_where_it_stopped(origin, embedded_gguf, write_pins, tmp_path,
                                                                     capsys):
    resolve, content = origin.serve_hugging_face(EMBEDDED_MODEL_FILE, embedded_gguf.data,
                                                 cut_after=CUT_AT, cuts=1)
    pins = write_pins({"hf": hugging_face_pin(embedded_gguf)})
    arguments = ["--hf-endpoint", origin.base_url, "--attempts", "1"]

    assert fetch(pins, tmp_path, *arguments) == ExitCode.TRANSFER_FAILED
    error = capsys.readouterr().err
    assert f"stopped at byte {CUT_AT:,} of {embedded_gguf.size:,}" in error
    assert "rerun the same command to resume" in error
    part = tmp_path / "downloads" / f"{embedded_gguf.sha256}.gguf.part"
    assert part.stat().st_size == CUT_AT

    assert fetch(pins, tmp_path, *arguments) == ExitCode.OK

    # The rerun asked for the rest only (through the redirect too), and only the rest was sent.
    assert [request.range for request in resolve.seen] == [None, f"bytes={CUT_AT}-"]
    assert [(request.status, request.range, request.body_bytes_sent) for request in content.seen] == [
        (200, None, CUT_AT), (206, f"bytes={CUT_AT}-", embedded_gguf.size - CUT_AT)]
    downloaded = tmp_path / "downloads" / f"{embedded_gguf.sha256}.gguf"
    assert hashlib.sha256(downloaded.read_bytes()).hexdigest() == embedded_gguf.sha256
    assert not part.exists()


def test_interrupted_download_resumes_within_the_same_run(origin, embedded_gguf, write_pins, tmp_path, capsys):
    route = origin.serve("model.gguf", embedded_gguf.data, cut_after=CUT_AT, cuts=1)
    pins = write_pins({"flaky": url_pin(route.url, embedded_gguf)})

    assert fetch(pins, tmp_path) == ExitCode.OK

    assert "resuming, attempt 2 of 3" in capsys.readouterr().err
    assert [(request.range, request.body_bytes_sent) for request in route.seen] == [
        (None, CUT_AT), (f"bytes={CUT_AT}-", embedded_gguf.size - CUT_AT)]


def test_server_that_ignores_range_is_downloaded_again_from_the_start(origin, embedded_gguf, write_pins,
                                                                       tmp_path, capsys):
    route = origin.serve("model.gguf", embedded_gguf.data, cut_after=CUT_AT, cuts=1, honour_range=False)
    pins = write_pins({"no-range": url_pin(route.url, embedded_gguf)})

    assert fetch(pins, tmp_path) == ExitCode.OK

    assert "ignored the Range request" in capsys.readouterr().err
    assert [(request.status, request.body_bytes_sent) for request in route.seen] == [
        (200, CUT_AT), (200, embedded_gguf.size)]
    downloaded = tmp_path / "downloads" / f"{embedded_gguf.sha256}.gguf"
    assert hashlib.sha256(downloaded.read_bytes()).hexdigest() == embedded_gguf.sha256


def test_interruptions_beyond_the_attempts_give_up(origin, embedded_gguf, write_pins, tmp_path, capsys):
    route = origin.serve("model.gguf", embedded_gguf.data, cut_after=1_000_000, cuts=5)
    pins = write_pins({"flaky": url_pin(route.url, embedded_gguf)})

    assert fetch(pins, tmp_path, "--attempts", "2") == ExitCode.TRANSFER_FAILED

    assert f"stopped at byte {2_000_000:,} of {embedded_gguf.size:,} after 2 attempt(s)" in capsys.readouterr().err
    assert [request.range for request in route.seen] == [None, "bytes=1000000-"]


def test_truncated_file_with_declared_length_is_refused_before_downloading(origin, embedded_gguf, write_pins,
                                                                         tmp_path, capsys):
    truncated = embedded_gguf.data[:CUT_AT]
    route = origin.serve("model.gguf", truncated)
    pins = write_pins({"truncated": url_pin(route.url, embedded_gguf)})

    assert fetch(pins, tmp_path) == ExitCode.VERIFICATION_FAILED

    error = capsys.readouterr().err
    assert (f"size mismatch for pin 'truncated': the server reports {CUT_AT:,} bytes, "
            f"the pin expects {embedded_gguf.size:,}") in error
    assert list((tmp_path / "downloads").iterdir()) == []


@pytest.mark.parametrize("served", [
    pytest.param(lambda data: data[:CUT_AT], id="truncated"),
    pytest.param(lambda data: data + b"\0" * 10, id="extra-bytes"),
])
def test_wrong_size_without_declared_length_is_found_after_download(served, origin, embedded_gguf, write_pins,
                                                                    tmp_path, capsys):
    body = served(embedded_gguf.data)
    route = origin.serve("model.gguf", body, declare_length=False)
    pins = write_pins({"sized": url_pin(route.url, embedded_gguf)})

    assert fetch(pins, tmp_path) == ExitCode.VERIFICATION_FAILED

    error = capsys.readouterr().err
    assert "size mismatch for pin 'sized'" in error
    assert f"the pin expects {embedded_gguf.size:,} bytes with sha256 {embedded_gguf.sha256}" in error
    assert f"the download has {len(body):,} bytes with sha256 {hashlib.sha256(body).hexdigest()}" in error
    assert list((tmp_path / "downloads").iterdir()) == []


def test_sha256_mismatch_names_both_hashes_and_discards_the_download(origin, embedded_gguf, write_pins, tmp_path,
                                                                      capsys):
    pinned_sha256 = "ab" * 32
    route = origin.serve("model.gguf", embedded_gguf.data)
    pins = write_pins({"wrong": url_pin(route.url, embedded_gguf, sha256=pinned_sha256.upper())})

    assert fetch(pins, tmp_path) == ExitCode.VERIFICATION_FAILED

    error = capsys.readouterr().err
    assert "sha256 mismatch for pin 'wrong'" in error
    assert f"the pin expects {embedded_gguf.size:,} bytes with sha256 {pinned_sha256}" in error
    assert f"the download has {embedded_gguf.size:,} bytes with sha256 {embedded_gguf.sha256}" in error
    assert list((tmp_path / "downloads").iterdir()) == []


def test_partial_file_longer_than_the_server_file_is_a_size_mismatch(origin, embedded_gguf, write_pins,
                                                                     tmp_path, capsys):
    # An earlier run left CUT_AT bytes; the server's file is now shorter than that (416 on resume).
    route = origin.serve("model.gguf", embedded_gguf.data[:1000])
    pins = write_pins({"shrunk": url_pin(route.url, embedded_gguf)})
    part = tmp_path / "downloads" / f"{embedded_gguf.sha256}.gguf.part"
    part.parent.mkdir()
    part.write_bytes(embedded_gguf.data[:CUT_AT])

    assert fetch(pins, tmp_path) == ExitCode.VERIFICATION_FAILED

    assert "the server reports 1,000 bytes" in capsys.readouterr().err
    assert [(request.status, request.range) for request in route.seen] == [(416, f"bytes={CUT_AT}-")]
    assert not part.exists()


def test_verified_download_is_reused_after_hashing_it_again(origin, embedded_gguf, write_pins, tmp_path, capsys):
    route = origin.serve("model.gguf", embedded_gguf.data)
    pins = write_pins({"reused": url_pin(route.url, embedded_gguf)})
    assert fetch(pins, tmp_path) == ExitCode.OK

    assert fetch(pins, tmp_path) == ExitCode.OK

    assert "from an earlier run; checking it again" in capsys.readouterr().err
    assert len(route.seen) == 1


def test_corrupted_earlier_download_is_fetched_again(origin, embedded_gguf, write_pins, tmp_path, capsys):
    route = origin.serve("model.gguf", embedded_gguf.data)
    pins = write_pins({"corrupted": url_pin(route.url, embedded_gguf)})
    stale = tmp_path / "downloads" / f"{embedded_gguf.sha256}.gguf"
    stale.parent.mkdir()
    stale.write_bytes(embedded_gguf.data[:-1] + b"\0")

    assert fetch(pins, tmp_path) == ExitCode.OK

    assert "no longer matches pin 'corrupted'" in capsys.readouterr().err
    assert hashlib.sha256(stale.read_bytes()).hexdigest() == embedded_gguf.sha256
    assert len(route.seen) == 1


def test_busy_server_is_asked_again(origin, embedded_gguf, write_pins, tmp_path, capsys):
    route = origin.serve("model.gguf", embedded_gguf.data, busy_responses=1)
    pins = write_pins({"busy": url_pin(route.url, embedded_gguf)})

    assert fetch(pins, tmp_path) == ExitCode.OK

    assert "download stopped at byte 0 (HTTP 503 Service Unavailable); resuming" in capsys.readouterr().err
    assert [(request.status, request.body_bytes_sent) for request in route.seen] == [
        (503, 0), (200, embedded_gguf.size)]


def test_http_error_is_a_transfer_failure(origin, embedded_gguf, write_pins, tmp_path, capsys):
    pins = write_pins({"missing": url_pin(origin.url("nothing-here.gguf"), embedded_gguf)})

    assert fetch(pins, tmp_path) == ExitCode.TRANSFER_FAILED

    assert f"GET {origin.url('nothing-here.gguf')}: HTTP 404" in capsys.readouterr().err
