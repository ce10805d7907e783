"""What a GGUF says about how it is to be answered: read once at start-up, before llama.cpp loads it.

A **decision GGUF** carries ``<arch>.decision.type`` in its metadata, a ``tokenizer.chat_template.systemone``
template and fitted temperatures ``<arch>.decision.temperature.<question type>[.<bucket>]``; llama.cpp's own
server (release b11361 and later) answers ``/v1/systemone`` for such files only, by the type's rules. A file
without the key is a plain chat model, answered by this adapter's own readout.

The metadata is read with the ``gguf`` package (header only, memory-mapped), not through llama.cpp: a head type
carries tensors that the bundled llama.cpp refuses to load, and the refusal must name the type, not the tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .prompt import ModelIncompatible

TEMPLATE_KEY = "tokenizer.chat_template.systemone"
# The llama.cpp bundled by the pinned llama-cpp-python 0.3.36 (ggml-org/llama.cpp b11312, 2026-10-01).
BUNDLED_BUILD = "b11312"
# Types whose rules are a letter readout over ordinary chat weights: this adapter answers them.
LETTER_TYPES = ("lev", "openjev")
# Types that need graph code of a later libllama (their extra tensors are unknown to the bundled one), and the
# first llama.cpp release that has it.
HEAD_TYPES = {"kev": "b11361", "laya": "b11361", "clef": "b11371"}
# Types llama.cpp's server knows that this adapter does not implement (yet): refused by name, never guessed at.
UNIMPLEMENTED_TYPES = ("nimble", "pplx-decider", "lfm2-d1", "lfm2-d1-omni")


@dataclass(frozen=True)
class DecisionFile:
    """A decision GGUF's own rules, as its metadata states them."""

    architecture: str
    type: str
    template: str
    # question type or "<question type>.<bucket>" -> temperature, as llama.cpp reads it (see ``file_temperature``)
    temperatures: dict[str, float] = field(default_factory=dict)


def file_temperature(value: Any) -> float:
    """A temperature as llama.cpp's server takes it from the file: the metadata value printed as text
    (``std::to_string``: a float with six decimals) and parsed back to a 32-bit float (``strtof``). So 0.8123456
    is used as 0.812346, rounded to float32, exactly as llama-server uses it."""
    import numpy as np

    text = value if isinstance(value, str) else f"{float(value):.6f}"
    try:
        return float(np.float32(float(text)))
    except ValueError:
        return 0.0  # strtof of text that is no number: refused as not positive


def read_decision_file(path: Path) -> DecisionFile | None:
    """The decision rules of the GGUF at ``path``, or None for a plain chat model. ModelIncompatible when the file
    names a type this runtime cannot answer (a head type: it says which llama.cpp build it needs), or when a
    letter-readout file lacks its template or has a temperature that is not positive."""
    try:
        from gguf import GGUFReader
    except ImportError:  # pragma: no cover - a deployment without the package: say what to install
        raise ModelIncompatible("reading a GGUF's decision metadata needs the gguf package (container/requirements.txt)")
    try:
        fields = GGUFReader(str(path), "r").fields
    except (ValueError, OSError):
        return None  # no metadata to read: llama.cpp's loader says what is wrong with the file

    def value(key: str) -> Any:
        found = fields.get(key)
        return None if found is None else found.contents()

    architecture = value("general.architecture") or "unknown"
    prefix = f"{architecture}.decision."
    kind = value(prefix + "type")
    if kind is None:
        return None
    if not isinstance(kind, str):
        raise ModelIncompatible(f"{prefix}type must be a string, not {kind!r}")
    if kind in HEAD_TYPES:
        raise ModelIncompatible(
            f"decision model type {kind!r} ({path.name}) needs llama.cpp {HEAD_TYPES[kind]} or later: its head "
            f"tensors and graph code are not in the llama.cpp this server bundles ({BUNDLED_BUILD}, "
            f"llama-cpp-python 0.3.36), so it cannot be served here; serve it with llama-server {HEAD_TYPES[kind]}+ "
            f"or a plain chat GGUF of the same weights")
    if kind in UNIMPLEMENTED_TYPES:
        raise ModelIncompatible(f"decision model type {kind!r} ({path.name}) is not implemented by this adapter "
                                f"(it answers {', '.join(LETTER_TYPES)} and plain chat GGUFs)")
    if kind not in LETTER_TYPES:
        raise ModelIncompatible(f"unknown decision model type {kind!r} in {prefix}type of {path.name} (known: "
                                f"{', '.join((*LETTER_TYPES, *HEAD_TYPES, *UNIMPLEMENTED_TYPES))})")
    template = value(TEMPLATE_KEY)
    if not isinstance(template, str) or not template.strip():
        raise ModelIncompatible(f"decision model {path.name} ({kind}) has no {TEMPLATE_KEY} template")
    temperatures: dict[str, float] = {}
    at = prefix + "temperature."
    for key in fields:
        if key.startswith(at):
            t = file_temperature(value(key))
            if not t > 0.0:
                raise ModelIncompatible(f"invalid decision temperature: {key} = {value(key)!r} (must be positive)")
            temperatures[key[len(at):]] = t
    return DecisionFile(architecture, kind, template, temperatures)
