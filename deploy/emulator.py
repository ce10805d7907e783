"""moto's server on loopback, for the deploy rehearsal (deploy/rehearse.py), with its gaps to real AWS closed.

Each change below makes the emulator do what the real service does; none changes what the stacks or the CLI send,
and none makes a resource type exist that moto's services do not implement (the types moto's CloudFormation
skips are listed in docs/deploy.md, "Deploy rehearsal (`make rehearse`)"). The changes apply to the moto of the
process that calls :func:`start`; ``make rehearse`` and its test run in a process of their own.

- **Generated ECR repository names.** CloudFormation names an ECR repository it generates a name for in lower
  case (ECR allows nothing else); moto reuses its generic ``<stack>-<LogicalId>-<suffix>`` and then refuses its own
  name ("Invalid parameter at 'repositoryName'"). Generated names of AWS::ECR::Repository are lower-cased here.
- **KMS key tags.** moto's AWS::KMS::Key handler passes CloudFormation's ``Key``/``Value`` tags to a tagger that
  wants KMS's ``TagKey``/``TagValue`` and fails the stack; they are converted.
- **SageMaker instance types and pools.** moto validates ``InstanceType`` against an old list without ml.c7i or
  ml.g6e, and knows no ``InstancePools`` (a variant must name an instance type or be serverless); here a variant's
  instance type, or each of its pools', is checked against the enum of botocore's SageMaker service model (the API's
  own), and a variant with pools and an instance type both is refused, as CreateEndpointConfig does.
- **S3 bucket versioning in templates.** moto's AWS::S3::Bucket handler ignores ``VersioningConfiguration``, so
  the artifact bucket came out unversioned and promote, which records the acceptance report's S3 version, found
  none; the bucket's versioning status is set as the template says.
- **AWS::SageMaker::Endpoint's EndpointName.** moto's handler ignores the property and generates a name;
  CloudFormation names the endpoint as the template says, which is how clients and alarms find it.
- **Imports, outputs and exports of change sets.** ``cdk deploy`` creates and updates stacks through change sets;
  moto creates a stack for a change set without the region's exports (so Fn::ImportValue fails), and its
  ExecuteChangeSet neither evaluates the template's Outputs nor registers its Exports (CreateStack and UpdateStack
  do), and it keeps executed change sets, which it then finds by name for any stack (the next ``cdk deploy`` waits
  forever for its "cdk-deploy-change-set" to go). Here a change set's stack sees the exports, and after it runs its
  outputs are evaluated, its exports replace the ones it had and the stack's change sets are removed, and
  DeleteChangeSet of a change set that is not there succeeds (moto fails with an UnboundLocalError) and
  DescribeChangeSet answers ChangeSetNotFoundException (moto: a ValidationError about a stack), as CloudFormation
  does: ``cdk deploy`` looks for and deletes a leftover "cdk-deploy-change-set" before every deploy. And a
  parameter passed with UsePreviousValue keeps its previous input (moto substitutes the value it resolved, so the
  CDK's BootstrapVersion, an SSM parameter name, became the parameter's value and broke every update).
- **AWS::CloudWatch::Alarm in templates.** moto's CloudWatch implements alarms (PutMetricAlarm, DescribeAlarms),
  but its CloudFormation has no handler for the resource type, so a template that refers to an alarm (the
  execution role's DescribeAlarms statement, the endpoint's rollback alarms) cannot be created. The handler here
  creates, replaces and deletes the alarm through moto's own PutMetricAlarm/DeleteAlarms with the template's
  properties, so the rehearsal can check the alarms that were really created.
- **AWS::IAM::OIDCProvider in templates.** moto's IAM implements OpenID Connect providers, but its CloudFormation
  has no handler for the resource type, so the review stack's role, whose trust names the provider's ARN, cannot be
  created. The handler here creates and deletes the provider through moto's own IAM with the template's properties.
- **Termination protection.** moto implements neither UpdateTerminationProtection, which ``cdk deploy`` calls for
  a stack with ``terminationProtection``, nor its effect on DeleteStack. Both are added as CloudFormation documents
  them: the flag is stored and shown by DescribeStacks, and DeleteStack of a protected stack fails with
  ``ValidationError`` "Stack [NAME] cannot be deleted while TerminationProtection is enabled".

``python -m deploy.emulator PORT`` serves until stopped (for trying the CLI by hand); :func:`start` serves in a
thread of the calling process.
"""

from __future__ import annotations

import socket
import sys
import time
from typing import Any

_PATCHED = False


def _patch() -> None:
    global _PATCHED
    if _PATCHED:
        return
    import botocore.session
    from moto.cloudformation import exceptions as cfn_exceptions
    from moto.cloudformation import models as cfn_models
    from moto.cloudformation import parsing
    from moto.cloudformation import responses as cfn_responses
    from moto.core.responses import ActionResult
    from moto.kms import models as kms_models
    from moto.sagemaker import models as sagemaker_models
    from moto.sagemaker.exceptions import ValidationError as SageMakerValidationError

    generate = parsing.generate_resource_name

    def generate_resource_name(resource_type: str, stack_name: str, logical_id: str) -> str:
        name = generate(resource_type, stack_name, logical_id)
        return name.lower() if resource_type == "AWS::ECR::Repository" else name

    parsing.generate_resource_name = generate_resource_name

    create_key = kms_models.KmsBackend.create_key

    def create_key_with_cfn_tags(self, *args: Any, tags: Any = None, **kwargs: Any):
        tags = [{"TagKey": t["Key"], "TagValue": t["Value"]} if "Key" in t else t for t in tags or []]
        return create_key(self, *args, tags=tags, **kwargs)

    kms_models.KmsBackend.create_key = create_key_with_cfn_tags

    instance_types = set(botocore.session.get_session().get_service_model("sagemaker")
                         .shape_for("ProductionVariantInstanceType").enum)

    def validate_instance_type(self, instance_type: str) -> None:
        if instance_type not in instance_types:
            raise SageMakerValidationError(message=f"Value '{instance_type}' at 'instanceType' failed to satisfy "
                                                   f"constraint: Member must satisfy enum value set")

    sagemaker_models.FakeEndpointConfig.validate_instance_type = validate_instance_type
    validate_variants = sagemaker_models.FakeEndpointConfig.validate_production_variants

    def validate_production_variants(self, production_variants: list[dict[str, Any]]) -> None:
        for variant in production_variants:
            pools = variant.get("InstancePools")
            if pools and "InstanceType" in variant:
                raise SageMakerValidationError(message="A production variant has either InstanceType or "
                                                       "InstancePools, not both")
            for pool in pools or ():
                validate_instance_type(self, pool["InstanceType"])
        validate_variants(self, [v for v in production_variants if not v.get("InstancePools")])

    sagemaker_models.FakeEndpointConfig.validate_production_variants = validate_production_variants
    sagemaker_models.FakeEndpoint.cloudformation_name_type = staticmethod(lambda: "EndpointName")

    from moto.s3 import models as s3_models
    create_bucket = s3_models.FakeBucket.create_from_cloudformation_json.__func__

    def create_bucket_with_versioning(cls, resource_name: str, cloudformation_json: Any, account_id: str,
                                      region_name: str, **kwargs: Any):
        bucket = create_bucket(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs)
        status = cloudformation_json.get("Properties", {}).get("VersioningConfiguration", {}).get("Status")
        if status:
            bucket.versioning_status = status
        return bucket

    s3_models.FakeBucket.create_from_cloudformation_json = classmethod(create_bucket_with_versioning)

    _add_alarm_resource_type()
    _add_oidc_provider_resource_type()
    backend = cfn_models.CloudFormationBackend
    execute_change_set = backend.execute_change_set

    def execute_change_set_with_outputs(self, change_set_name: str, stack_name: str | None = None) -> None:
        execute_change_set(self, change_set_name, stack_name)
        change_set = self.change_sets.get(change_set_name) or next(
            c for c in self.change_sets.values() if c.change_set_name == change_set_name)
        stack = self.stacks[change_set.stack_id]
        stack._parse_template()
        stack.output_map = stack._create_output_map()
        for name in [name for name, export in self.exports.items() if export.exporting_stack_id == stack.stack_id]:
            del self.exports[name]
        for export in stack.exports:
            self.exports[export.name] = export
        for key in [key for key, other in self.change_sets.items() if other.stack.stack_id == stack.stack_id]:
            del self.change_sets[key]

    backend.execute_change_set = execute_change_set_with_outputs
    create_change_set = backend.create_change_set

    def create_change_set_with_imports(self, stack_name: str, *args: Any, **kwargs: Any):
        if kwargs.get("change_set_type") == "UPDATE" and kwargs.get("parameters"):
            (stack,) = [stack for stack in self.stacks.values() if stack.name == stack_name]
            resolved, given = stack.resource_map.resolved_parameters, stack.resource_map.input_parameters or {}
            parameters = {}
            for key, value in kwargs["parameters"].items():
                if key in resolved and value == resolved[key]:      # UsePreviousValue (moto resolved it)
                    if key in given:
                        parameters[key] = given[key]
                    continue                                         # it was the template's default
                parameters[key] = value
            kwargs["parameters"] = parameters
        created = create_change_set(self, stack_name, *args, **kwargs)
        for stack in self.stacks.values():
            if stack.name == stack_name:
                stack.cross_stack_resources = self.exports
                stack.resource_map.cross_stack_resources = self.exports
        return created

    backend.create_change_set = create_change_set_with_imports
    delete_change_set = backend.delete_change_set

    def delete_change_set_if_there(self, change_set_name: str) -> None:
        if change_set_name in self.change_sets or any(
                c.change_set_name == change_set_name for c in self.change_sets.values()):
            delete_change_set(self, change_set_name)

    backend.delete_change_set = delete_change_set_if_there
    describe_change_set = backend.describe_change_set

    class ChangeSetNotFound(cfn_exceptions.CloudFormationError):
        code = "ChangeSetNotFoundException"

    def describe_change_set_or_not_found(self, change_set_name: str) -> Any:
        if change_set_name in self.change_sets or any(
                c.change_set_name == change_set_name for c in self.change_sets.values()):
            return describe_change_set(self, change_set_name)
        raise ChangeSetNotFound(f"ChangeSet [{change_set_name}] does not exist")

    backend.describe_change_set = describe_change_set_or_not_found

    def update_termination_protection(self, name_or_id: str, enabled: bool) -> str:
        stack = self.get_stack(name_or_id)
        stack.enable_termination_protection = enabled
        return stack.stack_id

    backend.update_termination_protection = update_termination_protection
    delete_stack = backend.delete_stack

    def delete_protected_stack(self, name_or_stack_id: str) -> None:
        for stack in list(self.stacks.values()):
            if name_or_stack_id in (stack.stack_id, stack.name) and stack.enable_termination_protection:
                raise cfn_exceptions.ValidationError(
                    message=f"Stack [{stack.name}] cannot be deleted while TerminationProtection is enabled")
        delete_stack(self, name_or_stack_id)

    backend.delete_stack = delete_protected_stack

    def update_termination_protection_action(self) -> ActionResult:
        enabled = self._get_param("EnableTerminationProtection") in (True, "true", "True")
        stack_id = self.cloudformation_backend.update_termination_protection(self._get_param("StackName"), enabled)
        return ActionResult({"StackId": stack_id})

    cfn_responses.CloudFormationResponse.update_termination_protection = update_termination_protection_action
    _PATCHED = True


def _add_alarm_resource_type() -> None:
    from moto.cloudformation import parsing
    from moto.cloudformation.exceptions import UnformattedGetAttTemplateException
    from moto.cloudwatch.models import Dimension, Metric, MetricDataQuery, MetricStat, cloudwatch_backends
    from moto.core.common_models import CloudFormationModel

    def queries(metrics: list[dict[str, Any]] | None) -> list[MetricDataQuery] | None:
        if not metrics:
            return None
        found = []
        for query in metrics:
            stat = query.get("MetricStat")
            metric_stat = None if stat is None else MetricStat(
                metric=Metric(metric_name=stat["Metric"]["MetricName"], namespace=stat["Metric"].get("Namespace"),
                              dimensions=[Dimension(d["Name"], d["Value"]) for d in stat["Metric"].get("Dimensions", [])]),
                period=stat.get("Period"), stat=stat.get("Stat"), unit=stat.get("Unit"))
            found.append(MetricDataQuery(query_id=query["Id"], label=query.get("Label"), period=query.get("Period"),
                                         return_data=query.get("ReturnData"), expression=query.get("Expression"),
                                         metric_stat=metric_stat))
        return found

    class CloudFormationAlarm(CloudFormationModel):
        __module__ = "moto.cloudwatch.models"      # moto files its models by the service in the module's name

        def __init__(self, alarm: Any):
            self.alarm = alarm

        @staticmethod
        def cloudformation_name_type() -> str:
            return "AlarmName"

        @staticmethod
        def cloudformation_type() -> str:
            return "AWS::CloudWatch::Alarm"

        @classmethod
        def has_cfn_attr(cls, attr: str) -> bool:
            return attr == "Arn"

        def get_cfn_attribute(self, attribute_name: str) -> Any:
            if attribute_name == "Arn":
                return self.alarm.alarm_arn
            raise UnformattedGetAttTemplateException()

        @property
        def physical_resource_id(self) -> str:
            return self.alarm.name

        def is_created(self) -> bool:
            return True

        @classmethod
        def create_from_cloudformation_json(cls, resource_name: str, cloudformation_json: dict[str, Any],
                                            account_id: str, region_name: str, **kwargs: Any) -> Any:
            properties = cloudformation_json["Properties"]
            backend = cloudwatch_backends[account_id][region_name]
            alarm = backend.put_metric_alarm(
                name=properties.get("AlarmName", resource_name), namespace=properties.get("Namespace"),
                metric_name=properties.get("MetricName"), metric_data_queries=queries(properties.get("Metrics")),
                comparison_operator=properties["ComparisonOperator"],
                evaluation_periods=int(properties["EvaluationPeriods"]),
                datapoints_to_alarm=properties.get("DatapointsToAlarm"), period=properties.get("Period"),
                threshold=float(properties["Threshold"]), statistic=properties.get("Statistic"),
                extended_statistic=properties.get("ExtendedStatistic"), description=properties.get("AlarmDescription"),
                dimensions=properties.get("Dimensions", []),
                alarm_actions=properties.get("AlarmActions", []), ok_actions=properties.get("OKActions", []),
                insufficient_data_actions=properties.get("InsufficientDataActions", []),
                unit=properties.get("Unit"), actions_enabled=properties.get("ActionsEnabled", True),
                treat_missing_data=properties.get("TreatMissingData"))
            return cls(alarm)

        @classmethod
        def update_from_cloudformation_json(cls, original_resource: Any, new_resource_name: str,
                                            cloudformation_json: dict[str, Any], account_id: str,
                                            region_name: str) -> Any:
            name = cloudformation_json["Properties"].get("AlarmName", new_resource_name)
            if name != original_resource.alarm.name:
                cloudwatch_backends[account_id][region_name].delete_alarms([original_resource.alarm.name])
            return cls.create_from_cloudformation_json(name, cloudformation_json, account_id, region_name)

        @classmethod
        def delete_from_cloudformation_json(cls, resource_name: str, cloudformation_json: dict[str, Any],
                                            account_id: str, region_name: str) -> None:
            cloudwatch_backends[account_id][region_name].delete_alarms([resource_name])

        def delete(self, account_id: str, region_name: str) -> None:
            cloudwatch_backends[account_id][region_name].delete_alarms([self.alarm.name])

    parsing.get_model_map.cache_clear()
    parsing.get_name_type_map.cache_clear()
    assert parsing.resource_class_from_type("AWS::CloudWatch::Alarm") is CloudFormationAlarm


def _add_oidc_provider_resource_type() -> None:
    from moto.cloudformation import parsing
    from moto.cloudformation.exceptions import UnformattedGetAttTemplateException
    from moto.core.common_models import CloudFormationModel
    from moto.iam.models import iam_backends

    class CloudFormationOidcProvider(CloudFormationModel):
        __module__ = "moto.iam.models"      # moto files its models by the service in the module's name

        def __init__(self, provider: Any):
            self.provider = provider

        @staticmethod
        def cloudformation_name_type() -> str:
            return ""

        @staticmethod
        def cloudformation_type() -> str:
            return "AWS::IAM::OIDCProvider"

        @classmethod
        def has_cfn_attr(cls, attr: str) -> bool:
            return attr == "Arn"

        def get_cfn_attribute(self, attribute_name: str) -> Any:
            if attribute_name == "Arn":
                return self.provider.arn
            raise UnformattedGetAttTemplateException()

        @property
        def physical_resource_id(self) -> str:
            return self.provider.arn

        def is_created(self) -> bool:
            return True

        @classmethod
        def create_from_cloudformation_json(cls, resource_name: str, cloudformation_json: dict[str, Any],
                                            account_id: str, region_name: str, **kwargs: Any) -> Any:
            properties = cloudformation_json["Properties"]
            provider = iam_backends[account_id]["global"].create_open_id_connect_provider(
                url=properties["Url"], thumbprint_list=properties.get("ThumbprintList", []),
                client_id_list=properties.get("ClientIdList", []), tags=properties.get("Tags", []))
            return cls(provider)

        @classmethod
        def delete_from_cloudformation_json(cls, resource_name: str, cloudformation_json: dict[str, Any],
                                            account_id: str, region_name: str) -> None:
            iam_backends[account_id]["global"].delete_open_id_connect_provider(resource_name)

        def delete(self, account_id: str, region_name: str) -> None:
            iam_backends[account_id]["global"].delete_open_id_connect_provider(self.provider.arn)

    parsing.get_model_list.cache_clear()
    parsing.get_model_map.cache_clear()
    parsing.get_name_type_map.cache_clear()
    assert parsing.resource_class_from_type("AWS::IAM::OIDCProvider") is CloudFormationOidcProvider


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(port: int | None = None):
    """moto's ThreadedMotoServer on 127.0.0.1, patched; returns (server, port). Call server.stop() when done."""
    import logging
    import warnings
    _patch()
    # One line per request and one warning per resource type moto skips (the rehearsal checks those itself).
    # moto answers the operations it lacks (UpdateEndpoint, DescribeAlarmHistory) with a 500 and logs a traceback.
    logging.getLogger("werkzeug").setLevel(logging.CRITICAL)
    logging.getLogger("moto.cloudformation.parsing").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message="Tried to parse .* but it's not supported by moto")
    from moto.server import ThreadedMotoServer
    port = port or free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return server, port


def main(argv: list[str]) -> int:
    server, port = start(int(argv[0]) if argv else None)
    print(f"moto (patched for the rehearsal) on http://localhost:{port}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
