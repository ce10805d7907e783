"""``make rehearse``: the deploy path of docs/deploy.md, run by the real CDK CLI against moto's server on loopback.

On a copy of the app whose cdk.json is pinned in the builds' formats (deploy/pins.py) and located in moto's
account, with ``AWS_ENDPOINT_URL=http://localhost:PORT`` (moto reads a template URL path-style only when its host
says localhost) and made-up credentials:

1. ``npx cdk bootstrap``;
2. ``npx cdk deploy -c env=dev --all``: every stack CREATE_COMPLETE, the artifacts stack's exports imported by the
   endpoint and build stacks, each endpoint InService on its pinned image and model;
3. a pin change (new image digests), ``npx cdk diff --method template`` showing it (its API calls recorded by moto
   and each evaluated against the review stack's role, deploy/iam_simulation.py: what a pull request's diff does
   with that role) and ``npx cdk deploy --all`` again: the endpoint stacks UPDATE_COMPLETE, each endpoint on a new
   EndpointConfig with the new image, the endpoint names unchanged; the calls the diff and the deploy made with the
   caller's own credentials (not a bootstrap role's) evaluated against the deployed deployer policy
   (``<prefix>-deployer`` of the access stack);
4. ``python -m endpoint_client acceptance -c env=dev --emulator moto`` with a rollback drill (``--drill-fault
   fail``): no check fails, and each one moto cannot show says why; the drill's faulty Model and EndpointConfig are
   made, UpdateEndpoint is asked (moto has none: no DeploymentConfig runs, no alarm history is kept) and the drill
   leaves nothing behind;
5. prod from dev's artifacts (``artifacts_from: dev``; dev retains its artifacts, as it must once prod pins them):
   ``python -m endpoint_client promote --from dev --to prod --emulator moto`` writes prod's pins from what dev serves
   and step 4's report accepted (full references into dev's repository, the archive in dev's bucket, the report's
   S3 version and sha256; refused at step 3, before any acceptance of those digests), tags the images so that
   dev's lifecycle keeps them, and ``promote --verify`` finds prod's pins in that very report version,
   ``npx cdk deploy -c env=prod --all``: no build
   stack, every other stack CREATE_COMPLETE and protected, each endpoint InService on a Model naming dev's image
   digest and model data URL; then ``npx cdk destroy`` of prod's monitoring stack refused by its termination
   protection; and prod's copy in a second account (``prod-elsewhere``, credentials of a role assumed there):
   ``npx cdk bootstrap`` and ``deploy`` in that account, promote pinning it, its Models naming dev's digests and
   archive, dev's repository and bucket policies naming exactly its execution roles under its account; that copy is
   placed in a VPC made in its account (cdk.json's ``vpc`` with ``create_endpoints``): its network stack's VPC
   endpoints created there, every Model's VpcConfig naming the subnets and security group; and its cpu endpoint
   captures data (``cpu.data_capture``): its EndpointConfig's DataCaptureConfig into its own artifact bucket;
6. ``npx cdk destroy -c env=dev --all``: every dev stack gone, and their exports.

It ends with the acceptance report of step 4.

moto stands in for the services (deploy/emulator.py says where it was made to behave like AWS, and docs/deploy.md,
"Deploy rehearsal (`make rehearse`)", which resource types it lacks and only records). Exit 0 when every step and
check passed, 1 otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable
from urllib.parse import unquote

import boto3

from deploy import emulator, iam_simulation, node
from deploy.pins import image_digest, image_manifest, pinned_cdk_json
from endpoint_client.deployment import SERVING, Served, served_by
from stacks.config import INTERFACE_ENDPOINT_SERVICES, execution_role_name, image_kind

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
CLI = REPOSITORY_ROOT / "node_modules" / ".bin" / "cdk"
ACCOUNT = "123456789012"        # moto's account: what STS answers for any credentials
# A second account, for a prod in another account than dev's: credentials of a role assumed there (moto serves each
# account apart and makes no role exist first, docs: "Multi-Account support").
OTHER_ACCOUNT = "210987654321"
OTHER_PROD = "prod-elsewhere"   # a copy of prod in OTHER_ACCOUNT, taking dev's artifacts as prod does
OTHER_PREFIX = "decision-prod-x"
REGION = "eu-west-1"
APP_FILES = ("app.py", "stacks", "container", "model_build", "endpoint_client", "examples", "package.json")
# Resource types of the stacks that moto's CloudFormation records but does not create (docs/deploy.md lists them).
MOTO_LACKS = {
    "AWS::ApplicationAutoScaling::ScalableTarget": "the endpoints' auto scaling",
    "AWS::ApplicationAutoScaling::ScalingPolicy": "the endpoints' target tracking",
    "AWS::CDK::Metadata": "the CDK's version report",
    "AWS::CodeBuild::Project": "the four build projects",
    "AWS::Logs::MetricFilter": "the adapter's log metrics",
    "AWS::S3::BucketPolicy": "the buckets' TLS-only and log-delivery policies",
    "AWS::SNS::TopicPolicy": "the alarm topic's policy",
}


def review_requests(recording: str, stacks: dict[str, dict[str, Any]], account: str, region: str
                    ) -> tuple[list[iam_simulation.Request], set[str]]:
    """The IAM requests of the calls in a moto recording (one JSON request per line), and the roles the CLI tried to
    assume (sts:AssumeRole, which the review role may not: on AWS the CLI then goes on with its own credentials)."""
    import base64
    import re
    from urllib.parse import parse_qs, urlsplit
    requests, assumed = [], set()
    for line in filter(None, recording.splitlines()):
        entry = json.loads(line)
        headers = {k.lower(): v for k, v in entry["headers"].items()}
        scope = re.search(r"Credential=[^/]+/\d+/[^/]+/([^/]+)/aws4_request", headers.get("authorization", ""))
        if scope is None:
            continue
        service = scope[1]
        body = entry.get("body") or ""
        if entry.get("body_encoded"):
            body = base64.b64decode(body).decode(errors="replace")
        target = headers.get("x-amz-target")
        if target:
            operation, params = target.split(".", 1)[1], json.loads(body or "{}")
        else:
            form = {k: v[0] for k, v in parse_qs(body).items()} or \
                {k: v[0] for k, v in parse_qs(urlsplit(entry["url"]).query).items()}
            operation, params = form.get("Action", ""), form
        if service == "sts":
            if operation == "AssumeRole":
                assumed.add(params.get("RoleArn", "?"))
            continue        # GetCallerIdentity needs no permission
        source = f"cdk diff: {service} {operation}"
        if service == "cloudformation":
            name = params.get("StackName")
            if name is None:
                resource = "*"
            else:
                stack = stacks.get(name) or next((s for s in stacks.values() if s["StackId"] == name), None)
                resource = stack["StackId"] if stack else \
                    f"arn:aws:cloudformation:{region}:{account}:stack/{name}/00000000-0000-0000-0000-000000000000"
        elif service == "ssm":
            resource = f"arn:aws:ssm:{region}:{account}:parameter/{params.get('Name', '').lstrip('/')}"
        else:
            resource = "*"
        requests.append(iam_simulation.Request(f"{service}:{operation}", resource, source=source))
    return requests, assumed


def one_request_a_line(recording: str) -> str:
    """moto's recording with one JSON request per line. Its server handles requests in threads and writes a
    record and its newline separately, so calls made in parallel (the deploy's) can leave two records on a line."""
    decoder, entries, position = json.JSONDecoder(), [], 0
    while True:
        while position < len(recording) and recording[position].isspace():
            position += 1
        if position == len(recording):
            return "".join(json.dumps(entry) + "\n" for entry in entries)
        entry, position = decoder.raw_decode(recording, position)
        entries.append(entry)


def caller_requests(recording: str, access_key: str, stacks: dict[str, dict[str, Any]], account: str, region: str
                    ) -> list[iam_simulation.Request]:
    """The IAM requests of the calls in a moto recording signed with ``access_key`` (the caller's own credentials,
    not those of a role the CLI assumed): what the deployer policy must allow. sts:AssumeRole is one of them; a call
    with session tags would also need sts:TagSession."""
    import re
    own = "\n".join(line for line in recording.splitlines() if line and re.search(
        rf"Credential={re.escape(access_key)}/", json.dumps(json.loads(line)["headers"])))
    requests, assumed = review_requests(own, stacks, account, region)
    tagged = [line for line in own.splitlines() if "AssumeRole" in line and "Tags.member" in line]
    return requests + [iam_simulation.Request("sts:AssumeRole", role, source="cdk: sts AssumeRole")
                       for role in sorted(assumed)] + \
        [iam_simulation.Request("sts:TagSession", "*", source="cdk: sts AssumeRole with tags") for _ in tagged[:1]]


class RehearsalFailed(AssertionError):
    pass


def check(condition: bool, message: str) -> None:
    if not condition:
        raise RehearsalFailed(message)


class Rehearsal:
    def __init__(self, workdir: Path, port: int, log: Callable[[str], None]):
        self.workdir, self.port, self.log = workdir, port, log
        self.url = f"http://localhost:{port}"
        self.checkout = workdir / "app"
        self.session = boto3.session.Session(aws_access_key_id="rehearsal", aws_secret_access_key="rehearsal",
                                             region_name=REGION)
        self.acceptance: list[str] = []
        self.dev: iam_simulation.Deployment | None = None  # dev's assembly as last deployed (step 3)

    # --- setting up -------------------------------------------------------------------------------------------

    def environment(self) -> dict[str, str]:
        environment = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CDK_"))}
        environment.update(AWS_ENDPOINT_URL=self.url, AWS_ACCESS_KEY_ID="rehearsal",
                           AWS_SECRET_ACCESS_KEY="rehearsal", AWS_REGION=REGION, AWS_DEFAULT_REGION=REGION,
                           AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=os.devnull,
                           AWS_SHARED_CREDENTIALS_FILE=os.devnull)
        return node.environment(environment)

    def write_app(self, generation: int) -> None:
        """The app as a user has it: the same files, cdk.json pinned (image build ``generation``) and located."""
        self.checkout.mkdir(parents=True, exist_ok=True)
        for name in APP_FILES:
            link = self.checkout / name
            if not link.exists():
                link.symlink_to(REPOSITORY_ROOT / name)
        cdk_json = pinned_cdk_json(json.loads((REPOSITORY_ROOT / "cdk.json").read_text()), generation=generation,
                                   account=ACCOUNT, region=REGION, one_account=True)
        environments = cdk_json["context"]["environments"]
        # prod again, in another account: dev's artifacts stack lets its execution roles pull across accounts. It is
        # the first environment of its account, so it creates what an account has once; promote pins it.
        elsewhere = json.loads(json.dumps(environments["prod"]))
        elsewhere.update(account=OTHER_ACCOUNT, name_prefix=OTHER_PREFIX, create_transform_log_group=None,
                         pins={"images": {kind: None for kind in environments["prod"]["pins"]["images"]},
                               "model": None})
        elsewhere["review"] = {**elsewhere["review"], "create_oidc_provider": None}
        environments[OTHER_PROD] = elsewhere
        (self.checkout / "cdk.json").write_text(json.dumps(cdk_json, indent=2))

    def other_account(self) -> dict[str, str]:
        """The CLI's environment with credentials of a role assumed in OTHER_ACCOUNT."""
        credentials = self.client("sts").assume_role(RoleArn=f"arn:aws:iam::{OTHER_ACCOUNT}:role/rehearsal-deployer",
                                                     RoleSessionName="rehearsal")["Credentials"]
        return {**self.environment(), "AWS_ACCESS_KEY_ID": credentials["AccessKeyId"],
                "AWS_SECRET_ACCESS_KEY": credentials["SecretAccessKey"],
                "AWS_SESSION_TOKEN": credentials["SessionToken"]}

    def cdk(self, *args: str, expect_failure: bool = False,
            environment: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        command = [str(CLI), *args, "--app", f"{sys.executable} app.py", "--no-notices"]
        started = time.monotonic()
        done = subprocess.run(command, cwd=self.checkout, env=environment or self.environment(), capture_output=True,
                              text=True, timeout=900)
        self.log(f"  npx cdk {' '.join(args)}: exit {done.returncode} in {time.monotonic() - started:.0f} s")
        if (done.returncode != 0) != expect_failure:
            raise RehearsalFailed(f"npx cdk {' '.join(args)} exited {done.returncode}:\n"
                                  f"{(done.stdout + done.stderr)[-6000:]}")
        return done

    def client(self, service: str) -> Any:
        return self.session.client(service, endpoint_url=self.url)

    # --- what is deployed -------------------------------------------------------------------------------------

    def stacks(self) -> dict[str, dict[str, Any]]:
        cloudformation = self.client("cloudformation")
        return {s["StackName"]: s for page in cloudformation.get_paginator("describe_stacks").paginate()
                for s in page["Stacks"]}

    def exports(self) -> dict[str, str]:
        cloudformation = self.client("cloudformation")
        return {e["Name"]: e["Value"] for page in cloudformation.get_paginator("list_exports").paginate()
                for e in page["Exports"]}

    def cdk_json(self) -> dict[str, Any]:
        return json.loads((self.checkout / "cdk.json").read_text())

    def stack_names(self, env: str) -> list[str]:
        """The environment's stacks: no build stack where it takes its artifacts from another (artifacts_from)."""
        environment = self.cdk_json()["context"]["environments"][env]
        kinds = ("artifacts", "build", "network", "monitoring", "review", "access", "endpoint-cpu", "endpoint-gpu",
                 "endpoint-text-generation")
        return [f"{environment['name_prefix']}-{kind}" for kind in kinds
                if (kind != "build" or not environment.get("artifacts_from"))
                and (kind != "network" or (environment.get("vpc") or {}).get("create_endpoints"))]

    def endpoint_images(self, endpoint_name: str) -> tuple[str, str]:
        """(EndpointConfig name, the image of its model) of a deployed endpoint."""
        served = self.serving(endpoint_name)
        return served.endpoint_config_name, served.image

    def serving(self, endpoint_name: str) -> Served:
        return serving(self.client("sagemaker"), endpoint_name)

    def check_skipped_resource_types(self, stack_names: list[str]) -> None:
        """The resources moto did not create are exactly of the types docs/deploy.md lists as missing from moto."""
        cloudformation, skipped = self.client("cloudformation"), set()
        for name in stack_names:
            template = json.loads((self.checkout / "cdk.out" / f"{name}.template.json").read_text())
            created = {r.get("LogicalResourceId") for r in
                       cloudformation.describe_stack_resources(StackName=name)["StackResources"]}
            skipped |= {r["Type"] for logical_id, r in template["Resources"].items() if logical_id not in created}
        check(skipped == set(MOTO_LACKS), f"moto skipped {sorted(skipped)}, docs/deploy.md lists {sorted(MOTO_LACKS)}")

    # --- the steps --------------------------------------------------------------------------------------------

    def run(self) -> None:
        self.write_app(generation=1)
        dev = self.stack_names("dev")
        # The async endpoint deploys as far as moto goes (its AsyncInferenceConfig, topics, scaling to 0); what
        # only an account shows of it (the answer, the scale from 0, the notifications) acceptance lists unprovable.
        endpoints = {"cpu": "decision-dev-cpu", "gpu": "decision-dev-gpu",
                     "text_generation": "decision-dev-text-generation", "async": "decision-dev-async"}

        self.log("1. bootstrap")
        self.cdk("bootstrap", f"aws://{ACCOUNT}/{REGION}", "-c", "env=dev")
        check(self.stacks().get("CDKToolkit", {}).get("StackStatus") == "CREATE_COMPLETE", "CDKToolkit is not there")

        self.log("2. deploy dev --all")
        self.cdk("deploy", "-c", "env=dev", "--all", "--require-approval", "never")
        stacks = self.stacks()
        for name in dev:
            check(stacks.get(name, {}).get("StackStatus") == "CREATE_COMPLETE",
                  f"{name}: {stacks.get(name, {}).get('StackStatus', 'missing')}")
        exports = self.exports()
        check("decision-dev-artifacts:ArtifactBucketArn" in exports, f"no bucket ARN export: {sorted(exports)}")
        check(exports["decision-dev-artifacts:ArtifactBucketArn"].startswith("arn:aws:s3:::"),
              f"bucket ARN export is {exports['decision-dev-artifacts:ArtifactBucketArn']}")
        check(any(name.startswith("decision-dev-monitoring:ExportsOutputRefAlarmTopic") for name in exports),
              f"no alarm topic export: {sorted(exports)}")
        self.check_skipped_resource_types(dev)
        alarms = {a["AlarmName"] for page in self.client("cloudwatch").get_paginator("describe_alarms").paginate()
                  for a in page["MetricAlarms"]}
        check({"decision-dev-cpu-ScoringFailures", "decision-dev-gpu-Invocation5xxRate",
               "decision-dev-text-generation-MemoryUtilization"} <= alarms, f"alarms missing: {sorted(alarms)}")
        first = {}
        for kind, endpoint_name in endpoints.items():
            config_name, image = self.endpoint_images(endpoint_name)
            check(image.endswith("@" + image_digest(image_kind(kind), 1)), f"{endpoint_name} runs {image}")
            first[kind] = config_name
        self.push_builds(1)

        self.log("3. a pin change: diff, then deploy dev --all")
        self.push_builds(2)
        self.write_app(generation=2)
        # As the pull-request workflow runs it: against the deployed templates (moto cannot delete a diff change set),
        # its calls recorded, then evaluated against the review role it runs with there.
        self.recorder("reset-recording")
        self.recorder("start-recording")
        diff = self.cdk("diff", "-c", "env=dev", "--all", "--method", "template")
        self.recorder("stop-recording")
        check(image_digest("cpu", 2) in diff.stdout + diff.stderr, "the diff does not show the new cpu digest")
        diff_calls = self.recorder("download-recording")
        self.check_review_role(diff_calls)
        self.recorder("reset-recording")
        self.recorder("start-recording")
        self.cdk("deploy", "-c", "env=dev", "--all", "--require-approval", "never")
        self.recorder("stop-recording")
        self.check_deployer_policy(diff_calls, self.recorder("download-recording"))
        # dev's templates as deployed now (the assembly is rewritten by the next synth): step 5b reads them.
        self.dev = iam_simulation.Deployment(self.checkout / "cdk.out", ACCOUNT, REGION)
        # Digests dev serves but no acceptance proved: promote refuses them, and writes nothing.
        before = (self.checkout / "cdk.json").read_text()
        refused = self.promote(expect_failure=True)
        check("no acceptance report" in refused, f"promote refused for another reason: {refused[-2000:]}")
        check((self.checkout / "cdk.json").read_text() == before, "a refused promote changed cdk.json")
        stacks = self.stacks()
        for name in dev:
            expected = "UPDATE_COMPLETE" if "-endpoint-" in name else ("CREATE_COMPLETE", "UPDATE_COMPLETE")
            status = stacks.get(name, {}).get("StackStatus")
            check(status in (expected if isinstance(expected, tuple) else (expected,)), f"{name}: {status}")
        for kind, endpoint_name in endpoints.items():
            config_name, image = self.endpoint_images(endpoint_name)
            check(image.endswith("@" + image_digest(image_kind(kind), 2)), f"{endpoint_name} still runs {image}")
            check(config_name != first[kind], f"{endpoint_name} kept its EndpointConfig {config_name}")

        self.log("4. acceptance -c env=dev (moto)")
        self.acceptance = self.accept()

        self.log("5. prod from dev's artifacts: deploy prod --all, then termination protection refuses a destroy")
        self.promote()
        self.verify_promoted()
        self.cdk("deploy", "-c", "env=prod", "--all", "--require-approval", "never")
        prod, stacks = self.stack_names("prod"), self.stacks()
        check("decision-prod-build" not in stacks and "decision-prod-build" not in prod,
              "prod has a build stack, though it takes its artifacts from dev")
        for name in prod:
            stack = stacks.get(name, {})
            check(stack.get("StackStatus") == "CREATE_COMPLETE", f"{name}: {stack.get('StackStatus', 'missing')}")
            check(stack.get("EnableTerminationProtection") is True, f"{name} is not protected")
        for kind, endpoint_name in endpoints.items():
            dev_served = self.serving(endpoint_name)
            prod_endpoint = endpoint_name.replace("decision-dev-", "decision-prod-")
            prod_served = self.serving(prod_endpoint)
            for key in ("image", "model_data_url"):
                check(getattr(prod_served, key) == getattr(dev_served, key), f"{prod_endpoint}'s Model has {key} "
                      f"{getattr(prod_served, key)}, dev's {getattr(dev_served, key)}")
            check(prod_served.image.endswith("@" + image_digest(image_kind(kind), 2)), f"{prod_endpoint} runs "
                  f"{prod_served.image}, not dev's accepted digest")
        self.log(f"  prod's {len(endpoints)} endpoints run dev's image digests and model archive; no prod build stack")
        protected = "decision-prod-monitoring"
        refused = self.cdk("destroy", "-c", "env=prod", protected, "--exclusively", "--force", expect_failure=True)
        check("TerminationProtection" in refused.stdout + refused.stderr,
              f"destroy failed for another reason:\n{(refused.stdout + refused.stderr)[-3000:]}")
        check(self.stacks().get(protected, {}).get("StackStatus") == "CREATE_COMPLETE", f"{protected} is gone")

        self.log(f"5b. prod in another account ({OTHER_ACCOUNT}) from dev's artifacts: bootstrap there, promote, deploy")
        self.deploy_elsewhere(endpoints)

        self.log("6. destroy dev --all")
        self.cdk("destroy", "-c", "env=dev", "--all", "--force")
        remaining = [name for name in dev if name in self.stacks()]
        check(not remaining, f"still there after destroy: {remaining}")
        check(not [name for name in self.exports() if name.startswith("decision-dev-")],
              f"exports left: {sorted(self.exports())}")

        self.log("acceptance report (step 4; python -m endpoint_client acceptance -c env=dev --emulator moto):")
        for line in self.acceptance:
            self.log(f"  {line}")

    def deploy_elsewhere(self, endpoints: dict[str, str]) -> None:
        """prod's copy in OTHER_ACCOUNT: bootstrapped and deployed with that account's credentials, pinned by promote
        (which reads dev); its Models name dev's image digests (dev's registry) and dev's archive, and dev's
        repository and bucket policies name exactly its execution roles, under its account's principal."""
        elsewhere = self.other_account()
        session = boto3.session.Session(aws_access_key_id=elsewhere["AWS_ACCESS_KEY_ID"],
                                        aws_secret_access_key=elsewhere["AWS_SECRET_ACCESS_KEY"],
                                        aws_session_token=elsewhere["AWS_SESSION_TOKEN"], region_name=REGION)
        cloudformation, sagemaker, ec2 = (session.client(s, endpoint_url=self.url)
                                          for s in ("cloudformation", "sagemaker", "ec2"))
        vpc = self.place_in_a_vpc(OTHER_PROD, ec2)
        self.capture_data(OTHER_PROD, "cpu", {"sampling_percentage": 100})
        self.cdk("bootstrap", f"aws://{OTHER_ACCOUNT}/{REGION}", "-c", f"env={OTHER_PROD}", environment=elsewhere)
        self.promote(OTHER_PROD)
        self.cdk("deploy", "-c", f"env={OTHER_PROD}", "--all", "--require-approval", "never", environment=elsewhere)
        theirs = {s["StackName"]: s for page in cloudformation.get_paginator("describe_stacks").paginate()
                  for s in page["Stacks"]}
        names = self.stack_names(OTHER_PROD)
        check(f"{OTHER_PREFIX}-build" not in names, f"{OTHER_PROD} has a build stack")
        for name in names:
            check(theirs.get(name, {}).get("StackStatus") == "CREATE_COMPLETE",
                  f"{name} in {OTHER_ACCOUNT}: {theirs.get(name, {}).get('StackStatus', 'missing')}")
            check(name not in self.stacks(), f"{name} is in dev's account too")
        for kind, endpoint_name in endpoints.items():
            dev_served = self.serving(endpoint_name)
            elsewhere_endpoint = endpoint_name.replace("decision-dev-", f"{OTHER_PREFIX}-")
            served = serving(sagemaker, elsewhere_endpoint)
            for key in ("image", "model_data_url"):
                check(getattr(served, key) == getattr(dev_served, key), f"{elsewhere_endpoint}'s Model has {key} "
                      f"{getattr(served, key)}, dev's {getattr(dev_served, key)}")
            placed = sagemaker.describe_model(ModelName=served.model_name).get("VpcConfig")
            check(placed == {"Subnets": vpc["subnet_ids"], "SecurityGroupIds": vpc["security_group_ids"]},
                  f"{elsewhere_endpoint}'s Model has VpcConfig {placed}, cdk.json's vpc {vpc}")
        created = {e["ServiceName"]: e for e in ec2.describe_vpc_endpoints(Filters=[{
            "Name": "vpc-id", "Values": [vpc["create_endpoints"]["vpc_id"]]}])["VpcEndpoints"]}
        wanted = {f"com.amazonaws.{REGION}.{service}" for service in (*INTERFACE_ENDPOINT_SERVICES, "s3")}
        check(set(created) == wanted, f"the VPC's endpoints are {sorted(created)}, not {sorted(wanted)}")
        check(created[f"com.amazonaws.{REGION}.s3"].get("RouteTableIds") == vpc["create_endpoints"]["route_table_ids"],
              f"S3's gateway endpoint is on {created[f'com.amazonaws.{REGION}.s3'].get('RouteTableIds')}")
        roles = sorted(f"arn:aws:iam::{OTHER_ACCOUNT}:role/{execution_role_name(OTHER_PREFIX, kind)}"
                       for kind in endpoints)
        # moto's CloudFormation applies neither an ECR repository's policy nor AWS::S3::BucketPolicy (it records
        # them): read both from dev's deployed artifacts template instead, resolved as a deployment resolves it.
        artifacts = "decision-dev-artifacts"
        assert self.dev is not None, "step 3 deploys dev first"
        deployed = self.client("cloudformation").get_template(StackName=artifacts)["TemplateBody"]
        check((deployed if isinstance(deployed, dict) else json.loads(deployed)) == self.dev.templates[artifacts],
              f"{artifacts} as deployed is not the template dev's last deploy synthesized")
        policies = {what: [self.dev.resolve(artifacts, r["Properties"][key])
                           for r in self.dev.resources_of_type(artifacts, kind).values()]
                    for what, kind, key in (("repository", "AWS::ECR::Repository", "RepositoryPolicyText"),
                                            ("bucket", "AWS::S3::BucketPolicy", "PolicyDocument"))}
        for what, found in policies.items():  # the bucket's: the artifact bucket's and its access-log bucket's
            granted = [statement for policy in found for statement in policy["Statement"]
                       if statement.get("Principal", {}).get("AWS") == f"arn:aws:iam::{OTHER_ACCOUNT}:root"]
            check(len(granted) == 1, f"dev's {what} policy has {len(granted)} statements for {OTHER_ACCOUNT}")
            named = granted[0]["Condition"]["ArnEquals"]["aws:PrincipalArn"]
            check(sorted([named] if isinstance(named, str) else named) == roles,
                  f"dev's {what} policy names {named} for {OTHER_ACCOUNT}, not {roles}")
        self.log(f"  {OTHER_PROD}'s {len(endpoints)} endpoints in {OTHER_ACCOUNT} run dev's image digests and model "
                 f"archive; dev's repository and bucket policies name exactly its {len(roles)} execution roles")
        self.log(f"  {OTHER_PROD} is placed in a VPC: every Model in its {len(vpc['subnet_ids'])} subnets, its network "
                 f"stack's {len(created)} VPC endpoints there")
        outputs = {o["OutputKey"]: o["OutputValue"]
                   for o in theirs[f"{OTHER_PREFIX}-artifacts"].get("Outputs", [])}
        for kind, endpoint_name in endpoints.items():
            served = serving(sagemaker, endpoint_name.replace("decision-dev-", f"{OTHER_PREFIX}-"))
            capture = sagemaker.describe_endpoint_config(
                EndpointConfigName=served.endpoint_config_name).get("DataCaptureConfig") or None
            expected = None if kind != "cpu" else {
                "EnableCapture": True, "InitialSamplingPercentage": 100,
                "DestinationS3Uri": f"s3://{outputs.get('ArtifactBucketName')}/data-capture/",
                "CaptureOptions": [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}],
                "CaptureContentTypeHeader": {"JsonContentTypes": ["application/json"]}}
            check(capture == expected, f"{served.endpoint_name}'s EndpointConfig captures {capture}, not {expected}")
        self.log(f"  {OTHER_PROD}'s cpu endpoint captures its requests and responses into its own artifact bucket "
                 f"(data-capture/); the others capture nothing")

    def capture_data(self, env: str, kind: str, capture: dict[str, Any]) -> None:
        """``<kind>.data_capture`` of ``env`` set in its cdk.json as a user writes it (docs/deploy.md, Data
        capture)."""
        cdk_json = self.cdk_json()
        cdk_json["context"]["environments"][env][kind]["data_capture"] = capture
        (self.checkout / "cdk.json").write_text(json.dumps(cdk_json, indent=2))

    def place_in_a_vpc(self, env: str, ec2: Any) -> dict[str, Any]:
        """A VPC made for ``env`` in its account (two subnets in two zones, a security group, a route table) and
        named in its cdk.json as a user writes it (docs/deploy.md, VPC), the network stack creating the VPC
        endpoints: its ``vpc`` settings."""
        vpc_id = ec2.create_vpc(CidrBlock="10.20.0.0/16")["Vpc"]["VpcId"]
        subnets = [ec2.create_subnet(VpcId=vpc_id, CidrBlock=f"10.20.{index}.0/24",
                                     AvailabilityZone=f"{REGION}{zone}")["Subnet"]["SubnetId"]
                   for index, zone in enumerate("ab")]
        group = ec2.create_security_group(GroupName="decision-endpoints", Description="the decision endpoints",
                                          VpcId=vpc_id)["GroupId"]
        table = ec2.create_route_table(VpcId=vpc_id)["RouteTable"]["RouteTableId"]
        vpc = {"subnet_ids": subnets, "security_group_ids": [group],
               "create_endpoints": {"vpc_id": vpc_id, "route_table_ids": [table]}}
        cdk_json = self.cdk_json()
        cdk_json["context"]["environments"][env]["vpc"] = vpc
        (self.checkout / "cdk.json").write_text(json.dumps(cdk_json, indent=2))
        return vpc

    # --- the review role and the acceptance command -------------------------------------------------------------

    def recorder(self, action: str) -> str:
        """moto's request recorder (/moto-api/recorder/<action>)."""
        import urllib.request
        method = "GET" if action == "download-recording" else "POST"
        with urllib.request.urlopen(urllib.request.Request(f"{self.url}/moto-api/recorder/{action}", method=method,
                                                           data=None if method == "GET" else b""), timeout=30) as r:
            text = r.read().decode()
        return one_request_a_line(text) if action == "download-recording" else text

    def check_review_role(self, recording: str) -> None:
        """Every call the CLI made during the diff, as the deployed review role: allowed by that role's policies."""
        iam = self.client("iam")
        role = iam.get_role(RoleName="decision-dev-cdk-diff")["Role"]
        policies = [iam.get_role_policy(RoleName=role["RoleName"], PolicyName=name)["PolicyDocument"]
                    for name in iam.list_role_policies(RoleName=role["RoleName"])["PolicyNames"]]
        requests, assumed = review_requests(recording, self.stacks(), ACCOUNT, REGION)
        check(requests, "the diff made no API call moto recorded")
        verdicts = iam_simulation.evaluate(role["Arn"], ACCOUNT, requests,
                                           identity_policies=[p if isinstance(p, dict) else json.loads(p)
                                                              for p in policies])
        denied = iam_simulation.denied(verdicts)
        check(not denied, "the review role does not allow what cdk diff --method template calls:\n" + "\n".join(denied))
        actions = sorted({r.action for r in requests})
        self.log(f"  the diff's {len(requests)} calls ({', '.join(actions)}) are allowed by decision-dev-cdk-diff"
                 + (f"; it also tried sts:AssumeRole on {', '.join(sorted(assumed))}, which that role may not"
                    if assumed else ""))

    def promote(self, target: str = "prod", *, expect_failure: bool = False) -> str:
        """``python -m endpoint_client promote --from dev --to <target> --emulator moto`` on the checkout's cdk.json:
        its output (the pins it wrote, or why it refused)."""
        command = [sys.executable, "-m", "endpoint_client", "promote", "--from", "dev", "--to", target,
                   "--emulator", "moto", "--endpoint-url", self.url, "--cdk-json", str(self.checkout / "cdk.json")]
        done = subprocess.run(command, cwd=self.checkout, env=self.environment(), capture_output=True, text=True,
                              timeout=300)
        output = done.stdout + done.stderr
        check((done.returncode != 0) == expect_failure, f"promote exited {done.returncode}:\n{output[-4000:]}")
        self.log(f"  promote --from dev --to {target}: exit {done.returncode}: {output.strip().splitlines()[-1]}")
        return output

    def push_builds(self, generation: int) -> None:
        """What the image builds push into dev's repository (CodeBuild is not emulated): each kind's manifest of this
        build, whose digest the pins name (deploy/pins.py), under its build tag. moto's SageMaker pulls nothing, but
        promote tags what it promotes, in the repository."""
        outputs = {o["OutputKey"]: o["OutputValue"] for o in self.stacks()["decision-dev-artifacts"]["Outputs"]}
        repository = outputs["ImageRepositoryUri"].split("/", 1)[1]
        ecr = self.client("ecr")
        for kind, tag in (("cpu", "cpu-"), ("gpu", "gpu-"), ("text_generation", "textgen-")):
            ecr.put_image(repositoryName=repository, imageManifest=image_manifest(kind, generation),
                          imageManifestMediaType="application/vnd.docker.distribution.manifest.v2+json",
                          imageTag=f"{tag}build{generation}", imageDigest=image_digest(kind, generation))

    def verify_promoted(self, target: str = "prod") -> None:
        """What promote wrote, before the target's deploy: ``promote --verify`` reads the recorded version of dev's
        acceptance report again and finds the target's pins in it; dev's images carry the tag that keeps them."""
        command = [sys.executable, "-m", "endpoint_client", "promote", "--from", "dev", "--to", target, "--verify",
                   "--emulator", "moto", "--endpoint-url", self.url, "--cdk-json", str(self.checkout / "cdk.json")]
        done = subprocess.run(command, cwd=self.checkout, env=self.environment(), capture_output=True, text=True,
                              timeout=300)
        output = done.stdout + done.stderr
        check(done.returncode == 0, f"promote --verify exited {done.returncode}:\n{output[-4000:]}")
        pins = json.loads((self.checkout / "cdk.json").read_text())["context"]["environments"][target]["pins"]
        ecr = self.client("ecr")
        for kind, image in pins["images"].items():
            repository, _, digest = image.split("/", 1)[1].partition("@")
            (details,) = ecr.describe_images(repositoryName=repository, imageIds=[{"imageDigest": digest}])[
                "imageDetails"]
            check(f"pinned-{digest.removeprefix('sha256:')}" in details.get("imageTags", []),
                  f"{kind}: {image} is not tagged pinned-<digest> in dev's repository")
        self.log(f"  promote --verify: {done.stdout.strip()}; dev's images tagged pinned-<digest>")

    def check_deployer_policy(self, *recordings: str) -> None:
        """Every call the CLI made with the caller's own credentials during the diff and the deploy: allowed by the
        deployed deployer policy (the bootstrap roles it assumed do the rest)."""
        iam = self.client("iam")
        outputs = {o["OutputKey"]: o["OutputValue"] for o in self.stacks()["decision-dev-access"]["Outputs"]}
        policy = iam.get_policy(PolicyArn=outputs["DeployerPolicyArn"])["Policy"]
        document = iam.get_policy_version(PolicyArn=policy["Arn"], VersionId=policy["DefaultVersionId"])[
            "PolicyVersion"]["Document"]
        document = document if isinstance(document, dict) else json.loads(unquote(document))
        stacks = self.stacks()
        requests = [r for recording in recordings
                    for r in caller_requests(recording, "rehearsal", stacks, ACCOUNT, REGION)]
        actions = sorted({r.action for r in requests})
        check("sts:AssumeRole" in actions,
              f"the CLI assumed no bootstrap role with the caller's credentials: {actions}")
        verdicts = iam_simulation.evaluate(f"arn:aws:iam::{ACCOUNT}:user/deployer", ACCOUNT, requests,
                                           identity_policies=[document])
        denied = iam_simulation.denied(verdicts)
        check(not denied, f"{policy['PolicyName']} does not allow what cdk diff and deploy call with the caller's "
                          f"credentials:\n" + "\n".join(denied))
        roles = sorted({r.resource.rsplit("/", 1)[1] for r in requests if r.action == "sts:AssumeRole"})
        self.log(f"  cdk diff and deploy made {len(requests)} calls with the caller's own credentials "
                 f"({', '.join(actions)}: {', '.join(roles)}); all are allowed by {policy['PolicyName']}")

    def accept(self) -> list[str]:
        command = [sys.executable, "-m", "endpoint_client", "acceptance", "-c", "env=dev", "--emulator", "moto",
                   "--endpoint-url", self.url, "--cdk-json", str(self.checkout / "cdk.json"), "--wait", "0",
                   "--rollback-drill", "cpu", "--drill-fault", "fail"]
        done = subprocess.run(command, cwd=self.checkout, env=self.environment(), capture_output=True, text=True,
                              timeout=600)
        lines = done.stdout.strip().splitlines()
        check(done.returncode == 0, f"acceptance exited {done.returncode}:\n{done.stdout[-4000:]}{done.stderr[-2000:]}")
        states = {line.split()[0] for line in lines[:-1]}
        check(states <= {"proved", "unprovable", "warn", "skipped"} and "unprovable" in states,
              f"acceptance reported {sorted(states)}:\n{done.stdout[-4000:]}")
        # The drill as far as moto goes: its faulty Model (ADAPTER_DRILL=fail, which the adapter's tests run) and
        # EndpointConfig made and sent to UpdateEndpoint, which moto lacks; nothing of it left behind.
        (drill,) = [line for line in lines if line.split()[1:3] == ["rollback", "drill"]]
        check(drill.startswith("unprovable") and "UpdateEndpoint" in drill and "ADAPTER_DRILL=fail" in drill,
              f"the drill did not reach UpdateEndpoint: {drill}")
        left = [m["ModelName"] for m in self.client("sagemaker").list_models()["Models"] if "-drill-" in m["ModelName"]]
        check(not left, f"the drill left its Model behind: {left}")
        self.log(f"  {lines[-1]}")
        return lines


def serving(sagemaker: Any, endpoint_name: str) -> Served:
    """What a deployed endpoint serves (its Model's image and archive, as promote reads it), which must be
    InService."""
    served = served_by(sagemaker, endpoint_name)
    check(served.status == SERVING, f"{endpoint_name} is {served.status}")
    return served


def rehearse(log: Callable[[str], None] = lambda line: print(line, flush=True)) -> None:
    if not CLI.exists():
        raise RehearsalFailed("the aws-cdk CLI is not installed: run make node_modules/.installed (npm ci)")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cdk-rehearsal-") as workdir:
        # moto's request recorder (step 3) writes where this says, read when its server starts.
        os.environ["MOTO_RECORDER_FILEPATH"] = str(Path(workdir) / "moto-recording.jsonl")
        server, port = emulator.start()
        try:
            Rehearsal(Path(workdir), port, log).run()
        finally:
            server.stop()
    log(f"rehearsal passed in {time.monotonic() - started:.0f} s")


def main() -> int:
    try:
        rehearse()
    except RehearsalFailed as failure:
        print(f"rehearsal failed: {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
