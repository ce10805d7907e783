"""The command line: read the request file, invoke the endpoint (endpoint_client.invoke), print the result.

``check-pins`` (endpoint_client.pins), ``preflight`` (endpoint_client.preflight), ``transform``
(endpoint_client.transform), ``acceptance`` (endpoint_client.acceptance), ``promote`` (endpoint_client.promote) and
``capture`` (endpoint_client.capture) as the first argument run those commands instead; each has its own --help.

Exit codes: 0 the result is printed on stdout; 1 the endpoint or SageMaker rejected the request (not retried);
2 bad arguments or request file; 3 still failing after the last retry; 4 no AWS region or credentials.
Progress and errors go to stderr as ``endpoint_client: ...``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

import boto3
from botocore.config import Config
from botocore.exceptions import NoCredentialsError, NoRegionError, PartialCredentialsError

from endpoint_client.invoke import InvokeFailed, RetryPolicy, invoke

EXIT_OK, EXIT_REJECTED, EXIT_USAGE, EXIT_GAVE_UP, EXIT_CONFIGURATION = 0, 1, 2, 3, 4


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m endpoint_client",
        description="Send a request file to a SageMaker endpoint and print the result (retries 503 and throttling "
                    "with capped exponential backoff and full jitter). Other commands: python -m endpoint_client "
                    "check-pins | preflight | transform | acceptance | promote | capture --help.")
    parser.add_argument("--endpoint-name", required=True, help="e.g. decision-dev-cpu (a stack output)")
    parser.add_argument("--file", required=True, type=Path,
                        help="request body, e.g. examples/support-route.json; '-' reads stdin")
    parser.add_argument("--region", help="AWS region (default: the AWS configuration's)")
    parser.add_argument("--content-type", default="application/json",
                        help="application/json (default) or application/jsonlines")
    parser.add_argument("--accept", default="application/json")
    parser.add_argument("--endpoint-url", help="another SageMaker Runtime endpoint (tests, VPC endpoints)")
    parser.add_argument("--max-attempts", type=_positive_int, default=6, help="requests in all (default 6)")
    parser.add_argument("--base-delay", type=_non_negative_float, default=0.5,
                        help="seconds; retry n waits up to base * 2**n (default 0.5)")
    parser.add_argument("--max-delay", type=_non_negative_float, default=20.0,
                        help="cap on one wait in seconds (default 20)")
    parser.add_argument("--read-timeout", type=_non_negative_float, default=120.0,
                        help="seconds to wait for an answer (default 120)")
    return parser


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def _read_body(path: Path, content_type: str) -> bytes:
    """The file's bytes, after checking that JSON bodies parse (a typo fails here, not as a 400 later)."""
    body = sys.stdin.buffer.read() if str(path) == "-" else path.read_bytes()
    kind = content_type.split(";")[0].strip().lower()
    if kind == "application/json":
        json.loads(body)
    elif kind in ("application/jsonlines", "application/x-jsonlines"):
        for number, line in enumerate(body.splitlines(), start=1):
            if line.strip():
                try:
                    json.loads(line)
                except ValueError as error:
                    raise ValueError(f"line {number}: {error}") from None
    return body


def _print_result(body: bytes, content_type: str) -> None:
    text = body.decode("utf-8", errors="replace")
    if content_type.split(";")[0].strip().lower() == "application/json":
        try:
            text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
        except ValueError:
            pass
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _error(message: str) -> None:
    print(f"endpoint_client: {message}", file=sys.stderr)


COMMANDS = {"check-pins": "endpoint_client.pins", "transform": "endpoint_client.transform",
            "preflight": "endpoint_client.preflight", "acceptance": "endpoint_client.acceptance",
            "promote": "endpoint_client.promote", "capture": "endpoint_client.capture"}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:
        import importlib
        return importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])
    args = _parser().parse_args(argv)
    try:
        body = _read_body(args.file, args.content_type)
    except OSError as error:
        _error(f"cannot read {args.file}: {error.strerror or error}")
        return EXIT_USAGE
    except ValueError as error:
        _error(f"{args.file} is not valid {args.content_type}: {error}")
        return EXIT_USAGE
    try:
        client = boto3.session.Session(region_name=args.region).client(
            "sagemaker-runtime", endpoint_url=args.endpoint_url,
            # One request per attempt: the retry policy is endpoint_client.invoke's alone.
            config=Config(retries={"total_max_attempts": 1}, connect_timeout=10, read_timeout=args.read_timeout))
    except NoRegionError:
        _error("no AWS region: pass --region or configure one (AWS_REGION, ~/.aws/config)")
        return EXIT_CONFIGURATION
    policy = RetryPolicy(max_attempts=args.max_attempts, base_delay_s=args.base_delay, max_delay_s=args.max_delay)
    try:
        result = invoke(client, endpoint_name=args.endpoint_name, body=body, content_type=args.content_type,
                        accept=args.accept, policy=policy, log=_error)
    except (NoCredentialsError, PartialCredentialsError) as error:
        _error(f"no AWS credentials: {error}")
        return EXIT_CONFIGURATION
    except InvokeFailed as failure:
        _error(f"{args.endpoint_name}: {failure}")
        return EXIT_GAVE_UP if failure.retryable else EXIT_REJECTED
    _print_result(result.body, result.content_type)
    return EXIT_OK
