"""Build once, promote by digest (issue 33): prod's endpoints run dev's images and model archive.

The synthesized templates are checked for the exact statements on both sides (dev's repository and bucket policies
name prod's account and exactly prod's execution roles; prod's roles may read exactly the pinned repository and
archive), and SageMaker's pull with prod's execution role is evaluated as AWS evaluates it
(deploy/iam_simulation.py, @cloud-copilot/iam-simulate): identity policy and resource policy together, with prod in
dev's account and in another account (where both must allow it). prod is pinned to dev's artifacts under the names
a deployment of dev's templates has (read off dev's resolved outputs), as ``endpoint_client promote`` reads them.
"""

from __future__ import annotations

import copy
import functools
import tempfile
from pathlib import Path

import pytest

import cdk_testkit
import role_calls
from cdk_testkit import EXAMPLE_REGION, TEST_PINS
from deploy import pins as test_pins
from deploy.iam_simulation import Deployment, Request, denied, evaluate
from stacks.config import image_kind

DEV_ACCOUNT = "111122223333"
OTHER_ACCOUNT = "444455556666"
KINDS = ("cpu", "gpu", "text_generation", "async")
ROLE_NAMES = ("decision-prod-cpu-execution", "decision-prod-gpu-execution",
              "decision-prod-text-generation-execution", "decision-prod-async-execution")


def context(env: str, prod_account: str, prod_pins: dict | None = None) -> dict:
    """cdk.json's context, dev and prod located (dev in DEV_ACCOUNT, prod in prod_account, one region), dev pinned
    to its builds and prod to prod_pins (else to made-up names of dev's artifacts)."""
    result = copy.deepcopy(cdk_testkit.cdk_json_context())
    environments = result["environments"]
    environments["dev"].update(account=DEV_ACCOUNT, region=EXAMPLE_REGION, pins=copy.deepcopy(TEST_PINS))
    environments["prod"].update(account=prod_account, region=EXAMPLE_REGION)
    test_pins.promote_into(environments, "prod")    # dev retains what prod pins (stacks/config.py)
    environments["prod"]["pins"] = prod_pins or environments["prod"]["pins"]
    for environment in environments.values():
        environment["review"]["github_repository"] = test_pins.EXAMPLE_REPOSITORY
    result["env"] = env
    return result


def synthesized(env: str, prod_account: str, prod_pins: dict | None = None) -> Deployment:
    outdir = Path(tempfile.mkdtemp(prefix=f"cdk-crossenv-{env}-"))
    cdk_testkit._OUTDIRS.append(outdir)
    cdk_testkit.synthesize(context(env, prod_account, prod_pins), outdir)
    return Deployment(outdir, DEV_ACCOUNT if env == "dev" else prod_account, EXAMPLE_REGION)


class Pair:
    """dev and prod (prod in prod_account) as deployed: prod pinned to dev's artifacts by their deployed names."""

    def __init__(self, prod_account: str):
        self.prod_account = prod_account
        self.dev = synthesized("dev", prod_account)
        stack = "decision-dev-artifacts"
        self.repository = self.dev.output(stack, "ImageRepositoryUri").split("/", 1)[1]
        self.bucket = self.dev.output(stack, "ArtifactBucketName")
        self.prod_pins = test_pins.promoted_pins(TEST_PINS, account=DEV_ACCOUNT, region=EXAMPLE_REGION,
                                                 repository=self.repository, bucket=self.bucket)
        self.prod = synthesized("prod", prod_account, self.prod_pins)
        (self.repository_id,) = self.dev.resources_of_type(stack, "AWS::ECR::Repository")
        self.repository_policy = self.dev.resolve(stack, self.dev.resource(stack, self.repository_id)["Properties"][
            "RepositoryPolicyText"])
        (self.bucket_policy,) = [self.dev.resolve(stack, policy["Properties"]["PolicyDocument"])
                                 for policy in self.dev.resources_of_type(stack, "AWS::S3::BucketPolicy").values()
                                 if policy["Properties"]["Bucket"] == {"Ref": self._bucket_id(stack)}]

    def _bucket_id(self, stack: str) -> str:
        return next(lid for lid in self.dev.resources_of_type(stack, "AWS::S3::Bucket")
                    if lid.startswith("ArtifactBucket"))

    def role_arn(self, name: str) -> str:
        return f"arn:aws:iam::{self.prod_account}:role/{name}"

    def execution_role(self, kind: str) -> tuple[str, str]:
        """(stack, role logical id) of prod's endpoint of kind."""
        stack = f"decision-prod-endpoint-{kind.replace('_', '-')}"
        (model,) = self.prod.resources_of_type(stack, "AWS::SageMaker::Model").values()
        return stack, model["Properties"]["ExecutionRoleArn"]["Fn::GetAtt"][0]

    def pull_requests(self, kind: str) -> list[Request]:
        """What SageMaker does with prod's execution role to start the endpoint: the artifacts part of it (read
        the archive the Model names, pull the image it names), with the request context AWS supplies."""
        stack, role = self.execution_role(kind)
        role_arn = self.prod.arn(stack, role)
        found = [r for r in role_calls.endpoint_execution_requests(self.prod, stack)
                 # the archive (not an asynchronous request's body, in prod's own bucket)
                 if (r.action == "s3:GetObject" and r.source == "SageMaker: ModelDataUrl")
                 or r.action in role_calls.ECR_PULL]
        assert {r.action for r in found} == {"s3:GetObject", *role_calls.ECR_PULL}
        return [with_principal(r, role_arn, self.prod_account) for r in found]

    def evaluate(self, principal: str, requests: list[Request], *, identity_policies: list[dict],
                 repository_policy: dict | None = None, bucket_policy: dict | None = None):
        """Each request against the identity policies and the dev resource's own policy (dev's account owns it)."""
        verdicts = []
        for request in requests:
            resource_policy = bucket_policy if request.action.startswith("s3:") else repository_policy
            verdicts += evaluate(principal, DEV_ACCOUNT, [request], identity_policies=identity_policies,
                                 resource_policy=resource_policy)
        return verdicts

    def as_deployed(self, principal: str, requests: list[Request], identity_policies: list[dict]):
        return self.evaluate(principal, requests, identity_policies=identity_policies,
                             repository_policy=self.repository_policy, bucket_policy=self.bucket_policy)


def with_principal(request: Request, role_arn: str, account: str) -> Request:
    return Request(request.action, request.resource, {**request.context, "aws:PrincipalArn": role_arn,
                                                      "aws:PrincipalAccount": account, "aws:SecureTransport": "true"},
                   request.source)


@functools.lru_cache(maxsize=None)
def pair_in(prod_account: str) -> Pair:
    return Pair(prod_account)


@pytest.fixture(scope="module", params=[DEV_ACCOUNT, OTHER_ACCOUNT], ids=["same-account", "other-account"])
def pair(request):
    return pair_in(request.param)


# --- the templates ---------------------------------------------------------------------------------------------

def test_devs_policies_name_prods_account_and_exactly_its_execution_roles(pair):
    account = pair.prod_account
    roles = [f"arn:aws:iam::{account}:role/{name}" for name in ROLE_NAMES]
    only_prods_roles = {"ArnEquals": {"aws:PrincipalArn": roles}}
    principal = {"AWS": f"arn:aws:iam::{account}:root"}
    pull = ["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]
    assert pair.repository_policy == {"Version": "2012-10-17", "Statement": [
        {"Sid": "ProdEndpointsPullImages", "Effect": "Allow", "Principal": principal, "Action": pull,
         "Condition": only_prods_roles},
        # CreateModel's validation of a cross-account image looks for SageMaker's service principal: only for
        # SageMaker acting for prod's account.
        {"Sid": "ProdSageMakerPullsImages", "Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"},
         "Action": pull, "Condition": {"StringEquals": {"aws:SourceAccount": account}}}]}
    (statement,) = [s for s in pair.bucket_policy["Statement"] if s.get("Sid") == "ProdEndpointsReadModelArchives"]
    assert statement == {"Sid": "ProdEndpointsReadModelArchives", "Effect": "Allow", "Principal": principal,
                         "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{pair.bucket}/models/*",
                         "Condition": only_prods_roles}
    # Nothing else in the bucket policy lets another account in.
    others = [s for s in pair.bucket_policy["Statement"] if s is not statement and s["Effect"] == "Allow"]
    assert all(account == DEV_ACCOUNT or account not in str(s) for s in others)


def test_prods_roles_are_named_and_read_exactly_the_pinned_artifacts(pair):
    for kind, name in zip(KINDS, ROLE_NAMES):
        stack, role = pair.execution_role(kind)
        assert pair.prod.name(stack, role) == name
        statements = [s for policy in pair.prod.role_policies(stack, role) for s in policy["Statement"]]
        (archive,) = [s for s in statements if s.get("Sid") == "ReadPinnedModelArchive"]
        assert archive["Resource"] == f"arn:aws:s3:::{pair.bucket}/{TEST_PINS['model']['s3_key']}"
        (pull,) = [s for s in statements if "ecr:BatchGetImage" in s["Action"]]
        assert pull["Resource"] == f"arn:aws:ecr:{EXAMPLE_REGION}:{DEV_ACCOUNT}:repository/{pair.repository}"
        (model,) = pair.prod.resources_of_type(stack, "AWS::SageMaker::Model").values()
        container = pair.prod.resolve(stack, model["Properties"]["PrimaryContainer"])
        assert container["Image"] == pair.prod_pins["images"][image_kind(kind)]
        assert container["ModelDataUrl"] == f"s3://{pair.bucket}/{TEST_PINS['model']['s3_key']}"


def test_prod_has_no_build_stack_and_dev_has_one(pair):
    assert "decision-prod-build" not in pair.prod.templates and "decision-dev-build" in pair.dev.templates


def test_an_environment_nobody_takes_from_has_no_resource_policies(tmp_path):
    """prod building its own again (no artifacts_from): dev's repository has no policy, its bucket no statement
    for another environment."""
    rebuilt = context("dev", OTHER_ACCOUNT)
    prod = rebuilt["environments"]["prod"]
    prod.pop("artifacts_from")
    prod["build"] = {**rebuilt["environments"]["dev"]["build"], "log_retention_days": 90}
    prod["pins"] = copy.deepcopy(TEST_PINS)
    cdk_testkit.synthesize(rebuilt, tmp_path)
    dev = Deployment(tmp_path, DEV_ACCOUNT, EXAMPLE_REGION)
    (repository,) = dev.resources_of_type("decision-dev-artifacts", "AWS::ECR::Repository").values()
    assert "RepositoryPolicyText" not in repository["Properties"]
    policies = dev.resources_of_type("decision-dev-artifacts", "AWS::S3::BucketPolicy").values()
    assert OTHER_ACCOUNT not in str(list(policies)) and "decision-prod" not in str(list(policies))


# --- the pull, evaluated -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_prods_execution_role_may_pull_devs_image_and_read_devs_archive(pair, kind):
    stack, role = pair.execution_role(kind)
    verdicts = pair.as_deployed(pair.prod.arn(stack, role), pair.pull_requests(kind),
                                pair.prod.role_policies(stack, role))
    assert not denied(verdicts), "\n".join(denied(verdicts))


def test_another_role_of_prods_account_is_denied(pair):
    """A role not listed in dev's policies, even with the very same identity policies: denied across accounts (the
    resource policy does not name it); in dev's own account its identity policy is enough, as AWS decides."""
    stack, role = pair.execution_role("cpu")
    intruder = pair.role_arn("decision-prod-someone-else")
    requests = [with_principal(r, intruder, pair.prod_account) for r in pair.pull_requests("cpu")]
    verdicts = pair.as_deployed(intruder, requests, pair.prod.role_policies(stack, role))
    if pair.prod_account == OTHER_ACCOUNT:
        assert all(not v.allowed for v in verdicts), [v.line() for v in verdicts]
    else:
        assert not denied(verdicts)
    # Without identity statements of its own, it is denied in either case.
    verdicts = pair.as_deployed(intruder, requests, [])
    assert all(not v.allowed for v in verdicts), [v.line() for v in verdicts]


def test_prods_role_reads_nothing_else_of_devs(pair):
    """Outside the pinned archive and repository (dev's digest records, another key, another repository):
    denied."""
    stack, role = pair.execution_role("cpu")
    role_arn = pair.prod.arn(stack, role)
    elsewhere = [
        Request("s3:GetObject", f"arn:aws:s3:::{pair.bucket}/image-digests/cpu/latest.json"),
        Request("s3:GetObject", f"arn:aws:s3:::{pair.bucket}/models/other-pin/{'0' * 64}/model.tar.gz"),
        Request("s3:GetObject", f"arn:aws:s3:::{pair.bucket}/batch/input/run1/a.jsonl"),
        *[Request(action, f"arn:aws:ecr:{EXAMPLE_REGION}:{DEV_ACCOUNT}:repository/another-repository")
          for action in role_calls.ECR_PULL]]
    requests = [with_principal(r, role_arn, pair.prod_account) for r in elsewhere]
    verdicts = pair.as_deployed(role_arn, requests, pair.prod.role_policies(stack, role))
    assert all(not v.allowed for v in verdicts), [v.line() for v in verdicts if v.allowed]


def test_devs_own_execution_role_does_not_read_prods_grant(pair):
    """dev's CPU execution role (dev's account): dev's policies' statements for prod do not extend to it (its own
    identity statements name dev's pins, not another model)."""
    stack = "decision-dev-endpoint-cpu"
    (model,) = pair.dev.resources_of_type(stack, "AWS::SageMaker::Model").values()
    role = model["Properties"]["ExecutionRoleArn"]["Fn::GetAtt"][0]
    role_arn = pair.dev.arn(stack, role)
    assert role_arn == f"arn:aws:iam::{DEV_ACCOUNT}:role/decision-dev-cpu-execution"
    requests = [with_principal(Request("s3:GetObject", f"arn:aws:s3:::{pair.bucket}/models/other-pin/{'0' * 64}/"
                                       "model.tar.gz"), role_arn, DEV_ACCOUNT)]
    verdicts = pair.as_deployed(role_arn, requests, pair.dev.role_policies(stack, role))
    assert all(not v.allowed for v in verdicts), [v.line() for v in verdicts]


def test_across_accounts_both_policies_are_needed():
    """prod in another account: without dev's resource-policy statement, or without the role's identity statements,
    the pull is denied; in one account the identity policy alone allows it (AWS's rule, shown here so that the
    cross-account denial is the policies', not the simulator's)."""
    for prod_account in (OTHER_ACCOUNT, DEV_ACCOUNT):
        pair = pair_in(prod_account)
        stack, role = pair.execution_role("gpu")
        role_arn, identity = pair.prod.arn(stack, role), pair.prod.role_policies(stack, role)
        requests = pair.pull_requests("gpu")
        without_statement = pair.evaluate(
            role_arn, requests, identity_policies=identity,
            repository_policy={**pair.repository_policy, "Statement": [
                s for s in pair.repository_policy["Statement"] if s["Sid"] != "ProdEndpointsPullImages"]},
            bucket_policy={**pair.bucket_policy, "Statement": [
                s for s in pair.bucket_policy["Statement"] if s.get("Sid") != "ProdEndpointsReadModelArchives"]})
        without_identity = pair.as_deployed(role_arn, requests, [])
        if prod_account == OTHER_ACCOUNT:
            assert all(not v.allowed for v in without_statement), [v.line() for v in without_statement if v.allowed]
        else:
            assert not denied(without_statement)
        assert all(not v.allowed for v in without_identity), [v.line() for v in without_identity if v.allowed]


def test_both_sides_are_cfn_lint_clean(pair):
    """dev's artifacts stack with prod's statements, and prod's endpoint stacks on dev's artifacts, in either
    account (cdk-nag already passed: synthesis applies it)."""
    from test_cdk_cfn_lint import findings
    stacks = [(pair.dev, "decision-dev-artifacts")] + [
        (pair.prod, f"decision-prod-endpoint-{kind.replace('_', '-')}") for kind in KINDS]
    for deployment, stack in stacks:
        assert findings(deployment.templates[stack]) == [], stack


def test_sagemakers_service_principal_may_pull_devs_images_for_prods_account_only(pair):
    """What CreateModel's validation of a cross-account image asks of the repository policy (aws/deep-learning-
    containers#5657): a grant to sagemaker.amazonaws.com. SageMaker acting for prod's account (aws:SourceAccount) is
    allowed the pull actions; for another account, or without the key, denied."""
    repository = f"arn:aws:ecr:{EXAMPLE_REGION}:{DEV_ACCOUNT}:repository/{pair.repository}"
    for source_account, allowed in ((pair.prod_account, True), ("999988887777", False), (None, False)):
        context = {"aws:SourceAccount": source_account} if source_account else {}
        requests = [Request(action, repository, context) for action in role_calls.ECR_PULL]
        verdicts = evaluate("sagemaker.amazonaws.com", DEV_ACCOUNT, requests, identity_policies=[],
                            resource_policy=pair.repository_policy)
        assert [v.allowed for v in verdicts] == [allowed] * len(requests), [v.line() for v in verdicts]


def test_prods_operator_reads_devs_artifacts_only_in_devs_account(pair):
    """What preflight and check-pins -c env=prod ask with prod's operator: dev's image details and archive. In one
    account its own policy allows them; across accounts dev's policies admit prod's execution roles only, so AWS
    answers AccessDenied, which those commands turn into one line naming dev's operator (tests/endpoint_client)."""
    operator = pair.prod.managed_policy("decision-prod-access", "decision-prod-operator")
    principal = pair.role_arn("decision-prod-people")
    image = pair.prod_pins["images"]["cpu"]
    requests = [with_principal(r, principal, pair.prod_account) for r in (
        Request("ecr:DescribeImages", f"arn:aws:ecr:{EXAMPLE_REGION}:{DEV_ACCOUNT}:repository/{pair.repository}"),
        Request("s3:GetObject", f"arn:aws:s3:::{pair.bucket}/{TEST_PINS['model']['s3_key']}"))]
    assert image.split("@")[0].endswith(pair.repository)
    verdicts = pair.as_deployed(principal, requests, [operator])
    if pair.prod_account == OTHER_ACCOUNT:
        assert all(not v.allowed for v in verdicts), [v.line() for v in verdicts if v.allowed]
    else:
        assert not denied(verdicts), "\n".join(denied(verdicts))
