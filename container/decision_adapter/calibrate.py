"""`python -m decision_adapter.calibrate`: fit calibration.json for a model from labelled decisions.

Rows are JevBench-format JSON lines (``state``, ``question`` {type, instructions, criteria}, ``labels``,
``expected``, optionally ``group`` and ``id``), or a folder of such ``.jsonl`` files. Each row is scored by the
adapter's own decision model, uncalibrated, with the prompt this adapter renders; one temperature per question
type (noul, choice, score) is fitted by negative log-likelihood; a group-disjoint cross-validation reports how
much the temperatures help on rows they were not fitted on. The file names the GGUF's SHA-256 and the prompt
version, so the adapter refuses it for any other model or prompt.

may import from the package: decisions, protocols, settings, startup, errors
never imports: flask, werkzeug, gunicorn, llama_cpp
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

from .decisions.calibration import FILE_NAME, Calibration, Row, fit, nll, out_of_fold
from .decisions.debias import MODES
from .errors import InputError
from .protocols import systemone
from .protocols.fields import RequestContext
from .settings import Settings, SettingsError


def read_rows(paths: list[Path]) -> Iterator[dict[str, Any]]:
    for path in paths:
        files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
        for file in files:
            for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
                if line.strip():
                    row = json.loads(line)
                    row.setdefault("id", f"{file.stem}:{number}")
                    yield row


def score_row(model, row: dict[str, Any], permutations: int, debias: str = "off") -> Row:
    """The model's option logits for one row as the temperature will see them (averaged over ``permutations``
    orderings, debiased with ``debias``, uncalibrated), in the order of its ``labels``."""
    body = {"model": systemone.ALIAS, "state": row["state"], "questions": {"q": row["question"]}}
    _, _, [item] = systemone.parse(body, RequestContext.of(model, max_decisions=1))
    question = replace(item.question, permutations=permutations, debias=debias)
    [scored] = model.score(model.prepare([question])).results
    names = {"true": "yes", "false": "no"} if item.type == "noul" else {}
    by_label = {names.get(name, name): logit for name, logit in zip(item.names, scored.adjusted_logits)}
    labels = [str(label) for label in row["labels"]]
    return Row(item.type, tuple(by_label[label] for label in labels), labels.index(str(row["expected"])),
               str(row.get("group") or row["id"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m decision_adapter.calibrate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rows", nargs="+", type=Path, help="JevBench-format .jsonl files or folders of them")
    parser.add_argument("--model-dir", required=True, help="the folder holding the GGUF (and its manifest)")
    parser.add_argument("--out", type=Path, help=f"where to write the file (default: MODEL_DIR/{FILE_NAME})")
    parser.add_argument("--folds", type=int, default=5, help="group-disjoint folds of the cross-validation")
    parser.add_argument("--permutations", type=int, default=None,
                        help="orderings averaged per decision (default ADAPTER_PERMUTATIONS)")
    parser.add_argument("--debias", choices=list(MODES), default=None,
                        help="content-free calibration of the answers fitted on (default ADAPTER_DEBIAS)")
    args = parser.parse_args(argv)

    from .startup import load_decision_model

    try:
        settings = replace(Settings.from_env(), model_dir=args.model_dir, state_cache_mb=0)
    except SettingsError as exc:
        print(f"calibrate: {exc}", file=sys.stderr)
        return 2
    permutations = args.permutations or settings.permutations
    debias = args.debias or settings.debias
    model = load_decision_model(settings, calibrated=False)
    rows, skipped = [], []
    for row in read_rows(args.rows):
        try:
            rows.append(score_row(model, row, permutations, debias))
        except (InputError, KeyError, ValueError) as exc:
            skipped.append(f"{row.get('id')}: {exc}")
    model.close()
    if len(rows) < 2 * args.folds:
        print(f"calibrate: {len(rows)} usable rows are too few for {args.folds} folds", file=sys.stderr)
        return 1
    temperatures = fit(rows)
    oof = out_of_fold(rows, args.folds)
    by_type = {}
    for kind in temperatures:
        mine = [i for i, r in enumerate(rows) if r.type == kind]
        before = nll([rows[i] for i in mine], 1.0)
        after = -math.fsum(math.log(max(oof[i][rows[i].answer], 1e-300)) for i in mine) / len(mine)
        by_type[kind] = {"rows": len(mine), "temperature": temperatures[kind],
                         "nll_before": before, "nll_after_out_of_fold": after}
    calibration = Calibration(gguf_sha256=model.identity.sha256, prompt_version=model.prompt_version,
                              temperatures=temperatures, permutations=permutations, debias=debias,
                              fitted={"rows": len(rows), "skipped": len(skipped), "folds": args.folds,
                                      "by_type": by_type, "sources": [str(p) for p in args.rows]})
    out = args.out or Path(args.model_dir) / FILE_NAME
    out.write_text(calibration.to_json())
    for kind, figures in by_type.items():
        print(f"{kind:7s} {figures['rows']:4d} rows  T = {figures['temperature']:.3f}  NLL "
              f"{figures['nll_before']:.4f} -> {figures['nll_after_out_of_fold']:.4f} (out of fold)")
    print(f"wrote {out}" + (f" ({len(skipped)} rows skipped)" if skipped else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
