"""`python -m benchmarks`: run the benchmark and write results.json, results.md and the plots."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from . import report
from .provenance import Provenance
from .run import Options, run
from .tasks import DEFAULT_TASKS, TIERS, add_selection_options, load, selected


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--tasks", nargs="+", type=Path, default=[DEFAULT_TASKS],
                        help="JSON-lines task files, or a folder with easy/original/hard.jsonl "
                             "(default: the public JevBench tasks in ../shared/benchmarks/jevbench)")
    add_selection_options(parser)
    parser.add_argument("--task-ids", nargs="+", metavar="ID", help="only these tasks (by id)")
    parser.add_argument("--endpoint", default="auto",
                        help="auto (start the adapter here), a /v1/systemone or /invocations URL, or sagemaker:NAME")
    parser.add_argument("--generation", default="auto",
                        help="auto (build and start llama-server here), none, a /v1/chat/completions URL, "
                             "or sagemaker:NAME (the llama.cpp DLC text-generation endpoint)")
    parser.add_argument("--model-dir", help="GGUF folder for the servers started here and for the prefill "
                                            "floor (default: the embedded SmolLM2 model)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--gpu-layers", type=int, default=0, metavar="N",
                        help="layers offloaded to the GPU by the servers started here and the floor "
                             "(-1: all; needs GPU builds of llama-cpp-python and llama-server)")
    parser.add_argument("--shared-questions", type=int, default=8, metavar="N",
                        help="questions in the shared-state comparison (0 to skip)")
    parser.add_argument("--no-repeated-state", dest="repeated_state", action="store_false",
                        help="skip the repeated-state comparison (first request, new question, identical repeat)")
    parser.add_argument("--region", help="AWS region for sagemaker: endpoints")
    parser.add_argument("--out", type=Path, default=Path("benchmark-results"))
    args = parser.parse_args(argv)

    missing = [p for p in args.tasks if not p.exists()]
    if missing:
        parser.error(f"no tasks at {', '.join(map(str, missing))}")
    tasks = load(args.tasks)
    if args.task_ids:
        unknown = set(args.task_ids) - {t.id for t in tasks}
        if unknown:
            parser.error(f"no task with id {', '.join(sorted(unknown))}")
        tasks = [t for t in tasks if t.id in args.task_ids]
    tasks = selected(tasks, args)
    with Provenance("benchmarks", argv) as provenance:
        options = Options(tasks=tasks, endpoint=args.endpoint, generation=args.generation, model_dir=args.model_dir,
                          threads=args.threads, gpu_layers=args.gpu_layers, shared_questions=args.shared_questions,
                          repeated_state=args.repeated_state, out=args.out,
                          region=args.region, api_key=os.environ.get("ADAPTER_API_KEY") or None,
                          notes={"task_files": [str(p) for p in args.tasks], "tiers": list(TIERS)},
                          provenance=provenance)
        result = run(options)
        result["provenance"] = provenance.record()
    command = provenance.command
    for path in report.write(result, args.out, command):
        print(f"wrote {path}")
    print(report.markdown({**{k: v for k, v in result.items() if not k.startswith('_')}, "command": command}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
