"""``python -m deploy.execution_policy``: a least-privilege CloudFormation execution policy for ``cdk bootstrap
--cloudformation-execution-policies``, generated from the app's synthesized templates.

A default ``cdk bootstrap`` gives CloudFormation's execution role AdministratorAccess, so whoever may deploy (the
``<prefix>-deployer`` policy, through the bootstrap's deploy role) may do anything in the account. This module
synthesizes every environment of cdk.json (each pinned as the builds print pins, deploy/pins.py, so that every
resource the app can make is there), collects the resource types of every template, and allows exactly what
CloudFormation's handlers for those types need: the permissions each type's resource provider schema lists for
create, read, update and delete (the CloudFormation registry's schemas, as cfn-lint ships them; the few types
without a schema are listed here). Beside them:

- IAM, the way to escalate, only on this app's own names: roles, managed policies and iam:PassRole on
  ``role/<prefix>-*`` and ``policy/<prefix>-*`` of the environments' name prefixes (every role and policy the
  stacks create is named so, CloudFormation's generated names starting with the stack's), the GitHub OIDC provider,
  and service-linked roles;
- a custom resource's provider Lambda invoked (CloudFormation calls it with the execution role), on
  ``function:<prefix>-*``;
- the bootstrap version parameter the templates read (``ssm:GetParameters``).

Every other action is allowed on any resource of its service: scoped by action, not by resource. The documents are
split to stay within IAM's 6,144 characters per managed policy; ``cdk bootstrap`` takes their ARNs separated by
commas. Nothing here calls AWS: ``--out DIR`` writes the documents and prints the commands that create them.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable

from deploy import node, service_authorization
from deploy.pins import (EXAMPLE_ACCOUNT, EXAMPLE_REGION, EXAMPLE_REPOSITORY, needs_location, pins_in,
                         promote_into)

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
POLICY_LIMIT = 6144
HANDLERS = ("create", "read", "update", "delete")
# Types the CloudFormation registry has no schema (handlers) for: what their create, update and delete call.
LEGACY_PERMISSIONS = {
    "AWS::CDK::Metadata": (),      # CloudFormation itself records it
    "AWS::CodeBuild::Project": ("codebuild:CreateProject", "codebuild:UpdateProject", "codebuild:DeleteProject",
                                "codebuild:BatchGetProjects", "iam:PassRole"),
}
GITHUB_OIDC = "token.actions.githubusercontent.com"
# What IAM accepts as an action; a schema lists the odd other name (AWS::Logs::LogGroup: s3:REST.PUT.OBJECT, an S3
# operation of CloudWatch Logs' own, not an IAM action), which a policy could not hold.
_ACTION = re.compile(r"^[a-z0-9-]+:[A-Za-z0-9*]+$")


def handler_permissions(resource_type: str, region: str = "us-east-1") -> tuple[str, ...]:
    """What CloudFormation's handlers of ``resource_type`` call (its registry schema); KeyError for a type
    without a schema and not in LEGACY_PERMISSIONS."""
    if resource_type in LEGACY_PERMISSIONS:
        return LEGACY_PERMISSIONS[resource_type]
    from cfnlint.schema import PROVIDER_SCHEMA_MANAGER
    handlers = PROVIDER_SCHEMA_MANAGER.get_resource_schema(region, resource_type).schema.get("handlers")
    if not handlers:
        raise KeyError(f"{resource_type}: no handler permissions in CloudFormation's schema; list them in "
                       f"deploy/execution_policy.py (LEGACY_PERMISSIONS)")
    return tuple(p for name in HANDLERS for p in handlers.get(name, {}).get("permissions", []) if _ACTION.match(p))


def templates_of(assembly: Path) -> list[dict[str, Any]]:
    manifest = json.loads((assembly / "manifest.json").read_text())
    return [json.loads((assembly / a["properties"]["templateFile"]).read_text())
            for a in manifest["artifacts"].values() if a["type"] == "aws:cloudformation:stack"]


def statements(templates: Iterable[dict[str, Any]], prefixes: Iterable[str], partition: str = "aws"
               ) -> list[dict[str, Any]]:
    """The execution policy's statements for these templates, the stacks of environments named by ``prefixes``."""
    actions, custom = set(), False
    for template in templates:
        for resource in template["Resources"].values():
            kind = resource["Type"]
            if kind.startswith("Custom::") or kind == "AWS::CloudFormation::CustomResource":
                custom = True
                continue
            actions |= set(handler_permissions(kind))
    prefixes = sorted(set(prefixes))
    iam = sorted(a for a in actions if a.startswith("iam:"))
    others = sorted(a for a in actions if not a.startswith("iam:"))
    found = [{"Sid": "ResourceHandlers", "Effect": "Allow", "Action": others, "Resource": "*"}]
    scoped = {"role": [f"arn:{partition}:iam::*:role/{p}-*" for p in prefixes],
              "policy": [f"arn:{partition}:iam::*:policy/{p}-*" for p in prefixes],
              "oidc-provider": [f"arn:{partition}:iam::*:oidc-provider/{GITHUB_OIDC}"]}
    unscoped = [a for a in iam if not _resource_types(a)]
    linked = [a for a in iam if a == "iam:CreateServiceLinkedRole"]
    named = [a for a in iam if a not in unscoped and a not in linked]
    resources = sorted({arn for a in named for t in _resource_types(a) for arn in scoped.get(t.name, [])})
    if named:
        found.append({"Sid": "IamOfTheseEnvironments", "Effect": "Allow", "Action": named, "Resource": resources})
    if linked:
        found.append({"Sid": "ServiceLinkedRoles", "Effect": "Allow", "Action": linked,
                      "Resource": f"arn:{partition}:iam::*:role/aws-service-role/*"})
    if unscoped:
        found.append({"Sid": "IamWithoutResources", "Effect": "Allow", "Action": unscoped, "Resource": "*"})
    if custom:
        found.append({"Sid": "CustomResourceProviders", "Effect": "Allow", "Action": "lambda:InvokeFunction",
                      "Resource": [f"arn:{partition}:lambda:*:*:function:{p}-*" for p in prefixes]})
    found.append({"Sid": "BootstrapVersion", "Effect": "Allow", "Action": "ssm:GetParameters",
                  "Resource": f"arn:{partition}:ssm:*:*:parameter/cdk-bootstrap/*/version"})
    return found


def _resource_types(action: str) -> tuple[service_authorization.ResourceType, ...]:
    """The action's resource types; none for a name the reference does not know (IAM ignores those)."""
    try:
        return service_authorization.resource_types(action)
    except KeyError:
        return ()


def documents(found: list[dict[str, Any]], limit: int = POLICY_LIMIT) -> list[dict[str, Any]]:
    """The statements as policy documents of at most ``limit`` characters each (without white space, as IAM
    counts), a statement's actions split where one would not fit."""
    def size(document: dict[str, Any]) -> int:
        return len(json.dumps(document, separators=(",", ":")))

    pieces = []
    for statement in found:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        part: list[str] = []
        for action in actions:
            candidate = {**statement, "Sid": f"{statement['Sid']}{len(pieces)}", "Action": [*part, action]}
            if part and size({"Version": "2012-10-17", "Statement": [candidate]}) > limit:
                pieces.append({**statement, "Sid": f"{statement['Sid']}{len(pieces)}", "Action": part})
                part = []
            part.append(action)
        pieces.append({**statement, "Sid": f"{statement['Sid']}{len(pieces)}", "Action": part})
    result: list[dict[str, Any]] = []
    for piece in pieces:
        if result and size({**result[-1], "Statement": [*result[-1]["Statement"], piece]}) <= limit:
            result[-1]["Statement"].append(piece)
        else:
            result.append({"Version": "2012-10-17", "Statement": [piece]})
    return result


def synthesize(environments: list[str] | None, outdir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Every named environment of cdk.json (all by default) synthesized as app.py does, pinned as the builds print
    pins: their templates and name prefixes."""
    node.use_pinned_node()   # jsii, started by importing the app's aws_cdk, on the Node.js package.json pins
    import app as cdk_app
    cdk_json = json.loads((REPOSITORY_ROOT / "cdk.json").read_text())
    names = environments or list(cdk_json["context"]["environments"])
    templates, prefixes = [], []
    for name in names:
        context = _pinned(cdk_json["context"], name)
        target = outdir / name
        cdk_app.build_app(context={**context, "env": name}, outdir=str(target), cli_environment={}).synth()
        templates += templates_of(target)
        prefixes.append(context["environments"][name]["name_prefix"])
    return templates, prefixes


def _pinned(context: dict[str, Any], name: str) -> dict[str, Any]:
    """cdk.json's context with environment ``name`` alone pinned (so that each environment keeps its own settings:
    a source that destroys its artifacts keeps the custom resource that empties them), located and given a
    repository where cdk.json must name them."""
    context = copy.deepcopy(context)
    environments = context["environments"]
    if environments[name].get("artifacts_from"):
        promote_into(environments, name, locate=False)
    else:
        environments[name]["pins"] = pins_in(environments, name)
    environment = environments[name]
    if needs_location(environment):
        environment["account"] = environment.get("account") or EXAMPLE_ACCOUNT
        environment["region"] = environment.get("region") or EXAMPLE_REGION
    review = environment.setdefault("review", {})
    review["github_repository"] = review.get("github_repository") or EXAMPLE_REPOSITORY
    return context


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.execution_policy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", action="append", help="an environment of cdk.json (default: every one)")
    parser.add_argument("--partition", default="aws")
    parser.add_argument("--out", type=Path, required=True, help="directory for cfn-execution-<n>.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cdk-execution-policy-") as workdir:
        templates, prefixes = synthesize(args.env, Path(workdir))
    args.out.mkdir(parents=True, exist_ok=True)
    names = []
    for index, document in enumerate(documents(statements(templates, prefixes, args.partition)), start=1):
        path = args.out / f"cfn-execution-{index}.json"
        path.write_text(json.dumps(document, indent=2) + "\n")
        names.append(f"cdk-cfn-execution-{index}")
        print(f"aws iam create-policy --policy-name {names[-1]} --policy-document file://{path}")
    arns = ",".join(f"arn:{args.partition}:iam::<account>:policy/{name}" for name in names)
    print(f"npx cdk bootstrap --cloudformation-execution-policies {arns} aws://<account>/<region>")
    return 0


if __name__ == "__main__":
    sys.exit(main())
