"""What the operator commands (check-pins, preflight, transform, acceptance, promote) know about a deployment,
without the CDK.

They read an environment from cdk.json with the CDK app's own validation (stacks/config.py, which imports no
CDK), the names CloudFormation generated from the stacks' outputs (the artifacts stack's bucket and repository,
an endpoint stack's Model), and what an endpoint serves (:func:`served_by`: its Model's image and model archive).
The commands of one environment take ``-c env=NAME`` as ``npx cdk`` does.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError, NoCredentialsError, PartialCredentialsError

from stacks.config import ConfigError, EnvironmentConfig, load_environment

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CONFIGURATION = 0, 1, 2, 4


class CommandError(Exception):
    """A failure the command reports on one line and exits with ``exit_code``."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE):
        super().__init__(message)
        self.exit_code = exit_code


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--context", action="append", default=[], metavar="KEY=VALUE",
                        help="as for npx cdk; env=NAME chooses the cdk.json environment (required)")
    add_aws_arguments(parser)


def add_aws_arguments(parser: argparse.ArgumentParser) -> None:
    """Where cdk.json is and how AWS is reached: every command's, whichever environments it names."""
    parser.add_argument("--cdk-json", type=Path, default=Path("cdk.json"),
                        help="the CDK app's cdk.json (default ./cdk.json; model_build/pins.json beside it)")
    parser.add_argument("--region", help="AWS region (default: the environment's in cdk.json, else the AWS "
                                         "configuration's)")
    parser.add_argument("--endpoint-url", help="another endpoint for every AWS API (tests)")


def load_config(args: argparse.Namespace) -> EnvironmentConfig:
    context = {}
    for pair in args.context:
        key, sep, value = pair.partition("=")
        if not sep:
            raise CommandError(f"-c {pair}: expected KEY=VALUE")
        context[key] = value
    try:
        cdk_json = json.loads(args.cdk_json.read_text())
    except (OSError, ValueError) as error:
        raise CommandError(f"cannot read {args.cdk_json}: {error}") from None
    return environment_of(cdk_json, context.get("env"), args.cdk_json)


def environment_of(cdk_json: Any, env_name: Any, path: Path) -> EnvironmentConfig:
    """``environments.<env_name>`` of the parsed cdk.json at ``path``, validated with model_build/pins.json beside
    it, as app.py validates it."""
    try:
        pins = json.loads((path.resolve().parent / "model_build" / "pins.json").read_text())
    except (OSError, ValueError) as error:
        raise CommandError(f"cannot read the model_build/pins.json beside {path}: {error}") from None
    environments = cdk_json.get("context", {}).get("environments") if isinstance(cdk_json, dict) else None
    try:
        return load_environment(environments, env_name, model_pins=sorted(pins["pins"]))
    except ConfigError as error:
        raise CommandError(f"cdk.json: {error}") from None


@dataclass
class Aws:
    """Clients of one session (region, endpoint) with the SDK's standard retries."""
    session: boto3.session.Session
    endpoint_url: str | None

    def client(self, service: str) -> Any:
        return self.session.client(service, endpoint_url=self.endpoint_url,
                                   config=Config(retries={"mode": "standard", "max_attempts": 5}))


def aws_for(args: argparse.Namespace, config: EnvironmentConfig) -> Aws:
    session = boto3.session.Session(region_name=args.region or config.region)
    if session.region_name is None:
        raise CommandError("no AWS region: pass --region, set it in cdk.json or configure one", EXIT_CONFIGURATION)
    return Aws(session=session, endpoint_url=args.endpoint_url)


def report_checks(command: str, args: argparse.Namespace,
                  checks_for: Callable[[EnvironmentConfig, Aws], Sequence[Any]], passed: Callable[[Any], bool]) -> int:
    """A read-only check command (check-pins, preflight): each check's ``line()`` on stdout; EXIT_OK when every one
    passed, EXIT_FAILED otherwise; a CommandError or missing credentials on one line of stderr, with its code."""
    try:
        config = load_config(args)
        checks = checks_for(config, aws_for(args, config))
    except CommandError as error:
        print(f"endpoint_client {command}: {error}", file=sys.stderr)
        return error.exit_code
    except (NoCredentialsError, PartialCredentialsError) as error:
        print(f"endpoint_client {command}: no AWS credentials: {error}", file=sys.stderr)
        return EXIT_CONFIGURATION
    except ClientError as error:    # one line, never a traceback: what AWS refused, and its message
        print(f"endpoint_client {command}: {error_code(error) or 'error'}: "
              f"{error.response.get('Error', {}).get('Message', error)}", file=sys.stderr)
        return EXIT_FAILED
    for check in checks:
        print(check.line())
    return EXIT_OK if all(passed(check) for check in checks) else EXIT_FAILED


def stack_outputs(cloudformation: Any, stack_name: str, required: Sequence[str]) -> dict[str, str]:
    """The stack's outputs by key; CommandError when the stack or one of ``required`` is missing."""
    try:
        (stack,) = cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "ValidationError":
            raise CommandError(f"stack {stack_name} is not deployed (npx cdk deploy {stack_name})",
                               EXIT_FAILED) from None
        raise
    outputs = {output["OutputKey"]: output["OutputValue"] for output in stack.get("Outputs", [])}
    missing = [key for key in required if key not in outputs]
    if missing:
        raise CommandError(f"stack {stack_name} has no output {', '.join(missing)} (deployed from an older "
                           f"version, or without its endpoint?)", EXIT_FAILED)
    return outputs


def error_code(error: ClientError) -> str:
    return error.response.get("Error", {}).get("Code", "")


# An endpoint in any other state (Creating, Updating, SystemUpdating, RollingBack, UpdateRollbackFailed, Deleting,
# Failed, OutOfService) is changing or broken: what it serves now is not what it will serve.
SERVING = "InService"


@dataclass(frozen=True)
class Served:
    """What an endpoint serves: DescribeEndpoint -> its EndpointConfig -> the variant's Model -> PrimaryContainer."""
    endpoint_name: str
    status: str
    endpoint_config_name: str
    model_name: str
    image: str              # PrimaryContainer.Image: '<repository URI>@sha256:...' as the endpoint stack pins it
    model_data_url: str     # s3://bucket/key: ModelDataUrl, or ModelDataSource.S3DataSource.S3Uri

    def artifacts(self) -> dict[str, str]:
        """What an acceptance report records and promote compares."""
        return {"endpoint_name": self.endpoint_name, "endpoint_config_name": self.endpoint_config_name,
                "model_name": self.model_name, "image": self.image, "model_data_url": self.model_data_url}


def served_by(sagemaker: Any, endpoint_name: str) -> Served:
    """The endpoint's Served; CommandError (EXIT_FAILED) when it does not exist, has other than one variant or its
    Model has no model data in S3 (the endpoint stacks deploy one variant with one model archive)."""
    try:
        endpoint = sagemaker.describe_endpoint(EndpointName=endpoint_name)
        config = sagemaker.describe_endpoint_config(EndpointConfigName=endpoint["EndpointConfigName"])
        variants = config["ProductionVariants"]
        if len(variants) != 1:
            raise CommandError(f"{endpoint_name}: EndpointConfig {config['EndpointConfigName']} has {len(variants)} "
                               f"variants; the endpoint stacks deploy one", EXIT_FAILED)
        model = sagemaker.describe_model(ModelName=variants[0]["ModelName"])
    except ClientError as error:
        raise CommandError(f"{endpoint_name}: {error_code(error) or 'error'}: "
                           f"{error.response.get('Error', {}).get('Message', error)}", EXIT_FAILED) from None
    container = model.get("PrimaryContainer", {})
    source = container.get("ModelDataSource", {}).get("S3DataSource", {})
    model_data_url = container.get("ModelDataUrl") or source.get("S3Uri")
    if not model_data_url:
        raise CommandError(f"{endpoint_name}: Model {model['ModelName']} has no model data in S3", EXIT_FAILED)
    image = container.get("Image", "")
    # What SageMaker pulled (DescribeEndpoint's DeployedImages, where it reports them): the digest it resolved must be
    # the Model's, or the Model's image is not what runs.
    resolved = {deployed["ResolvedImage"] for variant in endpoint.get("ProductionVariants", [])
                for deployed in variant.get("DeployedImages", []) if deployed.get("ResolvedImage")}
    other = sorted(r for r in resolved if r.rpartition("@")[2] != image.rpartition("@")[2])
    if other:
        raise CommandError(f"{endpoint_name}: runs {', '.join(other)}, not its Model's {image}", EXIT_FAILED)
    return Served(endpoint_name=endpoint_name, status=endpoint["EndpointStatus"],
                  endpoint_config_name=config["EndpointConfigName"], model_name=model["ModelName"],
                  image=image, model_data_url=model_data_url)
