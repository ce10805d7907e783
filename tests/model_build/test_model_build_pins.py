"""Pins: the shipped pins file, validation messages that name the key, and bad command-line input."""

from __future__ import annotations

import json
import subprocess
import sys
from copy import deepcopy

import pytest

from model_build.cli import main
from model_build.errors import BuildError, ExitCode
from model_build.pins import load_pins
from packaging_testkit import FAKE_AWS_ENV, REPO_ROOT

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
