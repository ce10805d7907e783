"""The planner and the state cache, without llama.cpp: layouts, memory peaks, limits, LRU by bytes."""

from __future__ import annotations

import pytest

from decision_adapter.engine.cache import PrefixCache, entry_cost, size_of, tokens_key
from decision_adapter.engine.plan import (FIRST_PATH_SEQ, HEAD_BLOB, PROMPT_SEQ, STATE_SEQ, Chunk, Decode, Fork, JobSpec,
                                   Limits, PlanError, Release, Restore, Save, plan_job)
from decision_adapter.engine.readout import LabelTrie

HEAD = tuple(range(100, 110))  # 10 tokens of template head
STATE = tuple(range(200, 1200))  # 1,000 tokens of state
SINGLE = LabelTrie.build([(1,), (2,), (3,)])
PAIRED = LabelTrie.build([(a, d) for a in (1, 2, 3) for d in (10, 11)][:5])  # 5 labels over 3 first tokens
LIMITS = Limits(batch_tokens=256, cells=4096, sequences=8)


def prompt(question: int, length: int) -> tuple[int, ...]:
    return HEAD + STATE + tuple(range(question * 1000, question * 1000 + length))


def spec(prompts, tries, **kw) -> JobSpec:
    return JobSpec(tuple(prompts), tuple(tries), len(HEAD), len(HEAD) + len(STATE), **kw)


def own_steps(plan, index: int) -> list:
    """The steps that serve one prompt, from its fork to its release, without the prompt's index."""
    runs: dict[int, list] = {}
    run: list | None = None
    for step in plan.steps:
        if step == Fork(STATE_SEQ, PROMPT_SEQ):
            run = []
        if run is None:
            continue
        if isinstance(step, Decode):
            run.append([(c.seq, c.pos, c.tokens, c.read and (c.read.node, c.read.tokens)) for c in step.chunks])
            runs.update({c.read.prompt: run for c in step.chunks if c.read is not None})
        else:
            run.append(step)
        if step == Release((PROMPT_SEQ,)):
            run = None
    return runs[index]


def test_a_miss_restores_the_head_decodes_the_state_in_micro_batches_from_its_first_token_and_saves_it():
    plan = plan_job(spec([prompt(1, 40)], [SINGLE], state_key=b"k"), LIMITS)

    assert plan.steps[0] == Restore(STATE_SEQ, HEAD_BLOB, len(HEAD))
    state_decodes = [s for s in plan.steps if isinstance(s, Decode) and s.chunks[0].seq == STATE_SEQ]
    assert [c.chunks[0].pos for c in state_decodes] == [10, 266, 522, 778]
    assert [len(c.chunks[0].tokens) for c in state_decodes] == [256, 256, 256, 232]
    assert Save(STATE_SEQ, b"k", 1010) in plan.steps
    assert (plan.shared_tokens, plan.cached_tokens, plan.own_tokens, plan.readout_tokens) == (1000, 0, (40,), 0)
    suffix = [s for s in plan.steps if isinstance(s, Decode) and s.chunks[0].seq == PROMPT_SEQ]
    assert suffix == [Decode((Chunk(PROMPT_SEQ, 1010, tuple(range(1000, 1040)), suffix[0].chunks[0].read),))]
    assert suffix[0].chunks[0].read.node == () and suffix[0].chunks[0].read.tokens == (1, 2, 3)
    assert plan.steps[-1] == Release((STATE_SEQ,))


def test_a_hit_restores_head_and_state_and_decodes_only_the_question():
    plan = plan_job(spec([prompt(1, 40)], [SINGLE], state_key=b"k", state_cached=True), LIMITS)

    assert plan.steps[0] == Restore(STATE_SEQ, b"k", 1010)
    assert not any(isinstance(s, Save) for s in plan.steps)
    assert [s for s in plan.steps if isinstance(s, Decode)][0].chunks[0].seq == PROMPT_SEQ
    assert (plan.shared_tokens, plan.cached_tokens, plan.own_tokens) == (0, 1000, (40,))


def test_each_prompt_is_laid_out_the_same_alone_beside_others_and_on_a_cache_hit():
    prompts = [prompt(1, 40), prompt(2, 700), prompt(3, 5)]
    tries = [SINGLE, PAIRED, SINGLE]
    together = plan_job(spec(prompts, tries, state_key=b"k"), LIMITS)
    reversed_ = plan_job(spec(prompts[::-1], tries[::-1], state_key=b"k"), LIMITS)
    for i, (p, t) in enumerate(zip(prompts, tries)):
        alone = plan_job(spec([p], [t], state_key=b"k"), LIMITS)
        hit = plan_job(spec([p], [t], state_key=b"k", state_cached=True), LIMITS)
        assert own_steps(together, i) == own_steps(alone, 0) == own_steps(hit, 0) == own_steps(reversed_, 2 - i)
        assert own_steps(alone, 0), "the prompt has steps of its own"
    long_suffix = [s for s in together.steps if isinstance(s, Decode) and s.chunks[0].read is None
                   and s.chunks[0].seq == PROMPT_SEQ]
    assert [c.chunks[0].pos for c in long_suffix] == [1010, 1266], "a question's micro-batches start at its own first token"


def test_label_paths_are_forked_from_the_prompt_and_decoded_side_by_side_after_it():
    plan = plan_job(spec([prompt(1, 40)], [PAIRED]), LIMITS)

    paths = [s for s in plan.steps if isinstance(s, Decode) and s.chunks[0].seq >= FIRST_PATH_SEQ]
    assert len(paths) == 1
    assert [(c.seq, c.pos, c.tokens, c.read.node) for c in paths[0].chunks] == [
        (2, 1050, (1,), (1,)), (3, 1050, (2,), (2,)), (4, 1050, (3,), (3,))]
    assert [Fork(PROMPT_SEQ, seq) for seq in (2, 3, 4)] == [s for s in plan.steps if isinstance(s, Fork)][1:]
    assert plan.readout_tokens == 3 and plan.sequences == 5


def test_label_paths_are_grouped_by_the_sequences_available():
    trie = LabelTrie.build([(a, 10) for a in range(1, 27)])
    plan = plan_job(spec([prompt(1, 40)], [trie]), Limits(batch_tokens=256, cells=4096, sequences=12))

    groups = [len(s.chunks) for s in plan.steps if isinstance(s, Decode) and s.chunks[0].seq >= FIRST_PATH_SEQ]
    assert groups == [10, 10, 6] and plan.sequences == 12


def test_answered_prompts_decode_nothing_and_a_fully_answered_job_has_no_steps():
    plan = plan_job(spec([prompt(1, 40), prompt(2, 30)], [SINGLE, SINGLE], answered=frozenset({0})), LIMITS)
    assert plan.own_tokens == (0, 30)
    assert plan_job(spec([prompt(1, 40)], [SINGLE], answered=frozenset({0})), LIMITS).steps == ()


def test_peak_memory_counts_the_state_and_one_question_at_a_time():
    prompts = [prompt(q, 3000) for q in range(1, 6)]  # five questions of 3,000 tokens over a 1,010-token prefix
    plan = plan_job(spec(prompts, [SINGLE] * 5), Limits(batch_tokens=256, cells=16384, sequences=8))
    assert plan.peak_cells == 1010 + 3000

    with pytest.raises(PlanError, match="needs 4010 memory cells at its peak, over the 4000"):
        plan_job(spec(prompts, [SINGLE] * 5), Limits(batch_tokens=256, cells=4000, sequences=8))


def test_snapshot_forks_count_the_copies_they_make():
    plan = plan_job(spec([prompt(1, 40)], [PAIRED]), Limits(256, 16384, 8, fork_by="snapshot"))
    # state 1,010; the prompt's fork copies it and adds 40; three label forks each copy the prompt (1,050) + 1
    assert plan.peak_cells == 1010 + 1050 + 3 * 1051


def test_a_prefix_that_leaves_a_prompt_no_token_of_its_own_is_refused():
    with pytest.raises(ValueError, match="at least one token of its own"):
        plan_job(JobSpec((HEAD + STATE,), (SINGLE,), len(HEAD), len(HEAD) + len(STATE)), LIMITS)


def test_cache_keeps_the_most_recently_used_entries_within_its_byte_budget():
    value = b"x" * 40
    cost = entry_cost(b"a", size_of(value))  # the value, its key and the bookkeeping
    cache = PrefixCache(budget_bytes=2 * cost + cost // 2)
    assert cache.put(b"a", value) and cache.put(b"b", value)
    assert cache.get(b"a") == value  # a is now the most recently used
    assert cache.put(b"c", value)
    assert b"b" not in cache and b"a" in cache and b"c" in cache
    assert cache.bytes == 2 * cost and cache.stats.evictions == 1 and cache.stats.hits == 1
    assert not cache.put(b"d", b"x" * 3 * cost), "an entry over the whole budget is not kept"
    assert cache.get(b"b") is None and cache.stats.misses == 1
    assert PrefixCache(0).put(b"e", b"x") is False


def test_cache_keys_name_exact_tokens_and_labels():
    assert tokens_key("state", [1, 2, 3]) == tokens_key("state", (1, 2, 3))
    assert tokens_key("state", [1, 2, 3]) != tokens_key("state", [1, 2, 4])
    assert tokens_key("state", [1, 2]) != tokens_key("answer", [1, 2])
    assert tokens_key("answer", [1, 2], [(5,), (6,)]) != tokens_key("answer", [1, 2], [(5,), (7,)])
    assert tokens_key("state", [258]) != tokens_key("state", [2, 1])
