"""The review stack (``<prefix>-review``): the role a pull request's ``npx cdk diff`` runs with.

.github/workflows/cdk-diff.yml runs a pull request's own code (app.py, stacks/, whatever the branch changed) with
this role's credentials, so the role may do only what ``cdk diff --method template`` needs: read the deployed
templates and stacks of this environment (``cloudformation:GetTemplate``, ``DescribeStacks`` on
``<prefix>-*`` and the bootstrap stack, ``ListStacks``) and the bootstrap's version parameter
(``ssm:GetParameter`` on ``/cdk-bootstrap/*``). No object, log, parameter or metric of the account beyond that:
not the bootstrap's lookup role (ReadOnlyAccess), which the workflow used to assume.

GitHub's OIDC provider vouches for the job: the role trusts tokens with audience ``sts.amazonaws.com`` whose
``sub`` is ``repo:<github_repository>:environment:<github_environment>``, i.e. a job of this repository running in
that GitHub environment (prod's has required reviewers, so no prod credentials before a reviewer approves). The
account's provider for token.actions.githubusercontent.com is created here where ``create_oidc_provider`` is
(set or decided by config: an account has one per URL, so unset it is the first environment of the account's), else the role trusts ``oidc_provider_arn`` or, without it, the account's provider for that URL. Without ``github_repository`` the stack holds a placeholder and synthesis warns.
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from constructs import Construct

from stacks import nag
from stacks.config import EnvironmentConfig

GITHUB_OIDC_HOST = "token.actions.githubusercontent.com"
GITHUB_OIDC_AUDIENCE = "sts.amazonaws.com"
BOOTSTRAP_STACK = "CDKToolkit"
BOOTSTRAP_PARAMETERS = "/cdk-bootstrap/"
# What `cdk diff --method template` reads (tests/deploy/test_rehearse.py records the CLI's calls against moto and
# evaluates each against this role).
TEMPLATE_READS = ("cloudformation:GetTemplate", "cloudformation:DescribeStacks")


class ReviewStack(cdk.Stack):
    def __init__(self, scope: Construct, construct_id: str, *, config: EnvironmentConfig, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        review = config.review
        self.role = None
        if review.github_repository is None:
            cdk.Annotations.of(self).add_warning_v2(
                "decision-models:no-review-repository",
                f"The pull-request diff role is left out until {config.key('review', 'github_repository')} names "
                f"the repository (docs/deploy.md, Review in pull requests).")
            cdk.CfnWaitConditionHandle(self, "NoReviewRoleYet")
            return
        provider_arn = review.oidc_provider_arn or cdk.Arn.format(cdk.ArnComponents(
            service="iam", region="", resource="oidc-provider", resource_name=GITHUB_OIDC_HOST), self)
        provider = None
        if review.create_oidc_provider:
            provider = iam.CfnOIDCProvider(self, "GitHubOidcProvider", url=f"https://{GITHUB_OIDC_HOST}",
                                           client_id_list=[GITHUB_OIDC_AUDIENCE])
            provider_arn = provider.attr_arn
        subject = f"repo:{review.github_repository}:environment:{review.github_environment}"
        self.role = iam.Role(
            self, "CdkDiffRole", role_name=f"{config.name_prefix}-cdk-diff", max_session_duration=cdk.Duration.hours(1),
            description=f"{config.name_prefix}: npx cdk diff --method template from {review.github_repository}'s "
                        f"pull requests (GitHub environment {review.github_environment})",
            assumed_by=iam.WebIdentityPrincipal(provider_arn, conditions={"StringEquals": {
                f"{GITHUB_OIDC_HOST}:aud": GITHUB_OIDC_AUDIENCE, f"{GITHUB_OIDC_HOST}:sub": subject}}))
        stacks = [cdk.Arn.format(cdk.ArnComponents(service="cloudformation", resource="stack",
                                                   resource_name=f"{name}/*"), self)
                  for name in (f"{config.name_prefix}-*", BOOTSTRAP_STACK)]
        self.role.add_to_policy(iam.PolicyStatement(sid="ReadTemplates", actions=list(TEMPLATE_READS),
                                                    resources=stacks))
        self.role.add_to_policy(iam.PolicyStatement(sid="ListStacks", actions=["cloudformation:ListStacks"],
                                                    resources=["*"]))
        parameters = cdk.Arn.format(cdk.ArnComponents(service="ssm", resource="parameter",
                                                      resource_name=f"{BOOTSTRAP_PARAMETERS.strip('/')}/*"), self)
        self.role.add_to_policy(iam.PolicyStatement(sid="ReadBootstrapVersion", actions=["ssm:GetParameter"],
                                                    resources=[parameters]))
        nag.acknowledge(self.role, "AwsSolutions-IAM5[Resource::*]",
                        "cloudformation:ListStacks has no resource-level permissions; the service requires "
                        "Resource '*'.")
        for resource in (*stacks, parameters):
            nag.acknowledge(self.role, nag.wildcard_resource_of(self, resource),
                            "Read-only access to this environment's stacks (named <prefix>-*) and the CDK bootstrap "
                            "stack's templates and version parameter, which cdk diff --method template reads.")
        cdk.CfnOutput(self, "CdkDiffRoleArn", value=self.role.role_arn,
                      description=f"The GitHub environment {review.github_environment}'s variable CDK_DIFF_ROLE")
