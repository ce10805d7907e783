"""The cost model admission reckons seconds with (engine/cost.py): the work a plan does, and the fit to jobs that ran.

Pure: real plans from the planner, seconds from a known cost function (what the fit must recover), no llama.cpp.
"""

from __future__ import annotations

import random

import pytest

from decision_adapter.engine.cost import MARGIN, CostModel, Work, done_work, plan_work
from decision_adapter.engine.plan import Decode, JobSpec, Limits, plan_job
from decision_adapter.engine.readout import LabelTrie

LIMITS = Limits(batch_tokens=512, cells=100_000, sequences=32)


def labels(options: int) -> list[tuple[int, ...]]:
    """Single-token labels for the first 26 options, two tokens past them (as the adapter's A..Z, AA.. are)."""
    return [(300 + i,) if i < 26 else (100 + i // 26, 200 + i % 26) for i in range(options)]


def spec(state: int, own: int, options: int, orderings: int = 1) -> JobSpec:
    prompts = tuple(tuple(range(state)) + tuple(range(10**6 + k * own, 10**6 + (k + 1) * own))
                    for k in range(orderings))
    return JobSpec(prompts, tuple(LabelTrie.build(labels(options)) for _ in prompts), 0, state)


def truth(work: Work) -> float:
    """A machine where a token costs 4 ms, a llama_decode call 30 ms, a cell attended over 1 us (as the embedded
    model on 2 cores: a token at position 4,000 costs twice one at 0), a job 10 ms."""
    return 0.004 * work.tokens + 0.03 * work.decodes + 1e-6 * work.attended + 0.01 * work.jobs


def slow_work(plan) -> Work:
    """The work of a plan counted independently of ``plan_work``: every token of every chunk, one by one."""
    decodes = tokens = attended = 0
    for step in plan.steps:
        if isinstance(step, Decode):
            decodes += 1
            for chunk in step.chunks:
                for i in range(len(chunk.tokens)):
                    tokens += 1
                    attended += chunk.pos + i + 1  # the token's own cell and those before it
    return Work(1, decodes, tokens, attended)


@pytest.mark.parametrize("shape", [(100, 30, 3, 1), (1800, 40, 2, 2), (300, 255 * 12, 255, 2), (4000, 90, 30, 1)])
def test_a_plan_s_work_is_its_decodes_tokens_and_cells_attended(shape):
    plan = plan_job(spec(*shape), LIMITS)
    work = plan_work(plan)
    assert work == slow_work(plan)
    assert work.tokens == plan.tokens
    assert done_work(plan, plan.tokens) == work and done_work(plan, 0) == Work(jobs=1)


def test_a_job_stopped_part_way_counts_the_decodes_it_did():
    plan = plan_job(spec(2000, 40, 3), LIMITS)
    first = next(s for s in plan.steps if isinstance(s, Decode))
    assert done_work(plan, first.tokens) == Work(1, 1, first.tokens, first.tokens * (first.tokens + 1) // 2)
    half = done_work(plan, plan.tokens // 2)
    assert half.tokens == plan.tokens // 2 and 0 < half.attended < plan_work(plan).attended


def test_the_fit_recovers_each_term_and_foresees_shapes_it_has_not_seen():
    rng = random.Random(7)
    model = CostModel()
    for _ in range(30):
        work = plan_work(plan_job(spec(rng.randrange(50, 3000), rng.randrange(20, 200), rng.choice((2, 3, 40, 120)),
                                       rng.choice((1, 2))), LIMITS))
        model.learn(work, truth(work), model.seconds(work))
    assert model.terms.keys() >= {"tokens", "attended"}, "the shapes seen pin both down"
    for shape in ((6000, 60, 3, 1), (300, 255 * 12, 255, 2), (20, 10, 2, 1)):
        work = plan_work(plan_job(spec(*shape), LIMITS))
        assert model.seconds(work) == pytest.approx(truth(work), rel=0.02)


def test_jobs_of_one_shape_are_not_extrapolated_past_the_per_token_term():
    """Ten jobs of one shape pin down nothing but a rate: no other term joins, so a very different job is
    foreseen at that rate, not by a wild combination."""
    model = CostModel()
    work = plan_work(plan_job(spec(500, 40, 3), LIMITS))
    for _ in range(10):
        model.learn(work, truth(work), model.seconds(work))
    assert list(model.terms) == ["tokens"]
    other = plan_work(plan_job(spec(5000, 40, 3), LIMITS))
    assert model.seconds(other) == pytest.approx(truth(work) / work.tokens * other.tokens)


def test_after_one_heavy_job_a_long_state_is_still_foreseen_at_its_own_cost():
    """The issue's case: short jobs, long states, then one 255-option question stopped at its deadline (its tokens
    sit at deep positions, each dearer than a short state's). A long state of 3,500 tokens that fits is then still
    foreseen within a few per cent, and its most optimistic estimate stays under what is allowed: it is not
    refused for good. (One mean speed, its error and the refusals it made are measured in ``benchmarks.estimates``.)
    """
    rng = random.Random(3)
    model = CostModel()

    def run(work: Work, seconds: float) -> None:
        model.learn(work, seconds, model.seconds(work))

    for _ in range(8):
        work = plan_work(plan_job(spec(rng.randrange(100, 600), 40, 3), LIMITS))
        run(work, truth(work))
    for state in (1500, 2500):
        work = plan_work(plan_job(spec(state, 40, 3), LIMITS))
        run(work, truth(work))
    allowed_s = 55.0
    heavy = plan_job(spec(400, 255 * 20, 255, 2), LIMITS)
    assert truth(plan_work(heavy)) > allowed_s, "the heavy job runs into its deadline"
    decoded = 0
    for step in (s for s in heavy.steps if isinstance(s, Decode)):  # whole micro-batches until the deadline
        if truth(done_work(heavy, decoded + step.tokens)) > allowed_s:
            break
        decoded += step.tokens
    stopped = done_work(heavy, decoded)
    run(stopped, truth(stopped))

    long_state = plan_work(plan_job(spec(3500, 40, 3), LIMITS))
    assert truth(long_state) < allowed_s, "it fits"
    assert model.seconds(long_state) == pytest.approx(truth(long_state), rel=0.05)
    assert model.fastest(long_state) < allowed_s
    assert model.seconds(plan_work(heavy)) == pytest.approx(truth(plan_work(heavy)), rel=0.05)


def test_the_optimistic_estimate_is_at_most_half_and_follows_the_record():
    model = CostModel()
    work = Work(1, 2, 1000, 10**6)
    model.learn(work, 4.0, None)
    assert model.fastest(work) == pytest.approx(MARGIN * model.seconds(work))
    model.learn(work, 1.0, 4.0)  # a job ran four times faster than foreseen: one ratio alone decides nothing
    assert model.fastest(work) == pytest.approx(MARGIN * model.seconds(work))
    model.learn(work, 1.2, 4.0)  # and another, about as fast: the record shows it
    assert model.fastest(work) == pytest.approx(0.3 * model.seconds(work))
    assert model.errors() == [0.25, 0.3]


def test_one_overestimated_job_does_not_make_the_bound_lenient():
    """The start-up probe's second job is foreseen from the first's fixed costs and runs far faster than foreseen
    (ratio 0.02 here); then jobs run as foreseen. The bound stays at half the estimate, so a request that cannot fit
    is still refused at once (the lowest ratio alone would put it at 0.02x: nothing would ever be too large)."""
    model = CostModel()
    small, large = Work(1, 1, 30, 500), Work(1, 4, 2000, 2 * 10**6)
    model.learn(small, 0.05, None)
    model.learn(large, 0.4, 20.0)
    for _ in range(30):
        model.learn(large, model.seconds(large), model.seconds(large))
    assert min(model.errors()) == pytest.approx(0.02)
    assert model.fastest(large) == pytest.approx(MARGIN * model.seconds(large))
    for _ in range(2):   # two more overestimates among 33 jobs: still below the 10 % quantile
        model.learn(large, 0.1 * model.seconds(large), model.seconds(large))
    assert model.fastest(large) == pytest.approx(MARGIN * model.seconds(large))


def test_nothing_is_foreseen_before_a_job_ran_and_no_work_costs_nothing():
    model = CostModel()
    assert model.seconds(Work(1, 1, 10, 55)) is None and model.fastest(Work(1, 1, 10, 55)) is None
    assert model.seconds(Work()) == 0.0
    model.learn(Work(1, 1, 0, 0), 1.0, None)  # nothing decoded: nothing to learn from
    assert model.seconds(Work(1, 1, 10, 55)) is None
