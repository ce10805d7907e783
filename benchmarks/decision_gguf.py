"""`python -m benchmarks.decision_gguf`: a decision GGUF beside the same weights read as a plain chat model.

A decision GGUF (``<arch>.decision.type``, a ``tokenizer.chat_template.systemone`` template, temperatures; see
``decision_adapter.decisions.decision_file``) is answered by its type's rules; a file without the key by this
adapter's own readout. This derives letter-readout decision GGUFs (``lev``, ``openjev``) from a plain model with the
``gguf`` package (its tensors and metadata copied, the decision metadata added) and scores the same tasks on the
plain file and on each derived one, in-process through ``DecisionModel.score``, as a System One request: accuracy,
Brier, ECE per question type, and seconds. The weights are a chat model's, not a decision model's, and the
derived files carry this module's templates, not a vendor's: the figures compare the rules and prompts on the same
weights, not a trained decision model. The tests derive their decision GGUFs here too (``derive``, ``derive_type``,
``derive_head``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

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


def derive_type(source: Path, folder: Path, decision_type: str,
                temperatures: Mapping[str, float] | None = None) -> Path:
    """A letter-readout decision GGUF of ``decision_type`` (lev, openjev) in a folder of its own, with the tests'
    temperatures unless others are given (``{}``: none, every temperature 1)."""
    folder.mkdir(parents=True, exist_ok=True)
    return derive(source, folder / f"smollm2-{decision_type}.gguf", decision_type, template=TEMPLATES[decision_type],
                  temperatures=TEMPERATURES[decision_type] if temperatures is None else temperatures)


def derive_head(source: Path, folder: Path, decision_type: str, embedding: int = 576, n_out: int = 64) -> Path:
    """A head-type file: the weights plus the head's projection (``cls.output``, as kev carries it)."""
    folder.mkdir(parents=True, exist_ok=True)
    head = np.random.default_rng(0).standard_normal((n_out, embedding)).astype(np.float32)
    return derive(source, folder / f"smollm2-{decision_type}.gguf", decision_type,
                  template="{{ state }}<|box_end|>", extra_tensors={"cls.output": head})


# ---- the benchmark --------------------------------------------------------------------------------------------------

def score_task(model: Any, task: Any) -> Any:
    """One task as a System One request (K 1, debias off: a decision GGUF takes no other), scored through
    ``DecisionModel.score``: its probabilities as the client gets them, in the task's label order (None if
    refused)."""
    import math

    from .scoring import Scored, answered, in_label_order

    found = answered(model, task)
    if found is None:
        return None
    item, result, seconds = found
    distribution = in_label_order(task, item.names, result.probabilities)
    return Scored(task, tuple(math.log(max(p, 1e-300)) for p in distribution), distribution, seconds)


def markdown(result: dict[str, Any]) -> str:
    kinds = list(result["models"])
    types = sorted({t for m in result["models"].values() for t in m["summary"]["types"]})
    lines = [f"`{result['command']}` ({result['model']}, {result['tasks']} tasks, {result['threads']} threads)", "",
             "| read as | accuracy | " + " | ".join(f"{t} accuracy" for t in types) +
             " | Brier | ECE (10 bins) | refused | seconds p50 |",
             "|---|---:|" + "---:|" * len(types) + "---:|---:|---:|---:|"]
    for kind in kinds:
        m = result["models"][kind]
        s = m["summary"]
        per_type = " | ".join(f"{s['types'][t]['accuracy']:.3f}" if t in s["types"] else "" for t in types)
        lines.append(f"| {kind} | {s['overall']['accuracy']:.3f} | {per_type} | {s['overall']['brier']:.3f} | "
                     f"{s['overall']['ece_10']:.3f} | {m['refused']} | {s['seconds_p50']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.decision_gguf``: the same tasks on a plain GGUF and on the letter-readout decision
    GGUFs derived from it (no temperatures: every one 1, so Brier and ECE are the rules' own)."""
    import argparse
    import json
    import os
    import tempfile
    from dataclasses import replace

    from .provenance import Provenance
    from .scoring import summary
    from .tasks import DEFAULT_TASKS, add_selection_options, load, selected

    parser = argparse.ArgumentParser(prog="python -m benchmarks.decision_gguf", description=main.__doc__)
    parser.add_argument("--tasks", nargs="+", type=Path, default=[DEFAULT_TASKS])
    parser.add_argument("--model-dir", help="the plain model's folder (default: the embedded model)")
    parser.add_argument("--types", nargs="+", choices=list(TEMPLATES), default=list(TEMPLATES))
    add_selection_options(parser)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--out", type=Path, default=Path("benchmark-results"))
    args = parser.parse_args(argv)

    from decision_adapter.decisions.model_files import embedded_model_dir, find_gguf
    from decision_adapter.settings import Settings
    from decision_adapter.startup import load_decision_model

    tasks = selected(load(args.tasks), args)
    model_dir = Path(args.model_dir) if args.model_dir else embedded_model_dir()
    source = find_gguf(model_dir)
    base = replace(Settings.from_env(), threads=args.threads, permutations=1, debias="off")
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"model": source.name, "tasks": len(tasks), "threads": args.threads, "models": {}}
    with Provenance("benchmarks.decision_gguf", argv) as provenance, \
            tempfile.TemporaryDirectory(prefix="decision-gguf-") as scratch:
        folders = {"plain": model_dir}
        for kind in args.types:
            folders[kind] = derive_type(source, Path(scratch) / kind, kind, temperatures={}).parent
        for kind, folder in folders.items():
            settings = replace(base, model_dir=str(folder))
            provenance.ran_with(settings)
            model = load_decision_model(settings, calibrated=False)
            try:
                provenance.kernels_of(model.model_info)
                scored = [s for task in tasks if (s := score_task(model, task)) is not None]
            finally:
                model.close()
            result["models"][kind] = {"refused": len(tasks) - len(scored), "summary": summary(tasks, scored)}
            print(json.dumps({kind: result["models"][kind]["summary"]["overall"]}), flush=True)
        result["command"] = provenance.command
        result["provenance"] = provenance.record()
    (args.out / "decision_gguf.json").write_text(json.dumps(result, indent=1) + "\n")
    table = markdown(result)
    (args.out / "decision_gguf.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
