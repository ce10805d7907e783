"""``python -m endpoint_client capture -c env=NAME --kind cpu --since ... --until ...``: the decisions an endpoint's
data capture recorded in a time window, as a table or as JSON lines.

SageMaker's data capture (cdk.json's ``<kind>.data_capture``) writes JSON-lines objects to the environment's artifact
bucket (the artifacts stack's ``ArtifactBucketName`` output) under ``<prefix><endpoint name>/<variant>/yyyy/mm/dd/hh/``,
each line one request and its response: ``captureData.endpointInput`` and ``endpointOutput`` (``observedContentType``,
``mode``, ``data``, ``encoding``: ``JSON``, the body as text, or ``BASE64``) and ``eventMetadata`` (``eventId``,
``inferenceTime``, and ``inferenceId`` where the caller gave InvokeEndpoint one). The command lists the objects of the
hours the window touches (and the hour before: an object's hour is when it was written), keeps the records whose
``inferenceTime`` is in the window, decodes both bodies and prints one row per decision: the time, the adapter's
request id (the answer's ``x_request.id``: the id of the container's log line), SageMaker's event id, the decision's
id and question, its options, the chosen option and its probability, for both protocols (a decision, shared-state
decisions, System One questions; each line of a JSON-lines body). A record that holds no decision (an error, a dry
run, a body that is not JSON, a request without its response) is a row that says what it holds, never a failure.

Exit codes: 0 printed (also when the window holds nothing); 1 AWS refused; 2 bad arguments or an endpoint kind that
captures nothing; 4 no region or credentials.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import sys
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator, Sequence

from botocore.exceptions import ClientError, NoCredentialsError, PartialCredentialsError

from endpoint_client.deployment import (EXIT_CONFIGURATION, EXIT_FAILED, EXIT_OK, EXIT_USAGE, CommandError,
                                        add_common_arguments, aws_for, error_code, load_config, stack_outputs)
from stacks.config import ADAPTER_KINDS

VARIANT = "AllTraffic"  # the endpoint stacks' one variant
DEFAULT_WINDOW = timedelta(hours=1)
_RELATIVE = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


@dataclass
class Row:
    """One decision of a captured record, or the record itself when it holds none (``note`` says what it holds)."""

    time: str | None
    event_id: str | None
    request_id: str | None = None
    inference_id: str | None = None
    decision: str | None = None
    question: str | None = None
    options: list[str] = field(default_factory=list)
    chosen: str | None = None
    probability: float | None = None
    model_sha256: str | None = None
    image_digest: str | None = None
    note: str | None = None
    key: str = ""


def parse_time(text: str, now: datetime) -> datetime:
    """An ISO 8601 time (UTC when it names no zone), or a duration before ``now``: 90s, 30m, 2h, 7d."""
    relative = _RELATIVE.match(text.strip())
    if relative:
        return now - timedelta(**{_UNITS[relative.group(2)]: int(relative.group(1))})
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise CommandError(f"{text!r} is neither an ISO 8601 time (2026-12-07T18:00:00Z) nor a duration before "
                           f"now (30m, 2h, 7d)") from None
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


def day_prefixes(base: str, since: datetime, until: datetime) -> Iterator[tuple[str, datetime]]:
    """Each day's prefix under ``base`` from the hour before ``since`` (slack) to the hour after ``until`` (an object
    is filed under the hour it was written, after its records), with the first hour of that day the window needs."""
    start = (since - timedelta(hours=1)).replace(minute=0, second=0, microsecond=0)
    day = start.replace(hour=0)
    while day <= until + timedelta(hours=1):
        yield f"{base}{day:%Y/%m/%d}/", max(start, day)
        day += timedelta(days=1)


def object_keys(s3: Any, bucket: str, base: str, since: datetime, until: datetime) -> list[str]:
    """The capture objects under ``base`` whose hour folder can hold records of the window (from the hour before
    ``since`` to the hour after ``until``: an object's hour is when it was written), in key order."""
    keys = []
    paginator = s3.get_paginator("list_objects_v2")
    for prefix, first_hour in day_prefixes(base, since, until):
        for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                hour = item["Key"][len(prefix):].split("/", 1)[0]
                if hour.isdigit() and int(hour) < 24 and \
                        first_hour <= first_hour.replace(hour=int(hour)) <= until + timedelta(hours=1):
                    keys.append(item["Key"])
    return sorted(keys)


def decode(part: Any) -> tuple[list[Any] | None, str | None]:
    """A captured body (``endpointInput`` or ``endpointOutput``) as its JSON values (one, or one per line of a
    JSON-lines body); None and why, when it is missing or not JSON."""
    if not isinstance(part, dict) or "data" not in part:
        return None, "not captured"
    data = part.get("data")
    if not isinstance(data, str):
        return None, "no body"
    encoding = str(part.get("encoding", "JSON")).upper()
    if encoding == "BASE64":
        try:
            data = base64.b64decode(data, validate=True).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            return None, "a BASE64 body that is not UTF-8 text"
    elif encoding not in ("JSON", "CSV"):
        return None, f"a body in an unknown encoding {encoding!r}"
    try:
        return [json.loads(data)], None
    except ValueError:
        pass
    try:
        values = [json.loads(line) for line in data.splitlines() if line.strip()]
    except ValueError:
        return None, f"a {part.get('observedContentType') or 'body'} that is not JSON"
    return (values, None) if values else (None, "an empty body")


def _argmax(probabilities: Sequence[Any]) -> int | None:
    numbers = [p for p in probabilities if isinstance(p, (int, float))]
    if not numbers or len(numbers) != len(probabilities):
        return None
    return max(range(len(numbers)), key=numbers.__getitem__)


def _not_a_decision(answer: Any) -> str:
    if isinstance(answer, dict):
        if "error" in answer:
            status = f" {answer['status']}" if "status" in answer else ""  # a batch line's status
            return f"error{status}: {answer['error']}"
        if "detail" in answer:
            return f"error: {json.dumps(answer['detail'], ensure_ascii=False)[:200]}"
        if "dry_run" in answer or "x_dry_run" in answer:
            return "dry run: nothing decided"
    return "not a decision answer"


def _decision_schema(request: Any, answer: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of a decision-schema answer: its result, or each of its results."""
    results = [answer["result"]] if isinstance(answer.get("result"), dict) else answer.get("results")
    if not isinstance(results, list):
        return []
    asked = {}
    if isinstance(request, dict):
        decisions = [request["decision"]] if isinstance(request.get("decision"), dict) else request.get("decisions")
        asked = {d.get("id"): d for d in decisions or [] if isinstance(d, dict)}
    rows = []
    for result in results:
        if not isinstance(result, dict):
            continue
        options = [str(o) for o in result.get("option_ids") or []]
        best = _argmax(result.get("probabilities") or [])
        ok = best is not None and best < len(options)
        rows.append({"decision": result.get("id"), "question": asked.get(result.get("id"), {}).get("question"),
                     "options": options, "chosen": options[best] if ok else None,
                     "probability": result["probabilities"][best] if ok else None,
                     "model_sha256": (result.get("model") or {}).get("sha256")})
    return rows


def _system_one(request: Any, answer: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of a System One answer, one per question: choice's option, noul's side, score's modal level."""
    questions = request.get("questions") if isinstance(request, dict) else None
    questions = questions if isinstance(questions, dict) else {}
    rows = []
    for qid, given in answer["answers"].items():
        if not isinstance(given, dict):
            continue
        asked = questions.get(qid) if isinstance(questions.get(qid), dict) else {}
        row: dict[str, Any] = {"decision": qid, "question": asked.get("instructions")}
        kind = given.get("type")
        if kind == "noul" and isinstance(given.get("noul"), (int, float)):
            p = given["noul"]
            row.update(options=["true", "false"], chosen="true" if p >= 0.5 else "false", probability=max(p, 1 - p))
        elif isinstance(given.get("probabilities"), dict):
            names = list(given["probabilities"])
            best = _argmax([given["probabilities"][n] for n in names])
            if kind == "choice" and given.get("choice") in names:  # the answer's own choice
                best = names.index(given["choice"])
            legend = given.get("legend") if isinstance(given.get("legend"), dict) else {}
            options = [str(legend.get(n, n)) for n in names]
            row.update(options=options, chosen=options[best] if best is not None else None,
                       probability=given["probabilities"][names[best]] if best is not None else None)
        else:
            row["note"] = f"a {kind or 'typeless'} answer without probabilities"
        rows.append(row)
    return rows


def decisions_of(request: Any, answer: Any) -> list[dict[str, Any]]:
    """The decisions one request object and its answer hold, as rows' fields; one row with a note when none."""
    identity = answer.get("x_request") if isinstance(answer, dict) else None
    common = {"request_id": identity.get("id"), "inference_id": identity.get("inference_id"),
              "model_sha256": identity.get("model_sha256"), "image_digest": identity.get("image_digest")} \
        if isinstance(identity, dict) else {}
    rows: list[dict[str, Any]] = []
    if isinstance(answer, dict) and ("result" in answer or "results" in answer):
        rows = _decision_schema(request, answer)
    elif isinstance(answer, dict) and isinstance(answer.get("answers"), dict):
        rows = _system_one(request, answer)
    if not rows:
        return [{**common, "note": _not_a_decision(answer)}]
    return [{**common, **{k: v for k, v in row.items() if v is not None}} for row in rows]


def rows_of(record: Any, key: str) -> list[Row]:
    """The rows of one captured line (a parsed JSON value); a line that is not a capture record is one row saying
    so."""
    if not isinstance(record, dict) or not isinstance(record.get("captureData"), dict):
        return [Row(time=None, event_id=None, note="not a data capture record", key=key)]
    meta = record.get("eventMetadata") if isinstance(record.get("eventMetadata"), dict) else {}
    base = {"time": str(meta["inferenceTime"]) if meta.get("inferenceTime") else None, "event_id": meta.get("eventId"),
            "inference_id": meta.get("inferenceId"), "key": key}
    requests, request_problem = decode(record["captureData"].get("endpointInput"))
    answers, answer_problem = decode(record["captureData"].get("endpointOutput"))
    if answers is None:
        return [Row(**base, note=f"response {answer_problem}")]
    if requests is None or len(requests) != len(answers):
        requests = [None] * len(answers)  # the answers alone still say what was decided
    rows = []
    for request, answer in zip(requests, answers):
        for found in decisions_of(request, answer):
            rows.append(Row(**{**base, **{k: v for k, v in found.items() if v is not None}}))
    return rows


def in_window(row: Row, since: datetime, until: datetime) -> bool:
    """Whether the row's record was made in the window; a row whose time cannot be read is shown, not dropped."""
    try:
        moment = datetime.fromisoformat(row.time or "")
    except ValueError:
        return True
    moment = moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment
    return since <= moment <= until


def read_rows(s3: Any, bucket: str, base: str, since: datetime, until: datetime) -> list[Row]:
    rows = []
    for key in object_keys(s3, bucket, base, since, until):
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode("utf-8", errors="replace")
        for number, line in enumerate(body.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                rows.append(Row(time=None, event_id=None, note="a line that is not JSON", key=f"{key}:{number}"))
                continue
            rows.extend(row for row in rows_of(record, f"{key}:{number}") if in_window(row, since, until))
    return sorted(rows, key=lambda row: (row.time or "", row.key))


COLUMNS = ("time", "request_id", "event_id", "decision", "question", "options", "chosen", "probability")


def _cell(row: Row, column: str) -> str:
    value = getattr(row, column)
    if column == "options":
        return ", ".join(value)
    if column == "probability":
        return "" if value is None else f"{value:.4f}"
    if column == "chosen" and row.note:
        return row.note
    text = "" if value is None else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def table(rows: Sequence[Row]) -> str:
    cells = [[column.replace("_", " ") for column in COLUMNS]] + [[_cell(row, c) for c in COLUMNS] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    return "".join("  ".join(text.ljust(width) for text, width in zip(line, widths)).rstrip() + "\n"
                   for line in cells)


def json_lines(rows: Sequence[Row]) -> str:
    return "".join(json.dumps({k: v for k, v in asdict(row).items() if v is not None and v != []},
                              ensure_ascii=False) + "\n" for row in rows)


def capture_base(config: Any, kind: str) -> str:
    """``<prefix><endpoint name>/<variant>/`` of the environment's endpoint kind; CommandError when it captures
    nothing."""
    if kind not in config.endpoints:
        raise CommandError(f"{config.key('endpoints')} has no {kind} endpoint")
    capture = config.endpoint_settings(kind).data_capture
    if capture is None:
        raise CommandError(f"{config.key(kind, 'data_capture')} is not set: the {kind} endpoint captures nothing "
                           f"(docs/deploy.md#data-capture)")
    return f"{capture.prefix}{config.endpoint_name(kind)}/{VARIANT}/"


def main(argv: Sequence[str], now: datetime | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m endpoint_client capture",
        description="Print the decisions an endpoint's data capture recorded in a time window: time, request id, "
                    "event id, decision, question, options, the chosen option and its probability.")
    add_common_arguments(parser)
    parser.add_argument("--kind", "--endpoint", dest="kind", choices=ADAPTER_KINDS, default="cpu",
                        help="whose captures to read (default cpu)")
    parser.add_argument("--since", help="ISO 8601 (UTC unless it says otherwise) or a duration before now: 30m, "
                                        "2h, 7d (default: an hour before --until)")
    parser.add_argument("--until", help="as --since (default: now)")
    parser.add_argument("--format", choices=("table", "jsonl"), default="table")
    args = parser.parse_args(argv)
    report = lambda message: print(f"endpoint_client capture: {message}", file=sys.stderr)  # noqa: E731
    now = now or datetime.now(timezone.utc)
    try:
        until = parse_time(args.until, now) if args.until else now
        since = parse_time(args.since, now) if args.since else until - DEFAULT_WINDOW
        if since > until:
            raise CommandError(f"--since {since:%Y-%m-%dT%H:%M:%SZ} is after --until {until:%Y-%m-%dT%H:%M:%SZ}")
        config = load_config(args)
        base = capture_base(config, args.kind)
        aws = aws_for(args, config)
        bucket = stack_outputs(aws.client("cloudformation"), config.artifacts_stack_name,
                               ["ArtifactBucketName"])["ArtifactBucketName"]
        rows = read_rows(aws.client("s3"), bucket, base, since, until)
    except CommandError as error:
        report(str(error))
        return error.exit_code
    except (NoCredentialsError, PartialCredentialsError) as error:
        report(f"no AWS credentials: {error}")
        return EXIT_CONFIGURATION
    except ClientError as error:
        report(f"{error_code(error) or 'error'}: {error.response.get('Error', {}).get('Message', error)}")
        return EXIT_FAILED
    report(f"{len(rows)} rows from s3://{bucket}/{base} between {since:%Y-%m-%dT%H:%M:%SZ} and "
           f"{until:%Y-%m-%dT%H:%M:%SZ}")
    sys.stdout.write(table(rows) if args.format == "table" else json_lines(rows))
    return EXIT_OK
