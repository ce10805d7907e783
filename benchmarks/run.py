"""One benchmark run: the decision endpoint on every task, with the baselines measured in the same run.

For each task, in turn and never concurrently (the machine is shared by everything measured):
1. the decision endpoint answers the System One request (accuracy, Brier, ECE, latency);
2. the generation baseline gets the same question as a chat completion, its reply parsed to an option;
3. the prefill floor: a raw llama_decode of the exact prompt tokens the adapter scores, in-process,
   with no HTTP and no readout: once from empty memory (the whole prompt, as a server without a
   prompt cache evaluates it), once forked from the resident prefix (only the tokens the adapter itself
   evaluates, so that the ratio to it is the adapter's own overhead).
Then the shared-state comparison (N questions over one long state as one request, against N requests) and the
repeated-state comparison (a first request, a new question over the same state, an identical repeat), the latter
for the adapter and for llama-server with its prompt cache, which keeps the previous prompt's prefix.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import platform
import statistics
import time
import urllib.parse
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from . import generation
from .clients import EndpointError, JsonEndpoint, endpoint
from .metrics import Outcome, accuracy, brier, ece, latency_summary
from .provenance import Provenance
from .tasks import Task

SHARED_STATE_REPEATS = 3
REPEATED_STATE_ROUNDS = 3
REPEATED_STATE_CHARS = 3200  # about 800 tokens: the state of the repeated-state comparison


@dataclass
class Options:
    tasks: list[Task]
    endpoint: str  # "auto", a URL of /v1/systemone or /invocations, or sagemaker:NAME
    generation: str  # "auto", "none", a chat-completions URL, or sagemaker:NAME
    model_dir: str | None  # the GGUF folder for auto servers and the prefill floor; None: no floor
    threads: int
    gpu_layers: int = 0
    shared_questions: int = 8
    repeated_state: bool = True
    out: Path = Path("benchmark-results")
    api_key: str | None = None
    region: str | None = None
    notes: dict[str, Any] = field(default_factory=dict)
    provenance: Provenance | None = None  # learns the settings, kernels and builds of the servers started here


def run(options: Options) -> dict[str, Any]:
    options.out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        ours = _decision_endpoint(options, stack)
        chat = _generation_endpoint(options, stack)
        floor = _floor_model(options)
        rows = []
        for task in tqdm(options.tasks, desc="tasks", unit="task", dynamic_ncols=True):
            rows.append(_one_task(task, ours, chat, floor))
        shared = _shared_state(options.tasks, ours, floor, options.shared_questions) \
            if options.shared_questions > 1 else None
        repeated = _repeated_state(options.tasks, ours, chat) if options.repeated_state else None
        if floor is not None:
            floor.close()
    return _summarise(options, rows, shared, repeated, ours, chat)


def _decision_endpoint(options: Options, stack: contextlib.ExitStack) -> JsonEndpoint:
    if options.endpoint != "auto":
        if options.provenance is not None:
            options.provenance.ran_elsewhere(options.endpoint)
            if options.endpoint.startswith(("http://", "https://")):  # an adapter's /ping names its kernels
                from .servers import ping

                parts = urllib.parse.urlsplit(options.endpoint)
                with contextlib.suppress(OSError, ValueError):  # requests' errors are OSErrors
                    options.provenance.kernels_of(ping(f"{parts.scheme}://{parts.netloc}"))
        return endpoint(options.endpoint, api_key=options.api_key, region=options.region)
    from .servers import adapter

    base = stack.enter_context(adapter(_model_dir(options), options.threads, options.gpu_layers,
                                       options.out / "adapter.log", provenance=options.provenance))
    return endpoint(f"{base}/v1/systemone")


def _generation_endpoint(options: Options, stack: contextlib.ExitStack) -> JsonEndpoint | None:
    if options.generation == "none":
        return None
    if options.generation != "auto":
        return endpoint(options.generation, region=options.region)
    from decision_adapter.decisions.model_files import find_gguf

    from .servers import llama_server

    gguf = str(find_gguf(_model_dir(options)))
    base = stack.enter_context(llama_server(gguf, options.threads, options.gpu_layers,
                                            options.out / "llama-server.log", provenance=options.provenance))
    return endpoint(f"{base}/v1/chat/completions")


def _model_dir(options: Options) -> str:
    if options.model_dir:
        return options.model_dir
    from decision_adapter.decisions.model_files import embedded_model_dir

    return str(embedded_model_dir())


def _floor_model(options: Options):
    if options.model_dir is None and options.endpoint != "auto":
        return None  # a remote endpoint: its model file is not here
    from decision_adapter.settings import Settings
    from decision_adapter.startup import load_decision_model

    # The adapter started here reads the same ADAPTER_* environment, so both evaluate in the same micro-batches.
    settings = replace(Settings.from_env(), model_dir=_model_dir(options), threads=options.threads,
                       gpu_layers=options.gpu_layers)
    return load_decision_model(settings)


@dataclass
class Row:
    task: Task
    ours: Outcome
    generation: Outcome | None
    parse_failure: bool
    reply: str | None
    floor_s: float | None
    prompt_tokens: int | None
    own_floor_s: float | None
    own_tokens: int | None
    cached_tokens: int | None = None
    ours_timing: dict[str, float] | None = None  # the adapter's own fields: tokens evaluated, prompt seconds
    generation_timing: dict[str, float] | None = None  # llama-server's `timings`: prompt and answer tokens, seconds


def own_timing(body: dict[str, Any]) -> dict[str, float] | None:
    """The adapter's own account of a System One answer: tokens evaluated and the seconds its prompt took. The
    tokens count a prior's (``x_evaluated_tokens``), so the seconds count its job's too (``x_timing.prior``)."""
    timing = body.get("x_timing") or {}
    if "x_evaluated_tokens" not in body or "prefill" not in timing:
        return None
    seconds = timing["prefill"] + timing.get("readout", 0.0) + timing.get("memory", 0.0) + timing.get("prior", 0.0)
    return {"prompt_tokens": body["x_evaluated_tokens"], "prompt_s": seconds, "answer_tokens": 0, "answer_s": 0.0}


def server_timing(response: dict[str, Any]) -> dict[str, float] | None:
    """llama-server's own account of a chat completion (its ``timings``): prompt and generated tokens, seconds."""
    timings = response.get("timings")
    if not timings or "prompt_n" not in timings:
        return None
    return {"prompt_tokens": timings["prompt_n"], "prompt_s": timings["prompt_ms"] / 1000,
            "answer_tokens": timings.get("predicted_n", 0), "answer_s": timings.get("predicted_ms", 0.0) / 1000}


def _one_task(task: Task, ours: JsonEndpoint, chat: JsonEndpoint | None, floor) -> Row:
    cached_tokens = ours_timing = generation_timing = None
    try:
        body, latency = ours.call(task.system_one())
        ours_outcome = Outcome(task.id, task.tier, task.labels, task.expected,
                               tuple(task.distribution(body["answers"]["q"])), latency)
        cached_tokens = body.get("x_cached_tokens")
        ours_timing = own_timing(body)
    except (EndpointError, KeyError, ValueError) as exc:
        ours_outcome = Outcome(task.id, task.tier, task.labels, task.expected, None, None, str(exc)[:300])

    gen_outcome, parse_failure, reply = None, False, None
    if chat is not None:
        try:
            response, latency = chat.call(generation.request(task))
            generation_timing = server_timing(response)
            reply = generation.reply_text(response)
            label = generation.parse(task, reply)
            parse_failure = label is None
            distribution = None if label is None else tuple(float(x == label) for x in task.labels)
            gen_outcome = Outcome(task.id, task.tier, task.labels, task.expected, distribution, latency,
                                  "unparsed reply" if label is None else None)
        except (EndpointError, KeyError, ValueError, IndexError) as exc:
            gen_outcome = Outcome(task.id, task.tier, task.labels, task.expected, None, None, str(exc)[:300])

    floor_s = prompt_tokens = own_floor_s = own_tokens = None
    if floor is not None:
        prepared = _prepare(floor, [task.question], task.state)
        if prepared is not None:
            tokens = prepared.tokens[0]
            floor_s, prompt_tokens = floor.engine.runner.prefill(tokens)
            own_floor_s, own_tokens = floor.engine.runner.prefill(tokens, reuse_resident=True)
    return Row(task, ours_outcome, gen_outcome, parse_failure, reply, floor_s, prompt_tokens, own_floor_s, own_tokens,
               cached_tokens, ours_timing, generation_timing)


def _prepare(model, questions: list[dict[str, Any]], state: Any):
    from decision_adapter.errors import InputError
    from decision_adapter.protocols import systemone
    from decision_adapter.protocols.fields import RequestContext

    body = {"model": "jev-latest", "state": state, "questions": {f"q{i}": q for i, q in enumerate(questions)}}
    try:
        _, _, items = systemone.parse(body, RequestContext.of(model, max_decisions=len(questions)))
        return model.prepare([item.question for item in items])
    except InputError:
        return None


def _shared_state(tasks: list[Task], ours: JsonEndpoint, floor, n: int) -> dict[str, Any] | None:
    """N questions over the longest state: one request against N requests, median of a few rounds. Every request
    gets a state no request sent before (``_unseen``), so that both sides decode it: this measures what sharing
    the state within one request saves, not the cross-request cache (the repeated-state comparison does)."""
    state_task = max(tasks, key=lambda t: len(t.state if isinstance(t.state, str) else str(t.state)))
    questions = []
    for task in tasks:
        if task.question not in questions:
            questions.append(task.question)
        if len(questions) == n:
            break
    if len(questions) < 2:
        return None
    together_s, apart_s = [], []
    for _ in range(SHARED_STATE_REPEATS):
        body = {"model": "jev-latest", "state": _unseen(state_task.state, next(_FRESH_CASES)),
                "questions": {f"q{i}": q for i, q in enumerate(questions)}}
        _, elapsed = ours.call(body)
        together_s.append(elapsed)
        total = 0.0
        for q in questions:
            _, elapsed = ours.call({"model": "jev-latest", "state": _unseen(state_task.state, next(_FRESH_CASES)),
                                    "questions": {"q": q}})
            total += elapsed
        apart_s.append(total)
    prepared = _prepare(floor, questions, state_task.state) if floor is not None else None
    return {
        "questions": len(questions), "state_task": state_task.id,
        "state_tokens": _state_tokens(prepared) if prepared else None,
        "one_request_s": statistics.median(together_s), "separate_requests_s": statistics.median(apart_s),
        "speedup": statistics.median(apart_s) / statistics.median(together_s),
        "rounds": SHARED_STATE_REPEATS,
    }


def _repeated_state(tasks: list[Task], ours: JsonEndpoint, chat: JsonEndpoint | None) -> dict[str, Any] | None:
    """First request, a new question over the same state, an identical repeat: medians over rounds, each round
    over a state neither server has seen (a different first line), for the adapter and the generation path."""
    def state_length(task: Task) -> int:
        return len(task.state if isinstance(task.state, str) else str(task.state))

    with_state = [t for t in tasks if isinstance(t.state, str)]
    if not with_state:
        return None
    base = min(with_state, key=lambda t: abs(state_length(t) - REPEATED_STATE_CHARS))
    other = next((t for t in tasks if t.question != base.question and t.kind == base.kind), None) \
        or next((t for t in tasks if t.question != base.question), None)
    if other is None:
        return None
    paths: dict[str, dict[str, list[float]]] = {"decision": {}, **({"generation": {}} if chat else {})}
    cached: list[int] = []
    for round_ in range(REPEATED_STATE_ROUNDS):
        state = _unseen(base.state, next(_FRESH_CASES))
        first, new = replace(base, state=state), replace(other, state=state)
        for name, (task, kind) in (("first", (first, "first")), ("new_question", (new, "new")),
                                   ("identical_repeat", (new, "repeat"))):
            body, elapsed = ours.call(task.system_one())
            paths["decision"].setdefault(name, []).append(elapsed)
            if kind == "new":
                cached.append(int(body.get("x_cached_tokens") or 0))
            if chat is not None:
                _, elapsed = chat.call(generation.request(task))
                paths["generation"].setdefault(name, []).append(elapsed)
    out: dict[str, Any] = {"state_task": base.id, "question_task": other.id, "rounds": REPEATED_STATE_ROUNDS,
                           "decision_cached_tokens_p50": statistics.median(cached)}
    for path, times in paths.items():
        medians = {name: statistics.median(values) for name, values in times.items()}
        out[path] = {**{f"{name}_s": value for name, value in medians.items()},
                     "new_question_ratio": medians["new_question"] / medians["first"],
                     "identical_repeat_ratio": medians["identical_repeat"] / medians["first"]}
    return out


# One numbering for every unseen state of a run: the shared-state and repeated-state sections may pick the same
# task, and a case number used twice would hand the second section the first one's cached state.
_FRESH_CASES = itertools.count(1)


def _unseen(state: Any, case: int) -> Any:
    """The state with a first line of its own, so that no cache holds its prefix."""
    if isinstance(state, str):
        return f"Case {case}.\n{state}"
    if isinstance(state, dict):
        return {"case": case, **state}
    return [f"Case {case}.", *state]


def _state_tokens(prepared) -> int:
    from decision_adapter.engine.readout import common_prefix

    return common_prefix(prepared.tokens)


def _summarise(options: Options, rows: list[Row], shared, repeated, ours: JsonEndpoint, chat) -> dict[str, Any]:
    def block(outcomes: list[Outcome]) -> dict[str, Any]:
        answered = [o for o in outcomes if o.distribution is not None]
        return {"n": len(outcomes), "answered": len(answered), "failures": len(outcomes) - len(answered),
                "accuracy": accuracy(outcomes), "brier": brier(outcomes), "ece_10": ece(outcomes)}

    tiers = sorted({r.task.tier for r in rows}, key=lambda t: ("easy", "original", "hard").index(t)
                   if t in ("easy", "original", "hard") else 99)
    ours_outcomes = [r.ours for r in rows]
    ours_latency = [o.latency_s for o in ours_outcomes if o.latency_s is not None]
    result: dict[str, Any] = {
        "config": {"endpoint": ours.name, "generation": chat.name if chat else None, "tasks": len(rows),
                   "threads": options.threads, "gpu_layers": options.gpu_layers, "machine": _machine(), **options.notes},
        "decision": {"overall": block(ours_outcomes),
                     "tiers": {t: block([r.ours for r in rows if r.task.tier == t]) for t in tiers},
                     "latency": latency_summary(ours_latency),
                     "decisions_per_s": len(ours_latency) / sum(ours_latency) if ours_latency else math.nan},
    }
    if chat is not None:
        gen = [r.generation for r in rows]
        gen_latency = [o.latency_s for o in gen if o.latency_s is not None]
        result["generation"] = {
            "overall": {**block(gen), "parse_failures": sum(r.parse_failure for r in rows)},
            "tiers": {t: {**block([r.generation for r in rows if r.task.tier == t]),
                          "parse_failures": sum(r.parse_failure for r in rows if r.task.tier == t)} for t in tiers},
            "latency": latency_summary(gen_latency),
            "decisions_per_s": len(gen_latency) / sum(gen_latency) if gen_latency else math.nan,
            "max_tokens": generation.MAX_TOKENS,
        }
        paired = [r.ours.latency_s / r.generation.latency_s for r in rows
                  if r.ours.latency_s and r.generation and r.generation.latency_s]
        result["decision_over_generation_p50"] = statistics.median(paired) if paired else None
    # The floor is what a miss evaluates; a task whose state an earlier task already brought into the cache
    # evaluates less, and is left out of the ratio.
    measured = [r for r in rows if r.floor_s and r.own_floor_s and r.ours.latency_s and not r.cached_tokens]
    if measured:
        result["prefill_floor"] = {
            "latency": latency_summary([r.floor_s for r in measured]),
            "ratio_p50": statistics.median(r.ours.latency_s / r.floor_s for r in measured),
            "prompt_tokens_p50": statistics.median(r.prompt_tokens for r in measured),
            "tasks": len(measured),
            "after_resident": {
                "latency": latency_summary([r.own_floor_s for r in measured]),
                "ratio_p50": statistics.median(r.ours.latency_s / r.own_floor_s for r in measured),
                "tokens_p50": statistics.median(r.own_tokens for r in measured),
            },
        }
    servers = _servers_own_timing(rows)
    if servers:
        result["servers_own_timing"] = servers
    if shared:
        result["shared_state"] = shared
    if repeated:
        result["repeated_state"] = repeated
    result["rows"] = [{
        "id": r.task.id, "tier": r.task.tier, "type": r.task.kind, "expected": r.task.expected,
        "predicted": r.ours.predicted, "distribution": r.ours.distribution, "latency_s": r.ours.latency_s,
        "error": r.ours.error, "prompt_tokens": r.prompt_tokens, "floor_s": r.floor_s,
        "own_tokens": r.own_tokens, "own_floor_s": r.own_floor_s, "cached_tokens": r.cached_tokens,
        "ours_timing": r.ours_timing, "generation_timing": r.generation_timing,
        "generation": None if r.generation is None else {
            "predicted": r.generation.predicted, "reply": r.reply, "latency_s": r.generation.latency_s,
            "error": r.generation.error},
    } for r in rows]
    result["_outcomes"] = {"ours": ours_outcomes, "generation": [r.generation for r in rows] if chat else None,
                           "floor": [r.floor_s for r in rows], "own_floor": [r.own_floor_s for r in rows]}
    return result


def _servers_own_timing(rows: list[Row]) -> dict[str, Any] | None:
    """Each server's own timing fields over the tasks both answered with nothing cached: tokens evaluated for the
    prompt, prompt seconds, prompt tokens per second (the medians, and the median of per-task rates), and the
    answer tokens generation spent; the adapter evaluates no answer token."""
    both = [r for r in rows if r.ours_timing and r.generation_timing and not r.cached_tokens]
    if not both:
        return None

    def side(timings: list[dict[str, float]]) -> dict[str, Any]:
        return {"prompt_tokens_p50": statistics.median(t["prompt_tokens"] for t in timings),
                "prompt_s_p50": statistics.median(t["prompt_s"] for t in timings),
                "prompt_tokens_per_s_p50": statistics.median(t["prompt_tokens"] / t["prompt_s"]
                                                             for t in timings if t["prompt_s"] > 0),
                "answer_tokens": [min(t["answer_tokens"] for t in timings), max(t["answer_tokens"] for t in timings)],
                "answer_s_p50": statistics.median(t["answer_s"] for t in timings)}

    ours, theirs = side([r.ours_timing for r in both]), side([r.generation_timing for r in both])
    return {"tasks": len(both), "decision": ours, "generation": theirs,
            "prompt_tokens_per_s_ratio": ours["prompt_tokens_per_s_p50"] / theirs["prompt_tokens_per_s_p50"]}


def _machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    import os

    return {"cpu": model, "cpus": len(os.sched_getaffinity(0)), "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d", time.gmtime())}


def as_json(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if not k.startswith("_")}

