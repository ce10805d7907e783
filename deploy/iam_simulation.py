"""The synthesized stacks' IAM evaluated as AWS evaluates it, for the role-call tests and the rehearsal.

moto checks no IAM unless told to (INITIAL_NO_AUTH_ACTION_COUNT), and even then it passes the resource ``*`` for
every service but S3 (so a statement scoped to a repository never matches) and denies every statement that has a
condition it cannot read. So the real policy documents are evaluated instead, by @cloud-copilot/iam-simulate
(package.json; deploy/iam_simulate.mjs runs it): identity policies, a resource policy (a role's trust), conditions,
wildcards, and the Service Authorization Reference's checks that an action exists and takes that kind of resource.

- :class:`Deployment`: one environment's cloud assembly, every intrinsic of its templates (Ref, Fn::GetAtt,
  Fn::Join, Fn::Sub, Fn::ImportValue, Fn::Select, Fn::Split) resolved to the names a deployment in ``account`` and
  ``region`` has: a name the template sets, else one made up the way CloudFormation makes them
  (``<stack>-<logical id>-<suffix>``);
- :class:`Request`: one request to authorize, with where it comes from;
- :func:`evaluate`: the simulator's verdict for each request of one principal.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from deploy import node

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
SIMULATOR = Path(__file__).resolve().parent / "iam_simulate.mjs"
NODE_MODULES = REPOSITORY_ROOT / "node_modules"


@dataclass(frozen=True)
class Request:
    action: str
    resource: str
    context: dict[str, Any] = field(default_factory=dict)
    source: str = ""                 # what makes the call: a buildspec command, a boto3 operation, a template


@dataclass(frozen=True)
class Verdict:
    request: Request
    result: str                      # Allowed, ImplicitlyDenied, ExplicitlyDenied, ..., or "error"
    errors: Any = None

    @property
    def allowed(self) -> bool:
        return self.result == "Allowed"

    def line(self) -> str:
        context = f" {json.dumps(self.request.context, sort_keys=True)}" if self.request.context else ""
        return (f"{self.result}: {self.request.action} on {self.request.resource}{context}"
                f"{f' ({self.errors})' if self.errors else ''}  <- {self.request.source}")


def evaluate(principal: str, account: str, requests: Sequence[Request], *, identity_policies: Sequence[dict],
             resource_policy: dict | None = None) -> list[Verdict]:
    """Each request made by ``principal`` (a role ARN, or a service principal for a trust policy), evaluated against
    its identity policies and, where given, the resource's own policy."""
    if not (NODE_MODULES / "@cloud-copilot" / "iam-simulate").is_dir():
        raise RuntimeError("@cloud-copilot/iam-simulate is not installed: run npm ci (make node_modules/.installed)")
    simulations = [{"identityPolicies": list(identity_policies), "resourcePolicy": resource_policy,
                    "request": {"principal": principal, "action": r.action, "resource": r.resource,
                                "accountId": account, "context": r.context}} for r in requests]
    done = subprocess.run([str(node.NODE), str(SIMULATOR)], input=json.dumps(simulations), capture_output=True, text=True,
                          cwd=REPOSITORY_ROOT, timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"iam_simulate.mjs failed: {done.stderr[-2000:]}")
    return [Verdict(request, result["result"], result["errors"])
            for request, result in zip(requests, json.loads(done.stdout))]


# How CloudFormation names and identifies what the stacks create: Ref and Fn::GetAtt per resource type.
_ARN_FORMATS = {
    "AWS::S3::Bucket": "arn:{partition}:s3:::{name}",
    "AWS::ECR::Repository": "arn:{partition}:ecr:{region}:{account}:repository/{name}",
    "AWS::Logs::LogGroup": "arn:{partition}:logs:{region}:{account}:log-group:{name}:*",
    "AWS::KMS::Key": "arn:{partition}:kms:{region}:{account}:key/{name}",
    "AWS::IAM::Role": "arn:{partition}:iam::{account}:role/{name}",
    "AWS::CloudWatch::Alarm": "arn:{partition}:cloudwatch:{region}:{account}:alarm:{name}",
    "AWS::SNS::Topic": "arn:{partition}:sns:{region}:{account}:{name}",
    "AWS::CodeBuild::Project": "arn:{partition}:codebuild:{region}:{account}:project/{name}",
    "AWS::SageMaker::Model": "arn:{partition}:sagemaker:{region}:{account}:model/{name}",
    "AWS::SageMaker::EndpointConfig": "arn:{partition}:sagemaker:{region}:{account}:endpoint-config/{name}",
    "AWS::SageMaker::Endpoint": "arn:{partition}:sagemaker:{region}:{account}:endpoint/{name}",
    "AWS::Lambda::Function": "arn:{partition}:lambda:{region}:{account}:function:{name}",
    "AWS::IAM::OIDCProvider": "arn:{partition}:iam::{account}:oidc-provider/{name}",
    "AWS::IAM::ManagedPolicy": "arn:{partition}:iam::{account}:policy/{name}",
    "AWS::ApplicationAutoScaling::ScalingPolicy": "arn:{partition}:autoscaling:{region}:{account}:scalingPolicy:"
                                                  "{name}",
}
# Types whose Ref is their ARN rather than their name.
_REF_IS_ARN = {"AWS::SNS::Topic", "AWS::ApplicationAutoScaling::ScalingPolicy", "AWS::SageMaker::Model",
               "AWS::SageMaker::EndpointConfig",
               "AWS::SageMaker::Endpoint", "AWS::IAM::OIDCProvider", "AWS::IAM::ManagedPolicy"}
# The property that names a resource, where a template may set it.
_NAME_PROPERTIES = {
    "AWS::S3::Bucket": "BucketName", "AWS::ECR::Repository": "RepositoryName", "AWS::Logs::LogGroup": "LogGroupName",
    "AWS::IAM::Role": "RoleName", "AWS::CloudWatch::Alarm": "AlarmName", "AWS::SNS::Topic": "TopicName",
    "AWS::CodeBuild::Project": "Name", "AWS::SageMaker::Endpoint": "EndpointName",
    "AWS::SageMaker::Model": "ModelName", "AWS::SageMaker::EndpointConfig": "EndpointConfigName",
    "AWS::Lambda::Function": "FunctionName", "AWS::IAM::ManagedPolicy": "ManagedPolicyName",
}
# Names that AWS allows in lower case only.
_LOWER_CASE = {"AWS::S3::Bucket", "AWS::ECR::Repository"}


class Deployment:
    """An environment's synthesized stacks as deployed to ``account`` in ``region``: templates with every value
    resolved."""

    def __init__(self, assembly: Path, account: str, region: str, partition: str = "aws"):
        self.assembly, self.account, self.region, self.partition = assembly, account, region, partition
        manifest = json.loads((assembly / "manifest.json").read_text())
        self.templates: dict[str, dict[str, Any]] = {}
        for artifact in manifest["artifacts"].values():
            if artifact["type"] == "aws:cloudformation:stack":
                name = artifact.get("displayName") or artifact["properties"]["templateFile"].split(".")[0]
                self.templates[name] = json.loads((assembly / artifact["properties"]["templateFile"]).read_text())
        self._exports: dict[str, str] | None = None

    # --- names ------------------------------------------------------------------------------------------------

    def resource(self, stack: str, logical_id: str) -> dict[str, Any]:
        return self.templates[stack]["Resources"][logical_id]

    def name(self, stack: str, logical_id: str) -> str:
        """The physical name (or id) of a resource: the template's, else a generated one."""
        resource = self.resource(stack, logical_id)
        kind = resource["Type"]
        prop = _NAME_PROPERTIES.get(kind)
        if prop and prop in resource.get("Properties", {}):
            return self.resolve(stack, resource["Properties"][prop])
        suffix = hashlib.sha256(f"{stack}/{logical_id}".encode()).hexdigest()
        if kind == "AWS::KMS::Key":
            return f"{suffix[:8]}-{suffix[8:12]}-{suffix[12:16]}-{suffix[16:20]}-{suffix[20:32]}"
        if kind == "AWS::IAM::OIDCProvider":
            return self.resolve(stack, resource["Properties"]["Url"]).removeprefix("https://")
        name = f"{stack}-{logical_id[:-8] if len(logical_id) > 8 else logical_id}-{suffix[:12]}"
        return name.lower() if kind in _LOWER_CASE else name

    def arn(self, stack: str, logical_id: str) -> str:
        kind = self.resource(stack, logical_id)["Type"]
        if kind not in _ARN_FORMATS:
            raise KeyError(f"{stack}/{logical_id}: no ARN format for {kind}")
        return _ARN_FORMATS[kind].format(partition=self.partition, region=self.region, account=self.account,
                                         name=self.name(stack, logical_id))

    def exports(self) -> dict[str, str]:
        if self._exports is None:
            self._exports = {}
            for stack, template in self.templates.items():
                for output in template.get("Outputs", {}).values():
                    if "Export" in output:
                        self._exports[self.resolve(stack, output["Export"]["Name"])] = \
                            self.resolve(stack, output["Value"])
        return self._exports

    def output(self, stack: str, key: str) -> str:
        return self.resolve(stack, self.templates[stack]["Outputs"][key]["Value"])

    # --- values -----------------------------------------------------------------------------------------------

    def _pseudo(self, stack: str, name: str) -> str:
        return {"AWS::AccountId": self.account, "AWS::Region": self.region, "AWS::Partition": self.partition,
                "AWS::URLSuffix": "amazonaws.com", "AWS::StackName": stack}[name]

    def resolve(self, stack: str, value: Any) -> Any:
        """A template value with every intrinsic function replaced by what it evaluates to."""
        if isinstance(value, list):
            return [self.resolve(stack, item) for item in value]
        if not isinstance(value, dict):
            return value
        if len(value) != 1 or not next(iter(value)).startswith(("Fn::", "Ref")):
            return {key: self.resolve(stack, item) for key, item in value.items()}
        (function, argument), = value.items()
        if function == "Ref":
            if argument.startswith("AWS::"):
                return self._pseudo(stack, argument)
            kind = self.resource(stack, argument)["Type"]
            return self.arn(stack, argument) if kind in _REF_IS_ARN else self.name(stack, argument)
        if function == "Fn::GetAtt":
            logical_id, attribute = argument if isinstance(argument, list) else argument.split(".", 1)
            if attribute in ("Arn", "TopicArn"):
                return self.arn(stack, logical_id)
            if attribute.endswith("Name"):
                return self.name(stack, logical_id)
            raise KeyError(f"{stack}/{logical_id}: Fn::GetAtt {attribute} is not resolved here")
        if function == "Fn::Join":
            separator, items = argument
            return separator.join(str(self.resolve(stack, item)) for item in items)
        if function == "Fn::Sub":
            text, variables = (argument, {}) if isinstance(argument, str) else argument
            return re.sub(r"\$\{([^}]+)\}", lambda m: str(
                self.resolve(stack, variables[m[1]]) if m[1] in variables else
                self._pseudo(stack, m[1]) if m[1].startswith("AWS::") else
                self.resolve(stack, {"Fn::GetAtt": m[1].split(".", 1)}) if "." in m[1] else
                self.resolve(stack, {"Ref": m[1]})), text)
        if function == "Fn::ImportValue":
            name = self.resolve(stack, argument)
            if name not in self.exports():
                raise KeyError(f"{stack}: Fn::ImportValue {name}: no stack exports it")
            return self.exports()[name]
        if function == "Fn::Select":
            index, items = argument
            return self.resolve(stack, items)[int(self.resolve(stack, index))]
        if function == "Fn::Split":
            separator, text = argument
            return str(self.resolve(stack, text)).split(separator)
        raise KeyError(f"{stack}: {function} is not resolved here")

    # --- roles ------------------------------------------------------------------------------------------------

    def role_policies(self, stack: str, role_logical_id: str) -> list[dict[str, Any]]:
        """Every policy document that applies to the role: its inline policies and the AWS::IAM::Policy resources
        attached to it (managed policies are refused: the stacks attach none)."""
        role = self.resource(stack, role_logical_id)["Properties"]
        if role.get("ManagedPolicyArns"):
            raise ValueError(f"{stack}/{role_logical_id} has managed policies, which are not evaluated here")
        documents = [self.resolve(stack, p["PolicyDocument"]) for p in role.get("Policies", [])]
        for resource in self.templates[stack]["Resources"].values():
            if resource["Type"] == "AWS::IAM::Policy" and {"Ref": role_logical_id} in resource["Properties"]["Roles"]:
                documents.append(self.resolve(stack, resource["Properties"]["PolicyDocument"]))
        return documents

    def managed_policy(self, stack: str, name: str) -> dict[str, Any]:
        """The document of the customer-managed policy named ``name`` (ManagedPolicyName) in the stack."""
        (document,) = [self.resolve(stack, resource["Properties"]["PolicyDocument"])
                       for resource in self.resources_of_type(stack, "AWS::IAM::ManagedPolicy").values()
                       if self.resolve(stack, resource["Properties"].get("ManagedPolicyName")) == name]
        return document

    def tags(self, stack: str, logical_id: str) -> dict[str, str]:
        """A resource's tags as the template sets them (app.py's and its own)."""
        tags = self.resolve(stack, self.resource(stack, logical_id).get("Properties", {}).get("Tags", []))
        return {tag["Key"]: tag["Value"] for tag in tags}

    def trust_policy(self, stack: str, role_logical_id: str) -> dict[str, Any]:
        return self.resolve(stack, self.resource(stack, role_logical_id)["Properties"]["AssumeRolePolicyDocument"])

    def resources_of_type(self, stack: str, resource_type: str) -> dict[str, dict[str, Any]]:
        return {logical_id: resource for logical_id, resource in self.templates[stack]["Resources"].items()
                if resource["Type"] == resource_type}


def denied(verdicts: Iterable[Verdict]) -> list[str]:
    """The lines of the verdicts that are not Allowed (empty when every request is allowed)."""
    return [verdict.line() for verdict in verdicts if not verdict.allowed]
