"""`python -m benchmarks.transform`: a Batch Transform job driven against `serve` the way SageMaker drives it.

SageMaker asks the container ``GET /execution-parameters`` once, then sends ``MaxConcurrentTransforms`` requests
at a time, each a mini-batch of whole lines (``SplitType`` Line) up to ``MaxPayloadInMB`` (``MULTI_RECORD``; one
line per request for ``SINGLE_RECORD``), and fails a request that is not answered within
``InvocationsTimeoutInSeconds``. This harness does the same with distinct, realistic records (support tickets
routed to a queue, and System One questions over them, about the size of examples/support-route.json) and a few
that can never be answered (a prompt over the limit), and reports, per mini-batch, its seconds against the
timeout and its records answered or given an error line; a mini-batch not answered in time, a record without
its line, or a record larger than ``MaxPayloadInMB`` (SageMaker fails the job on one) fails the run.
``--large-record`` adds a valid record of more than 1 MiB, in a mini-batch of its own, larger than the 1 MiB the
sizing once advertised with MULTI_RECORD (``decisions``: 64 decisions over one 20 KB state; ``padded``: a usual
record padded with JSON whitespace, which costs the model nothing). ``--payload-kb`` fills mini-batches to less
than the advertised payload (the shorter variant `make test` runs); ``make bench`` runs it filled to
``MaxPayloadInMB``. The container runs as a transform (``ADAPTER_DEPLOYMENT=transform``), as
``python -m endpoint_client transform`` deploys it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import os
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import requests

from .provenance import Provenance

TEAMS = [("account_access", "Account access and authentication support."),
         ("billing", "Billing, invoices, refunds and payment support."),
         ("shipping", "Shipping, delivery, damaged or lost parcels."),
         ("sales", "Sales and product evaluation before a purchase."),
         ("technical", "Bugs, errors and technical problems in the product.")]
PROBLEMS = ["cannot log in after resetting the password", "was charged twice for order {n}",
            "says parcel {n} arrived crushed", "asks for a quote for {n} seats", "reports error {n} when exporting",
            "wants a refund for invoice {n}", "never received the verification email for account {n}",
            "asks when order {n} will ship", "cannot open the app since update {n}"]
MOODS = ["politely", "angrily", "for the third time", "briefly", "in a long message"]


def record(i: int, rng: random.Random) -> dict[str, Any]:
    """One distinct, realistic request object (the walkthrough's decision, or System One every fifth)."""
    state = (f"Ticket {10_000 + i}: the customer {rng.choice(MOODS)} writes that they "
             f"{rng.choice(PROBLEMS).format(n=rng.randint(100, 99_999))}. Plan: {rng.choice(['free', 'pro', 'team'])}.")
    teams = rng.sample(TEAMS, k=rng.randint(3, 5))
    if i % 5 == 4:
        return {"model": "jev-latest", "state": state, "questions": {
            "team": {"type": "choice", "criteria": dict(teams)},
            "urgent": {"type": "noul", "instructions": "Does the customer need an answer today?"}}}
    return {"decision": {"id": f"ticket-{i}", "state": state, "question": "Which queue should handle this ticket?",
                        "options": [{"id": t, "description": d} for t, d in teams]}}


def never_fits(i: int) -> dict[str, Any]:
    """A record this server can never answer: 255 options averaged over 16 orderings are over the request's
    token limit (ADAPTER_MAX_REQUEST_TOKENS), though the line is only a few KB."""
    return {"decision": {"id": f"never-fits-{i}", "state": f"Ticket {i}.", "question": "Which product is it about?",
                         "options": [{"id": f"Product line {j}"} for j in range(255)], "permutations": 16}}


def large_record(kind: str) -> bytes:
    """A valid record of more than 1 MiB (see the module's text), as one JSON line."""
    if kind == "padded":
        compact = json.dumps(record(0, random.Random(1))).encode()
        return compact[:1] + b" " * (1_200_000 - len(compact)) + compact[1:] + b"\n"
    rng = random.Random(2)
    state = " ".join(f"Message {i}: the customer {rng.choice(MOODS)} writes that they "
                     f"{rng.choice(PROBLEMS).format(n=rng.randint(100, 99_999))}." for i in range(200))[:20_000]
    teams = TEAMS[:4]
    return json.dumps({"decisions": [
        {"id": f"large-{i}", "state": state, "question": f"Which queue should handle part {i} of this thread?",
         "options": [{"id": t, "description": d} for t, d in teams]} for i in range(64)]}).encode() + b"\n"


def lines(seed: int = 7, never_fits_every: int = 200) -> Iterator[bytes]:
    """Distinct records as JSON lines; every ``never_fits_every``-th (0: none) one that cannot be answered."""
    rng = random.Random(seed)
    for i in itertools.count():
        every = never_fits_every
        yield json.dumps(never_fits(i) if every and i % every == every - 1 else record(i, rng)).encode() + b"\n"


def mini_batches(count: int, payload_bytes: int, never_fits_every: int = 200) -> list[list[bytes]]:
    """``count`` mini-batches of whole lines, each as many lines as fit ``payload_bytes``."""
    source = lines(never_fits_every=never_fits_every)
    batches: list[list[bytes]] = []
    line = next(source)
    for _ in range(count):
        batch: list[bytes] = []
        size = 0
        while not batch or size + len(line) <= payload_bytes:
            batch.append(line)
            size += len(line)
            line = next(source)
        batches.append(batch)
    return batches


@dataclass
class BatchOutcome:
    records: int
    payload_bytes: int
    seconds: float
    answered: int
    error_lines: int
    status: int
    on_time: bool


def send(base: str, lines: list[bytes], timeout_s: float) -> BatchOutcome:
    body = b"".join(lines)
    started = time.monotonic()
    try:
        response = requests.post(f"{base}/invocations", data=body, timeout=timeout_s,
                                 headers={"Content-Type": "application/jsonlines"})
    except requests.Timeout:
        return BatchOutcome(len(lines), len(body), time.monotonic() - started, 0, 0, 0, False)
    seconds = time.monotonic() - started
    out = [json.loads(line) for line in response.text.splitlines()] if response.status_code == 200 else []
    answered = sum("status" not in o for o in out)
    return BatchOutcome(len(lines), len(body), seconds, answered, len(out) - answered, response.status_code,
                        seconds <= timeout_s)


def run(base: str, *, timeout_s: float, payload_kb: int | None = None, batches: int | None = None,
        single_records: int = 40, never_fits_every: int = 200, strategy: str | None = None,
        large: str | None = None) -> dict[str, Any]:
    """Drive one container at ``base`` as a Batch Transform job would (with the strategy it advertises, or
    ``strategy``); the figures, and whether it held."""
    parameters = requests.get(f"{base}/execution-parameters", timeout=30).json()
    concurrent_n = parameters["MaxConcurrentTransforms"]
    if (strategy or parameters["BatchStrategy"]) == "SINGLE_RECORD":
        payload = parameters["MaxPayloadInMB"] << 20
        groups = [[line] for line in itertools.islice(lines(never_fits_every=never_fits_every), single_records)]
    else:
        payload = (payload_kb << 10) if payload_kb else parameters["MaxPayloadInMB"] << 20
        groups = mini_batches(batches or concurrent_n, payload, never_fits_every=never_fits_every)
    if large:
        groups.append([large_record(large)])
    largest = max(len(line) for group in groups for line in group)
    fits = largest <= parameters["MaxPayloadInMB"] << 20  # SageMaker fails the job on a larger record
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(concurrent_n) as pool:
        outcomes = list(pool.map(lambda lines: send(base, lines, timeout_s), groups))
    wall = time.monotonic() - started
    records = sum(o.records for o in outcomes)
    held = fits and all(o.on_time and o.status == 200 and o.answered + o.error_lines == o.records for o in outcomes)
    return {"execution_parameters": parameters, "strategy": strategy or parameters["BatchStrategy"],
            "invocation_timeout_s": timeout_s, "payload_bytes": payload,
            "mini_batches": [asdict(o) for o in outcomes], "records": records,
            "answered": sum(o.answered for o in outcomes), "error_lines": sum(o.error_lines for o in outcomes),
            "seconds": wall, "records_per_s": records / wall if wall else None,
            "slowest_mini_batch_s": max(o.seconds for o in outcomes),
            "largest_record_bytes": largest, "records_within_max_payload": fits,
            "median_mini_batch_s": statistics.median(o.seconds for o in outcomes), "held": held}


def markdown(result: dict[str, Any]) -> str:
    p = result["execution_parameters"]
    lines = [f"`/execution-parameters`: {p['BatchStrategy']}, MaxPayloadInMB {p['MaxPayloadInMB']}, "
             f"MaxConcurrentTransforms {p['MaxConcurrentTransforms']}; sent {result['strategy']}; invocation timeout "
             f"{result['invocation_timeout_s']:.0f} s. Reproduce: `{result.get('command', '')}`", "",
             "| mini-batch | records | KiB | seconds | answered | error lines | within the timeout |",
             "|---:|---:|---:|---:|---:|---:|---|"]
    for i, b in enumerate(result["mini_batches"], start=1):
        lines.append(f"| {i} | {b['records']} | {b['payload_bytes'] / 1024:.0f} | {b['seconds']:.1f} | "
                     f"{b['answered']} | {b['error_lines']} | {'yes' if b['on_time'] else 'NO'} |")
    lines += ["", f"{result['records']} records in {result['seconds']:.0f} s ({result['records_per_s']:.2f} a second); "
              f"largest record {result['largest_record_bytes'] / 1024:.0f} KiB, within MaxPayloadInMB: "
              f"{'yes' if result['records_within_max_payload'] else 'NO (SageMaker fails the job)'}; "
              f"every mini-batch answered in time with a line per record: {'yes' if result['held'] else 'NO'}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.transform", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", help="the model folder (default: the embedded model)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="InvocationsTimeoutInSeconds, also given to the server as ADAPTER_BATCH_TIMEOUT_S")
    parser.add_argument("--payload-kb", type=int, help="fill mini-batches to this much, not MaxPayloadInMB")
    parser.add_argument("--strategy", choices=["MULTI_RECORD", "SINGLE_RECORD"],
                        help="send batches this way whatever /execution-parameters says (default: as it says)")
    parser.add_argument("--batches", type=int, help="mini-batches to send (default: MaxConcurrentTransforms)")
    parser.add_argument("--single-records", type=int, default=40, help="records to send for SINGLE_RECORD")
    parser.add_argument("--never-fits-every", type=int, default=200,
                        help="every Nth record is one that cannot be answered (0: none)")
    parser.add_argument("--large-record", choices=["decisions", "padded"],
                        help="add a valid record of more than 1 MiB, in a mini-batch of its own")
    parser.add_argument("--out", type=Path, default=Path("benchmark-results"))
    args = parser.parse_args(argv)

    from decision_adapter.decisions.model_files import embedded_model_dir

    from .servers import adapter

    args.out.mkdir(parents=True, exist_ok=True)
    os.environ["ADAPTER_BATCH_TIMEOUT_S"] = str(int(args.timeout))
    os.environ["ADAPTER_DEPLOYMENT"] = "transform"  # as endpoint_client transform deploys it
    model_dir = args.model_dir or str(embedded_model_dir())
    with Provenance("benchmarks.transform", argv) as provenance:
        with adapter(model_dir, args.threads, 0, args.out / "transform-adapter.log", provenance=provenance) as base:
            result = run(base, timeout_s=args.timeout, payload_kb=args.payload_kb, batches=args.batches,
                         single_records=args.single_records, never_fits_every=args.never_fits_every,
                         strategy=args.strategy, large=args.large_record)
    result["model"] = Path(model_dir).name
    result["command"] = provenance.command
    result["provenance"] = provenance.record()
    (args.out / "transform.json").write_text(json.dumps(result, indent=1) + "\n")
    table = markdown(result)
    (args.out / "transform.md").write_text(table)
    print(table)
    return 0 if result["held"] else 1


if __name__ == "__main__":
    sys.exit(main())
