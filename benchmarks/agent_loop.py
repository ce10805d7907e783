"""`python -m benchmarks.agent_loop`: an agent loop over a growing event log, step by step.

An agent (or a workflow reading an event log) asks the same question after every step, and each step's state is
the previous step's state plus a few new lines. This runs such a loop: a deterministic synthetic ops/agent event
log (seeded), step 1 holding its first ``--log-tokens`` tokens, each later step ``--growth`` times that many more
(whole events appended; ``--state json``: a JSON array of event objects, events appended), and at each step one
decision (which action next, five options) as a ``{"decisions": [...]}`` request on ``/invocations``, to:

(a) the warm adapter: one server for every step, default settings (its state cache on);
(b) a fresh decode of each step: a second adapter with the state cache off (ADAPTER_STATE_CACHE_MB=0), whose
    probabilities are what a fresh server answers; the warm ones are compared with ``==``;
(c) llama-server (built for this CPU, one slot, ``cache_prompt: true``), sent the adapter's own prompt tokens for
    the step (``n_predict`` 1: it is prompt processing that is compared), with its own ``timings``.

Only one llama.cpp process runs at a time: the prompts are tokenized in-process first (the model is then closed),
then (a), (b) and (c) each start, run every step and stop. Per step: tokens decoded (the adapter's ``timing``:
state tokens decoded plus the question's own tokens; llama-server's ``prompt_n``), seconds by each server's own
timing (the adapter's prefill + readout, llama-server's ``prompt_ms``) and by the wall clock, and the floor.

The floor, exact by layout: a state is decoded in ADAPTER_BATCH_TOKENS micro-batches counted from its first token
(after the resident head), and an exact prefix can only be restored up to one of those boundaries. So a step must
decode at least its state from the last full micro-batch within what it shares with the previous step's state
(the new tokens, and the part of a micro-batch before them that must be decoded again), plus the question's own
tokens and label paths. A state equal to the previous one is a state-cache hit (nothing of it decoded).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from .clients import HttpEndpoint
from .provenance import Provenance

SEED = 20260401
QUESTION = "Given the event log so far, which action should the agent take next?"
OPTIONS = (
    ("inspect_logs", "Read the failing service's recent error logs before changing anything."),
    ("rollback", "Roll back the most recent deployment of the affected service."),
    ("scale_out", "Add replicas to the overloaded service and watch the latency."),
    ("page_oncall", "Page the on-call engineer and wait for a human decision."),
    ("close_incident", "Report that every service is healthy and stop."),
)
# The targets (issue 32), checked in the summary for steps 2 onwards.
TARGET_FRACTION = 0.20
TARGET_RATIO = 0.3

# ---- the event log ------------------------------------------------------------------------------------------------

SERVICES = ("checkout-api", "payments-worker", "ledger-svc", "auth-gateway", "search-indexer", "notifications",
            "inventory-db", "cart-service", "billing-cron", "edge-proxy")
REGIONS = ("eu-west-1", "us-east-1", "ap-southeast-2", "eu-central-1")
USERS = ("maria.k", "dev-ops-bot", "j.okafor", "li.wei", "sam", "oncall-secondary")
ERRORS = ("timeout calling {dep} after {ms} ms", "connection reset by peer ({dep}:5432)",
          "HTTP 503 from {dep} (upstream overloaded)", "deadlock detected on table orders_{n}",
          "OOMKilled: container used {mb} MiB of {limit} MiB", "TLS handshake with {dep} failed: certificate expired",
          "rate limit exceeded for tenant t-{n} ({rps} req/s)", "null amount in refund {hexid}")
THOUGHTS = ("the error rate rose right after the deploy, so the new version is the main suspect",
            "latency is high but errors are flat; could be load rather than a bug",
            "need to see whether {svc} recovers on its own before escalating",
            "the alert fired in {region} only, other regions look fine",
            "this looks like the same pattern as incident INC-{n} last week",
            "pods are restarting; memory limits might be too tight after the config change")
USER_ASKS = ("why are refunds failing for some customers?", "is checkout slow right now in {region}?",
             "can you confirm the {svc} deploy went out cleanly?", "customers report duplicate emails, please check",
             "status update please, the support queue is growing", "did the rollback of {svc} finish?")
TOOLS = ("kubectl get pods -n {ns}", "kubectl logs deploy/{svc} --since=10m", "http GET /healthz on {svc}",
         "promql rate(http_requests_total{{service=\"{svc}\",code=~\"5..\"}}[5m])",
         "sql SELECT count(*) FROM refunds WHERE status = 'failed' AND created_at > now() - interval '1 hour'",
         "aws cloudwatch get-metric-statistics --metric-name CPUUtilization --dimensions {svc}")


def events(seed: int = SEED) -> Iterator[dict[str, Any]]:
    """An endless, deterministic log of agent and operations events (a seeded ``random.Random``): each an object
    with a timestamp, level, source, kind and text, varied enough (services, numbers, ids, commands, prose) that
    it tokenizes like a real log."""
    rng = random.Random(seed)
    t = 1_774_000_000 + rng.randrange(86_400)  # 2026-03-20, some time of day
    while True:
        t += rng.choice((1, 2, 3, 5, 8, 13, 21, 34, 55, 90))
        svc, dep = rng.sample(SERVICES, 2)
        fields = {"svc": svc, "dep": dep, "region": rng.choice(REGIONS), "ns": svc.split("-")[0],
                  "ms": rng.choice((500, 1000, 2500, 5000, 30000)), "n": rng.randrange(100, 10_000),
                  "mb": rng.randrange(400, 2048), "limit": rng.choice((512, 1024, 2048)),
                  "rps": rng.randrange(50, 5000), "hexid": f"{rng.getrandbits(40):010x}"}
        kind = rng.choices(("tool_call", "tool_result", "error", "metric", "deploy", "thought", "user", "alert"),
                           weights=(4, 4, 3, 3, 1, 2, 1, 2))[0]
        if kind == "tool_call":
            level, source, text = "INFO", "agent", "call " + rng.choice(TOOLS).format(**fields)
        elif kind == "tool_result":
            ready, total = rng.randrange(0, 13), 12
            text = rng.choice((f"{min(ready, total)}/{total} pods ready, {rng.randrange(0, 5)} restarts in the last "
                               f"hour ({svc}-{rng.getrandbits(24):06x})",
                               f"{rng.randrange(0, 900)} rows; slowest query {rng.randrange(5, 4000)} ms",
                               f"healthz {rng.choice(('200 OK', '503 Service Unavailable', '200 OK (degraded)'))} "
                               f"in {rng.randrange(2, 900)} ms",
                               f"5xx rate {rng.random() * 8:.2f}% over 5m, p95 {rng.randrange(80, 4000)} ms"))
            level, source = "INFO", "tool"
        elif kind == "error":
            level, source = "ERROR", svc
            text = rng.choice(ERRORS).format(**fields) + f" (req {rng.getrandbits(32):08x})"
        elif kind == "metric":
            level, source = "INFO", "monitor"
            text = (f"{svc} {fields['region']}: cpu {rng.randrange(5, 99)}%, mem {rng.randrange(20, 97)}%, "
                    f"p50 {rng.randrange(8, 300)} ms, p99 {rng.randrange(300, 9000)} ms, {rng.randrange(10, 3000)} rps")
        elif kind == "deploy":
            level, source = "INFO", "ci"
            text = (f"deploy {svc} v{rng.randrange(1, 5)}.{rng.randrange(0, 30)}.{rng.randrange(0, 12)} to "
                    f"{fields['region']} by {rng.choice(USERS)} (commit {rng.getrandbits(28):07x}, "
                    f"{rng.choice(('canary 10%', 'rolling', 'blue/green'))})")
        elif kind == "thought":
            level, source, text = "DEBUG", "agent", "thought: " + rng.choice(THOUGHTS).format(**fields)
        elif kind == "user":
            level, source, text = "INFO", f"user:{rng.choice(USERS)}", rng.choice(USER_ASKS).format(**fields)
        else:
            level, source = rng.choice(("WARN", "CRIT")), "alertmanager"
            text = (f"{rng.choice(('HighErrorRate', 'HighLatencyP95', 'PodCrashLooping', 'QueueBacklog'))} firing "
                    f"for {svc} in {fields['region']} (value {rng.random() * 10:.2f}, for {rng.randrange(1, 30)}m)")
        yield {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)), "level": level, "source": source,
               "kind": kind, "text": text}


def line(event: dict[str, Any]) -> str:
    """An event as one line of a text log."""
    return f"{event['time']} {event['level']:5s} [{event['source']}] {event['kind']}: {event['text']}"


def state_of(log: Sequence[dict[str, Any]], kind: str) -> Any:
    """The state a step sends: the events as text lines, or (``json``) the list of event objects itself."""
    return "\n".join(line(e) for e in log) if kind == "text" else list(log)


def piece(event: dict[str, Any], kind: str) -> str:
    """What an event adds to the rendered state (for sizing the steps): its line, or its JSON object and the
    separator."""
    return line(event) + "\n" if kind == "text" else json.dumps(event, ensure_ascii=False) + ", "


def step_lengths(event_tokens: Iterable[int], log_tokens: int, growth: float, steps: int) -> list[int]:
    """How many events each step's state holds: step 1 the fewest whose tokens reach ``log_tokens``, each later
    step the fewest that reach ``growth * log_tokens`` more than the step before's target (whole events, at least
    one new event a step). ``event_tokens`` is each event's token count in order (read lazily)."""
    if steps < 1 or log_tokens < 1 or growth < 0:
        raise ValueError("steps and log tokens must be positive and growth not negative")
    counts = iter(event_tokens)
    lengths: list[int] = []
    n = total = 0
    for step in range(steps):
        target = log_tokens + step * growth * log_tokens
        while total < target or (lengths and n == lengths[-1]):
            total += next(counts)
            n += 1
        lengths.append(n)
    return lengths


def decision_body(state: Any, step: int) -> dict[str, Any]:
    """A step's request: one decision over the state, in the decisions shape (its timing names the resident,
    decoded and question tokens)."""
    return {"decisions": [{"id": f"step-{step}", "state": state, "question": QUESTION,
                           "options": [{"id": i, "description": d} for i, d in OPTIONS]}]}


# ---- the floor --------------------------------------------------------------------------------------------------


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def floor(previous_state: Sequence[int] | None, state: Sequence[int], question_tokens: int, readout_tokens: int,
          batch_tokens: int) -> dict[str, int]:
    """The fewest tokens a step must decode, exact by layout: the state from the last micro-batch boundary
    (``batch_tokens`` apart, from the state's first token after the resident head) within the tokens it shares
    with the previous step's state, then the question's own tokens and label paths. A state the previous step
    had in full is a state-cache hit. ``new``: state tokens the previous state lacks; ``again``: shared tokens past
    the last boundary, decoded again."""
    common = common_prefix(previous_state, state) if previous_state is not None else 0
    reusable = len(state) if common == len(state) else common // batch_tokens * batch_tokens
    return {"shared": common, "reusable": reusable, "new": len(state) - common, "again": common - reusable,
            "question": question_tokens, "readout": readout_tokens,
            "tokens": len(state) - reusable + question_tokens + readout_tokens}


# ---- the prompts, tokenized in-process ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    step: int
    events: int
    body: dict[str, Any]
    tokens: tuple[int, ...]  # the whole prompt, as the adapter decodes it
    head: int  # the resident head's tokens
    state: tuple[int, ...]  # the state's tokens (with the question heading), after the head
    question_tokens: int  # the question's own tokens, the template's tail included
    readout_tokens: int  # label-path tokens past the answer position
    prompt_sha256: str


def prepare_steps(model, kind: str, log_tokens: int, growth: float, steps: int, seed: int = SEED) -> list[Step]:
    """Each step's request and its prompt tokens, as ``model`` (a DecisionModel with the servers' settings)
    prepares them; the steps sized by the events' tokens."""
    from decision_adapter.protocols import decision_schema
    from decision_adapter.protocols.fields import RequestContext

    log: list[dict[str, Any]] = []
    source = events(seed)
    tokenize = model.engine.vocabulary.tokenize

    def sized() -> Iterator[int]:
        for event in source:
            log.append(event)
            yield len(tokenize(piece(event, kind)))

    lengths = step_lengths(sized(), log_tokens, growth, steps)
    out = []
    for number, n in enumerate(lengths, 1):
        body = decision_body(state_of(log[:n], kind), number)
        decisions, _ = decision_schema.parse(body, RequestContext.of(model, max_decisions=1))
        prepared = model.prepare([d.question for d in decisions])
        head, end = prepared.state
        [tokens] = prepared.tokens
        out.append(Step(number, n, body, tokens, head, tokens[head:end], len(tokens) - end,
                        prepared.plan.readout_tokens, prepared.digests[0]))
    return out


# ---- the three runs -----------------------------------------------------------------------------------------------


def adapter_step(endpoint: HttpEndpoint, step: Step) -> dict[str, Any]:
    """One step on an adapter: its probabilities and its own account of the work (``timing``)."""
    body, wall = endpoint.call(step.body)
    [result], timing = body["results"], body["timing"]
    prior_tokens = timing.get("prior_tokens", 0)
    if "evaluated_tokens" in timing:  # the request's tokens decoded, the priors' included
        decoded = timing["evaluated_tokens"] - prior_tokens
    else:
        decoded = timing["shared_tokens"] + sum(timing["question_tokens"]) + \
            (step.readout_tokens if any(timing["question_tokens"]) else 0)
    return {"probabilities": result["probabilities"], "prompt_sha256": result["prompt_sha256"],
            "input_tokens": result["input_tokens"], "resident_tokens": timing["resident_tokens"],
            "shared_tokens": timing["shared_tokens"], "question_tokens": timing["question_tokens"],
            "cached_tokens": timing["cached_tokens"], "evaluated_tokens": timing.get("evaluated_tokens"),
            "decoded_tokens": decoded, "prior_tokens": prior_tokens, "prior_s": timing.get("prior", 0.0),
            "prefill_s": timing["prefill"], "readout_s": timing["readout"], "queue_s": timing["queue"],
            "total_s": timing["total"], "memory_s": timing.get("memory", 0.0),
            "seconds": timing["prefill"] + timing["readout"] + timing.get("memory", 0.0), "wall_s": wall}


def llama_server_step(endpoint: HttpEndpoint, step: Step) -> dict[str, Any]:
    """One step on llama-server: the adapter's prompt tokens, one token generated, its own ``timings``."""
    body, wall = endpoint.call({"prompt": list(step.tokens), "n_predict": 1, "temperature": 0.0,
                                "cache_prompt": True, "id_slot": 0})
    timings = body.get("timings") or {}
    return {"prompt_n": timings.get("prompt_n"), "prompt_ms": timings.get("prompt_ms"),
            "cache_n": timings.get("cache_n"), "predicted_ms": timings.get("predicted_ms"),
            "tokens_evaluated": body.get("tokens_evaluated"), "tokens_cached": body.get("tokens_cached"),
            "decoded_tokens": timings.get("prompt_n"),
            "seconds": timings["prompt_ms"] / 1000 if "prompt_ms" in timings else None, "wall_s": wall}


def run_steps(call: Callable[[Step], dict[str, Any]], steps: list[Step], label: str) -> list[dict[str, Any]]:
    rows = []
    for step in steps:
        rows.append(call(step))
        print(f"{label}: step {step.step}, {rows[-1]['decoded_tokens']} tokens decoded, "
              f"{rows[-1]['seconds']:.2f} s ({rows[-1]['wall_s']:.2f} s wall)", flush=True)
    return rows


def run(steps: list[Step], model_dir: str, threads: int, gpu_layers: int, out: Path, env: dict[str, str],
        llama_server: bool, provenance: Provenance | None) -> dict[str, list[dict[str, Any]]]:
    """(a), (b) and (c) one after the other, each server stopped before the next starts."""
    from . import servers
    from decision_adapter.decisions.model_files import find_gguf

    runs: dict[str, list[dict[str, Any]]] = {}
    for name, extra in (("warm", {}), ("fresh", {"ADAPTER_STATE_CACHE_MB": "0"})):
        with servers.adapter_process(model_dir, threads, gpu_layers, out / f"adapter-agent-loop-{name}.log",
                                     env={**env, **extra}, provenance=provenance) as (base, _):
            endpoint = HttpEndpoint(f"{base}/invocations", timeout_s=1800)
            runs[name] = run_steps(lambda s: adapter_step(endpoint, s), steps, f"adapter ({name})")
    if llama_server:
        ctx = max(8192, max(len(s.tokens) for s in steps) + 64)
        with servers.llama_server(str(find_gguf(model_dir)), threads, gpu_layers, out / "llama-server-agent-loop.log",
                                  ctx_tokens=ctx, parallel=1, provenance=provenance) as base:
            endpoint = HttpEndpoint(f"{base}/completion", timeout_s=1800)
            runs["llama_server"] = run_steps(lambda s: llama_server_step(endpoint, s), steps, "llama-server")
    return runs


# ---- the summary ------------------------------------------------------------------------------------------------


def rows_of(steps: list[Step], runs: dict[str, list[dict[str, Any]]], batch_tokens: int) -> list[dict[str, Any]]:
    """Every step's figures: its tokens, the floor, each run's raw figures, and the comparisons."""
    rows = []
    previous: Step | None = None
    for i, step in enumerate(steps):
        warm, fresh = runs["warm"][i], runs["fresh"][i]
        server = runs["llama_server"][i] if "llama_server" in runs else None
        input_tokens = len(step.tokens) - step.head  # what the request brings: the state and the question
        row = {"step": step.step, "events": step.events, "prompt_tokens": len(step.tokens), "head_tokens": step.head,
               "state_tokens": len(step.state), "question_tokens": step.question_tokens,
               "input_tokens": input_tokens, "prompt_sha256": step.prompt_sha256,
               "floor": floor(previous.state if previous else None, step.state, step.question_tokens,
                              step.readout_tokens, batch_tokens),
               "warm": warm, "fresh": fresh, "llama_server": server,
               "warm_fraction": warm["decoded_tokens"] / input_tokens,
               "fresh_fraction": fresh["decoded_tokens"] / input_tokens,
               "warm_over_fresh": warm["seconds"] / fresh["seconds"],
               "warm_over_fresh_wall": warm["wall_s"] / fresh["wall_s"],
               "equal": warm["probabilities"] == fresh["probabilities"],
               "same_prompt": warm["prompt_sha256"] == fresh["prompt_sha256"] == step.prompt_sha256}
        row["floor_fraction"] = row["floor"]["tokens"] / input_tokens
        if server is not None:
            row["llama_server_fraction"] = server["decoded_tokens"] / input_tokens
            row["llama_server_over_fresh"] = server["seconds"] / fresh["seconds"]
            row["warm_over_llama_server"] = warm["seconds"] / server["seconds"]
        rows.append(row)
        previous = step
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Steps 2 onwards (step 1 has nothing before it): tokens decoded over input tokens, seconds against the
    fresh decode (in total, and the worst step), probabilities equal at every step, and the issue's targets."""
    later = rows[1:]
    if not later:
        return {"steps": 0, "all_equal": all(r["equal"] for r in rows)}
    inputs = sum(r["input_tokens"] for r in later)
    out: dict[str, Any] = {
        "steps": len(later), "input_tokens": inputs,
        "warm_tokens": sum(r["warm"]["decoded_tokens"] for r in later),
        "fresh_tokens": sum(r["fresh"]["decoded_tokens"] for r in later),
        "floor_tokens": sum(r["floor"]["tokens"] for r in later),
        "warm_s": sum(r["warm"]["seconds"] for r in later), "fresh_s": sum(r["fresh"]["seconds"] for r in later),
        "warm_wall_s": sum(r["warm"]["wall_s"] for r in later),
        "fresh_wall_s": sum(r["fresh"]["wall_s"] for r in later),
        "max_warm_over_fresh": max(r["warm_over_fresh"] for r in later),
        "all_equal": all(r["equal"] for r in rows)}
    out["warm_fraction"] = out["warm_tokens"] / inputs
    out["floor_fraction"] = out["floor_tokens"] / inputs
    out["warm_over_fresh"] = out["warm_s"] / out["fresh_s"]
    if all(r["llama_server"] is not None for r in later):
        out["llama_server_tokens"] = sum(r["llama_server"]["decoded_tokens"] for r in later)
        out["llama_server_s"] = sum(r["llama_server"]["seconds"] for r in later)
        out["llama_server_wall_s"] = sum(r["llama_server"]["wall_s"] for r in later)
        out["llama_server_fraction"] = out["llama_server_tokens"] / inputs
        out["llama_server_over_fresh"] = out["llama_server_s"] / out["fresh_s"]
    out["meets_targets"] = (out["warm_fraction"] <= TARGET_FRACTION and out["max_warm_over_fresh"] <= TARGET_RATIO
                            and out["all_equal"])
    return out


def markdown(result: dict[str, Any]) -> str:
    rows, total = result["rows"], result["summary"]
    server = all(r["llama_server"] is not None for r in rows)
    priors = {name: sum(r[name].get("prior_tokens", 0) for r in rows) for name in ("warm", "fresh")}
    prior = (f"here {priors['warm']:,} prior tokens warm and {priors['fresh']:,} fresh over the {len(rows)} steps"
             if any(priors.values()) else "none here")
    lines = [
        f"Model `{result['model']}`, {len(rows)} steps over a {result['state']} event log of about "
        f"{result['log_tokens']} tokens growing {100 * result['growth']:.0f}% of that a step, one decision "
        f"({len(OPTIONS)} options) a step, micro-batches of {result['batch_tokens']} tokens, {result['threads']} "
        f"threads. Warm: one adapter for every step (state cache on); fresh: an adapter with the state cache off; "
        f"llama-server: one slot, `cache_prompt: true`, sent the adapter's prompt tokens. Input: the prompt's tokens "
        f"less the resident head (state and question). Decoded: the adapter's `timing` (state tokens decoded and "
        f"the question's own), llama-server's `prompt_n`. Seconds: each server's own timing (the adapter's prefill "
        f"+ readout, llama-server's `prompt_ms`). A debiased decision's prior (the default debias: a job of its "
        f"own, cached after step 1 on the warm server, decoded at every step on the fresh one) is not in these "
        f"tokens and seconds ({prior}); the wall time has it. Floor: what an exact prefix restore must still decode "
        f"(the new state tokens, the part of a micro-batch before them decoded again, the question). "
        f"Reproduce: `{result['command']}`", "",
        "| step | state tokens | input | floor | decoded warm | fresh | llama-server | warm / input | "
        "warm s | fresh s | llama-server s | warm / fresh | llama-server / fresh | warm == fresh |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|"]
    for r in rows:
        s = r["llama_server"]
        lines.append("| " + " | ".join([
            str(r["step"]), f"{r['state_tokens']:,}", f"{r['input_tokens']:,}",
            f"{r['floor']['tokens']:,} ({r['floor']['new']:,} new + {r['floor']['again']:,} again + "
            f"{r['floor']['question'] + r['floor']['readout']:,})",
            f"{r['warm']['decoded_tokens']:,}", f"{r['fresh']['decoded_tokens']:,}",
            f"{s['decoded_tokens']:,}" if s else "-", f"{r['warm_fraction']:.3f}",
            f"{r['warm']['seconds']:.2f}", f"{r['fresh']['seconds']:.2f}", f"{s['seconds']:.2f}" if s else "-",
            f"{r['warm_over_fresh']:.2f}", f"{r['llama_server_over_fresh']:.2f}" if s else "-",
            "yes" if r["equal"] else "**no**"]) + " |")
    if total["steps"]:
        lines += ["", f"Steps 2-{len(rows)}: decoded {total['warm_tokens']:,} of {total['input_tokens']:,} input "
                  f"tokens warm ({total['warm_fraction']:.3f}; floor {total['floor_tokens']:,}, "
                  f"{total['floor_fraction']:.3f}; fresh {total['fresh_tokens']:,}"
                  + (f"; llama-server {total['llama_server_tokens']:,}, {total['llama_server_fraction']:.3f}"
                     if server else "") + f"), in {total['warm_s']:.2f} s against {total['fresh_s']:.2f} s fresh "
                  f"({total['warm_over_fresh']:.2f}x; the slowest step {total['max_warm_over_fresh']:.2f}x)"
                  + (f" and {total['llama_server_s']:.2f} s on llama-server ({total['llama_server_over_fresh']:.2f}x)"
                     if server else "") + f"; wall {total['warm_wall_s']:.2f} s against {total['fresh_wall_s']:.2f} s"
                  + (f" and {total['llama_server_wall_s']:.2f} s" if server else "") + ". Probabilities `==` fresh "
                  f"at every step: {'yes' if total['all_equal'] else 'no'}. Issue 32's targets (at most "
                  f"{TARGET_FRACTION} of the input decoded, every step at most {TARGET_RATIO}x fresh, all `==`): "
                  f"{'met' if total['meets_targets'] else 'not met'}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.agent_loop", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", help="the model folder (default: the embedded model)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--growth", type=float, default=0.05, help="tokens appended a step, as a share of --log-tokens")
    parser.add_argument("--log-tokens", type=int, default=3900, help="the state's tokens at step 1")
    parser.add_argument("--state", choices=("text", "json"), default="text",
                        help="text: event lines; json: an array of event objects")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--batch-tokens", type=int,
                        help="ADAPTER_BATCH_TOKENS for both adapters (default: the environment's, else 512)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--gpu-layers", type=int, default=0)
    parser.add_argument("--no-llama-server", dest="llama_server", action="store_false")
    parser.add_argument("--out", type=Path, default=Path("benchmark-results"))
    args = parser.parse_args(argv)

    from decision_adapter.decisions.model_files import embedded_model_dir
    from decision_adapter.settings import Settings
    from decision_adapter.startup import load_decision_model

    model_dir = args.model_dir or str(embedded_model_dir())
    env = {"ADAPTER_BATCH_TOKENS": str(args.batch_tokens)} if args.batch_tokens else {}
    settings = replace(Settings.from_env({**os.environ, **env}), model_dir=model_dir, threads=args.threads,
                       gpu_layers=args.gpu_layers, state_cache_mb=0)
    args.out.mkdir(parents=True, exist_ok=True)
    with Provenance("benchmarks.agent_loop", argv) as provenance:
        model = load_decision_model(settings)  # tokenizes the steps as the servers will; closed before they start
        try:
            steps = prepare_steps(model, args.state, args.log_tokens, args.growth, args.steps, args.seed)
        finally:
            model.close()
        print(f"{len(steps)} steps, state tokens " + ", ".join(str(len(s.state)) for s in steps), flush=True)
        runs = run(steps, model_dir, args.threads, args.gpu_layers, args.out, env, args.llama_server, provenance)
    rows = rows_of(steps, runs, settings.batch_tokens)
    result = {"model": Path(model_dir).name, "state": args.state, "steps": args.steps, "growth": args.growth,
              "log_tokens": args.log_tokens, "seed": args.seed, "batch_tokens": settings.batch_tokens,
              "threads": args.threads, "gpu_layers": args.gpu_layers, "question": QUESTION,
              "options": [i for i, _ in OPTIONS], "summary": summary(rows), "rows": rows,
              "command": provenance.command, "provenance": provenance.record()}
    name = f"agent_loop-{args.state}"
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    table = markdown(result)
    (args.out / f"{name}.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
