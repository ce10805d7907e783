"""Pins: the shipped pins file, validation messages that name the key, a pin's calibration file, and bad
command-line input."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from copy import deepcopy

import pytest

from model_build.cli import main
from model_build.errors import BuildError, ExitCode
from model_build.pins import load_pins
from packaging_testkit import FAKE_AWS_ENV, REPO_ROOT, calibration_document

VALID_HUGGING_FACE_PIN = {
    "repository": "bartowski/Qwen_Qwen3.5-4B-GGUF",
    "revision": "4168f45a16a1290d65a4ec0fa312ae917a4c15d6",
    "file": "Qwen_Qwen3.5-4B-Q4_K_M.gguf",
    "sha256": "13c16f426047e2de38cd075bdade4a7bcbc8c774384876f677740cda65f8a983",
    "bytes": 3013027808,
}
VALID_URL_PIN = {
    "url": "https://example.org/models/some%20model.gguf",
    "sha256": "ab" * 32,
    "bytes": 1234,
}


def test_shipped_default_pin_is_the_walkthrough_model():
    pins = load_pins()
    pin = pins.get(None)
    assert pin.name == pins.default == "qwen3.5-4b"
    assert (pin.repository, pin.revision, pin.file, pin.sha256, pin.size_bytes) == (
        "bartowski/Qwen_Qwen3.5-4B-GGUF", "4168f45a16a1290d65a4ec0fa312ae917a4c15d6",
        "Qwen_Qwen3.5-4B-Q4_K_M.gguf", "13c16f426047e2de38cd075bdade4a7bcbc8c774384876f677740cda65f8a983",
        3_013_027_808)
    assert pin.download_url() == (
        "https://huggingface.co/bartowski/Qwen_Qwen3.5-4B-GGUF/resolve/"
        "4168f45a16a1290d65a4ec0fa312ae917a4c15d6/Qwen_Qwen3.5-4B-Q4_K_M.gguf")
    assert pin.archive_key("models/") == (
        "models/qwen3.5-4b/13c16f426047e2de38cd075bdade4a7bcbc8c774384876f677740cda65f8a983/model.tar.gz")


def test_pins_command_lists_the_archive_key(capsys):
    assert main(["pins", "--prefix", "/models"]) == ExitCode.OK
    listing = capsys.readouterr().out
    assert "qwen3.5-4b (default)" in listing
    assert "key:    models/qwen3.5-4b/13c16f426047e2de38cd075bdade4a7bcbc8c774384876f677740cda65f8a983/" in listing


def test_hugging_face_endpoint_override_and_paths_in_repository(write_pins):
    pins = load_pins(write_pins({"nested": {**VALID_HUGGING_FACE_PIN, "file": "Q4_K_M/my model.gguf"}}))
    pin = pins.get("nested")
    assert pin.download_url("http://127.0.0.1:9999/mirror/") == (
        "http://127.0.0.1:9999/mirror/bartowski/Qwen_Qwen3.5-4B-GGUF/resolve/"
        "4168f45a16a1290d65a4ec0fa312ae917a4c15d6/Q4_K_M/my%20model.gguf")
    # The archive holds the file at its root, under its own name.
    assert pin.gguf_name == "my model.gguf"


def test_url_pin_takes_its_file_name_from_the_url(write_pins):
    pin = load_pins(write_pins({"web": VALID_URL_PIN})).get("web")
    assert (pin.source, pin.revision, pin.file) == (VALID_URL_PIN["url"], None, "some model.gguf")


def _without(key):
    return lambda pin: {name: value for name, value in pin.items() if name != key}


def _with(**changes):
    return lambda pin: {**pin, **changes}


@pytest.mark.parametrize("base, change, message", [
    (VALID_HUGGING_FACE_PIN, _with(sha256="13c16f42"), "pins.p.sha256: expected 64 hex characters"),
    (VALID_HUGGING_FACE_PIN, _with(sha256="z" * 64), "pins.p.sha256: expected 64 hex characters"),
    (VALID_HUGGING_FACE_PIN, _without("sha256"), "pins.p.sha256: expected 64 hex characters"),
    (VALID_HUGGING_FACE_PIN, _with(bytes=0), "pins.p.bytes: expected a positive whole number of bytes"),
    (VALID_HUGGING_FACE_PIN, _with(bytes=True), "pins.p.bytes: expected a positive whole number of bytes"),
    (VALID_HUGGING_FACE_PIN, _with(bytes="3013027808"), "pins.p.bytes: expected a positive whole number"),
    (VALID_HUGGING_FACE_PIN, _with(revision="main"),
     "pins.p.revision: expected a 40-character lowercase commit hash (branch and tag names can move)"),
    (VALID_HUGGING_FACE_PIN, _without("revision"), "pins.p.revision: expected a 40-character"),
    (VALID_HUGGING_FACE_PIN, _with(repository="Qwen3.5-4B-GGUF"), "pins.p.repository: expected owner/name"),
    (VALID_HUGGING_FACE_PIN, _without("file"), "pins.p.file: expected the path of the .gguf file"),
    (VALID_HUGGING_FACE_PIN, _with(file="model.safetensors"), "pins.p.file: the file name must end in .gguf"),
    (VALID_HUGGING_FACE_PIN, _with(file="../model.gguf"), "pins.p.file: expected a relative path without"),
    (VALID_HUGGING_FACE_PIN, _with(url="https://example.org/m.gguf"),
     "pins.p: give either url, or repository, revision and file, not both"),
    (VALID_HUGGING_FACE_PIN, _with(sha="ab" * 32), "pins.p.sha: unknown key"),
    (VALID_HUGGING_FACE_PIN, _without("repository"), "pins.p.repository: expected owner/name"),
    (VALID_URL_PIN, _without("url"), "pins.p: missing url, or repository, revision and file"),
    (VALID_URL_PIN, _with(url="http://example.org/m.gguf"),
     "pins.p.url: plain http is allowed only for a loopback host"),
    (VALID_URL_PIN, _with(url="ftp://example.org/m.gguf"), "pins.p.url: expected an https:// URL"),
    (VALID_URL_PIN, _with(url="https://example.org/download?id=7"),
     "pins.p.url: the URL's last path segment must end in .gguf"),
    (VALID_URL_PIN, _with(url="https://example.org/download?id=7", file="dir/m.gguf"),
     "pins.p.file: expected a file name without '/'"),
    (VALID_URL_PIN, _with(description=7), "pins.p.description: expected a string"),
])
def test_invalid_pin_is_reported_with_its_key(base, change, message, write_pins, capsys):
    pins_path = write_pins({"p": change(deepcopy(base))})

    with pytest.raises(BuildError) as raised:
        load_pins(pins_path)
    assert raised.value.exit_code == ExitCode.BAD_INPUT
    assert message in str(raised.value)

    assert main(["pins", "--pins", str(pins_path)]) == ExitCode.BAD_INPUT
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("content, message", [
    ('{"default": "a", "pins": {', "invalid JSON at line 1 column 27"),
    ('["a"]', "(top level): expected an object with keys default, pins"),
    ('{"default": "a", "pins": {}}', "pins: expected an object with at least one named pin"),
    (json.dumps({"default": "nope", "pins": {"a": VALID_URL_PIN}}), "default: 'nope' is not one of the pins (a)"),
    (json.dumps({"pins": {"a": VALID_URL_PIN}}), "default: expected the name of a pin"),
    (json.dumps({"default": "a", "pins": {"a": VALID_URL_PIN}, "pinz": {}}), "pinz: unknown key"),
    (json.dumps({"default": "Qwen 4B", "pins": {"Qwen 4B": VALID_URL_PIN}}),
     "pins.Qwen 4B: a pin name is 1 to 64 characters of a-z, 0-9"),
    (json.dumps({"default": "a", "pins": {"a": "https://example.org/m.gguf"}}), "pins.a: expected an object"),
])
def test_invalid_pins_file_is_reported(content, message, tmp_path):
    pins_path = tmp_path / "pins.json"
    pins_path.write_text(content)
    with pytest.raises(BuildError) as raised:
        load_pins(pins_path)
    assert raised.value.exit_code == ExitCode.BAD_INPUT
    assert message in str(raised.value)


def test_every_problem_is_reported_at_once(write_pins):
    pins_path = write_pins({"a": {**VALID_HUGGING_FACE_PIN, "sha256": "x", "bytes": -1},
                            "b": {**VALID_URL_PIN, "url": "http://example.org/m.gguf"}})
    with pytest.raises(BuildError) as raised:
        load_pins(pins_path)
    lines = str(raised.value).splitlines()
    assert lines[0] == f"invalid pins file {pins_path}:"
    assert [line.split(":")[0].strip() for line in lines[1:]] == ["pins.a.sha256", "pins.a.bytes", "pins.b.url"]


# --------------------------------------------------------------------------------------------------------
# A pin's calibration file

PIN_SHA256 = VALID_HUGGING_FACE_PIN["sha256"]
OTHER_SHA256 = hashlib.sha256(b"another model").hexdigest()


def test_calibration_is_read_relative_to_the_pins_file(write_pins, write_calibration, tmp_path):
    # Formatted unlike json.dumps' default: the pin keeps the file's bytes, not a re-encoding of them.
    text = json.dumps(calibration_document(PIN_SHA256, prompt_version="2026-12-01.1"), indent=3) + "\n\n"
    relative = write_calibration(text)

    pin = load_pins(write_pins({"p": {**VALID_HUGGING_FACE_PIN, "calibration": relative}})).get("p")

    assert pin.calibration.path == tmp_path / relative
    assert pin.calibration.data == text.encode("utf-8")
    assert pin.calibration.sha256 == hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert pin.calibration.prompt_version == "2026-12-01.1"


def test_calibration_matches_a_pin_whose_sha256_is_written_in_uppercase(write_pins, write_calibration):
    relative = write_calibration(calibration_document(PIN_SHA256))
    pins = write_pins({"p": {**VALID_HUGGING_FACE_PIN, "sha256": PIN_SHA256.upper(), "calibration": relative}})
    pin = load_pins(pins).get("p")
    assert pin.sha256 == PIN_SHA256
    assert pin.calibration is not None and pin.calibration.path.name == "model.json"


def test_pin_without_calibration_has_none(write_pins):
    assert load_pins(write_pins({"p": VALID_HUGGING_FACE_PIN})).get("p").calibration is None


def test_pins_command_lists_the_calibration(write_pins, write_calibration, tmp_path, capsys):
    relative = write_calibration(calibration_document(PIN_SHA256, prompt_version="v7"))
    pins = write_pins({"p": {**VALID_HUGGING_FACE_PIN, "calibration": relative}})
    assert main(["pins", "--pins", str(pins)]) == ExitCode.OK
    assert f"  calibration: {tmp_path / relative} (prompt version v7)\n" in capsys.readouterr().out


def _document_without(*keys):
    return {key: value for key, value in calibration_document(PIN_SHA256).items() if key not in keys}


# (what to write as calibrations/model.json, or None for nothing; the pin's `calibration` value, or None for
# the written file; the message, where {folder} is the pins file's folder)
@pytest.mark.parametrize("content, value, message", [
    pytest.param(None, "calibrations/absent.json", "pins.p.calibration: {folder}/calibrations/absent.json not found",
                 id="missing-file"),
    pytest.param(calibration_document(PIN_SHA256), "calibrations", "pins.p.calibration: cannot read "
                 "{folder}/calibrations: Is a directory", id="directory"),
    pytest.param('{"gguf_sha256": ', None, "pins.p.calibration: {folder}/calibrations/model.json is not valid JSON "
                 "(line 1 column 17: Expecting value)", id="bad-json"),
    pytest.param(b"\xff\xfe{}", None, "pins.p.calibration: {folder}/calibrations/model.json is not UTF-8 text",
                 id="not-utf-8"),
    pytest.param([PIN_SHA256], None, "pins.p.calibration: {folder}/calibrations/model.json must hold a JSON object "
                 "with keys gguf_sha256, prompt_version, temperatures", id="not-an-object"),
    pytest.param(_document_without("gguf_sha256"), None,
                 "pins.p.calibration: {folder}/calibrations/model.json: missing gguf_sha256 (a calibration file has "
                 "gguf_sha256, prompt_version, temperatures", id="missing-gguf-sha256"),
    pytest.param(_document_without("prompt_version"), None, ".json: missing prompt_version (",
                 id="missing-prompt-version"),
    pytest.param(_document_without("temperatures"), None, ".json: missing temperatures (", id="missing-temperatures"),
    pytest.param(_document_without("gguf_sha256", "temperatures"), None, ".json: missing gguf_sha256, temperatures (",
                 id="missing-two-keys"),
    pytest.param(calibration_document(OTHER_SHA256), None,
                 f"pins.p.calibration: {{folder}}/calibrations/model.json was fitted for the GGUF with sha256 "
                 f"{OTHER_SHA256}, not this pin's ({PIN_SHA256}); fit one for this GGUF with "
                 "python -m decision_adapter.calibrate", id="fitted-for-another-gguf"),
    # The adapter compares the hash character for character with its lowercase digest.
    pytest.param(calibration_document(PIN_SHA256.upper()), None,
                 ".json: gguf_sha256: expected 64 lowercase hex characters", id="uppercase-gguf-sha256"),
    pytest.param(calibration_document(PIN_SHA256[:12]), None,
                 ".json: gguf_sha256: expected 64 lowercase hex characters", id="short-gguf-sha256"),
    pytest.param(calibration_document(PIN_SHA256, prompt_version=""), None,
                 ".json: prompt_version: expected a non-empty string", id="empty-prompt-version"),
    pytest.param(calibration_document(PIN_SHA256, prompt_version=3), None,
                 ".json: prompt_version: expected a non-empty string", id="numeric-prompt-version"),
    pytest.param(calibration_document(PIN_SHA256, temperatures=[2.5]), None,
                 ".json: temperatures: expected an object from question type (noul, choice, score) to temperature",
                 id="temperatures-not-an-object"),
    pytest.param(calibration_document(PIN_SHA256, temperatures={"choice": 2.0, "multiple": 1.0}), None,
                 ".json: temperatures: unknown question types 'multiple' (expected noul, choice, score)",
                 id="unknown-question-type"),
    pytest.param(calibration_document(PIN_SHA256, temperatures={"choice": 0, "noul": -1.5, "score": "2"}), None,
                 ".json: temperatures: expected a positive finite number for 'choice', 'noul', 'score'",
                 id="bad-temperatures"),
    pytest.param(calibration_document(PIN_SHA256, temperatures={"choice": True, "noul": float("nan")}), None,
                 ".json: temperatures: expected a positive finite number for 'choice', 'noul'",
                 id="bool-and-nan-temperatures"),
    pytest.param(calibration_document(PIN_SHA256, permutations=0), None,
                 ".json: permutations: expected a whole number of at least 1", id="zero-permutations"),
    pytest.param(None, 7, "pins.p.calibration: expected the path of a calibration JSON file, relative to the "
                 "pins file's folder", id="not-a-string"),
    pytest.param(None, "", "pins.p.calibration: expected the path of a calibration JSON file", id="empty-path"),
    pytest.param(calibration_document(PIN_SHA256), "/etc/calibration.json",
                 "pins.p.calibration: expected a relative path inside the pins file's folder, without empty, '.' or "
                 "'..' segments (got '/etc/calibration.json')", id="absolute-path"),
    pytest.param(calibration_document(PIN_SHA256), "calibrations/../calibrations/model.json",
                 "pins.p.calibration: expected a relative path inside the pins file's folder", id="dot-dot-segment"),
])
def test_invalid_calibration_is_reported_with_its_key(content, value, message, write_pins, write_calibration,
                                                      tmp_path, capsys):
    written = write_calibration(content) if content is not None else None
    pins_path = write_pins({"p": {**VALID_HUGGING_FACE_PIN, "calibration": written if value is None else value}})
    expected = message.replace("{folder}", str(tmp_path))

    with pytest.raises(BuildError) as raised:
        load_pins(pins_path)
    assert raised.value.exit_code == ExitCode.BAD_INPUT
    assert expected in str(raised.value)

    assert main(["pins", "--pins", str(pins_path)]) == ExitCode.BAD_INPUT
    assert expected in capsys.readouterr().err


def test_calibration_problems_are_reported_with_the_others(write_pins, write_calibration):
    other_model = write_calibration(calibration_document(OTHER_SHA256), name="other.json")
    pins_path = write_pins({"a": {**VALID_HUGGING_FACE_PIN, "bytes": -1, "calibration": other_model},
                            # An invalid pin sha256 is reported once, not again as a calibration mismatch.
                            "b": {**VALID_URL_PIN, "sha256": "x", "calibration": other_model}})
    with pytest.raises(BuildError) as raised:
        load_pins(pins_path)
    lines = str(raised.value).splitlines()[1:]
    assert [line.split(":")[0].strip() for line in lines] == ["pins.a.bytes", "pins.a.calibration", "pins.b.sha256"]
    assert "was fitted for the GGUF with sha256" in lines[1]


def test_missing_pins_file(tmp_path, capsys):
    assert main(["pins", "--pins", str(tmp_path / "absent.json")]) == ExitCode.BAD_INPUT
    assert f"pins file {tmp_path / 'absent.json'} not found" in capsys.readouterr().err


@pytest.mark.parametrize("arguments, message", [
    (["package", "--pin", "nope", "--no-upload", "--output", "out"], "unknown pin 'nope'"),
    (["package", "--no-upload"], "--no-upload needs --output DIR"),
    (["package"], "--bucket is required"),
    (["fetch", "--hf-endpoint", "http://mirror.example.org"],
     "--hf-endpoint: plain http is allowed only for a loopback host"),
    (["fetch", "--hf-endpoint", "huggingface.co"], "--hf-endpoint: expected an https:// URL"),
])
def test_bad_arguments_exit_2_before_any_work(arguments, message, tmp_path, capsys):
    assert main([*arguments, "--work-dir", str(tmp_path / "work")]) == ExitCode.BAD_INPUT
    assert message in capsys.readouterr().err
    assert not (tmp_path / "work" / "downloads").exists()


def test_argument_syntax_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as raised:
        main(["fetch", "--attempts", "0"])
    assert raised.value.code == ExitCode.BAD_INPUT
    assert "expected a whole number of at least 1" in capsys.readouterr().err


def test_module_prints_errors_without_a_traceback(tmp_path):
    pins_path = tmp_path / "pins.json"
    pins_path.write_text(json.dumps({"default": "p", "pins": {"p": {**VALID_URL_PIN, "sha256": "short"}}}))
    completed = subprocess.run([sys.executable, "-m", "model_build", "fetch", "--pins", str(pins_path)],
                               cwd=REPO_ROOT, env={**FAKE_AWS_ENV, "PATH": "/usr/bin:/bin"},
                               capture_output=True, text=True, timeout=120, check=False)
    assert completed.returncode == ExitCode.BAD_INPUT
    assert completed.stderr == f"model_build: error: invalid pins file {pins_path}:\n" \
                               "  pins.p.sha256: expected 64 hex characters\n"
    assert completed.stdout == ""
