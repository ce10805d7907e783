"""Decision GGUFs derived here from the embedded model (SmolLM2-135M) with the ``gguf`` package: its tensors and
metadata copied, plus ``<arch>.decision.type``, a ``tokenizer.chat_template.systemone`` template, fitted-looking
temperatures and, for a head type, the head's extra tensor. The weights are a chat model's, not a decision model's:
the derived models answer at about chance; they test the rules, not accuracy."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np

# ChatML, as SmolLM2's own template writes it. lev is handed each option's label; openjev letters its options
# itself. Structured values are written with tojson, as a decision model's template would.
LEV_TEMPLATE = """<|im_start|>system
You are a decision model. Reply with one label.<|im_end|>
<|im_start|>user
{% if state is string %}{{ state }}{% else %}{{ state | tojson }}{% endif %}

Question: {% if instructions is string %}{{ instructions }}{% else %}{{ instructions | tojson }}{% endif %}

{% if type == "noul" %}
Rate how true it is, from A (certainly false) to I (certainly true).
{% for o in options %}
{{ o.key }}{% if o.description is not none %}: {{ o.description if o.description is string else o.description | tojson }}{% endif %}

{% endfor %}
{% else %}
{% for o in options %}
{{ o.label }}. {{ o.key }}{% if o.description is not none %}: {{ o.description if o.description is string else o.description | tojson }}{% endif %}

{% endfor %}
{% endif %}
<|im_end|>
<|im_start|>assistant
"""

OPENJEV_TEMPLATE = """<|im_start|>system
You are a decision model. Reply with one letter.<|im_end|>
<|im_start|>user
{% if state is string %}{{ state }}{% else %}{{ state | tojson }}{% endif %}

{{ type }}: {% if instructions is string %}{{ instructions }}{% else %}{{ instructions | tojson }}{% endif %}

{% for o in options %}
{{ "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"[loop.index0] }}. {{ o.key }}{% if o.description is not none %}: {{ o.description if o.description is string else o.description | tojson }}{% endif %}

{% endfor %}
<|im_end|>
<|im_start|>assistant
"""

TEMPLATES = {"lev": LEV_TEMPLATE, "openjev": OPENJEV_TEMPLATE}
# Temperatures unlike 1, one per lookup rule: type.bucket, the type alone, and none (1.0).
TEMPERATURES = {
    "lev": {"choice.small": 0.5, "choice": 1.75, "noul": 0.8123456, "score.mid": 3.0},
    "openjev": {"choice.3_5": 0.5, "choice": 2.0, "noul.2": 0.75},
}


def derive(source: Path, dest: Path, decision_type: str | None, *, template: str | None = None,
           temperatures: Mapping[str, float] = {}, extra_tensors: Mapping[str, np.ndarray] = {},
           extra_metadata: Mapping[str, object] = {}) -> Path:
    """Write ``dest``: ``source``'s tensors and metadata, plus the decision metadata (``decision_type`` None:
    the same file under another name, a plain chat GGUF) and any extra tensors."""
    import gguf

    reader = gguf.GGUFReader(str(source), "r")
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(dest), arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by the writer itself
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    if decision_type is not None:
        writer.add_key_value(f"{arch}.decision.type", decision_type, gguf.GGUFValueType.STRING)
    if template is not None:
        writer.add_key_value("tokenizer.chat_template.systemone", template, gguf.GGUFValueType.STRING)
    for name, value in temperatures.items():
        writer.add_key_value(f"{arch}.decision.temperature.{name}", value, gguf.GGUFValueType.FLOAT32)
    for key, value in extra_metadata.items():
        writer.add_key_value(key, value, gguf.GGUFValueType.STRING if isinstance(value, str)
                             else gguf.GGUFValueType.FLOAT32)
    for tensor in reader.tensors:
        writer.add_tensor_info(tensor.name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes,
                               tensor.tensor_type)
    for name, array in extra_tensors.items():
        writer.add_tensor_info(name, array.shape, array.dtype, array.nbytes, gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:
        writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    for array in extra_tensors.values():
        writer.write_tensor_data(array)
    writer.close()
    return dest


def derive_type(source: Path, folder: Path, decision_type: str) -> Path:
    """A letter-readout decision GGUF of ``decision_type`` (lev, openjev) in a folder of its own."""
    folder.mkdir(parents=True, exist_ok=True)
    return derive(source, folder / f"smollm2-{decision_type}.gguf", decision_type,
                  template=TEMPLATES[decision_type], temperatures=TEMPERATURES[decision_type])


def derive_head(source: Path, folder: Path, decision_type: str, embedding: int = 576, n_out: int = 64) -> Path:
    """A head-type file: the weights plus the head's projection (``cls.output``, as kev carries it)."""
    folder.mkdir(parents=True, exist_ok=True)
    head = np.random.default_rng(0).standard_normal((n_out, embedding)).astype(np.float32)
    return derive(source, folder / f"smollm2-{decision_type}.gguf", decision_type,
                  template="{{ state }}<|box_end|>", extra_tensors={"cls.output": head})
