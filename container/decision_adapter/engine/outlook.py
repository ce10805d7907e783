"""What a job will decode when it starts, foreseen when it is admitted.

A job decodes less than its uncached plan when the cache holds its state (restored, not decoded), a prefix of it
(restored up to one of its micro-batch boundaries, the rest decoded) or some of its prompts' answers, and the jobs
queued ahead of it leave entries in the cache before it starts: a job saves the state it decodes (which serves as
each of its boundary prefixes too) and the answers it reads. So three requests over one new state, queued one behind the other,
decode the state once; admission charges each what it will decode given what is cached and what the jobs ahead
will have cached by then (``foreseen_plan``), and the job is checked again when it starts, against what the cache
then holds (``Engine.begin``).

Pure: no llama.cpp.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterable

from .plan import JobSpec, Limits, Plan, plan_job


def leaves(spec: JobSpec) -> Iterable[bytes]:
    """The cache entries a job leaves once it has run: its state (decoded and saved, or restored) with the prefixes
    it serves as, and its prompts' answers; nothing the cache could not keep (the engine gives such a job no state
    key and no answer keys: the cache is off, or a state as long did not fit)."""
    if spec.state_key is not None:
        yield spec.state_key
        yield from spec.prefixes
    yield from spec.answer_keys


def foreseen_plan(spec: JobSpec, plan: Plan, limits: Limits, held: Callable[[bytes], bool]) -> Plan:
    """The plan of ``spec`` (``plan``: its plan with nothing cached) where ``held`` says which cache entries will
    be there when it starts: its answers already read, and its state restored instead of decoded (whole, or its
    longest prefix held, as ``Runner.begin`` will)."""
    answered = frozenset(i for i, key in enumerate(spec.answer_keys) if held(key))
    looked_up = spec.state_key is not None and len(answered) < len(spec.prompts)
    state_cached = looked_up and held(spec.state_key)
    prefix = 0
    if looked_up and not state_cached:
        prefix = next((end for end, digest in reversed(spec.boundaries) if held(digest)), 0)
    if not answered and not state_cached and not prefix:
        return plan
    return plan_job(replace(spec, state_cached=state_cached, prefix=prefix, answered=answered), limits)
