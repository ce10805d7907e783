"""`python -m benchmarks.examples`: what the request bodies in ``examples/`` are answered, at each K of order
averaging and each debias mode, against the answer a person would give (``EXPECTED``), in-process.

The examples are what a newcomer tries first (`make run` prints the first one's call), so their answers are the
project's first impression (issue 35, item 7). For each example, K (``--orders``) and debias mode (``--debias``):
each question's answer, whether it is the expected one, its probability and its margin over the runner-up, and the
seconds the request took with the state cache emptied before it. Then, at K = 1 only, the same body with its
options in every order (choice questions of up to 5 options): how many of the orders are answered right (K >= the
number of options answers every order alike, by construction; a score's levels are ordered and stay so).

Requests go through the adapter's own routes (``create_app``, Flask's test client: everything but the socket), so the
answers are those `curl` gets from `make run` at the same settings.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from .provenance import Provenance

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# The answer a person gives each example's questions, by its content (decision: the option id; System One: noul
# true/false, choice the criterion's name, score the level's text).
EXPECTED: dict[str, dict[str, Any]] = {
    # a forgotten password and a reset email that never arrived: account access
    "support-route.json": {"support-route": "account_access"},
    # charged twice, a promised refund not arrived, a threat to dispute the charge: money back, billing; the tone is
    # firm, not abusive ("Frustrated"; "Very angry" is defensible, a score is judged by its level)
    "systemone-ticket.json": {"refund": True, "team": "Billing", "anger": "Frustrated"},
}
MAX_PERMUTED = 5  # options beyond which every order (n!) is too many to score


def questions_of(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each question's id: its options in order (decision: option ids; noul: true/false; choice: criteria names;
    score: level texts)."""
    if "decision" in body:
        d = body["decision"]
        return {d["id"]: {"kind": "choice", "options": [o["id"] for o in d["options"]]}}
    out = {}
    for qid, q in body["questions"].items():
        if q["type"] == "noul":
            out[qid] = {"kind": "noul", "options": [True, False]}
        elif q["type"] == "choice":
            out[qid] = {"kind": "choice", "options": list(q["criteria"])}
        else:
            out[qid] = {"kind": "score", "options": list(q["criteria"])}
    return out


def with_settings(body: dict[str, Any], k: int, debias: str) -> dict[str, Any]:
    body = copy.deepcopy(body)
    if "decision" in body:
        body["decision"].update(permutations=k, debias=debias)
    else:
        body.update(x_permutations=k, x_debias=debias)
    return body


def reordered(body: dict[str, Any], qid: str, order: tuple[int, ...]) -> dict[str, Any]:
    body = copy.deepcopy(body)
    if "decision" in body:
        options = body["decision"]["options"]
        body["decision"]["options"] = [options[i] for i in order]
    else:
        criteria = body["questions"][qid]["criteria"]
        if isinstance(criteria, dict):
            names = list(criteria)
            body["questions"][qid]["criteria"] = {names[i]: criteria[names[i]] for i in order}
        else:
            body["questions"][qid]["criteria"] = [criteria[i] for i in order]
    return body


def answers(response: dict[str, Any], questions: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | Any]]:
    """Each question's distribution over its options (in the order the question lists them)."""
    if "result" in response:
        r = response["result"]
        return {r["id"]: dict(zip(r["option_ids"], r["probabilities"]))}
    out = {}
    for qid, q in questions.items():
        a = response["answers"][qid]
        if q["kind"] == "noul":
            out[qid] = {True: a["noul"], False: 1 - a["noul"]}
        elif q["kind"] == "choice":
            out[qid] = dict(a["probabilities"])
        else:  # a score's distribution is over its levels, named by position; the legend gives their texts
            out[qid] = {a["legend"][name]: p for name, p in a["probabilities"].items()}
    return out


def verdict(distribution: dict[Any, float], expected: Any) -> dict[str, Any]:
    ranked = sorted(distribution.items(), key=lambda kv: -kv[1])
    (top, p), runner = ranked[0], ranked[1][1] if len(ranked) > 1 else 0.0
    return {"answer": top, "right": top == expected, "p": p, "margin": p - runner,
            "p_expected": distribution.get(expected)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.examples", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", help="GGUF folder (default: the embedded SmolLM2 model)")
    parser.add_argument("--orders", type=int, nargs="+", default=[1, 2, 3, 4, 16], help="K values of order averaging")
    parser.add_argument("--debias", nargs="+", default=["empty", "off"], help="debias modes (the served ones)")
    parser.add_argument("--repeats", type=int, default=3, help="timed requests per configuration (median)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, help="write examples.json here")
    args = parser.parse_args(argv)

    from decision_adapter.decisions.model_files import embedded_model_dir
    from decision_adapter.server.app import create_app
    from decision_adapter.settings import Settings

    settings = replace(Settings.from_env({}), model_dir=args.model_dir or str(embedded_model_dir()),
                       threads=args.threads)
    rows, orders_rows = [], []
    with Provenance("benchmarks.examples", argv) as provenance:
        app = create_app(settings)
        state = app.extensions["decision_adapter"]
        try:
            state.readiness.wait(600)
            model = state.readiness.model
            if model is None:
                raise SystemExit(f"the model did not load: {state.readiness.reason}")
            provenance.ran_with(settings)
            provenance.kernels_of(model.model_info)
            client = app.test_client()
            route = {True: "/invocations", False: "/v1/systemone"}

            def ask(body: dict[str, Any]) -> tuple[dict[str, Any], float]:
                model.engine.cache.clear()
                started = time.perf_counter()
                response = client.post(route["decision" in body], json=body)
                seconds = time.perf_counter() - started
                if response.status_code != 200:
                    raise SystemExit(f"{response.status_code}: {response.get_data(as_text=True)}")
                return response.get_json(), seconds

            for name, expected in EXPECTED.items():
                body = json.loads((EXAMPLES / name).read_text())
                questions = questions_of(body)
                for debias in args.debias:
                    for k in args.orders:
                        asked = with_settings(body, k, debias)
                        seconds = []
                        for _ in range(args.repeats):
                            response, s = ask(asked)
                            seconds.append(s)
                        for qid, distribution in answers(response, questions).items():
                            rows.append({"example": name, "question": qid, "debias": debias, "k": k,
                                         "expected": expected[qid], "seconds": statistics.median(seconds),
                                         **verdict(distribution, expected[qid])})
                    for qid, q in questions.items():
                        n = len(q["options"])
                        if q["kind"] != "choice" or n > MAX_PERMUTED:  # a score's levels keep their order
                            continue
                        right = []
                        for order in itertools.permutations(range(n)):
                            response, _ = ask(with_settings(reordered(body, qid, order), 1, debias))
                            right.append(verdict(answers(response, questions)[qid], expected[qid])["right"])
                        orders_rows.append({"example": name, "question": qid, "debias": debias,
                                            "orders": len(right), "right": sum(right)})
        finally:
            state.close()
    record = {"rows": rows, "orders": orders_rows, "command": provenance.command, "provenance": provenance.record()}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "examples.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(f"Reproduce: `{provenance.command}`\n")
    print("| example | question | expected | debias | K | answer | p | margin | p(expected) | s per request |")
    print("|---|---|---|---|---:|---|---:|---:|---:|---:|")
    for r in rows:
        mark = "" if r["right"] else " (wrong)"
        print(f"| {r['example']} | {r['question']} | {r['expected']} | {r['debias']} | {r['k']} | "
              f"{r['answer']}{mark} | {r['p']:.3f} | {r['margin']:.3f} | {r['p_expected']:.3f} | {r['seconds']:.2f} |")
    print("\nK = 1, the options in every order:\n\n| example | question | debias | orders answered right |\n"
          "|---|---|---|---:|")
    for r in orders_rows:
        print(f"| {r['example']} | {r['question']} | {r['debias']} | {r['right']} of {r['orders']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
