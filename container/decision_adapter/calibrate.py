"""`python -m decision_adapter.calibrate`: fit calibration.json for a model from labelled decisions.

Rows are JevBench-format JSON lines (``state``, ``question`` {type, instructions, criteria}, ``labels``,
``expected``, optionally ``group`` and ``id``), or a folder of such ``.jsonl`` files. Each row is scored by the
adapter's own decision model, uncalibrated, with the prompt this adapter renders, in the debias mode and with the
floor the file will be used with; per question type (noul, choice, score) the strength of the prior (alpha in 0,
0.05, ..., 1) and a temperature are fitted together by negative log-likelihood; a group-disjoint cross-validation
reports how much they help on rows they were not fitted on, against the server's label-free default
(ADAPTER_DEBIAS_STRENGTH, no temperature). The file names the GGUF's SHA-256 and the prompt version, so the
adapter refuses it for any other model or prompt.

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

from .decisions.calibration import FILE_NAME, Calibration, Row, fit_both, nll, out_of_fold
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


def score_row(model, row: dict[str, Any], permutations: int, debias: str = "off", floor: float = 0.0) -> Row:
    """One row as the fit sees it, in the order of its ``labels``: the model's option logits averaged over
    ``permutations`` orderings, and the log-probabilities of its ``debias`` prior mixed with the uniform by
    ``floor`` (None when no prior is divided out: mode off, or the prior's prompt is the question's own). They
    differ from what the server subtracts by a constant per row, which no softmax sees."""
    body = {"model": systemone.ALIAS, "state": row["state"], "questions": {"q": row["question"]}}
    _, _, [item] = systemone.parse(body, RequestContext.of(model, max_decisions=1))
    question = replace(item.question, permutations=permutations, debias=debias)
    [scored] = model.score(model.prepare([question])).results
    names = {"true": "yes", "false": "no"} if item.type == "noul" else {}
    labels = [str(label) for label in row["labels"]]

    def by_label(values) -> tuple[float, ...]:
        mine = {names.get(name, name): value for name, value in zip(item.names, values)}
        return tuple(mine[label] for label in labels)

    prior = None
    if scored.debias is not None and scored.prior is not None:
        n = len(scored.prior)
        prior = by_label([math.log((1.0 - floor) * p + floor / n) for p in scored.prior])
    return Row(item.type, by_label(scored.option_logits), labels.index(str(row["expected"])),
               str(row.get("group") or row["id"]), prior)


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
    parser.add_argument("--floor", type=float, default=None,
                        help="the uniform's share mixed into the prior (default ADAPTER_DEBIAS_FLOOR)")
    args = parser.parse_args(argv)

    from .startup import load_decision_model

    try:
        settings = replace(Settings.from_env(), model_dir=args.model_dir, state_cache_mb=0)
    except SettingsError as exc:
        print(f"calibrate: {exc}", file=sys.stderr)
        return 2
    permutations = args.permutations or settings.permutations
    debias = args.debias or settings.debias
    floor = settings.debias_floor if args.floor is None else args.floor
    if not 0.0 <= floor <= 1.0:
        print(f"calibrate: --floor {floor} is outside [0, 1]", file=sys.stderr)
        return 2
    model = load_decision_model(settings, calibrated=False)
    rows, skipped = [], []
    for row in read_rows(args.rows):
        try:
            rows.append(score_row(model, row, permutations, debias, floor))
        except (InputError, KeyError, ValueError) as exc:
            skipped.append(f"{row.get('id')}: {exc}")
    model.close()
    if len(rows) < 2 * args.folds:
        print(f"calibrate: {len(rows)} usable rows are too few for {args.folds} folds", file=sys.stderr)
        return 1
    fitted = fit_both(rows)
    temperatures = {kind: t for kind, (_, t) in fitted.items()}
    strengths = {kind: a for kind, (a, _) in fitted.items()} if debias != "off" else {}
    oof = out_of_fold(rows, args.folds, strengths=True)
    by_type = {}
    for kind in temperatures:
        mine = [i for i, r in enumerate(rows) if r.type == kind]
        before = nll([rows[i] for i in mine], 1.0, settings.debias_strength)
        after = -math.fsum(math.log(max(oof[i][rows[i].answer], 1e-300)) for i in mine) / len(mine)
        by_type[kind] = {"rows": len(mine), "temperature": temperatures[kind], "strength": strengths.get(kind),
                         "nll_before": before, "nll_after_out_of_fold": after,
                         "right_before": sum(_top(rows[i].adjusted(settings.debias_strength)) == rows[i].answer
                                             for i in mine),
                         "right_after_out_of_fold": sum(_top(oof[i]) == rows[i].answer for i in mine)}
    calibration = Calibration(gguf_sha256=model.identity.sha256, prompt_version=model.prompt_version,
                              temperatures=temperatures, permutations=permutations, debias=debias,
                              strengths=strengths, floor=floor,
                              fitted={"rows": len(rows), "skipped": len(skipped), "folds": args.folds,
                                      "default_strength": settings.debias_strength,
                                      "by_type": by_type, "sources": [str(p) for p in args.rows]})
    out = args.out or Path(args.model_dir) / FILE_NAME
    out.write_text(calibration.to_json())
    for kind, f in by_type.items():
        alpha = f"alpha = {f['strength']:.2f}  " if f["strength"] is not None else ""
        print(f"{kind:7s} {f['rows']:4d} rows  {alpha}T = {f['temperature']:.3f}  NLL {f['nll_before']:.4f} -> "
              f"{f['nll_after_out_of_fold']:.4f}, right {f['right_before']} -> {f['right_after_out_of_fold']} "
              f"(out of fold, against the label-free default)")
    print(f"wrote {out}" + (f" ({len(skipped)} rows skipped)" if skipped else ""))
    return 0


def _top(values) -> int:
    return max(range(len(values)), key=values.__getitem__)


if __name__ == "__main__":
    sys.exit(main())
