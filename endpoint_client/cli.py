"""The command line: read the request file, invoke the endpoint (endpoint_client.invoke), print the result.

``invoke`` as the first argument is the same command, named. With ``--async`` the endpoint is an asynchronous one
(endpoint_client.invoke_async): the body goes to ``--input-location`` in S3, and the command waits for the output or
the failure SageMaker writes and prints it; with ``--local-container URL`` it plays SageMaker's side against a
container on this machine (the adapter with ``ADAPTER_DEPLOYMENT=async``), with no AWS at all.

``check-pins`` (endpoint_client.pins), ``preflight`` (endpoint_client.preflight), ``transform``
(endpoint_client.transform), ``acceptance`` (endpoint_client.acceptance), ``promote`` (endpoint_client.promote) and
``capture`` (endpoint_client.capture) as the first argument run those commands instead; each has its own --help.

Exit codes: 0 the result is printed on stdout; 1 the endpoint or SageMaker rejected the request (not retried; with
--async: the failure it wrote, printed on stderr); 2 bad arguments or request file; 3 still failing after the last
retry (with --async: no answer within --wait); 4 no AWS region or credentials.
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
from endpoint_client.invoke_async import DEFAULT_INVOCATION_TIMEOUT_S, AsyncFailed, invoke_async, invoke_local

EXIT_OK, EXIT_REJECTED, EXIT_USAGE, EXIT_GAVE_UP, EXIT_CONFIGURATION = 0, 1, 2, 3, 4


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m endpoint_client",
        description="Send a request file to a SageMaker endpoint and print the result (retries 503 and throttling "
                    "with capped exponential backoff and full jitter). Other commands: python -m endpoint_client "
                    "check-pins | preflight | transform | acceptance | promote | capture --help.")
    parser.add_argument("--endpoint-name", help="e.g. decision-dev-cpu (a stack output); required, but with --async "
                                                "and -c env=NAME it defaults to that environment's async endpoint")
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
    asynchronous = parser.add_argument_group("asynchronous endpoints (--async)")
    asynchronous.add_argument("--async", dest="asynchronous", action="store_true",
                              help="invoke an asynchronous endpoint: upload the body, invoke, wait for its output or "
                                   "failure and print it")
    asynchronous.add_argument("-c", "--context", action="append", default=[], metavar="env=NAME",
                              help="the cdk.json environment whose async endpoint to invoke: its name, its input "
                                   "prefix in the artifact bucket and its invocation timeout come from cdk.json and the "
                                   "artifacts stack's outputs, as for the other commands")
    asynchronous.add_argument("--cdk-json", type=Path, default=Path("cdk.json"), help="with -c (default ./cdk.json)")
    asynchronous.add_argument("--input-location", metavar="S3_PREFIX",
                              help="s3://bucket/prefix/ the endpoint reads bodies from (the async kind's input_prefix "
                                   "in the artifact bucket); the body is uploaded there as <inference id>.json")
    asynchronous.add_argument("--inference-id", help="the request's InferenceId (default: a random one)")
    asynchronous.add_argument("--invocation-timeout", type=_positive_int,
                              help="InvocationTimeoutSeconds for this request, 1 to 3600 (default: the endpoint's)")
    asynchronous.add_argument("--wait", type=_non_negative_float, default=3600.0,
                              help="seconds to wait for the output or the failure (default 3600)")
    asynchronous.add_argument("--poll", type=_non_negative_float, default=5.0,
                              help="seconds between reads of the output and failure locations (default 5)")
    asynchronous.add_argument("--local-container", metavar="URL",
                              help="play SageMaker's side against this container (e.g. http://127.0.0.1:8080 "
                                   "started with ADAPTER_DEPLOYMENT=async) instead of AWS")
    asynchronous.add_argument("--local-dir", type=Path, default=Path("async-invocations"),
                              help="with --local-container: where input/, output/ and failure/ are written "
                                   "(default ./async-invocations)")
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
    if argv and argv[0] == "invoke":
        argv = argv[1:]
    parser = _parser()
    args = parser.parse_args(argv)
    if args.asynchronous and not (args.input_location or args.local_container or args.context):
        parser.error("--async needs -c env=NAME, --input-location s3://bucket/prefix/ or --local-container URL")
    if not args.asynchronous and (args.input_location or args.local_container or args.context):
        parser.error("-c, --input-location and --local-container go with --async")
    if args.endpoint_name is None and not (args.asynchronous and args.context):
        parser.error("--endpoint-name is required (with --async, -c env=NAME names the environment's async endpoint)")
    try:
        body = _read_body(args.file, args.content_type)
    except OSError as error:
        _error(f"cannot read {args.file}: {error.strerror or error}")
        return EXIT_USAGE
    except ValueError as error:
        _error(f"{args.file} is not valid {args.content_type}: {error}")
        return EXIT_USAGE
    if args.asynchronous:
        return _invoke_async(args, body)
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


def _invoke_async(args: argparse.Namespace, body: bytes) -> int:
    """``--async``: one asynchronous invocation, on AWS (or moto) or against a local container."""
    from endpoint_client.deployment import CommandError  # cdk.json's validation, for -c env=NAME only

    try:
        if args.local_container:
            answer = invoke_local(args.local_container, args.local_dir, body=body, content_type=args.content_type,
                                  accept=args.accept, inference_id=args.inference_id,
                                  invocation_timeout_s=args.invocation_timeout or DEFAULT_INVOCATION_TIMEOUT_S)
        else:
            if args.context:
                _async_endpoint_of_environment(args)
            session = boto3.session.Session(region_name=args.region)
            config = Config(connect_timeout=10, read_timeout=args.read_timeout)
            answer = invoke_async(session.client("sagemaker-runtime", endpoint_url=args.endpoint_url, config=config),
                                  session.client("s3", endpoint_url=args.endpoint_url, config=config),
                                  endpoint_name=args.endpoint_name, input_prefix=args.input_location, body=body,
                                  content_type=args.content_type, accept=args.accept,
                                  inference_id=args.inference_id, invocation_timeout_s=args.invocation_timeout,
                                  wait_s=args.wait, poll_s=args.poll, log=_error)
    except NoRegionError:
        _error("no AWS region: pass --region or configure one (AWS_REGION, ~/.aws/config)")
        return EXIT_CONFIGURATION
    except (NoCredentialsError, PartialCredentialsError) as error:
        _error(f"no AWS credentials: {error}")
        return EXIT_CONFIGURATION
    except ValueError as error:
        _error(str(error))
        return EXIT_USAGE
    except CommandError as error:
        _error(str(error))
        return error.exit_code
    except AsyncFailed as failure:
        _error(f"{args.endpoint_name}: {failure}")
        return EXIT_GAVE_UP
    if answer.failed:
        _error(f"{args.endpoint_name}: {answer.inference_id} failed after {answer.waited_s:.1f} s "
               f"({answer.location}): {answer.body.decode('utf-8', errors='replace')}")
        return EXIT_REJECTED
    _error(f"{answer.inference_id} answered in {answer.waited_s:.1f} s ({answer.location})")
    _print_result(answer.body, args.accept)
    return EXIT_OK


def _async_endpoint_of_environment(args: argparse.Namespace) -> None:
    """``-c env=NAME``: fill in what was not given from the environment's async kind (cdk.json) and its artifact
    bucket (the artifacts stack's output): the endpoint's name, its input prefix and the invocation timeout the
    adapter's deadline is set from (CloudFormation cannot set it on the endpoint: each request carries it)."""
    from endpoint_client.deployment import CommandError, aws_for, load_config, stack_outputs

    config = load_config(args)
    if "async" not in config.endpoints:
        raise CommandError(f"environment {config.name} has no async endpoint (its endpoints: "
                           f"{', '.join(config.endpoints)})")
    settings = config.endpoint_settings("async")
    args.endpoint_name = args.endpoint_name or config.endpoint_name("async")
    args.invocation_timeout = args.invocation_timeout or settings.invocation_timeout_s
    if not args.input_location:
        aws = aws_for(args, config)
        bucket = stack_outputs(aws.client("cloudformation"), config.artifacts_stack_name,
                               ["ArtifactBucketName"])["ArtifactBucketName"]
        args.input_location = f"s3://{bucket}/{settings.input_prefix}"
    args.region = args.region or config.region
