"""The pull-request diff role (stacks/review_stack.py): trusted by GitHub's OIDC provider for one repository's jobs
in one GitHub environment, and allowed to read this environment's templates and nothing else.

Its permissions are evaluated with the synthesized policies (deploy/iam_simulation.py); what the CDK CLI calls
during ``cdk diff --method template`` is recorded and evaluated against the deployed role in the rehearsal
(deploy/rehearse.py). The trust's GitHub claims (``token.actions.githubusercontent.com:sub``) are keys the
simulator does not know, so the trust is checked as a document here.
"""

from __future__ import annotations

import pytest

import cdk_testkit
from cdk_testkit import EXAMPLE_ACCOUNT, EXAMPLE_REGION
from deploy.iam_simulation import Deployment, Request, evaluate
from deploy.pins import EXAMPLE_REPOSITORY


@pytest.fixture(scope="module", params=cdk_testkit.ENVIRONMENTS)
def review(request):
    synth = cdk_testkit.synthesized(request.param, pinned=True)
    deployment = Deployment(synth.outdir, EXAMPLE_ACCOUNT, EXAMPLE_REGION)
    stack = synth.stack_name("review")
    (role,) = deployment.resources_of_type(stack, "AWS::IAM::Role")
    return synth, deployment, stack, role


def test_the_role_trusts_one_repositorys_jobs_in_one_github_environment(review):
    synth, deployment, stack, role = review
    (statement,) = deployment.trust_policy(stack, role)["Statement"]
    environment = cdk_testkit.cdk_json_context()["environments"][synth.env]["review"]["github_environment"]
    assert environment == f"cdk-diff-{synth.env}"
    assert statement["Effect"] == "Allow" and statement["Action"] == "sts:AssumeRoleWithWebIdentity"
    assert statement["Principal"] == {"Federated": f"arn:aws:iam::{EXAMPLE_ACCOUNT}:oidc-provider/"
                                                   "token.actions.githubusercontent.com"}
    # Exact matches only: no pull request of another repository, no job outside the (reviewer-gated) environment.
    assert statement["Condition"] == {"StringEquals": {
        "token.actions.githubusercontent.com:aud": "sts.amazonaws.com",
        "token.actions.githubusercontent.com:sub": f"repo:{EXAMPLE_REPOSITORY}:environment:{environment}"}}
    assert deployment.resource(stack, role)["Properties"]["RoleName"] == f"{synth.prefix}-cdk-diff"
    (provider,) = deployment.resources_of_type(stack, "AWS::IAM::OIDCProvider").values()
    assert provider["Properties"]["Url"] == "https://token.actions.githubusercontent.com"
    assert provider["Properties"]["ClientIdList"] == ["sts.amazonaws.com"]


def test_it_reads_this_environments_templates_and_nothing_else(review):
    synth, deployment, stack, role = review
    account, region = EXAMPLE_ACCOUNT, EXAMPLE_REGION
    own = f"arn:aws:cloudformation:{region}:{account}:stack/{synth.prefix}-endpoint-cpu/0a1b2c3d"
    other = "prod" if synth.env == "dev" else "dev"
    allowed = [Request("cloudformation:GetTemplate", own), Request("cloudformation:DescribeStacks", own),
               Request("cloudformation:DescribeStacks", f"arn:aws:cloudformation:{region}:{account}:stack/CDKToolkit/1"),
               Request("cloudformation:ListStacks", "*"),
               Request("ssm:GetParameter", f"arn:aws:ssm:{region}:{account}:parameter/cdk-bootstrap/hnb659fds/version")]
    refused = [
        Request("cloudformation:GetTemplate", f"arn:aws:cloudformation:{region}:{account}:stack/decision-{other}-build/1"),
        Request("cloudformation:CreateChangeSet", own), Request("cloudformation:UpdateStack", own),
        Request("s3:GetObject", f"arn:aws:s3:::{deployment.output(synth.stack_name('artifacts'), 'ArtifactBucketName')}"
                                f"/batch/input/run1/a.jsonl"),
        Request("ssm:GetParameter", f"arn:aws:ssm:{region}:{account}:parameter/app/secret"),
        Request("logs:FilterLogEvents", f"arn:aws:logs:{region}:{account}:log-group:/aws/sagemaker/Endpoints/x:*"),
        Request("sts:AssumeRole", f"arn:aws:iam::{account}:role/cdk-hnb659fds-lookup-role-{account}-{region}"),
    ]
    verdicts = evaluate(deployment.arn(stack, role), account, allowed + refused,
                        identity_policies=deployment.role_policies(stack, role))
    assert [v.result for v in verdicts[:len(allowed)]] == ["Allowed"] * len(allowed), [v.line() for v in verdicts]
    assert not [v.line() for v in verdicts[len(allowed):] if v.allowed]


def test_without_a_repository_the_stack_is_a_placeholder_and_synthesis_says_why(fresh_clone):
    assert fresh_clone.resources("review", "AWS::IAM::Role") == {}
    assert fresh_clone.resources("review", "AWS::CloudFormation::WaitConditionHandle")
    assert (f"The pull-request diff role is left out until environments.{fresh_clone.env}.review.github_repository "
            "names the repository (docs/deploy.md, Review in pull requests).") in fresh_clone.warnings()


def test_an_account_that_has_the_provider_already_refers_to_it():
    synth = cdk_testkit.synthesized_with("dev", lambda e: e["review"].__setitem__("create_oidc_provider", False))
    assert synth.resources("review", "AWS::IAM::OIDCProvider") == {}
    (role,) = synth.resources("review", "AWS::IAM::Role").values()
    principal = role["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"]["Federated"]
    assert cdk_testkit.flatten(principal).endswith(":oidc-provider/token.actions.githubusercontent.com")


def test_an_existing_provider_named_by_its_arn_is_trusted():
    arn = "arn:aws:iam::111122223333:oidc-provider/token.actions.githubusercontent.com"
    synth = cdk_testkit.synthesized_with("dev", lambda e: e["review"].update(create_oidc_provider=False,
                                                                             oidc_provider_arn=arn))
    assert synth.resources("review", "AWS::IAM::OIDCProvider") == {}
    (role,) = synth.resources("review", "AWS::IAM::Role").values()
    assert role["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"]["Federated"] == arn
