"""Decision tasks in the JevBench row format: loading, and turning a row into a System One request.

A row holds `id`, `state`, `question` ({type, instructions, criteria}), the ordered `labels`, the
`expected` label and, for the public JevBench files, `family` and `split`. The tier is the file's stem
(easy, original, hard) unless the row names one. ``BIAS_TASKS`` are this project's own tasks (tier ``bias``,
benchmarks/bias-tasks/SOURCE.md): the cases a prior divided out of the answer can get wrong.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_TASKS = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "jevbench"
BIAS_TASKS = Path(__file__).resolve().parent / "bias-tasks" / "bias.jsonl"
JEVBENCH_TIERS = ("easy", "original", "hard")  # the files of a JevBench folder
TIERS = (*JEVBENCH_TIERS, "bias")


@dataclass(frozen=True)
class Task:
    id: str
    tier: str
    family: str
    state: Any
    question: dict[str, Any]
    labels: tuple[str, ...]
    expected: str
    group: str | None = None  # tasks of one group are variants of one case (kept in one fold)

    @property
    def kind(self) -> str:
        return self.question["type"]

    def system_one(self, model: str = "jev-latest") -> dict[str, Any]:
        return {"model": model, "state": self.state, "questions": {"q": self.question}}

    def distribution(self, answer: dict[str, Any]) -> list[float]:
        """The answer's probabilities in `labels` order (noul labels are no, yes)."""
        if self.kind == "noul":
            p = float(answer["noul"])
            return [1.0 - p if label == "no" else p for label in self.labels]
        probabilities = answer["probabilities"]
        return [float(probabilities[label]) for label in self.labels]


def load(paths: list[Path]) -> list[Task]:
    """Rows from JSON-lines files, or every tier of a folder holding easy/original/hard.jsonl."""
    files: list[Path] = []
    for path in paths:
        files += [path / f"{tier}.jsonl" for tier in JEVBENCH_TIERS] if path.is_dir() else [path]
    tasks = []
    for file in files:
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                tasks.append(_task(row, default_tier=file.stem))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{file}:{number}: not a decision task: {exc}") from None
    return tasks


def _task(row: dict[str, Any], default_tier: str) -> Task:
    question = row["question"]
    if question["type"] not in ("noul", "choice", "score"):
        raise ValueError(f"unknown question type {question['type']!r}")
    labels = tuple(str(label) for label in row["labels"])
    expected = str(row["expected"])
    if expected not in labels:
        raise ValueError(f"expected {expected!r} is not one of the labels {labels}")
    return Task(id=str(row["id"]), tier=str(row.get("tier") or default_tier), family=str(row.get("family") or ""),
                state=row["state"], question=question, labels=labels, expected=expected,
                group=row.get("group"))


def first_per_tier(tasks: list[Task], n: int) -> list[Task]:
    """The first n tasks of each tier, in file order."""
    counts: dict[str, int] = {}
    kept = []
    for task in tasks:
        if counts.get(task.tier, 0) < n:
            kept.append(task)
            counts[task.tier] = counts.get(task.tier, 0) + 1
    return kept


def state_chars(task: Task) -> int:
    """The state's length in characters (as JSON when it is not a string)."""
    return len(task.state) if isinstance(task.state, str) else len(json.dumps(task.state, ensure_ascii=False))


def with_short_states(tasks: list[Task], max_chars: int) -> list[Task]:
    """The tasks whose state is at most ``max_chars`` characters: on a slow machine, long states cost most."""
    return [t for t in tasks if state_chars(t) <= max_chars]


def add_selection_options(parser: Any) -> None:
    """The options both harnesses take to run a subset of the tasks (see ``selected``)."""
    parser.add_argument("--per-tier", type=int, default=0, metavar="N",
                        help="only the first N tasks of each tier (default: all)")
    parser.add_argument("--max-state-chars", type=int, default=0, metavar="N",
                        help="only tasks whose state is at most N characters (as JSON when not a string): on a "
                             "slow machine, long states cost most of the run (default: all)")


def selected(tasks: list[Task], options: Any) -> list[Task]:
    """The tasks ``add_selection_options``'s options keep: short states first, then the first N per tier."""
    if options.max_state_chars:
        tasks = with_short_states(tasks, options.max_state_chars)
    if options.per_tier:
        tasks = first_per_tier(tasks, options.per_tier)
    return tasks
