"""The generation baseline: the same question as a chat completion, the reply parsed back to an option.

This is how users answer decisions on the standard text-generation path (llama-server, or the llama.cpp
DLC on SageMaker): ask, let the model write, read the option out of the text. A reply that names no
option, or more than one, is a parse failure and counts as wrong.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .tasks import Task

MAX_TOKENS = 48
INSTRUCTION = ("You are a decision model. Read the state, then answer the question by choosing exactly one "
               "of the listed options. Reply with the option only, nothing else.")


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def render(task: Task) -> list[dict[str, str]]:
    question = task.question
    instructions = question.get("instructions")
    criteria = question.get("criteria")
    if task.kind == "noul":
        criteria = criteria or {}
        lines = [f"- yes: {_text(criteria['true'])}" if criteria.get("true") else "- yes",
                 f"- no: {_text(criteria['false'])}" if criteria.get("false") else "- no"]
        ask = "Reply with yes or no."
    elif task.kind == "choice":
        lines = [f"- {name}: {_text(d)}" if d else f"- {name}" for name, d in criteria.items()]
        ask = "Reply with the option's name exactly as written."
    else:
        lines = [f"- {i}: {_text(level)}" for i, level in enumerate(criteria)]
        ask = "Reply with the level's number."
    user = (f"State:\n{_text(task.state)}\n\nQuestion:\n{_text(instructions) if instructions else 'Decide.'}"
            f"\n\nOptions:\n" + "\n".join(lines) + f"\n\n{ask}")
    return [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": user}]


def request(task: Task, model: str = "default") -> dict[str, Any]:
    return {"model": model, "messages": render(task), "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "stream": False}


def reply_text(response: dict[str, Any]) -> str:
    return response["choices"][0]["message"].get("content") or ""


def parse(task: Task, reply: str) -> str | None:
    """The label the reply names, or None when it names none or several."""
    text = re.sub(r"[*`\"'_]+", " ", reply).strip().lower()
    text = re.sub(r"^(answer|option|level|the answer is)\s*[:\-]?\s*", "", text).strip()
    if task.kind == "noul":
        first = re.match(r"[a-z]+", text)
        word = first.group(0) if first else ""
        return {"yes": "yes", "true": "yes", "no": "no", "false": "no"}.get(word)
    if task.kind == "score":
        numbers = re.findall(r"\d+", text)
        return numbers[0] if numbers and numbers[0] in task.labels else None
    def norm(s: str) -> str:
        return re.sub(r"[\s_\-]+", " ", s.lower()).strip()
    reply_norm = norm(text)
    exact = [label for label in task.labels if norm(label) == reply_norm.rstrip(".")]
    if len(exact) == 1:
        return exact[0]
    spans = {label: [m.span() for m in re.finditer(rf"\b{re.escape(norm(label))}\b", reply_norm)]
             for label in task.labels}
    # A label named only inside a longer one ("order" in "cancel order") is not named on its own.
    named = [label for label, own in spans.items() if any(
        not any(other != label and a <= s and e <= b for other, theirs in spans.items() for a, b in theirs)
        for s, e in own)]
    return named[0] if len(named) == 1 else None
