"""`python -m benchmarks.agent_loop`: the event log, the steps' sizes, the floor and the summary; and one short loop
on the embedded model, on both adapters and llama-server (built as the harness tests build it)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import agent_loop, servers
from benchmarks.agent_loop import Step, events, floor, line, markdown, rows_of, state_of, step_lengths, summary

REPO = Path(__file__).resolve().parents[2]


# ---- the event log ----------------------------------------------------------------------------------------------


def test_the_log_is_the_same_for_a_seed_and_another_for_another_seed():
    first = list(itertools.islice(events(7), 300))
    assert first == list(itertools.islice(events(7), 300))
    assert first != list(itertools.islice(events(8), 300))
    assert first[:5] == list(itertools.islice(events(7), 5))  # a prefix does not depend on how far one reads


def test_the_log_reads_like_an_ops_log_one_event_a_line_in_time_order():
    log = list(itertools.islice(events(), 400))
    lines = [line(e) for e in log]
    assert all("\n" not in text for text in lines)
    assert [e["time"] for e in log] == sorted(e["time"] for e in log)
    assert {e["kind"] for e in log} == {"tool_call", "tool_result", "error", "metric", "deploy", "thought", "user",
                                        "alert"}
    assert len(set(lines)) == len(lines)  # varied: no line repeats
    assert {e["level"] for e in log} >= {"INFO", "ERROR", "DEBUG"}


def test_a_later_steps_state_starts_with_the_earlier_one():
    log = list(itertools.islice(events(), 30))
    short, long = state_of(log[:20], "text"), state_of(log[:25], "text")
    assert long.startswith(short + "\n") and long.count("\n") == 24
    assert state_of(log[:25], "json")[:20] == state_of(log[:20], "json") == log[:20]


def test_step_one_reaches_the_log_tokens_and_each_step_grows_by_the_share_in_whole_events():
    assert step_lengths(itertools.repeat(10), 100, 0.2, 4) == [10, 12, 14, 16]  # 100, 120, 140, 160 tokens
    assert step_lengths(itertools.cycle([7, 13]), 100, 0.1, 3) == [10, 12, 13]  # 100, 120 (110 wanted), 127
    # A growth smaller than an event still appends one, and the counts are read lazily (an endless log).
    assert step_lengths(itertools.repeat(10), 100, 0.01, 3) == [10, 11, 12]
    assert step_lengths(itertools.repeat(10), 100, 0.0, 1) == [10]
    with pytest.raises(ValueError):
        step_lengths(itertools.repeat(10), 100, 0.1, 0)


def test_a_step_asks_one_decision_in_the_decisions_shape():
    body = agent_loop.decision_body("a log", 3)
    [decision] = body["decisions"]
    assert decision["id"] == "step-3" and decision["state"] == "a log"
    assert 4 <= len(decision["options"]) <= 6


# ---- the floor --------------------------------------------------------------------------------------------------


def test_the_floor_is_the_state_from_the_last_shared_boundary_and_the_question():
    previous = list(range(1000))
    grown = previous[:998] + [-1, -2] + list(range(5000, 5100))  # the last two tokens merge with the new text
    f = floor(previous, grown, question_tokens=40, readout_tokens=0, batch_tokens=512)
    assert f == {"shared": 998, "reusable": 512, "new": 102, "again": 486, "question": 40, "readout": 0,
                 "tokens": 1100 - 512 + 40}
    # Micro-batches of 64: 15 of them within the 998 shared tokens.
    assert floor(previous, grown, 40, 3, 64)["tokens"] == 1100 - 960 + 40 + 3
    # Nothing before the first step, or nothing shared: the whole state.
    assert floor(None, grown, 40, 0, 512)["tokens"] == 1140
    assert floor([7, 8], grown, 40, 0, 512)["reusable"] == 0
    # Less than a micro-batch shared: it is all decoded again.
    assert floor(previous[:300], previous[:300] + [1], 40, 0, 512) == {
        "shared": 300, "reusable": 0, "new": 1, "again": 300, "question": 40, "readout": 0, "tokens": 341}
    # The same state again is a state-cache hit: only the question.
    assert floor(previous, previous, 40, 2, 512)["tokens"] == 42


# ---- the summary ------------------------------------------------------------------------------------------------


def _step(n: int, state: int) -> Step:
    return Step(n, n * 10, {}, tuple(range(5 + state + 20)), 5, tuple(range(state)), 20, 0, f"sha{n}")


def _adapter(decoded: int, seconds: float, p=(0.25, 0.75)) -> dict:
    return {"decoded_tokens": decoded, "seconds": seconds, "wall_s": seconds + 0.01, "probabilities": list(p),
            "prompt_sha256": None, "cached_tokens": 0}


def _runs(sha: bool = True) -> tuple[list[Step], dict]:
    steps = [_step(1, 1000), _step(2, 1100), _step(3, 1200)]
    warm = [_adapter(1020, 2.0), _adapter(608, 0.5), _adapter(196, 0.2)]
    fresh = [_adapter(1020, 2.0), _adapter(1120, 2.2), _adapter(1220, 2.5, (0.5, 0.5))]
    for row, step in zip(warm + fresh, steps + steps):
        row["prompt_sha256"] = step.prompt_sha256 if sha else "other"
    server = [{"decoded_tokens": n, "seconds": s, "wall_s": s + 0.02} for n, s in ((1025, 1.5), (120, 0.3),
                                                                                   (120, 0.3))]
    return steps, {"warm": warm, "fresh": fresh, "llama_server": server}


def test_rows_carry_the_floor_the_fractions_the_ratios_and_equality():
    steps, runs = _runs()
    rows = rows_of(steps, runs, batch_tokens=512)
    assert [r["input_tokens"] for r in rows] == [1020, 1120, 1220]
    assert [r["floor"]["tokens"] for r in rows] == [1020, 1100 - 512 + 20, 1200 - 1024 + 20]
    assert rows[1]["warm_fraction"] == 608 / 1120 and rows[1]["warm_over_fresh"] == 0.5 / 2.2
    assert rows[1]["llama_server_over_fresh"] == 0.3 / 2.2
    assert [r["equal"] for r in rows] == [True, True, False] and all(r["same_prompt"] for r in rows)
    assert not any(r["same_prompt"] for r in rows_of(*_runs(sha=False), batch_tokens=512))


def test_the_summary_counts_steps_two_onwards_against_the_issues_targets():
    steps, runs = _runs()
    total = summary(rows_of(steps, runs, batch_tokens=512))
    assert total["steps"] == 2 and total["input_tokens"] == 1120 + 1220
    assert total["warm_tokens"] == 608 + 196 and total["warm_fraction"] == 804 / 2340
    assert total["max_warm_over_fresh"] == 0.5 / 2.2 and total["warm_over_fresh"] == 0.7 / 4.7
    assert total["llama_server_tokens"] == 240 and total["all_equal"] is False
    assert total["meets_targets"] is False  # unequal, and 0.34 of the input decoded
    runs["fresh"][2]["probabilities"] = runs["warm"][2]["probabilities"]
    runs["warm"][1]["decoded_tokens"] = runs["warm"][2]["decoded_tokens"] = 100
    total = summary(rows_of(steps, runs, batch_tokens=512))
    assert total["all_equal"] and total["warm_fraction"] == 200 / 2340 and total["meets_targets"] is True
    assert summary(rows_of(steps[:1], {k: v[:1] for k, v in runs.items()}, 512)) == {"steps": 0, "all_equal": True}


def test_the_markdown_has_a_row_per_step_the_totals_and_the_command():
    steps, runs = _runs()
    rows = rows_of(steps, runs, batch_tokens=512)
    result = {"model": "m", "state": "text", "log_tokens": 1000, "growth": 0.1, "batch_tokens": 512, "threads": 2,
              "command": "python -m benchmarks.agent_loop --steps 3", "rows": rows, "summary": summary(rows)}
    table = markdown(result)
    assert "Reproduce: `python -m benchmarks.agent_loop --steps 3`" in table
    assert "| 2 | 1,100 | 1,120 | 608 (100 new + 488 again + 20) | 608 | 1,120 | 120 | 0.543 | 0.50 | 2.20 | 0.30 | " \
           "0.23 | 0.14 | yes |" in table
    assert "| 3 | " in table and "**no**" in table
    assert "Steps 2-3: decoded 804 of 2,340 input tokens warm" in table and "not met" in table
    assert "tokens and seconds (none here)" in table
    runs["fresh"][1]["prior_tokens"] = 30
    assert "(here 0 prior tokens warm and 30 fresh over the 3 steps)" in markdown(result)
    runs.pop("llama_server")
    rows = rows_of(steps, runs, batch_tokens=512)
    assert "| 1 | 1,000 | 1,020 | 1,020 (1,000 new + 0 again + 20) | 1,020 | 1,020 | - |" in markdown(
        {**result, "rows": rows, "summary": summary(rows)})


# ---- one short loop on the embedded model -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    """Three steps over a log of about 600 tokens growing 10% a step, in micro-batches of 64 tokens, so that a
    step shares several whole micro-batches with the one before."""
    out = tmp_path_factory.mktemp("agent-loop")
    done = subprocess.run([sys.executable, "-m", "benchmarks.agent_loop", "--steps", "3", "--log-tokens", "600",
                           "--growth", "0.1", "--batch-tokens", "64", "--threads", "2", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, json.loads((out / "agent_loop-text.json").read_text())


def test_a_short_loop_answers_every_step_on_both_adapters_and_llama_server_alike(loop):
    out, result = loop
    rows = result["rows"]
    assert len(rows) == 3 and result["batch_tokens"] == 64
    assert 550 <= rows[0]["state_tokens"] < rows[1]["state_tokens"] < rows[2]["state_tokens"] < 800
    for row in rows:
        assert row["equal"] and row["same_prompt"], row["step"]  # warm == fresh, bit for bit, at every step
        fresh, warm, server = row["fresh"], row["warm"], row["llama_server"]
        # The fresh adapter decodes all of it, as the steps were tokenized before the servers started.
        assert fresh["cached_tokens"] == 0 and fresh["shared_tokens"] == row["state_tokens"]
        assert fresh["question_tokens"] == [row["question_tokens"]]
        assert fresh["decoded_tokens"] == row["input_tokens"] and warm["resident_tokens"] == row["head_tokens"]
        # Every token the warm adapter did not decode came from its cache.
        assert warm["cached_tokens"] + warm["decoded_tokens"] == row["input_tokens"]
        # llama-server was sent the same tokens, and decoded at least the question.
        assert server["tokens_evaluated"] == row["prompt_tokens"]
        assert row["question_tokens"] <= server["prompt_n"] <= row["prompt_tokens"]
    assert rows[0]["floor"]["tokens"] == rows[0]["input_tokens"]
    assert all(r["floor"]["tokens"] < r["input_tokens"] for r in rows[1:])
    provenance = result["provenance"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert provenance["commit"] == head and provenance["command"].startswith("python -m benchmarks.agent_loop")
    assert provenance["builds"] == {"llama-server": servers.llama_server_flags()}
    assert provenance["settings"]["state_cache_mb"] == [1024, 0] and provenance["settings"]["batch_tokens"] == 64
    table = (out / "agent_loop-text.md").read_text()
    assert "| 3 | " in table and "Steps 2-3: decoded" in table


def test_a_warm_step_decodes_only_past_the_last_shared_micro_batch(loop):
    """The warm adapter restores the longest prefix of the previous step's state that ends on a micro-batch
    boundary of its own: it decodes exactly the floor, fewer tokens than the fresh decode."""
    _, result = loop
    for row in result["rows"][1:]:
        warm, fresh = row["warm"], row["fresh"]
        assert warm["decoded_tokens"] == row["floor"]["tokens"] < fresh["decoded_tokens"], row["step"]
        assert warm["cached_tokens"] == row["floor"]["reusable"] > 0
