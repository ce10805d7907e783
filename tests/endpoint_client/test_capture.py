"""python -m endpoint_client capture against moto on loopback: records in SageMaker's data capture format, made from
real adapter answers (the adapter on a fake engine), read back for a time window as JSON lines and as a table; records
that hold no decision are rows that say what they hold."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest

from adapter.adapter_fakes import FakeEngine, fake_model_dir
from decision_adapter.server.app import create_app
from decision_adapter.settings import Settings
from endpoint_client import capture, cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DECISION = json.loads((EXAMPLES / "support-route.json").read_text())
SYSTEM_ONE = json.loads((EXAMPLES / "systemone-ticket.json").read_text())
BASE = "data-capture/decision-dev-cpu/AllTraffic/"
DIGEST = "sha256:" + "cd" * 32   # ADAPTER_IMAGE_DIGEST, as the endpoint stacks set it
WINDOW = ["--since", "2026-12-07T18:00:00Z", "--until", "2026-12-07T18:30:00Z"]


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    """The adapter on a fake engine: its answers are the real shapes, x_request included."""
    folder = fake_model_dir(tmp_path_factory.mktemp("capture"))
    app = create_app(Settings(model_dir=str(folder), threads=1, permutations=1, debias="off", image_digest=DIGEST),
                     FakeEngine(folder / "fake.gguf"))
    yield app.test_client()
    app.extensions["decision_adapter"].close()


def exchange(client, body, content_type="application/json", **headers):
    """A request body and the adapter's answer to it, as text, with the answer's X-Request-Id."""
    text = body if isinstance(body, str) else json.dumps(body)
    response = client.post("/invocations", data=text, content_type=content_type, headers=headers)
    return text, response.get_data(as_text=True), response.headers["X-Request-Id"]


def record(request: str | None, answer: str | None, time: str, *, encoding="JSON", inference_id=None,
           content_type="application/json") -> dict:
    """One line of a capture object, as SageMaker writes it."""
    def part(mode, data):
        if encoding == "BASE64":
            data = base64.b64encode(data if isinstance(data, bytes) else data.encode()).decode()
        return {"observedContentType": content_type, "mode": mode, "data": data, "encoding": encoding}
    data = {}
    if request is not None:
        data["endpointInput"] = part("INPUT", request)
    if answer is not None:
        data["endpointOutput"] = part("OUTPUT", answer)
    meta = {"eventId": str(uuid.uuid4()), "inferenceTime": time,
            **({"inferenceId": inference_id} if inference_id else {})}
    return {"captureData": data, "eventMetadata": meta, "eventVersion": "0"}


def put(deployment, hour_folder: str, lines: list) -> None:
    body = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    key = f"{BASE}{hour_folder}/capture-{uuid.uuid4()}.jsonl"
    deployment.client("s3").put_object(Bucket=deployment.bucket, Key=key, Body=body.encode())


def capturing(deployment):
    deployment.write_cdk_json(lambda env: env["cpu"].update(data_capture={"sampling_percentage": 100}))


def run(deployment, *extra, capsys):
    code = capture.main(deployment.args(*extra))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def rows(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


def test_decisions_of_both_protocols_are_read_back_for_the_window(deployment, adapter, capsys):
    capturing(deployment)
    decision_in, decision_out, decision_id = exchange(adapter, DECISION, **{"X-Request-Id": "req-route"})
    s1_in, s1_out, s1_id = exchange(adapter, SYSTEM_ONE, **{"X-Amzn-SageMaker-Inference-Id": "audit-1"})
    shared = {"decisions": [{**DECISION["decision"], "id": "first"},
                            {**DECISION["decision"], "id": "second", "question": "Which queue is least fitting?"}]}
    shared_in, shared_out, shared_id = exchange(adapter, shared)
    lines_in, lines_out, lines_id = exchange(adapter, json.dumps(DECISION) + "\n" + json.dumps(SYSTEM_ONE) + "\n",
                                             content_type="application/jsonlines")
    early = record(decision_in, decision_out, "2026-12-07T17:59:59Z")
    put(deployment, "2026/12/07/18", [
        record(decision_in, decision_out, "2026-12-07T18:01:00Z"),
        record(s1_in, s1_out, "2026-12-07T18:02:00Z", inference_id="audit-1"),
        record(shared_in, shared_out, "2026-12-07T18:03:00Z", encoding="BASE64"),
        record(lines_in, lines_out, "2026-12-07T18:04:00Z", content_type="application/jsonlines", encoding="BASE64"),
        record(decision_in, decision_out, "2026-12-07T18:31:00Z")])   # after the window
    put(deployment, "2026/12/07/17", [early])                           # before it
    put(deployment, "2026/12/07/12", [record(decision_in, decision_out, "2026-12-07T18:10:00Z")])  # not listed

    code, out, err = run(deployment, *WINDOW, "--format", "jsonl", capsys=capsys)

    assert code == 0, err
    found = rows(out)
    answer = json.loads(decision_out)["result"]
    best = max(range(3), key=answer["probabilities"].__getitem__)
    assert found[0] == {"time": "2026-12-07T18:01:00Z", "event_id": found[0]["event_id"], "request_id": "req-route",
                        "decision": "support-route", "question": DECISION["decision"]["question"],
                        "options": answer["option_ids"], "chosen": answer["option_ids"][best],
                        "probability": answer["probabilities"][best], "model_sha256": answer["model"]["sha256"],
                        "image_digest": DIGEST, "key": found[0]["key"]}
    assert decision_id == "req-route" and found[0]["key"].startswith(BASE + "2026/12/07/18/")
    answers = json.loads(s1_out)["answers"]
    system_one = [r for r in found if r["time"] == "2026-12-07T18:02:00Z"]
    assert [r["decision"] for r in system_one] == ["refund", "team", "anger"]
    assert {r["request_id"] for r in system_one} == {s1_id} == {"audit-1"}
    assert {r["inference_id"] for r in system_one} == {"audit-1"}
    refund, team, anger = system_one
    assert refund["options"] == ["true", "false"] and refund["probability"] == max(answers["refund"]["noul"],
                                                                                   1 - answers["refund"]["noul"])
    assert team["chosen"] == answers["team"]["choice"]
    assert team["probability"] == answers["team"]["probabilities"][answers["team"]["choice"]]
    assert anger["options"] == ["Calm", "Frustrated", "Very angry"] and anger["question"] == \
        SYSTEM_ONE["questions"]["anger"]["instructions"]
    assert [(r["decision"], r["request_id"]) for r in found if r["time"] == "2026-12-07T18:03:00Z"] == \
        [("first", shared_id), ("second", shared_id)]
    assert [r["question"] for r in found if r["time"] == "2026-12-07T18:03:00Z"][1] == "Which queue is least fitting?"
    assert [(r["decision"], r["request_id"]) for r in found if r["time"] == "2026-12-07T18:04:00Z"] == \
        [("support-route", lines_id), ("refund", lines_id), ("team", lines_id), ("anger", lines_id)]
    assert len(found) == 1 + 3 + 2 + 4, "the records before and after the window are left out"
    assert "10 rows from s3://" in err


def test_the_table_names_each_decision_its_choice_and_probability(deployment, adapter, capsys):
    capturing(deployment)
    request, answer, request_id = exchange(adapter, DECISION)
    put(deployment, "2026/12/07/18", [record(request, answer, "2026-12-07T18:05:00Z")])

    code = cli.main(["capture", *deployment.args(*WINDOW)])   # as python -m endpoint_client capture runs it
    out, err = capsys.readouterr()

    assert code == 0, err
    header, line = out.splitlines()
    assert header.split() == ["time", "request", "id", "event", "id", "decision", "question", "options", "chosen",
                              "probability"]
    result = json.loads(answer)["result"]
    best = max(range(3), key=result["probabilities"].__getitem__)
    assert request_id in line and "account_access, billing, sales" in line
    assert line.rstrip().endswith(f"{result['option_ids'][best]}  {result['probabilities'][best]:.4f}")


def test_records_that_hold_no_decision_are_shown_as_such(deployment, adapter, capsys):
    capturing(deployment)
    bad_in, bad_out, bad_id = exchange(adapter, {"decision": {"id": "x"}})
    dry_in, dry_out, dry_id = exchange(adapter, {**DECISION, "x_dry_run": True})
    put(deployment, "2026/12/07/18", [
        record(bad_in, bad_out, "2026-12-07T18:06:00Z"),
        record(dry_in, dry_out, "2026-12-07T18:07:00Z"),
        record(b"\xff\xfe", b"\x00\xff", "2026-12-07T18:08:00Z", encoding="BASE64",
               content_type="application/octet-stream"),
        record(json.dumps(DECISION), None, "2026-12-07T18:09:00Z"),
        record("{}", "not json", "2026-12-07T18:10:00Z"),
        record("{}", json.dumps({"something": "else"}), "2026-12-07T18:11:00Z"),
        "this line is not JSON",
        {"neither": "a capture record"}])

    code, out, err = run(deployment, *WINDOW, "--format", "jsonl", capsys=capsys)

    assert code == 0, err
    notes = {r.get("time"): r.get("note") for r in rows(out)}
    assert notes["2026-12-07T18:06:00Z"] == "error: decision.state is required"
    assert notes["2026-12-07T18:07:00Z"] == "dry run: nothing decided"
    assert notes["2026-12-07T18:08:00Z"] == "response a BASE64 body that is not UTF-8 text"
    assert notes["2026-12-07T18:09:00Z"] == "response not captured"
    assert notes["2026-12-07T18:10:00Z"] == "response a application/json that is not JSON"
    assert notes["2026-12-07T18:11:00Z"] == "not a decision answer"
    assert sorted(r["note"] for r in rows(out) if "time" not in r) == ["a line that is not JSON",
                                                                      "not a data capture record"]
    dry = [r for r in rows(out) if r.get("time") == "2026-12-07T18:07:00Z"]
    assert dry[0]["request_id"] == dry_id, "a dry run's answer carries its request id too"
    code, out, err = run(deployment, *WINDOW, capsys=capsys)
    assert code == 0 and "dry run: nothing decided" in out and "not a data capture record" in out


def test_an_endpoint_that_captures_nothing_is_named(deployment, capsys):
    code, out, err = run(deployment, *WINDOW, capsys=capsys)
    assert code == 2 and out == ""
    assert "environments.dev.cpu.data_capture is not set: the cpu endpoint captures nothing" in err


@pytest.mark.parametrize("window, message", [
    (["--since", "yesterday"], "'yesterday' is neither an ISO 8601 time"),
    (["--since", "2026-12-07T19:00:00Z", "--until", "2026-12-07T18:00:00Z"], "is after --until")])
def test_bad_windows_are_refused(deployment, capsys, window, message):
    capturing(deployment)
    code, out, err = run(deployment, *window, capsys=capsys)
    assert code == 2 and message in err


def test_relative_times_count_back_from_now():
    now = datetime(2026, 12, 7, 18, 30, tzinfo=timezone.utc)
    assert capture.parse_time("2h", now) == datetime(2026, 12, 7, 16, 30, tzinfo=timezone.utc)
    assert capture.parse_time("2026-12-07T18:00:00", now) == datetime(2026, 12, 7, 18, tzinfo=timezone.utc)
    assert capture.parse_time("2026-12-07T19:00:00+01:00", now) == datetime(2026, 12, 7, 18, tzinfo=timezone.utc)


def test_the_hour_after_the_window_is_listed_across_midnight():
    """A record of 23:50 may be in the object SageMaker files under the next day's hour 00."""
    since, until = (datetime(2026, 12, 7, 23, 0, tzinfo=timezone.utc), datetime(2026, 12, 7, 23, 59,
                                                                                  tzinfo=timezone.utc))
    assert [prefix for prefix, _ in capture.day_prefixes("p/", since, until)] == ["p/2026/12/07/", "p/2026/12/08/"]
