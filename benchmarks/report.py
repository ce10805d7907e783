"""The run's outputs: a JSON result file, a Markdown table and PNG plots (reliability, latency)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from .metrics import Outcome, reliability  # noqa: E402
from .run import as_json  # noqa: E402


def write(result: dict[str, Any], out: Path, command: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    data = {**as_json(result), "command": command}
    paths = [out / "results.json", out / "results.md", out / "reliability.png", out / "latency.png"]
    paths[0].write_text(json.dumps(data, indent=1, ensure_ascii=False, default=_plain) + "\n")
    paths[1].write_text(markdown(data))
    _reliability_plot(result, paths[2])
    _latency_plot(result, paths[3])
    return paths


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else str(value)


def _pct(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def _num(x: float, digits: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _ms(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{1000 * x:.0f} ms"


def markdown(data: dict[str, Any]) -> str:
    config = data["config"]
    ours, gen = data["decision"], data.get("generation")
    lines = [f"Endpoint `{config['endpoint']}`; {config['tasks']} tasks; {config['machine']['cpus']} CPUs "
             f"({config['machine']['cpu'] or 'unknown CPU'}), {config['threads']} threads; {config['machine']['date']}.",
             f"Reproduce: `{data['command']}`", "",
             "| tier | n | decision accuracy | Brier | ECE (10 bins) | generation accuracy | generation parse failures |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for tier, block in [*ours["tiers"].items(), ("overall", ours["overall"])]:
        g = (gen["tiers"].get(tier) if tier != "overall" else gen["overall"]) if gen else None
        lines.append(f"| {tier} | {block['n']} | {_pct(block['accuracy'])} | {_num(block['brier'])} | "
                     f"{_num(block['ece_10'])} | {_pct(g['accuracy']) if g else '-'} | "
                     f"{g['parse_failures'] if g else '-'} |")
    lines += ["", "| path | p50 | p95 | max | decisions/s (one client) |", "|---|---:|---:|---:|---:|"]
    lat = ours["latency"]
    lines.append(f"| decision endpoint (logit readout) | {_ms(lat['p50_s'])} | {_ms(lat['p95_s'])} | "
                 f"{_ms(lat['max_s'])} | {_num(ours['decisions_per_s'], 2)} |")
    if gen:
        lat = gen["latency"]
        lines.append(f"| generation (chat completion, max_tokens {gen['max_tokens']}) | {_ms(lat['p50_s'])} | "
                     f"{_ms(lat['p95_s'])} | {_ms(lat['max_s'])} | {_num(gen['decisions_per_s'], 2)} |")
    floor = data.get("prefill_floor")
    if floor:
        lat = floor["latency"]
        own = floor["after_resident"]
        lines.append(f"| prefill floor, whole prompt (raw llama_decode, in-process) | {_ms(lat['p50_s'])} | "
                     f"{_ms(lat['p95_s'])} | {_ms(lat['max_s'])} | - |")
        lat = own["latency"]
        lines.append(f"| prefill floor, past the resident prefix | {_ms(lat['p50_s'])} | {_ms(lat['p95_s'])} | "
                     f"{_ms(lat['max_s'])} | - |")
        lines += ["", f"Decision latency / prefill floor (one llama_decode per micro-batch of the prompt, in-process), "
                      f"median over the {floor.get('tasks', lat['n'])} tasks answered without the state cache: "
                      f"**{floor['ratio_p50']:.2f}** against "
                      f"the whole prompt (median {floor['prompt_tokens_p50']:.0f} tokens), "
                      f"**{own['ratio_p50']:.2f}** against the tokens past the resident prefix (median "
                      f"{own['tokens_p50']:.0f}: what the adapter evaluates itself)."]
    if data.get("decision_over_generation_p50"):
        lines += ["", f"Decision / generation latency, per-task median: **{data['decision_over_generation_p50']:.2f}**."]
    servers = data.get("servers_own_timing")
    if servers:
        lines += ["", f"Each server's own timing fields (the adapter's `x_evaluated_tokens` and `x_timing`, llama-server's "
                      f"`timings`), medians over the {servers['tasks']} tasks both answered with nothing cached:", "",
                  "| | tokens evaluated | prompt seconds | prompt tokens/s | answer tokens |", "|---|---:|---:|---:|---:|"]
        for name, label in (("decision", "decision endpoint"), ("generation", "llama-server")):
            side = servers[name]
            low, high = side["answer_tokens"]
            answered = f"{low}" if low == high else f"{low}-{high}"
            if name == "generation":
                answered += f" ({_ms(side['answer_s_p50'])})"
            lines.append(f"| {label} | {side['prompt_tokens_p50']:.1f} | {side['prompt_s_p50']:.3f} | "
                         f"{side['prompt_tokens_per_s_p50']:.0f} | {answered} |")
        lines += ["", f"Prompt tokens/s, decision / llama-server: **{servers['prompt_tokens_per_s_ratio']:.2f}**."]
    shared = data.get("shared_state")
    if shared:
        lines += ["", f"Shared state: {shared['questions']} questions over one state of "
                      f"{shared['state_tokens'] or '?'} prompt-prefix tokens: one request "
                      f"{_ms(shared['one_request_s'])}, {shared['questions']} separate requests "
                      f"{_ms(shared['separate_requests_s'])}: **{shared['speedup']:.2f}x** (median of "
                      f"{shared['rounds']} rounds)."]
    repeated = data.get("repeated_state")
    if repeated:
        lines += ["", f"Repeated state (task `{repeated['state_task']}`, medians of {repeated['rounds']} rounds):", "",
                  "| path | first request | new question, same state | identical repeat |", "|---|---:|---:|---:|"]
        for path, label in (("decision", "decision endpoint (state cache)"),
                            ("generation", "generation (llama-server, prompt cache)")):
            if path in repeated:
                r = repeated[path]
                lines.append(f"| {label} | {_ms(r['first_s'])} | {_ms(r['new_question_s'])} "
                             f"({r['new_question_ratio']:.2f}x) | {_ms(r['identical_repeat_s'])} "
                             f"({r['identical_repeat_ratio']:.2f}x) |")
    return "\n".join(lines) + "\n"


def _reliability_plot(result: dict[str, Any], path: Path) -> None:
    outcomes = [o for o in result["_outcomes"]["ours"] if o.distribution is not None]
    reliability_plot(outcomes, path, f"Reliability, ECE {result['decision']['overall']['ece_10']:.3f}",
                     "decision endpoint")


def reliability_plot(outcomes: list[Outcome], path: Path, title: str, label: str) -> None:
    """Accuracy against the top probability in ten bins (marker size: tasks in the bin), with the diagonal of
    perfect calibration; for the harness's decision endpoint and for benchmarks.accuracy's calibration."""
    fig, ax = plt.subplots(figsize=(5, 5))
    xs, ys, ns = [], [], []
    for _, _, members in reliability(outcomes, 10):
        if members:
            xs.append(statistics.fmean(max(o.distribution) for o in members))
            ys.append(statistics.fmean(o.correct for o in members))
            ns.append(len(members))
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", label="perfect calibration")
    ax.scatter(xs, ys, s=[20 + 4 * n for n in ns], label=f"{label} (size: tasks)")
    ax.plot(xs, ys)
    ax.set(xlabel="top probability (bin mean)", ylabel="accuracy in bin", xlim=(0, 1), ylim=(0, 1), title=title)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _latency_plot(result: dict[str, Any], path: Path) -> None:
    series = {"decision endpoint": [o.latency_s for o in result["_outcomes"]["ours"] if o.latency_s]}
    if result["_outcomes"]["generation"]:
        series["generation"] = [o.latency_s for o in result["_outcomes"]["generation"] if o and o.latency_s]
    for name, key in (("prefill floor, whole prompt", "floor"), ("prefill floor, past resident prefix", "own_floor")):
        floors = [f for f in result["_outcomes"][key] if f]
        if floors:
            series[name] = floors
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.boxplot([[1000 * v for v in values] for values in series.values()], vert=False,
               tick_labels=list(series), showfliers=True)
    ax.set_xscale("log")
    ax.set_xlabel("latency per task (ms, log scale)")
    ax.set_title("Latency per decision")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
