#!/usr/bin/env python3
"""The CDK app: ``npx cdk synth|diff|deploy|destroy -c env=NAME``.

The only place that reads CDK context and the CLI's environment: it parses ``environments.<env>`` from cdk.json
once into a frozen EnvironmentConfig (stacks/config.py), builds the stacks of that environment (by lifecycle:
``<name_prefix>-artifacts``, ``-build`` (not where ``artifacts_from`` names the environment whose builds it
deploys), ``-monitoring``, ``-review`` (the pull-request diff role), ``-access`` (the operator, deployer and
invoker policies), ``-network`` (the VPC endpoints, only where ``vpc.create_endpoints`` is set) and one
``-endpoint-<kind>`` per endpoint kind, from its spec in stacks/endpoint_specs.py)
and applies cdk-nag's AwsSolutions checks, so that synthesis fails on any finding that is not acknowledged with
a reason.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Mapping

import aws_cdk as cdk  # noqa: E402
from cdk_nag import AwsSolutionsChecks  # noqa: E402

from stacks.access_stack import AccessStack  # noqa: E402
from stacks.artifacts_stack import ArtifactsStack  # noqa: E402
from stacks.build_stack import BuildStack  # noqa: E402
from stacks.config import ConfigError, EnvironmentConfig, load_environment  # noqa: E402
from stacks.endpoint_specs import endpoint_specs  # noqa: E402
from stacks.endpoint_stack import EndpointStack  # noqa: E402
from stacks.monitoring_stack import MonitoringStack  # noqa: E402
from stacks.network_stack import NetworkStack  # noqa: E402
from stacks.review_stack import ReviewStack  # noqa: E402

REPOSITORY_ROOT = Path(__file__).resolve().parent
MODEL_PINS_FILE = REPOSITORY_ROOT / "model_build" / "pins.json"


def model_pin_names() -> list[str]:
    return sorted(json.loads(MODEL_PINS_FILE.read_text())["pins"])


def build_app(*, context: Mapping[str, Any] | None = None, outdir: str | None = None,
              cli_environment: Mapping[str, str] | None = None) -> cdk.App:
    """The app with its stacks; tests call this with their own context and outdir."""
    app = cdk.App(context=dict(context) if context is not None else None, outdir=outdir)
    environ = os.environ if cli_environment is None else cli_environment
    config = load_environment(
        app.node.try_get_context("environments"), app.node.try_get_context("env"), model_pins=model_pin_names(),
        default_account=environ.get("CDK_DEFAULT_ACCOUNT"), default_region=environ.get("CDK_DEFAULT_REGION"))
    add_stacks(app, config)
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app


def add_stacks(app: cdk.App, config: EnvironmentConfig) -> dict[str, cdk.Stack]:
    """The environment's stacks by key: artifacts, build, monitoring, review, access and endpoint-<slug> per endpoint
    kind."""
    prefix = config.name_prefix
    common = {"env": cdk.Environment(account=config.account, region=config.region),
              "termination_protection": config.termination_protection}
    # Every resource carries them; the operator policy finds this environment's generated names by them.
    resource_tags = {"project": "decision-models", "environment": config.name}
    for key, value in resource_tags.items():
        cdk.Tags.of(app).add(key, value)

    artifacts = ArtifactsStack(app, f"{prefix}-artifacts", config=config, **common,
                               description=f"{prefix}: artifact bucket and image repository")
    # An environment that deploys another's artifacts (artifacts_from) builds nothing: no build stack at all.
    build = None if config.build is None else BuildStack(
        app, f"{prefix}-build", config=config, artifacts=artifacts, **common,
        description=f"{prefix}: CodeBuild projects for the model archive and the images")
    specs = endpoint_specs(config)
    monitoring = MonitoringStack(app, f"{prefix}-monitoring", config=config, specs=specs, **common,
                                 description=f"{prefix}: alarm topic and dashboard of the endpoints")
    review = ReviewStack(app, config.review_stack_name, config=config, **common,
                         description=f"{prefix}: the read-only role of pull requests' cdk diff")
    access = AccessStack(app, f"{prefix}-access", config=config, artifacts=artifacts,
                         alarm_topic=monitoring.alarm_topic, resource_tags=resource_tags, **common,
                         description=f"{prefix}: the managed policies of operators, deployers and invokers")
    access.add_stack_dependency(artifacts)
    stacks: dict[str, cdk.Stack] = {"artifacts": artifacts, "monitoring": monitoring, "review": review,
                                    "access": access, **({} if build is None else {"build": build})}
    # The VPC endpoints the endpoints' subnets need, where cdk.json's vpc.create_endpoints asks this environment to
    # create them.
    network = None
    if config.vpc is not None and config.vpc.create_endpoints is not None:
        network = stacks["network"] = NetworkStack(
            app, f"{prefix}-network", config=config, **common,
            description=f"{prefix}: the VPC endpoints of S3, ECR, CloudWatch Logs and STS the endpoints' subnets use")
    for spec in specs:
        endpoint = EndpointStack(app, spec.stack_name, spec=spec, artifacts=artifacts,
                                 alarm_topic=monitoring.alarm_topic, name_prefix=prefix,
                                 execution_role_name=config.execution_role_name(spec.kind),
                                 log_retention_days=config.endpoint_log_retention_days,
                                 retain_logs=config.retain_logs, **common,
                                 description=f"{prefix}: the {spec.title} endpoint on the pinned artifacts")
        # Its IAM statements import the artifact bucket's named export (ArtifactsStack.bucket_objects_arn).
        endpoint.add_stack_dependency(artifacts)
        if network is not None:
            # The image and the archive are pulled through the VPC endpoints: they exist before a Model does.
            endpoint.add_stack_dependency(network)
        stacks[f"endpoint-{spec.slug}"] = endpoint
    if build is not None:
        build.add_stack_dependency(artifacts)
    return stacks


def main() -> int:
    try:
        app = build_app()
    except ConfigError as error:
        print(f"cdk.json: {error}", file=sys.stderr)
        return 2
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
