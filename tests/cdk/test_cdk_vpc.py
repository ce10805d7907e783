"""An environment placed in a VPC (cdk.json ``vpc``: subnet_ids and security_group_ids): every Model's VpcConfig, the
execution roles' network-interface rights evaluated with the policy simulator against the calls SageMaker makes with
them (in the subnets: allowed; elsewhere: denied), the network stack's VPC endpoints where ``create_endpoints`` asks
for them, cdk-nag and cfn-lint clean, in-process and through the pinned CLI; each refusal named by its key; the
shipped environments (no vpc) without a VpcConfig, a network stack or any EC2 right."""

from __future__ import annotations

import copy
import json
import shutil

import pytest

import app as cdk_app
import cdk_testkit
import role_calls
from cdk_testkit import ENDPOINT_STACKS, EXAMPLE_ACCOUNT, EXAMPLE_REGION
from deploy.iam_simulation import Deployment, denied, evaluate
from stacks.config import ConfigError, load_environment
from test_cdk_botocore import problems as api_problems
from test_cdk_botocore import requests_of
from test_cdk_cfn_lint import findings
from test_cdk_cli import pinned_checkout, run_cdk

SUBNETS = ["subnet-0a1b2c3d4e5f60718", "subnet-0b1b2c3d4e5f60718"]
GROUPS = ["sg-0c1b2c3d4e5f60718"]
VPC = {"subnet_ids": SUBNETS, "security_group_ids": GROUPS}
CREATED = {"vpc_id": "vpc-0d1b2c3d4e5f60718", "route_table_ids": ["rtb-0e1b2c3d4e5f60718", "rtb-0f1b2c3d4e5f60718"]}
ELSEWHERE = "subnet-0fffffffffffffff0"


def in_vpc(vpc):
    return lambda environment: environment.__setitem__("vpc", copy.deepcopy(vpc))


@pytest.fixture(scope="module", params=cdk_testkit.ENVIRONMENTS)
def placed(request):
    """cdk.json's environment, pinned, with a vpc whose endpoints it creates: synthesized with cdk-nag applied (a
    finding fails it)."""
    return cdk_testkit.synthesized_with(request.param, in_vpc({**VPC, "create_endpoints": CREATED}))


def models(synth):
    return {kind: synth.resource(stack, "AWS::SageMaker::Model", "Endpoint")
            for kind, stack in ENDPOINT_STACKS.items()}


def test_every_model_runs_in_the_subnets_with_the_security_groups(placed):
    for kind, model in models(placed).items():
        properties = model["Properties"]
        assert properties["VpcConfig"] == {"Subnets": SUBNETS, "SecurityGroupIds": GROUPS}, kind
        assert properties["EnableNetworkIsolation"] is True, kind
    assert not [w for w in placed.warnings() if "Availability Zone" in w]


def test_a_placed_environment_is_nag_and_cfn_lint_clean(placed):
    report = placed.outdir / "validation-report.json"
    if report.exists():
        for plugin in json.loads(report.read_text())["pluginReports"]:
            assert plugin["conclusion"] == "success", plugin
    for kind in (*placed.stack_kinds, "network"):
        assert findings(placed.template(kind)) == [], kind


@pytest.mark.parametrize("kind", ENDPOINT_STACKS)
def test_the_requests_with_a_vpc_are_valid_for_sagemakers_api(placed, kind):
    """CreateModel with its VpcConfig (and the rest) as botocore's service model defines them."""
    calls = requests_of(placed.template(ENDPOINT_STACKS[kind]))
    assert [params["VpcConfig"] for _, operation, params in calls if operation == "CreateModel"] == [
        {"Subnets": SUBNETS, "SecurityGroupIds": GROUPS}]
    for service, operation, params in calls:
        assert api_problems(service, operation, params) == [], (operation, params)


def test_the_network_stack_creates_the_endpoints_the_subnets_need(placed):
    network = placed.template("network")["Resources"]
    region = {"Ref": "AWS::Region"} if placed.env == "dev" else EXAMPLE_REGION
    endpoints = {r["Properties"]["ServiceName"]["Fn::Join"][1][2] if isinstance(r["Properties"]["ServiceName"], dict)
                 else r["Properties"]["ServiceName"].rsplit(f"{EXAMPLE_REGION}", 1)[1]: r["Properties"]
                 for r in network.values() if r["Type"] == "AWS::EC2::VPCEndpoint"}
    assert sorted(endpoints) == [".ecr.api", ".ecr.dkr", ".logs", ".s3", ".sts"]
    (group_id, group), = [(lid, r) for lid, r in network.items() if r["Type"] == "AWS::EC2::SecurityGroup"]
    for service, properties in endpoints.items():
        name = properties["ServiceName"]
        assert name == (f"com.amazonaws.{EXAMPLE_REGION}{service}" if placed.env == "prod" else
                        {"Fn::Join": ["", ["com.amazonaws.", region, service]]})
        assert properties["VpcId"] == CREATED["vpc_id"]
        if service == ".s3":
            assert properties["VpcEndpointType"] == "Gateway"
            assert properties["RouteTableIds"] == CREATED["route_table_ids"]
        else:
            assert properties["VpcEndpointType"] == "Interface" and properties["PrivateDnsEnabled"] is True
            assert properties["SubnetIds"] == SUBNETS
            assert properties["SecurityGroupIds"] == [{"Fn::GetAtt": [group_id, "GroupId"]}]
    # HTTPS from the endpoints' security groups only; no egress.
    ingress = group["Properties"]["SecurityGroupIngress"]
    assert [(i["IpProtocol"], i["FromPort"], i["ToPort"], i["SourceSecurityGroupId"]) for i in ingress] == \
        [("tcp", 443, 443, group) for group in GROUPS]
    assert not any("CidrIp" in i for i in ingress)
    assert [e["CidrIp"] for e in group["Properties"]["SecurityGroupEgress"]] == ["255.255.255.255/32"]
    # Each endpoint stack deploys after it (and is destroyed before it).
    artifacts = placed.manifest()["artifacts"]
    for slug in ENDPOINT_STACKS.values():
        assert placed.stack_name("network") in artifacts[placed.stack_name(slug)]["dependencies"], slug


def test_without_create_endpoints_there_is_no_network_stack():
    synth = cdk_testkit.synthesized_with("dev", in_vpc(VPC))
    assert not (synth.outdir / f"{synth.stack_name('network')}.template.json").exists()
    for model in models(synth).values():
        assert model["Properties"]["VpcConfig"] == {"Subnets": SUBNETS, "SecurityGroupIds": GROUPS}


@pytest.mark.parametrize("kind", ENDPOINT_STACKS)
def test_what_sagemaker_does_in_the_subnets_is_allowed_and_nothing_elsewhere(placed, kind):
    deployment = Deployment(placed.outdir, EXAMPLE_ACCOUNT, EXAMPLE_REGION)
    stack = placed.stack_name(ENDPOINT_STACKS[kind])
    role = role_calls.endpoint_execution_role(deployment, stack)

    def verdicts(requests):
        return evaluate(deployment.arn(stack, role), deployment.account, requests,
                        identity_policies=deployment.role_policies(stack, role))

    requests = role_calls.endpoint_execution_requests(deployment, stack)
    network = [r for r in requests if r.action.startswith("ec2:")]
    assert {r.action for r in network} == {
        "ec2:CreateNetworkInterface", "ec2:CreateNetworkInterfacePermission", "ec2:DeleteNetworkInterface",
        "ec2:DeleteNetworkInterfacePermission", "ec2:DescribeNetworkInterfaces", "ec2:DescribeVpcs",
        "ec2:DescribeDhcpOptions", "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups"}
    assert not role_calls.resource_type_problems(requests), role_calls.resource_type_problems(requests)
    assert not denied(verdicts(requests)), "\n".join(denied(verdicts(requests)))
    # An interface in a subnet cdk.json does not name: neither created nor managed there.
    elsewhere = role_calls.network_interface_requests(deployment, stack, subnets=[ELSEWHERE])
    refused = {(v.request.action, v.request.resource.rsplit(":", 1)[-1]) for v in verdicts(elsewhere)
               if not v.allowed}
    assert refused == {("ec2:CreateNetworkInterface", f"subnet/{ELSEWHERE}"),
                       ("ec2:CreateNetworkInterfacePermission", f"network-interface/{role_calls.EXAMPLE_INTERFACE}"),
                       ("ec2:DeleteNetworkInterface", f"network-interface/{role_calls.EXAMPLE_INTERFACE}")}


def test_the_shipped_environments_have_no_vpc_and_no_ec2_rights(pinned):
    assert not (pinned.outdir / f"{pinned.stack_name('network')}.template.json").exists()
    for kind, model in models(pinned).items():
        assert "VpcConfig" not in model["Properties"], kind
    for _, template in pinned.templates():
        for _, statement in cdk_testkit.statements(template):
            assert not [a for a in cdk_testkit.as_list(statement["Action"]) if a.startswith("ec2:")], statement


def test_one_subnet_is_allowed_with_a_warning_per_endpoint():
    synth = cdk_testkit.synthesized_with("dev", in_vpc({**VPC, "subnet_ids": SUBNETS[:1]}))
    warnings = [w for w in synth.warnings() if "Availability Zone" in w]
    assert sorted(warnings) == sorted(
        f"The {kind} endpoint's instances all run in one Availability Zone: vpc.subnet_ids names one subnet. Name 2 "
        f"or more, in different zones, so that an endpoint of 2 or more instances survives a zone's outage "
        f"(docs/deploy.md, VPC)." for kind in ENDPOINT_STACKS)
    for model in models(synth).values():
        assert model["Properties"]["VpcConfig"]["Subnets"] == SUBNETS[:1]


def problems(vpc, env="dev") -> list[str]:
    context = cdk_testkit.context_for(env, edit=in_vpc(vpc))
    with pytest.raises(ConfigError) as raised:
        load_environment(context["environments"], env, model_pins=cdk_app.model_pin_names())
    return list(raised.value.problems)


GROUPS_REQUIRED = ("environments.dev.vpc.security_group_ids: is required with environments.dev.vpc.subnet_ids: "
                   "SageMaker attaches 1 to 5 security groups to the network interfaces it creates in those subnets")


@pytest.mark.parametrize("vpc", [{"subnet_ids": SUBNETS}, {"subnet_ids": SUBNETS, "security_group_ids": []}],
                         ids=["absent", "empty"])
def test_subnets_without_security_groups_are_refused_naming_the_key(vpc):
    (problem,) = problems(vpc)
    assert problem.startswith(GROUPS_REQUIRED), problem


@pytest.mark.parametrize("vpc, expected", [
    ({"security_group_ids": GROUPS}, "environments.dev.vpc.subnet_ids: is required"),
    ({"subnet_ids": [], "security_group_ids": GROUPS},
     "environments.dev.vpc.subnet_ids: expected a list of 1 to 16 subnet ids (2 or more, in different Availability "
     "Zones, recommended), got a list ([])"),
    ({"subnet_ids": "subnet-0a1b2c3d4e5f60718", "security_group_ids": GROUPS},
     "environments.dev.vpc.subnet_ids: expected a list of 1 to 16 subnet ids (2 or more, in different Availability "
     "Zones, recommended), got a string ('subnet-0a1b2c3d4e5f60718')"),
    ({"subnet_ids": ["subnet-123"], "security_group_ids": GROUPS},
     "environments.dev.vpc.subnet_ids[0]: 'subnet-123' is not a subnet id (subnet-<8 or 17 hex>)"),
    ({"subnet_ids": SUBNETS, "security_group_ids": ["sg-0c1b2c3d4e5f60718", "default"]},
     "environments.dev.vpc.security_group_ids[1]: 'default' is not a security group id (sg-<8 or 17 hex>)"),
    ({"subnet_ids": SUBNETS, "security_group_ids": [f"sg-0000000{i}" for i in range(6)]},
     "environments.dev.vpc.security_group_ids: expected a list of 1 to 5 security group ids, got a list"),
    ({"subnet_ids": [SUBNETS[0], SUBNETS[0]], "security_group_ids": GROUPS},
     "environments.dev.vpc.subnet_ids[1]: 'subnet-0a1b2c3d4e5f60718' is already subnet 1"),
    ({**VPC, "vpc_id": "vpc-0a1b2c3d"},
     "environments.dev.vpc.vpc_id: unknown key (expected one of: subnet_ids, security_group_ids, create_endpoints)"),
    ({**VPC, "create_endpoints": {"vpc_id": "vpc-x", "route_table_ids": CREATED["route_table_ids"]}},
     "environments.dev.vpc.create_endpoints.vpc_id: 'vpc-x' is not a VPC id (vpc-<8 or 17 hex>)"),
    ({**VPC, "create_endpoints": {"vpc_id": CREATED["vpc_id"]}},
     "environments.dev.vpc.create_endpoints.route_table_ids: is required"),
    ({**VPC, "create_endpoints": {**CREATED, "route_table_ids": ["rtb-0e1b2c3d4e5f60718"] * 2}},
     "environments.dev.vpc.create_endpoints.route_table_ids[1]: 'rtb-0e1b2c3d4e5f60718' is already route table 1"),
    ("subnet-0a1b2c3d4e5f60718", "environments.dev.vpc: expected an object, got a string"),
], ids=["no-subnets", "empty-subnets", "a-string", "bad-subnet", "bad-group", "six-groups", "repeated-subnet",
        "unknown-key", "bad-vpc-id", "no-route-tables", "repeated-route-table", "not-an-object"])
def test_each_bad_vpc_setting_is_refused_naming_its_key(vpc, expected):
    (problem,) = problems(vpc)
    assert problem.startswith(expected), problem


def test_two_environments_creating_the_endpoints_of_one_vpc_are_refused():
    """Private DNS allows one interface endpoint per service and VPC: the second network stack would fail."""
    # prod located (it must name its account and region), both in one VPC.
    context = cdk_testkit.context_for("prod", pinned=False, edit=in_vpc({**VPC, "create_endpoints": CREATED}))
    context["environments"]["dev"]["vpc"] = {**VPC, "create_endpoints": CREATED}
    for env, other in (("dev", "prod"), ("prod", "dev")):
        with pytest.raises(ConfigError) as raised:
            load_environment(context["environments"], env, model_pins=cdk_app.model_pin_names())
        assert list(raised.value.problems) == [
            f"environments.{env}.vpc.create_endpoints.vpc_id: {CREATED['vpc_id']} is also "
            f"environments.{other}.vpc.create_endpoints's VPC: a VPC has one interface endpoint per service with "
            f"private DNS, so one environment creates them and the others use them (remove create_endpoints from "
            f"every environment of that VPC but one)"]
    # One creates them, the other uses them: both parse.
    context["environments"]["prod"]["vpc"] = dict(VPC)
    assert load_environment(context["environments"], "dev", model_pins=cdk_app.model_pin_names()).vpc.create_endpoints
    assert load_environment(context["environments"], "prod", model_pins=cdk_app.model_pin_names(),
                            ).vpc.create_endpoints is None


def test_npx_cdk_synth_of_a_placed_environment_with_real_format_pins(tmp_path):
    """The path a user takes: cdk.json with pins and a vpc, through the pinned CLI; nag-clean (no finding printed)
    and cfn-lint clean, every Model in the subnets."""
    checkout = pinned_checkout(tmp_path, lambda cdk_json: cdk_json["context"]["environments"]["dev"].update(
        vpc={**VPC, "create_endpoints": CREATED}))
    cdk_json = json.loads((checkout / "cdk.json").read_text())
    out = tmp_path / "cdk.out"
    completed = run_cdk("synth", "-c", "env=dev", "--output", str(out), "--quiet", cwd=checkout, region="eu-west-1")
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "AwsSolutions" not in completed.stderr and "left out" not in completed.stderr
    prefix = cdk_json["context"]["environments"]["dev"]["name_prefix"]
    assert (out / f"{prefix}-network.template.json").exists()
    for path in out.glob(f"{prefix}-*.template.json"):
        template = json.loads(path.read_text())
        assert findings(template) == [], path.name
        for resource in template["Resources"].values():
            if resource["Type"] == "AWS::SageMaker::Model":
                assert resource["Properties"]["VpcConfig"] == {"Subnets": SUBNETS, "SecurityGroupIds": GROUPS}
    shutil.rmtree(out)
