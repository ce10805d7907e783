"""deploy/execution_policy.py: the CloudFormation execution policy for `cdk bootstrap --cloudformation-execution-
policies`, generated from the synthesized templates of every environment of cdk.json, evaluated with the policy
simulator: every permission CloudFormation's handlers of every resource in the templates call is allowed; IAM
outside the environments' names, services the templates do not use, and other functions are denied; each
document fits IAM's managed-policy size."""

from __future__ import annotations

import json
import os

import pytest

from deploy import execution_policy, service_authorization
from deploy.iam_simulation import Request, denied, evaluate

ACCOUNT, REGION = "111122223333", "eu-west-1"
PRINCIPAL = f"arn:aws:iam::{ACCOUNT}:role/cdk-hnb659fds-cfn-exec-role-{ACCOUNT}-{REGION}"
APP_IAM = ("role", "policy", "oidc-provider")


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    templates, prefixes = execution_policy.synthesize(None, tmp_path_factory.mktemp("assemblies"))
    return templates, prefixes, execution_policy.documents(execution_policy.statements(templates, prefixes))


def known(action: str) -> bool:
    try:
        service_authorization.resource_types(action)
    except KeyError:
        return False
    return True


def resource_for(action: str, prefix: str) -> str:
    """A resource of this app the action could be called on: its first resource type's ARN, named as the stacks
    name things (``<prefix>-...``), or '*' for an action without resource-level permissions."""
    types = service_authorization.resource_types(action)
    if action.startswith("iam:"):   # the IAM resources the stacks make; a handler's groups and users they never do
        types = tuple(t for t in types if t.name in APP_IAM) or types
    if not types:
        return "*"
    values = {"Partition": "aws", "Region": REGION, "Account": ACCOUNT}
    names = {"OidcProviderName": execution_policy.GITHUB_OIDC,
             "RoleNameWithPath": "aws-service-role/sagemaker.application-autoscaling.amazonaws.com/x"
             if action == "iam:CreateServiceLinkedRole" else f"{prefix}-x"}
    return types[0].arn({**{v: names.get(v, f"{prefix}-x") for v in types[0].variables}, **values})


def test_every_handler_permission_of_every_resource_is_allowed(generated):
    templates, prefixes, documents = generated
    kinds = {r["Type"] for t in templates for r in t["Resources"].values()}
    assert {"AWS::SageMaker::Endpoint", "AWS::CodeBuild::Project", "AWS::IAM::Role", "AWS::KMS::Key"} <= kinds
    actions = sorted({a for kind in kinds if not kind.startswith("Custom::")
                      for a in execution_policy.handler_permissions(kind)})
    # Handlers list a few names the Service Authorization Reference does not (s3:DeleteBucketAnalyticsConfiguration,
    # authorized as s3:PutAnalyticsConfiguration): kept in the policy, where IAM ignores them, and not requested.
    unknown = [a for a in actions if not known(a)]
    assert len(unknown) < len(actions) / 10, unknown
    actions = [a for a in actions if known(a)]
    # A policy's handlers may attach it to groups and users too; the stacks attach to roles only, so those stay
    # denied (the next test).
    actions = [a for a in actions if not a.startswith("iam:") or
               any(t.name in APP_IAM for t in service_authorization.resource_types(a)) or
               not service_authorization.resource_types(a)]
    requests = [Request(a, resource_for(a, prefix), source="CloudFormation handler") for a in actions
                for prefix in prefixes]
    # An ARN two of its action's resource types share (a Lambda version's and alias's) the simulator cannot place:
    # those actions are checked as listed on every resource instead.
    ambiguous = {r.action for r in requests if r.resource != "*" and sum(
        bool(t.pattern().match(r.resource)) for t in service_authorization.resource_types(r.action)) > 1}
    everywhere = {a for d in documents for st in d["Statement"] if st["Resource"] == "*" for a in st["Action"]}
    assert ambiguous <= everywhere, ambiguous - everywhere
    requests = [r for r in requests if r.action not in ambiguous]
    requests.append(Request("ssm:GetParameters", f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/cdk-bootstrap/hnb659fds/"
                                                 f"version"))
    if any(kind.startswith("Custom::") for kind in kinds):
        requests.append(Request("lambda:InvokeFunction", f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:"
                                                         f"{prefixes[0]}-artifacts-CustomS3AutoDeleteObjects-x"))
    # A key's own policy must delegate to IAM for an identity policy to count (the stacks' keys' policies do, as
    # CDK writes them); everything else is the identity policy's alone.
    keys = [r for r in requests if r.resource.startswith("arn:aws:kms:")]
    delegating = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "kms:*", "Resource": "*",
                                                          "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"}}]}
    lines = denied(evaluate(PRINCIPAL, ACCOUNT, [r for r in requests if r not in keys], identity_policies=documents))
    lines += denied(evaluate(PRINCIPAL, ACCOUNT, keys, identity_policies=documents, resource_policy=delegating))
    assert not lines, "\n".join(lines[:20])


def test_iam_and_everything_else_outside_the_app_is_denied(generated):
    _, _, documents = generated
    requests = [Request("iam:CreateRole", f"arn:aws:iam::{ACCOUNT}:role/admin"),
                Request("iam:AttachRolePolicy", f"arn:aws:iam::{ACCOUNT}:role/OrganizationAccountAccessRole"),
                Request("iam:PutRolePolicy", f"arn:aws:iam::{ACCOUNT}:role/cdk-hnb659fds-deploy-role"),
                Request("iam:PassRole", f"arn:aws:iam::{ACCOUNT}:role/admin"),
                Request("iam:CreateUser", f"arn:aws:iam::{ACCOUNT}:user/intruder"),
                Request("iam:AttachUserPolicy", f"arn:aws:iam::{ACCOUNT}:user/decision-dev-x"),
                Request("iam:PutGroupPolicy", f"arn:aws:iam::{ACCOUNT}:group/decision-dev-x"),
                Request("ec2:RunInstances", f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/*"),
                Request("lambda:InvokeFunction", f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:someone-elses"),
                Request("organizations:LeaveOrganization", "*")]
    verdicts = evaluate(PRINCIPAL, ACCOUNT, requests, identity_policies=documents)
    assert not [v.line() for v in verdicts if v.allowed]


def test_each_document_fits_a_managed_policy(generated):
    _, _, documents = generated
    assert documents
    for document in documents:
        assert len(json.dumps(document, separators=(",", ":"))) <= execution_policy.POLICY_LIMIT
    sids = [s["Sid"] for d in documents for s in d["Statement"]]
    assert len(sids) == len(set(sids))


def test_the_command_writes_the_documents_and_says_how_to_bootstrap_with_them(tmp_path, capsys, monkeypatch, generated):
    templates, prefixes, documents = generated
    monkeypatch.setattr(execution_policy, "synthesize", lambda envs, outdir: (templates, prefixes))
    assert execution_policy.main(["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    written = sorted(tmp_path.glob("cfn-execution-*.json"))
    assert [json.loads(p.read_text()) for p in written] == documents
    assert "npx cdk bootstrap --cloudformation-execution-policies arn:aws:iam::<account>:policy/cdk-cfn-execution-1" \
        in out
