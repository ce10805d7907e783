"""``python -m endpoint_client preflight -c env=NAME``: what a deploy of the environment needs, checked before it.

Read-only; run it before ``npx cdk diff`` and ``npx cdk deploy``. Each line is one check:

1. **pins**: as ``check-pins`` without ``--protect``: each listed endpoint's image exists as a Docker schema 2
   manifest and is protected from lifecycle expiry, and the model archive exists; an environment pinned from
   another (artifacts_from) also has its pins checked against the acceptance report promote recorded for them (as
   ``promote --verify``). Where the source is in another account these credentials may not read its artifacts:
   one failed line names the source's operator policy to check them with, and the other checks still run.
2. **quota**: per instance type, the SageMaker Service Quota "<type> for endpoint usage" covers the most instances
   this environment's endpoints can hold at once (the largest fleet, ``max_instance_count``, plus what its update
   provisions beside it: a whole second fleet for blue/green, half the fleet for rolling; stacks/updates.py) plus
   what the account's other endpoints run now. Every GPU pool is sized as if the whole fleet fell back to it; a
   first pool that cannot hold it fails, a later pool only warns (a fallback to it would fail).
3. **instance types**: a deployed endpoint whose instance type or pools cdk.json changes must not have auto scaling
   registered: SageMaker refuses UpdateEndpoint then. Deploy once with ``autoscaling`` false first
   (docs/deploy.md, "Change the instance type or the pools").

Exit codes: 0 every check passed (warnings allowed), 1 a check failed or could not be made (a quota that cannot be
read counts as failed), 2 bad arguments or cdk.json, 4 no region or credentials.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from botocore.exceptions import BotoCoreError, ClientError

from endpoint_client.deployment import EXIT_FAILED, Aws, CommandError, add_common_arguments, error_code, report_checks
from endpoint_client.pins import check_pins, denied, source_operator
from endpoint_client.promote import verify_promoted
from stacks import updates
from stacks.config import EnvironmentConfig

VARIANT_NAME = "AllTraffic"
# Kinds whose capacity is scarce: they roll instead of going blue/green (stacks/endpoint_specs.py).
SCARCE_KINDS = ("gpu",)


@dataclass(frozen=True)
class Check:
    state: str          # ok | warn | fail | unchecked
    subject: str
    detail: str

    @property
    def passed(self) -> bool:
        return self.state in ("ok", "warn")

    def line(self) -> str:
        return f"{self.state:11} {self.subject}: {self.detail}"


@dataclass(frozen=True)
class Need:
    """Instances of one type that one endpoint of this environment can hold at once."""
    endpoint: str
    instance_type: str
    count: int
    fallback: bool           # a GPU pool after the first: used only when the earlier pools have no capacity
    why: str


def deployed_kinds(config: EnvironmentConfig) -> list[str]:
    """The endpoints this environment's deploy creates: listed, and pinned."""
    return [kind for kind in config.endpoints
            if config.pins.images.of(kind) is not None and config.pins.model is not None]


def needs(config: EnvironmentConfig) -> list[Need]:
    found = []
    for kind in deployed_kinds(config):
        settings = config.endpoint_settings(kind)
        update = updates.plan(scarce_capacity=kind in SCARCE_KINDS,
                              initial_instance_count=settings.initial_instance_count)
        peak = updates.peak_instances(max_instance_count=settings.max_instance_count, update=update,
                                      scaling_attached=settings.autoscaling,
                                      initial_instance_count=settings.initial_instance_count)
        why = (f"{settings.max_instance_count} at most, plus {peak - settings.max_instance_count} during a "
               f"{update.strategy.replace('_', '/')} update")
        for position, instance_type in enumerate(settings.variant_instance_types):
            found.append(Need(config.endpoint_name(kind), instance_type, peak, fallback=position > 0, why=why))
    return found


def endpoint_quotas(service_quotas: Any, instance_types: Iterable[str]) -> dict[str, float]:
    """{instance type: its "<type> for endpoint usage" quota value}, from the account's applied values, else the
    defaults. Raises CommandError when Service Quotas cannot be read."""
    wanted = {f"{t} for endpoint usage": t for t in instance_types}
    found: dict[str, float] = {}
    errors = []
    # The account's values (applied increases), then AWS's defaults for what the account never changed.
    for operation in ("list_service_quotas", "list_aws_default_service_quotas"):
        try:
            for page in service_quotas.get_paginator(operation).paginate(ServiceCode="sagemaker"):
                for quota in page.get("Quotas", []):
                    name = quota.get("QuotaName")
                    if name in wanted and wanted[name] not in found:
                        found[wanted[name]] = float(quota["Value"])
        except (ClientError, BotoCoreError) as error:
            code = error_code(error) if isinstance(error, ClientError) else type(error).__name__
            errors.append(f"{operation}: {code or error}")
            continue
        if len(found) == len(wanted):
            break
    if errors and not found:
        raise CommandError(f"Service Quotas for sagemaker cannot be read ({'; '.join(errors)})", EXIT_FAILED)
    return found


def instances_elsewhere(sagemaker: Any, own_endpoints: set[str]) -> dict[str, int]:
    """{instance type: instances} that the account's other endpoints run now."""
    found: dict[str, int] = defaultdict(int)
    for page in sagemaker.get_paginator("list_endpoints").paginate():
        for summary in page.get("Endpoints", []):
            name = summary["EndpointName"]
            if name in own_endpoints:
                continue
            for instance_type, count in _running(sagemaker, name).items():
                found[instance_type] += count
    return dict(found)


def _running(sagemaker: Any, endpoint_name: str) -> dict[str, int]:
    description = sagemaker.describe_endpoint(EndpointName=endpoint_name)
    configured = {variant["VariantName"]: variant for variant in sagemaker.describe_endpoint_config(
        EndpointConfigName=description["EndpointConfigName"])["ProductionVariants"]}
    found: dict[str, int] = defaultdict(int)
    for variant in description.get("ProductionVariants", []):
        if variant.get("InstancePools"):
            for pool in variant["InstancePools"]:
                found[pool["InstanceType"]] += pool.get("CurrentInstanceCount", 0)
        elif variant["VariantName"] in configured and configured[variant["VariantName"]].get("InstanceType"):
            found[configured[variant["VariantName"]]["InstanceType"]] += variant.get("CurrentInstanceCount", 0)
    return dict(found)


def quota_checks(config: EnvironmentConfig, aws: Aws) -> list[Check]:
    wanted = needs(config)
    types = sorted({need.instance_type for need in wanted})
    if not types:
        return []
    try:
        quotas = endpoint_quotas(aws.client("service-quotas"), types)
    except CommandError as error:
        return [Check("unchecked", f"quota {t} for endpoint usage", str(error)) for t in types]
    elsewhere = instances_elsewhere(aws.client("sagemaker"), {config.endpoint_name(k) for k in config.endpoints})
    checks = []
    for instance_type in types:
        mine = [need for need in wanted if need.instance_type == instance_type]
        total = sum(need.count for need in mine) + elsewhere.get(instance_type, 0)
        parts = "; ".join(f"{need.endpoint}: {need.count} ({need.why}"
                          f"{', if the whole fleet falls back to it' if need.fallback else ''})" for need in mine)
        if elsewhere.get(instance_type):
            parts += f"; other endpoints of the account run {elsewhere[instance_type]}"
        subject = f"quota {instance_type} for endpoint usage"
        if instance_type not in quotas:
            checks.append(Check("unchecked", subject, f"needs {total} ({parts}); Service Quotas has no such quota"))
            continue
        quota = quotas[instance_type]
        if total <= quota:
            checks.append(Check("ok", subject, f"needs {total} of {quota:g} ({parts})"))
        elif all(need.fallback for need in mine):
            checks.append(Check("warn", subject, f"needs {total}, quota {quota:g} ({parts}): a fallback to this pool "
                                                 f"would fail"))
        else:
            checks.append(Check("fail", subject, f"needs {total}, quota {quota:g} ({parts}): request an increase "
                                                 f"in Service Quotas, or lower max_instance_count"))
    return checks


def instance_type_checks(config: EnvironmentConfig, aws: Aws) -> list[Check]:
    sagemaker, scaling = aws.client("sagemaker"), aws.client("application-autoscaling")
    checks = []
    for kind in deployed_kinds(config):
        name = config.endpoint_name(kind)
        try:
            description = sagemaker.describe_endpoint(EndpointName=name)
        except ClientError as error:
            if error_code(error) in ("ValidationException", "ResourceNotFound"):
                continue            # not deployed yet: nothing to change
            raise
        (variant,) = [v for v in sagemaker.describe_endpoint_config(
            EndpointConfigName=description["EndpointConfigName"])["ProductionVariants"]
            if v["VariantName"] == VARIANT_NAME]
        deployed = tuple(p["InstanceType"] for p in variant.get("InstancePools") or []) or (variant["InstanceType"],)
        wanted = config.endpoint_settings(kind).variant_instance_types
        subject = f"instance types of {name}"
        if deployed == wanted:
            checks.append(Check("ok", subject, f"{', '.join(wanted)}, unchanged"))
            continue
        registered = scaling.describe_scalable_targets(
            ServiceNamespace="sagemaker", ResourceIds=[f"endpoint/{name}/variant/{VARIANT_NAME}"],
            ScalableDimension="sagemaker:variant:DesiredInstanceCount")["ScalableTargets"]
        change = f"{', '.join(deployed)} -> {', '.join(wanted)}"
        if registered:
            checks.append(Check("fail", subject, f"{change} while auto scaling is registered: SageMaker refuses the "
                                                 f"update. Deploy the current types with {config.key(kind)}.autoscaling "
                                                 f"false first, then this change (docs/deploy.md, Change the "
                                                 f"instance type or the pools)"))
        else:
            checks.append(Check("ok", subject, f"{change}; auto scaling is detached, so the update can proceed"))
    return checks


def pin_checks(config: EnvironmentConfig, aws: Aws) -> list[Check]:
    try:
        statuses = check_pins(config, aws, protect=False)
    except CommandError as error:
        return [Check("fail", "pins", str(error))]
    # check-pins' own line: its state (ok, missing, unsupported, unprotected) says what is wrong.
    return [Check("ok" if status.ok else "fail", status.key, f"{status.state} {status.line().split(': ', 1)[1]}")
            for status in statuses]


def acceptance_checks(config: EnvironmentConfig, aws: Aws) -> list[Check]:
    """An environment pinned from another (artifacts_from): its pins against the acceptance report promote recorded
    for them (promote --verify's check). Across accounts these credentials may not read the source's bucket: a
    failed line naming the operator to use."""
    if config.artifacts_from is None or config.pins.acceptance is None:
        return []
    subject = config.key("pins", "acceptance")
    try:
        return [Check("ok", subject, verify_promoted(config, aws.client("s3")))]
    except CommandError as error:
        return [Check("fail", subject, str(error))]
    except ClientError as error:
        if not denied(error):
            return [Check("fail", subject, f"{error_code(error)}: the report cannot be read")]
        return [Check("fail", subject, f"{error_code(error)} with these credentials: check it with "
                                       f"{source_operator(config)}: python -m endpoint_client promote --verify --from "
                                       f"{config.artifacts_from} --to {config.name}")]


def preflight(config: EnvironmentConfig, aws: Aws) -> list[Check]:
    return [*pin_checks(config, aws), *acceptance_checks(config, aws), *quota_checks(config, aws),
            *instance_type_checks(config, aws)]


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m endpoint_client preflight",
        description="Before a deploy: the pins exist as SageMaker can pull them, the Service Quotas cover the "
                    "largest fleet and its update, and no instance type changes under registered auto scaling.")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    return report_checks("preflight", args, preflight, lambda check: check.passed)
