"""Large bodies take turns (``server.admission.LargeBodyTurns``): one body over the threshold at a time is parsed,
checked and rendered, so that sixteen at once leave the GIL to ``/ping`` and the scheduler; the turn is given
back as the work reaches the scheduler, or when the request ends whatever its answer."""

from __future__ import annotations

import json
import threading

import pytest

from benchmarks import hostile
from decision_adapter.server.admission import LARGE_BODY_BYTES, LargeBodyTurns

EXAMPLE = {"decision": {"id": "d", "state": "A customer cannot log in.", "question": "Which team?",
                        "options": [{"id": "billing", "description": "Billing."},
                                    {"id": "account_access", "description": "Account access."}]}}


def padded(payload: dict, size: int) -> bytes:
    """``payload`` as JSON after white space (valid JSON) to ``size`` bytes."""
    text = json.dumps(payload).encode()
    return b" " * (size - len(text)) + text


def test_a_small_body_takes_no_turn_and_a_large_one_waits_for_the_one_before():
    turns = LargeBodyTurns(threshold=100)
    assert turns.take(100) is None
    give_back = turns.take(101)
    entered = threading.Event()

    def second() -> None:
        turns.take(5_000)()
        entered.set()

    thread = threading.Thread(target=second)
    thread.start()
    assert not entered.wait(0.2), "a second large body got a turn while the first held it"
    give_back()
    give_back()  # a second give-back is a no-op, never a release of someone else's turn
    assert entered.wait(5)
    thread.join()
    assert turns.take(101) is not None


@pytest.fixture
def turn_probe(client, monkeypatch):
    """Records, as each request's work reaches the model, whether the large bodies' turn is free then."""
    state = client.application.extensions["decision_adapter"]
    model = state.readiness.model
    seen: list[bool] = []
    score = model.score

    def scoring(*args, **kwargs):
        seen.append(not state.turns._turn.locked())
        return score(*args, **kwargs)

    monkeypatch.setattr(model, "score", scoring)
    return state.turns, seen


@pytest.mark.parametrize("path, payload", [
    ("/invocations", EXAMPLE),
    ("/v1/systemone", {"model": "jev-latest", "state": "A customer cannot log in.",
                       "questions": {"q": {"type": "noul"}}}),
])
def test_a_large_body_gives_its_turn_back_before_it_is_scored_and_after_it_is_answered(client, turn_probe, path,
                                                                                     payload):
    turns, seen = turn_probe
    response = client.post(path, data=padded(payload, LARGE_BODY_BYTES + 1024),
                           headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.get_json()
    assert seen == [True]
    assert not turns._turn.locked()


@pytest.mark.parametrize("body, status", [
    (b" " * LARGE_BODY_BYTES + b'{"decision": ', 400),  # does not parse
    (padded({"decision": {"id": "d"}}, LARGE_BODY_BYTES + 10), 400),  # parses, does not validate
    (b"\xff" * (LARGE_BODY_BYTES + 10), 400),  # not UTF-8
])
def test_a_large_body_refused_gives_its_turn_back(client, turn_probe, body, status):
    turns, seen = turn_probe
    response = client.post("/invocations", data=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.get_json()
    assert seen == []
    assert not turns._turn.locked()


# ---- sixteen at once against a live `serve` ----------------------------------------------------------------------

# The shapes whose 16 concurrent 6 MiB bodies kept /ping waiting longest before the turns (docs/benchmarks.md,
# "Many large bodies at once"): 2.2, 1.41, 1.09 and 1.09 s.
HEAVY_SHAPES = [("object-of-many-keys", "json"), ("millions-of-small-items", "lines"),
                ("request-of-many-fields", "systemone"), ("nan-infinity", "json")]


@pytest.fixture(scope="module")
def live(model_dir):
    from adapter_server import live_server

    with live_server(str(model_dir)) as served:
        yield served


@pytest.mark.parametrize("family, fmt", HEAVY_SHAPES)
def test_sixteen_large_bodies_at_once_leave_ping_answering_within_a_second(live, family, fmt):
    """Sixteen copies (the admission capacity) of a 6 MiB body of a heavy shape, sent at once while /ping is
    polled every 50 ms: every poll answers 200 within 1 s (issue 35's bound), every body gets a 2xx or 4xx."""
    base, _ = live
    envelope = hostile.ENVELOPES[fmt]
    data = hostile.body(family, fmt, hostile.SIZES["6MiB"])
    watch = hostile.PingWatch(base)
    try:
        statuses, slowest = hostile.send_concurrently(base, envelope.path, envelope.content_type, data, 16,
                                                      timeout_s=120)
        worst, failures = watch.worst()
    finally:
        watch.stop()
    assert all(200 <= status < 500 for status in statuses), statuses
    assert failures == 0
    assert worst < 1.0, f"/ping waited {worst:.2f} s while 16 bodies were answered (slowest {slowest:.1f} s)"
