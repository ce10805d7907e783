"""A state that grows between calls (an agent's transcript, an event log) is decoded once: a request restores the
longest prefix of its state that a cached state holds up to one of its own micro-batch boundaries, and decodes the
rest. Exact by layout: every answer is ``==`` a fresh server's, on every kind of memory (``memory_kind``): plain
attention (the embedded model), a sliding window (Gemma 3 270M) and a hybrid of recurrent layers and attention (a
Qwen3.5-architecture model with random weights). The planner, the prefix index and the outlook are tested without
llama.cpp; the answers on the real models, through both protocols."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading

import pytest

from decision_adapter.engine.cache import (PrefixCache, SavedState, _token_bytes, boundary_keys, entry_cost,
                                           prefix_cost, size_of)
from decision_adapter.engine.core import Engine
from decision_adapter.engine.memory_kind import MemoryKind
from decision_adapter.engine.outlook import foreseen_plan, leaves
from decision_adapter.engine.plan import (HEAD_BLOB, STATE_END, STATE_SEQ, Checkpoint, Cut, Decode, JobSpec, Limits,
                                          Restore, RestoreCheckpoint, Save, checkpoint_key, kept_boundaries, plan_job)
from decision_adapter.engine.readout import LabelTrie
from decision_adapter.decisions.model_files import find_gguf
from decision_adapter.server.app import create_app
from decision_adapter.startup import engine_options

from memory_kinds import KINDS, model_dir_of

HEAD = tuple(range(100, 110))  # 10 tokens of template head
SINGLE = LabelTrie.build([(1,), (2,), (3,)])
LIMITS = Limits(batch_tokens=64, cells=4096, sequences=8)


SWA = dataclasses.replace(LIMITS, memory=MemoryKind(window=512))
HYBRID = dataclasses.replace(LIMITS, memory=MemoryKind(recurrent=True), fork_by="snapshot")


def job(state: tuple[int, ...], question: int = 1, limits: Limits = LIMITS, **kw) -> JobSpec:
    """A job over ``state``, its boundaries and prefixes as the engine gives them (on a memory that needs
    checkpoints, the prefixes are the boundaries ``kept_boundaries`` keeps)."""
    prompt = HEAD + state + tuple(range(question * 1000, question * 1000 + 20))
    end = len(HEAD) + len(state)
    last = end - 1 if limits.fused else end
    boundaries = boundary_keys(prompt, len(HEAD), last, limits.batch_tokens)
    kept = kept_boundaries(len(boundaries)) if limits.memory.checkpoints else range(len(boundaries))
    return JobSpec((prompt,), (SINGLE,), len(HEAD), end, state_key=hashlib.sha256(bytes(str(state), "ascii")).digest(),
                   boundaries=boundaries, prefixes=tuple(d for n, (_, d) in enumerate(boundaries) if n in kept), **kw)


def state_decodes(plan) -> list[tuple[int, tuple[int, ...]]]:
    return [(s.chunks[0].pos, s.chunks[0].tokens) for s in plan.steps
            if isinstance(s, Decode) and s.chunks[0].seq == STATE_SEQ]


# ---- pure: boundaries, the plan, the prefix index, the outlook ------------------------------------------------

def test_boundary_digests_are_those_of_each_prefix_computed_on_its_own():
    tokens = tuple(range(5, 400))
    fast = boundary_keys(tokens, 10, 300, 64)
    slow = [(end, hashlib.sha256(b"prefix\0" + _token_bytes(tokens[:end])).digest()) for end in (74, 138, 202, 266)]
    assert list(fast) == slow
    assert boundary_keys(tokens, 10, 74, 64)[-1][0] == 74 and boundary_keys(tokens, 10, 73, 64) == ()
    other = tokens[:100] + (0,) + tokens[101:]
    assert boundary_keys(other, 10, 300, 64)[0] == fast[0] and boundary_keys(other, 10, 300, 64)[1] != fast[1]


def test_a_prefix_hit_restores_the_prefix_and_decodes_the_rest_as_a_miss_does_after_that_boundary():
    state = tuple(range(2000, 2300))  # 300 tokens: boundaries at 74, 138, 202, 266 (from the 10-token head)
    spec = job(state)
    miss = plan_job(spec, LIMITS)
    hit = plan_job(dataclasses.replace(spec, prefix=202), LIMITS)

    digest = dict(spec.boundaries)[202]
    assert hit.steps[:2] == (Restore(STATE_SEQ, digest, 202), Cut(STATE_SEQ, 202))
    assert HEAD_BLOB not in [s.blob for s in hit.steps if isinstance(s, Restore)]
    assert state_decodes(hit) == [d for d in state_decodes(miss) if d[0] >= 202] == [(202, state[192:256]),
                                                                                    (266, state[256:])]
    assert (hit.shared_tokens, hit.cached_tokens) == (108, 192)
    assert (miss.shared_tokens, miss.cached_tokens) == (300, 0)
    saves = [s for s in hit.steps if isinstance(s, Save)]
    assert saves == [Save(STATE_SEQ, spec.state_key, 310, tuple(d for _, d in spec.boundaries))]
    # everything after the state is laid out alike
    assert hit.steps[-5:] == miss.steps[-5:]


def test_a_state_that_ends_on_a_cached_boundary_restores_it_and_decodes_only_its_question():
    state = tuple(range(2000, 2128))  # 128 tokens: its end (138) is a boundary
    spec = job(state)
    plan = plan_job(dataclasses.replace(spec, prefix=138), LIMITS)
    assert state_decodes(plan) == [] and (plan.shared_tokens, plan.cached_tokens) == (0, 128)
    assert any(isinstance(s, Save) for s in plan.steps)


def test_the_fused_layout_keeps_its_last_micro_batch_out_of_the_boundaries():
    fused = dataclasses.replace(LIMITS, fused=True)
    spec = job(tuple(range(2000, 2128)), limits=fused)
    assert [end for end, _ in spec.boundaries] == [74]


def test_a_prefix_must_be_one_of_the_state_s_boundaries():
    spec = job(tuple(range(2000, 2300)))
    with pytest.raises(ValueError, match="boundaries"):
        plan_job(dataclasses.replace(spec, prefix=100), LIMITS)


def steps_of(plan, *kinds) -> list:
    return [s for s in plan.steps if isinstance(s, kinds)]


def memory_marks(plan) -> list[tuple[str, int]]:
    return [(type(s).__name__, s.tokens) for s in steps_of(plan, Checkpoint, RestoreCheckpoint, Save, Cut)]


def test_a_sliding_window_is_laid_out_as_a_restore_lays_it_at_every_boundary_and_at_the_state_s_end():
    state = tuple(range(2000, 2300))  # boundaries at 74, 138, 202, 266; the state ends at 310
    spec = job(state, limits=SWA)
    miss = plan_job(spec, SWA)
    laid = [m for end in (74, 138, 202, 266) for m in (("Checkpoint", end), ("RestoreCheckpoint", end))]
    assert memory_marks(miss) == laid + [("Save", 310), ("Checkpoint", 310), ("RestoreCheckpoint", 310)]
    assert steps_of(miss, Checkpoint)[-1].key == checkpoint_key(STATE_END)
    # a prefix: the saved state, its checkpoint at the boundary, the cut; then the miss's very steps after it
    digest = dict(spec.boundaries)[202]
    hit = plan_job(dataclasses.replace(spec, prefix=202), SWA)
    assert hit.steps[:3] == (Restore(STATE_SEQ, digest, 202), RestoreCheckpoint(STATE_SEQ, checkpoint_key(digest), 202),
                             Cut(STATE_SEQ, 202))
    after = miss.steps.index(RestoreCheckpoint(STATE_SEQ, checkpoint_key(digest), 202)) + 1
    assert hit.steps[3:] == miss.steps[after:]
    # the whole state restored is laid out already; uncached, it is laid out alike
    whole = plan_job(dataclasses.replace(spec, state_cached=True), SWA)
    assert whole.steps[0] == Restore(STATE_SEQ, spec.state_key, 310) and memory_marks(whole) == []
    cold = plan_job(dataclasses.replace(spec, state_key=None, prefixes=()), SWA)
    assert memory_marks(cold) == laid + [("Checkpoint", 310), ("RestoreCheckpoint", 310)]


def test_a_recurrent_state_keeps_checkpoints_where_its_saved_state_serves_and_a_prefix_restores_one_first():
    state = tuple(range(2000, 2600))  # 600 tokens: 9 boundaries, 74 .. 586
    spec = job(state, limits=HYBRID)
    miss = plan_job(spec, HYBRID)
    kept = [end for n, (end, _) in enumerate(spec.boundaries) if n in kept_boundaries(9)]
    assert kept == [74, 330, 458, 522, 586]
    assert memory_marks(miss) == [*(("Checkpoint", end) for end in kept), ("Save", 610)]
    digest = dict(spec.boundaries)[522]
    hit = plan_job(dataclasses.replace(spec, prefix=522), HYBRID)
    # the checkpoint goes back before the cut: a recurrent state refuses a cut to a position it is not at
    assert hit.steps[:3] == (Restore(STATE_SEQ, digest, 522), RestoreCheckpoint(STATE_SEQ, checkpoint_key(digest), 522),
                             Cut(STATE_SEQ, 522))
    assert memory_marks(hit)[2:] == [("Checkpoint", 586), ("Save", 610)]


def test_a_recurrent_state_decodes_every_stem_on_its_own_and_shares_it_by_a_checkpoint():
    from decision_adapter.engine.plan import PROMPT_SEQ, STEM

    state, stem = tuple(range(2000, 2100)), tuple(range(7000, 7030))
    prompts = tuple(HEAD + state + stem + tuple(range(k * 100, k * 100 + 20)) for k in (8, 9))
    end = len(HEAD) + len(state)
    split = end + 24  # the stem's 30 tokens, down to a multiple of 8 rows

    def own_decodes(n: int, limits: Limits):
        spec = JobSpec(prompts[:n], (SINGLE,) * n, len(HEAD), end, stems=(end + 30,) * n)
        plan = plan_job(spec, limits)
        return plan, [(c.pos, len(c.tokens)) for d in steps_of(plan, Decode) for c in d.chunks if c.seq == PROMPT_SEQ]

    plan, decodes = own_decodes(2, HYBRID)
    assert decodes == [(end, 24), (split, 26), (split, 26)]
    key = checkpoint_key(STEM, 0)
    assert Checkpoint(PROMPT_SEQ, key, split) in plan.steps
    restored = plan.steps.index(RestoreCheckpoint(PROMPT_SEQ, key, split))
    assert plan.steps[restored + 1] == Cut(PROMPT_SEQ, split)
    alone, decodes = own_decodes(1, HYBRID)  # split alone too: the layout of every prompt with a stem
    assert decodes == [(end, 24), (split, 26)] and not steps_of(alone, Checkpoint, RestoreCheckpoint)
    assert own_decodes(2, LIMITS)[1] == [(end, 50), (split, 26)]  # plain attention: the first decoded whole
    assert own_decodes(1, LIMITS)[1] == [(end, 50)]


def test_the_kept_boundaries_are_the_last_three_and_then_spaced_by_powers_of_two():
    assert kept_boundaries(0) == frozenset() and kept_boundaries(1) == {0} and kept_boundaries(3) == {0, 1, 2}
    assert kept_boundaries(9) == {8, 7, 6, 4, 0}
    assert kept_boundaries(64) == {63, 62, 61, 59, 55, 47, 31}
    assert all(len(kept_boundaries(n)) <= n.bit_length() + 2 for n in range(1, 5000))
    assert kept_boundaries(9, "every") == frozenset(range(9)) and kept_boundaries(9, "last") == {7, 8}
    with pytest.raises(ValueError, match="every, last or spaced"):
        kept_boundaries(3, "all")


def test_a_short_prefix_restores_the_smallest_saved_state_that_holds_it():
    cache = PrefixCache(1 << 20)
    short = boundary_keys(tuple(range(300)), 0, 300, 64)
    long = boundary_keys(tuple(range(300)) + (7,) * 900, 0, 1200, 64)
    cache.put(b"short", b"s" * 300, prefixes=[d for _, d in short])
    cache.put(b"long", b"l" * 1200, prefixes=[d for _, d in long])
    assert cache.acquire_prefix(short[1][1])[0] == b"short"  # both hold it, the newer is larger
    assert cache.acquire_prefix(long[-1][1])[0] == b"long"


def test_a_state_grown_from_a_saved_state_takes_its_place_where_it_took_up_one_of_its_last_prefixes():
    cache = PrefixCache(1 << 20)
    step1 = boundary_keys(tuple(range(500)), 0, 500, 64)  # 7 boundaries
    step2 = boundary_keys(tuple(range(700)), 0, 700, 64)
    branch = boundary_keys(tuple(range(200)) + (9,) * 500, 0, 700, 64)
    cache.put(b"step1", b"a" * 500, prefixes=[d for _, d in step1])
    cache.put(b"branch", b"c" * 700, prefixes=[d for _, d in branch], grown_from=(b"step1", step1[2][1]))
    assert b"step1" in cache and cache.stats.superseded == 0  # a branch from further back leaves it
    cache.put(b"step2", b"b" * 700, prefixes=[d for _, d in step2], grown_from=(b"step1", step1[-2][1]))
    assert b"step1" not in cache and cache.stats.superseded == 1 and cache.holder_count == 2


def test_checkpoints_count_in_the_budget_and_in_the_stats():
    import ctypes

    blob, first, second = (ctypes.c_uint8 * 4000)(), (ctypes.c_uint8 * 1500)(), (ctypes.c_uint8 * 1500)()
    saved = SavedState(blob, {b"d" * 32: first, b"e" * 32: second})
    assert size_of(saved) >= 4000 + 3000
    cache = PrefixCache(1 << 20)
    assert cache.put(b"k", saved, prefixes=[b"d" * 32, b"e" * 32])
    assert (cache.stats.checkpoints, cache.stats.checkpoint_bytes) == (2, 3000)
    assert cache.bytes >= size_of(saved)
    cache.discard(b"k")
    assert (cache.stats.checkpoints, cache.stats.checkpoint_bytes, cache.bytes) == (0, 0, 0)
    assert not PrefixCache(size_of(saved)).put(b"k", saved)  # its key and bookkeeping do not fit beside it


def test_the_prefix_index_serves_the_smallest_holder_and_of_equal_ones_the_most_recent():
    cache = PrefixCache(1 << 20)
    a = boundary_keys(tuple(range(1000)), 0, 1000, 64)
    b = boundary_keys(tuple(range(1000)) + (9,) * 10, 0, 1010, 64)  # the same boundaries, another state
    grown = boundary_keys(tuple(range(1000)) + (7,) * 200, 0, 1200, 64)
    assert grown[:len(a)] == a == b
    cache.put(b"a", b"x" * 1000, prefixes=[d for _, d in a])
    cache.put(b"b", b"z" * 1000, prefixes=[d for _, d in b])
    cache.put(b"grown", b"y" * 1000, prefixes=[d for _, d in grown])
    assert cache.prefixes == len(grown)
    assert cache.acquire_prefix(a[3][1]) == (b"b", b"z" * 1000)  # three hold it: of the two smallest, the newer
    cache.release(b"b")
    assert a[3][1] in cache and grown[-1][1] in cache and cache.stats.prefix_hits == 1
    assert sorted(cache.holders(a[:2])) == [b"a", b"b", b"grown"]
    cache.discard(b"b")
    cache.discard(b"a")
    assert cache.acquire_prefix(a[3][1]) == (b"grown", b"y" * 1000)
    cache.release(b"grown")
    cache.discard(b"grown")
    assert cache.prefixes == 0 and cache.bytes == 0 and cache.acquire_prefix(a[0][1]) is None


def test_prefixes_count_in_the_budget_and_a_state_with_many_cannot_grow_past_it():
    digests = [d for _, d in boundary_keys(tuple(range(20_000)), 0, 20_000, 16)]  # 1,250 boundaries
    value = b"v" * 100
    cost = entry_cost(b"k" * 32, len(value) + 33) + prefix_cost(digests)
    assert prefix_cost(digests) > 1250 * 100
    cache = PrefixCache(budget_bytes=2 * cost + cost // 2)
    for i in range(5):
        assert cache.put(bytes([i]) * 32, value, prefixes=digests)
        assert cache.bytes <= cache.budget_bytes
    assert len(cache) == 2 and cache.stats.evictions == 3
    assert cache.holders([(0, digests[0])]) == [bytes([3]) * 32, bytes([4]) * 32]
    assert not PrefixCache(budget_bytes=cost - 1).put(b"k" * 32, value, prefixes=digests)


def test_a_held_prefix_is_not_evicted_while_a_job_restores_it():
    [(_, digest)] = boundary_keys(tuple(range(64)), 0, 64, 64)
    plain = entry_cost(b"k" * 32, len(b"y" * 900) + 33)
    cache = PrefixCache(budget_bytes=plain + prefix_cost([digest]) + plain + plain // 2)
    cache.put(b"a" * 32, b"x" * 900, prefixes=[digest])
    assert cache.acquire_prefix(digest)[0] == b"a" * 32
    cache.put(b"b" * 32, b"y" * 900)
    cache.put(b"c" * 32, b"z" * 900)  # makes room: b goes, a is held
    assert digest in cache and b"a" * 32 in cache and b"b" * 32 not in cache and b"c" * 32 in cache
    cache.release(b"a" * 32)


def test_the_outlook_charges_what_a_prefix_leaves_to_decode_and_counts_on_the_jobs_ahead():
    base = tuple(range(2000, 2300))
    grown = base + tuple(range(5000, 5040))
    first, second = job(base), job(grown)
    uncached = plan_job(second, LIMITS)
    ahead = set(leaves(first))
    foreseen = foreseen_plan(second, uncached, LIMITS, lambda key: key in ahead)
    assert foreseen.cached_tokens == 256 and foreseen.shared_tokens == 340 - 256
    assert foreseen.tokens == uncached.tokens - 256
    changed = job(base[:100] + (9,) + base[101:] + tuple(range(5000, 5040)))  # changed at state token 100
    assert foreseen_plan(changed, plan_job(changed, LIMITS), LIMITS, lambda key: key in ahead).cached_tokens == 64


# ---- the real model: answers == a fresh server's ----------------------------------------------------------------

BATCH = 64  # small micro-batches: many boundaries in a short state, so each test stays cheap


@pytest.fixture(scope="module", params=KINDS)
def kind(request) -> str:
    """The memory kind the module's real-model tests run on: each test runs once per kind."""
    return request.param


@pytest.fixture(scope="module")
def prefix_settings(settings, kind):
    return dataclasses.replace(settings, model_dir=model_dir_of(kind), batch_tokens=BATCH)


@pytest.fixture(scope="module")
def warm_engine(prefix_settings):
    with Engine(str(find_gguf(prefix_settings.model_dir)), engine_options(prefix_settings)) as engine:
        yield engine


@pytest.fixture(scope="module")
def fresh_engine(prefix_settings):
    cold = dataclasses.replace(prefix_settings, state_cache_mb=0)
    with Engine(str(find_gguf(cold.model_dir)), engine_options(cold)) as engine:
        yield engine


@pytest.fixture(scope="module")
def served(prefix_settings, warm_engine, fresh_engine):
    """A warm server and a fresh one over the same settings, started once per memory kind (a start-up measures
    the engine and warms its priors: tens of seconds on 2 cores)."""
    from adapter_apps import close_app

    warm = create_app(prefix_settings, warm_engine)
    fresh = create_app(dataclasses.replace(prefix_settings, state_cache_mb=0), fresh_engine)
    try:
        yield warm, fresh
    finally:
        close_app(warm)
        close_app(fresh)


@pytest.fixture
def apps(served, warm_engine):
    """The warm server (its cache kept across the test's requests) and the fresh one (no cache: every state decoded
    from the head). The warm cache starts empty in each test, and a cut refused in one test is not in the next."""
    warm, fresh = served
    warm_engine.cache.clear()
    warm_engine.runner.cuts_refused = False
    yield warm.test_client(), fresh.test_client()


EVENTS = [f"{i:03d} {kind} service={svc} latency_ms={(i * 37) % 900} user=u{(i * 7) % 13}"
          for i, (kind, svc) in enumerate(zip(["deploy", "retry", "timeout", "alarm", "login", "refund"] * 40,
                                              ["api", "billing", "auth", "search", "queue"] * 48))]
OPTIONS = [{"id": "retry", "description": "Retry the failed call"}, {"id": "rollback", "description": "Roll back"},
           {"id": "page", "description": "Page the on-call engineer"}, {"id": "wait", "description": "Wait"}]


def decision(state, **extra) -> dict:
    return {"decisions": [{"id": "next", "state": state, "question": "What should the agent do next?",
                           "options": OPTIONS, **extra}]}


def answers(body: dict) -> list:
    return [(r["probabilities"], r["option_logits"]) for r in body["results"]]


def ask_both(warm, fresh, body: dict, path: str = "/invocations") -> tuple[dict, dict]:
    got, want = warm.post(path, json=body), fresh.post(path, json=body)
    assert got.status_code == want.status_code == 200, (got.get_data(as_text=True), want.get_data(as_text=True))
    return got.get_json(), want.get_json()


def reused_bound(previous_state_tokens: int) -> int:
    """The most a step can take from the previous step's state: whole micro-batches of it."""
    return previous_state_tokens // BATCH * BATCH


# The state's last tokens are the question heading, which the grown state has after its new lines: a step shares
# all but those (and a token the new text may merge with) of the previous state.
HEADING_SLACK = 16


def test_a_text_state_that_grows_reuses_its_prefix_and_answers_as_a_fresh_server(apps):
    warm, fresh = apps
    previous = None
    for step, lines in enumerate((40, 44, 48, 53)):
        got, want = ask_both(warm, fresh, decision("\n".join(EVENTS[:lines])))
        assert answers(got) == answers(want), f"step {step}"
        timing = got["timing"]
        assert want["timing"]["cached_tokens"] == 0
        if previous is None:
            assert timing["cached_tokens"] == 0
        else:
            assert reused_bound(previous - HEADING_SLACK) <= timing["cached_tokens"] <= reused_bound(previous)
            assert timing["shared_tokens"] == want["timing"]["shared_tokens"] - timing["cached_tokens"]
            new = want["timing"]["shared_tokens"] - previous
            assert timing["shared_tokens"] <= new + BATCH + HEADING_SLACK  # the new lines and one micro-batch again
        previous = want["timing"]["shared_tokens"]


@pytest.mark.parametrize("grow", ["list", "object"])
def test_a_json_state_that_grows_reuses_its_prefix(apps, grow):
    warm, fresh = apps
    events = [{"t": i, "event": line} for i, line in enumerate(EVENTS)]
    for step, n in enumerate((30, 33, 36)):
        state = events[:n] if grow == "list" else {"agent": "ops-bot", "log": "\n".join(EVENTS[:n])}
        got, want = ask_both(warm, fresh, decision(state))
        assert answers(got) == answers(want), f"step {step}"
        if step:
            assert got["timing"]["cached_tokens"] >= 4 * BATCH, got["timing"]


def test_system_one_structured_state_grows_and_answers_as_a_fresh_server(apps):
    warm, fresh = apps
    questions = {"next": {"type": "choice", "instructions": "What should the agent do next?",
                          "criteria": {o["id"]: o["description"] for o in OPTIONS}},
                 "urgent": {"type": "noul", "instructions": "Is this urgent?"}}
    for step, n in enumerate((30, 34, 38)):
        body = {"model": "jev-latest", "state": {"events": EVENTS[:n]}, "questions": questions}
        for path in ("/v1/systemone", "/invocations"):
            got, want = ask_both(warm, fresh, body, path)
            assert got["answers"] == want["answers"], (step, path)
            if step and path == "/v1/systemone":
                assert got["x_cached_tokens"] >= 4 * BATCH and got["x_evaluated_tokens"] < want["x_evaluated_tokens"]


@pytest.mark.parametrize("extra", [{"debias": "empty", "permutations": 3}, {"debias": "off", "permutations": 2}],
                         ids=["debias-K3", "off-K2"])
def test_priors_and_orderings_stay_exact_over_a_grown_state(apps, extra):
    warm, fresh = apps
    for n in (40, 45):
        got, want = ask_both(warm, fresh, decision("\n".join(EVENTS[:n]), **extra))
        assert answers(got) == answers(want)
        assert [r.get("debias") for r in got["results"]] == [r.get("debias") for r in want["results"]]


def test_labels_of_several_tokens_stay_exact_over_a_grown_state(apps):
    warm, fresh = apps
    many = [{"id": f"action-{i}"} for i in range(30)]
    for n in (40, 45):
        got, want = ask_both(warm, fresh, decision("\n".join(EVENTS[:n]), options=many))
        assert answers(got) == answers(want) and got["results"][0]["readout"] == want["results"][0]["readout"]
    assert got["timing"]["cached_tokens"] > 0


def test_a_state_changed_in_the_middle_or_shrunk_reuses_nothing_past_the_change(apps, kind):
    warm, fresh = apps
    base = "\n".join(EVENTS[:50])
    ask_both(warm, fresh, decision(base))
    changed_at = len("\n".join(EVENTS[:20]))
    changed = base[:changed_at] + "\nXXX operator note: disk replaced" + base[changed_at:]
    got, want = ask_both(warm, fresh, decision(changed))
    assert answers(got) == answers(want)
    text_before = fresh.post("/invocations", json=decision(base[:changed_at])).get_json()["timing"]["shared_tokens"]
    assert got["timing"]["cached_tokens"] <= text_before  # nothing past the change
    shrunk = "\n".join(EVENTS[:25])
    got, want = ask_both(warm, fresh, decision(shrunk))
    assert answers(got) == answers(want)
    whole = want["timing"]["shared_tokens"]
    # plain attention can be cut back to any boundary; elsewhere a saved state serves the boundaries it kept a
    # checkpoint at (kept_boundaries): some boundary at or before the shrunk state's end
    least = reused_bound(whole - HEADING_SLACK) if kind == "plain" else BATCH
    assert least <= got["timing"]["cached_tokens"] <= reused_bound(whole)


def test_concurrent_requests_over_one_grown_state_decode_its_new_part_once(apps):
    warm, fresh = apps
    warm.post("/invocations", json=decision("\n".join(EVENTS[:40])))
    grown = "\n".join(EVENTS[:46])
    questions = ["What should the agent do next?", "Which step is safest?", "What would an SRE do?",
                 "What is the cheapest fix?"]
    results: list = [None] * len(questions)

    def ask(i: int) -> None:
        body = decision(grown)
        body["decisions"][0]["question"] = questions[i]
        results[i] = warm.post("/invocations", json=body).get_json()

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(questions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    decoded = [r["timing"]["shared_tokens"] for r in results]
    assert sorted(decoded)[:-1] == [0] * (len(questions) - 1), decoded  # one decodes the new part, the rest restore it
    fresh_state = fresh.post("/invocations", json=decision(grown)).get_json()["timing"]["shared_tokens"]
    assert 0 < max(decoded) < fresh_state
    for i, r in enumerate(results):
        body = decision(grown)
        body["decisions"][0]["question"] = questions[i]
        assert answers(r) == answers(fresh.post("/invocations", json=body).get_json())


def test_interleaved_agents_keep_one_saved_state_each_and_answer_as_a_fresh_server(apps, warm_engine):
    """Two agents whose transcripts grow in turns: every step == a fresh server, each step takes its own agent's
    transcript up again, and the cache keeps one saved state per agent, not one per step."""
    warm, fresh = apps
    before, superseded = warm_engine.cache.holder_count, warm_engine.cache.stats.superseded
    other = [line.replace("service=", "svc:").replace("user=", "by ") for line in reversed(EVENTS)]
    logs = {"ops": EVENTS, "audit": other}
    for step, n in enumerate((30, 34, 38, 42)):
        for name, log in logs.items():
            got, want = ask_both(warm, fresh, decision("\n".join(log[:n])))
            assert answers(got) == answers(want), (name, step)
            if step:
                assert got["timing"]["cached_tokens"] >= 4 * BATCH, (name, step, got["timing"])
    assert warm_engine.cache.holder_count == before + 2  # the start-up probe's state, and one per agent
    assert warm_engine.cache.stats.superseded - superseded == 6


def test_saved_states_evicted_under_a_small_budget_leave_answers_exact(apps, warm_engine):
    """A budget that holds one saved state but not two (its checkpoints counted with it): states and checkpoints
    are evicted as agents alternate, and every answer is still == a fresh server's."""
    warm, fresh = apps
    before = warm_engine.cache.bytes
    ask_both(warm, fresh, decision("\n".join(EVENTS[:40])))
    one = warm_engine.cache.bytes - before  # the state, its checkpoints, its answer
    saved, evicted = warm_engine.cache.budget_bytes, warm_engine.cache.stats.evictions
    warm_engine.cache.clear()
    warm_engine.cache.budget_bytes = one + one // 2
    try:
        other = [line.replace("latency_ms", "ms") for line in EVENTS]
        for n in (40, 44, 48):
            for log in (EVENTS, other):
                got, want = ask_both(warm, fresh, decision("\n".join(log[:n])))
                assert answers(got) == answers(want)
                assert warm_engine.cache.bytes <= warm_engine.cache.budget_bytes
        assert warm_engine.cache.stats.evictions > evicted
    finally:
        warm_engine.cache.budget_bytes = saved


def test_ping_and_every_result_name_the_memory_kind_and_the_reuse_it_gets(apps, kind):
    warm, _ = apps
    ping = warm.get("/ping").get_json()
    assert ping["memory"] == kind and set(ping["reuse"]) == {"states", "prefixes", "stems"}
    assert ("checkpoint" in ping["reuse"]["prefixes"]) == (kind != "plain")
    assert ping["reuse"]["stems"].startswith("orderings share their stem")  # the start-up probe found them exact
    model = warm.post("/invocations", json=decision("\n".join(EVENTS[:5]))).get_json()["results"][0]["model"]
    assert (model["memory"], model["window"] > 0) == (kind, kind == "sliding-window")
    assert model["reuse"] == ping["reuse"]


def test_with_the_cache_off_nothing_is_saved_and_admission_counts_on_nothing(fresh_engine):
    tokens = fresh_engine.vocabulary.tokenize("\n".join(EVENTS[:30]))
    head = fresh_engine.runner.head
    spec = fresh_engine.job_spec([head + tuple(tokens) + (1, 2, 3)], [SINGLE], (len(head), len(head) + len(tokens)))
    assert spec.state_key is None and spec.answer_keys == () and spec.prefixes == ()
    assert list(leaves(spec)) == []
    assert not steps_of(fresh_engine.plan(spec), Save)


def test_a_cut_refused_after_a_prefix_restore_restarts_the_job_and_turns_prefixes_and_stems_off(
        apps, warm_engine, monkeypatch):
    """llama.cpp refusing a cut the memory kind allows (a memory this adapter does not know): the job is decoded
    again from the head, answers == a fresh server's, and from then on no prefix or stem is used."""
    warm, fresh = apps
    ask_both(warm, fresh, decision("\n".join(EVENTS[:40])))
    memory = warm_engine.runner._memory
    cut = memory.cut
    refused = []

    def refusing(seq, tokens):
        if seq == STATE_SEQ and not refused:
            refused.append(tokens)
            from decision_adapter.engine.errors import CutRefused

            raise CutRefused("refused for the test")
        cut(seq, tokens)

    monkeypatch.setattr(memory, "cut", refusing)
    try:
        got, want = ask_both(warm, fresh, decision("\n".join(EVENTS[:44]), permutations=2))
        assert refused and answers(got) == answers(want)
        assert got["timing"]["cached_tokens"] == 0  # decoded again from the head
        assert warm.get("/ping").get_json()["reuse"]["stems"].startswith("off")
        again, _ = ask_both(warm, fresh, decision("\n".join(EVENTS[:48])))
        assert again["timing"]["cached_tokens"] == 0
    finally:
        warm_engine.runner.cuts_refused = False


def test_forget_drops_the_states_that_hold_a_spec_s_prefixes(warm_engine):
    warm_engine.cache.clear()
    tokens = warm_engine.vocabulary.tokenize("\n".join(EVENTS[:30]))
    head = warm_engine.runner.head
    prompt = head + tuple(tokens) + (1, 2, 3)
    trie = LabelTrie.build([(1,), (2,), (3,)])
    spec = warm_engine.job_spec([prompt], [trie], (len(head), len(head) + len(tokens)))
    warm_engine.cache.put(b"other" * 7, b"saved", prefixes=[d for _, d in spec.boundaries[:2]])
    assert spec.boundaries[0][1] in warm_engine.cache
    warm_engine.forget(spec)
    assert spec.boundaries[0][1] not in warm_engine.cache and len(warm_engine.cache) == 0
