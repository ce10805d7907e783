"""``make rehearse``: the README's deploy path, run by the real CDK CLI against moto's server on loopback.

On a copy of the app whose cdk.json is pinned in the builds' formats (deploy/pins.py) and located in moto's
account, with ``AWS_ENDPOINT_URL=http://localhost:PORT`` (moto reads a template URL path-style only when its host
says localhost) and made-up credentials:

1. ``npx cdk bootstrap``;
2. ``npx cdk deploy -c env=dev --all``: every stack CREATE_COMPLETE, the artifacts stack's exports imported by the
   endpoint and build stacks, each endpoint InService on its pinned image and model;
3. a pin change (new image digests), ``npx cdk diff`` showing it and ``npx cdk deploy --all`` again: the endpoint
   stacks UPDATE_COMPLETE, each endpoint on a new EndpointConfig with the new image, the endpoint names unchanged;
4. ``npx cdk deploy -c env=prod`` of prod's monitoring stack, and ``npx cdk destroy`` of it refused by its
   termination protection;
5. ``npx cdk destroy -c env=dev --all``: every dev stack gone, and their exports.

moto stands in for the services (deploy/emulator.py says where it was made to behave like AWS, and README which
resource types it lacks and only records). Exit 0 when every step and check passed, 1 otherwise.
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

import boto3

from deploy import emulator
from deploy.pins import image_digest, pinned_cdk_json

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
CLI = REPOSITORY_ROOT / "node_modules" / ".bin" / "cdk"
ACCOUNT = "123456789012"        # moto's account: what STS answers for any credentials
REGION = "eu-west-1"
APP_FILES = ("app.py", "stacks", "container", "model_build", "package.json")
# Resource types of the stacks that moto's CloudFormation records but does not create (README lists them).
MOTO_LACKS = {
    "AWS::ApplicationAutoScaling::ScalableTarget": "the endpoints' auto scaling",
    "AWS::ApplicationAutoScaling::ScalingPolicy": "the endpoints' target tracking",
    "AWS::CDK::Metadata": "the CDK's version report",
    "AWS::CodeBuild::Project": "the four build projects",
    "AWS::Logs::MetricFilter": "the adapter's log metrics",
    "AWS::S3::BucketPolicy": "the buckets' TLS-only and log-delivery policies",
    "AWS::SNS::TopicPolicy": "the alarm topic's policy",
}


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

    # --- setting up -------------------------------------------------------------------------------------------

    def environment(self) -> dict[str, str]:
        environment = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CDK_"))}
        environment.update(AWS_ENDPOINT_URL=self.url, AWS_ACCESS_KEY_ID="rehearsal",
                           AWS_SECRET_ACCESS_KEY="rehearsal", AWS_REGION=REGION, AWS_DEFAULT_REGION=REGION,
                           AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=os.devnull,
                           AWS_SHARED_CREDENTIALS_FILE=os.devnull, JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20")
        return environment

    def write_app(self, generation: int) -> None:
        """The app as a user has it: the same files, cdk.json pinned (image build ``generation``) and located."""
        self.checkout.mkdir(parents=True, exist_ok=True)
        for name in APP_FILES:
            link = self.checkout / name
            if not link.exists():
                link.symlink_to(REPOSITORY_ROOT / name)
        cdk_json = pinned_cdk_json(json.loads((REPOSITORY_ROOT / "cdk.json").read_text()), generation=generation,
                                   account=ACCOUNT, region=REGION)
        (self.checkout / "cdk.json").write_text(json.dumps(cdk_json, indent=2))

    def cdk(self, *args: str, expect_failure: bool = False) -> subprocess.CompletedProcess:
        command = [str(CLI), *args, "--app", f"{sys.executable} app.py", "--no-notices"]
        started = time.monotonic()
        done = subprocess.run(command, cwd=self.checkout, env=self.environment(), capture_output=True, text=True,
                              timeout=900)
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

    def stack_names(self, env: str) -> list[str]:
        prefix = json.loads((self.checkout / "cdk.json").read_text())["context"]["environments"][env]["name_prefix"]
        return [f"{prefix}-{kind}" for kind in ("artifacts", "build", "monitoring", "endpoint-cpu", "endpoint-gpu",
                                                "endpoint-text-generation")]

    def endpoint_images(self, endpoint_name: str) -> tuple[str, str]:
        """(EndpointConfig name, the image of its model) of a deployed endpoint."""
        sagemaker = self.client("sagemaker")
        endpoint = sagemaker.describe_endpoint(EndpointName=endpoint_name)
        check(endpoint["EndpointStatus"] == "InService", f"{endpoint_name} is {endpoint['EndpointStatus']}")
        config = sagemaker.describe_endpoint_config(EndpointConfigName=endpoint["EndpointConfigName"])
        (variant,) = config["ProductionVariants"]
        model = sagemaker.describe_model(ModelName=variant["ModelName"])
        return endpoint["EndpointConfigName"], model["PrimaryContainer"]["Image"]

    def check_skipped_resource_types(self, stack_names: list[str]) -> None:
        """The resources moto did not create are exactly of the types README lists as missing from moto."""
        cloudformation, skipped = self.client("cloudformation"), set()
        for name in stack_names:
            template = json.loads((self.checkout / "cdk.out" / f"{name}.template.json").read_text())
            created = {r.get("LogicalResourceId") for r in
                       cloudformation.describe_stack_resources(StackName=name)["StackResources"]}
            skipped |= {r["Type"] for logical_id, r in template["Resources"].items() if logical_id not in created}
        check(skipped == set(MOTO_LACKS), f"moto skipped {sorted(skipped)}, README lists {sorted(MOTO_LACKS)}")

    # --- the steps --------------------------------------------------------------------------------------------

    def run(self) -> None:
        self.write_app(generation=1)
        dev = self.stack_names("dev")
        endpoints = {"cpu": "decision-dev-cpu", "gpu": "decision-dev-gpu",
                     "text_generation": "decision-dev-text-generation"}

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
            check(image.endswith("@" + image_digest(kind, 1)), f"{endpoint_name} runs {image}")
            first[kind] = config_name

        self.log("3. a pin change: diff, then deploy dev --all")
        self.write_app(generation=2)
        # As the pull-request workflow runs it: against the deployed template (moto cannot delete a diff change set).
        diff = self.cdk("diff", "-c", "env=dev", "decision-dev-endpoint-cpu", "--exclusively", "--method", "template")
        check(image_digest("cpu", 2) in diff.stdout + diff.stderr, "the diff does not show the new cpu digest")
        self.cdk("deploy", "-c", "env=dev", "--all", "--require-approval", "never")
        stacks = self.stacks()
        for name in dev:
            expected = "UPDATE_COMPLETE" if "-endpoint-" in name else ("CREATE_COMPLETE", "UPDATE_COMPLETE")
            status = stacks.get(name, {}).get("StackStatus")
            check(status in (expected if isinstance(expected, tuple) else (expected,)), f"{name}: {status}")
        for kind, endpoint_name in endpoints.items():
            config_name, image = self.endpoint_images(endpoint_name)
            check(image.endswith("@" + image_digest(kind, 2)), f"{endpoint_name} still runs {image}")
            check(config_name != first[kind], f"{endpoint_name} kept its EndpointConfig {config_name}")

        self.log("4. prod: termination protection refuses a destroy")
        protected = "decision-prod-monitoring"
        self.cdk("deploy", "-c", "env=prod", protected, "--exclusively", "--require-approval", "never")
        stack = self.stacks()[protected]
        check(stack.get("EnableTerminationProtection") is True, f"{protected} is not protected: {stack}")
        refused = self.cdk("destroy", "-c", "env=prod", protected, "--exclusively", "--force", expect_failure=True)
        check("TerminationProtection" in refused.stdout + refused.stderr,
              f"destroy failed for another reason:\n{(refused.stdout + refused.stderr)[-3000:]}")
        check(self.stacks().get(protected, {}).get("StackStatus") == "CREATE_COMPLETE", f"{protected} is gone")

        self.log("5. destroy dev --all")
        self.cdk("destroy", "-c", "env=dev", "--all", "--force")
        remaining = [name for name in dev if name in self.stacks()]
        check(not remaining, f"still there after destroy: {remaining}")
        check(not [name for name in self.exports() if name.startswith("decision-dev-")],
              f"exports left: {sorted(self.exports())}")


def rehearse(log: Callable[[str], None] = lambda line: print(line, flush=True)) -> None:
    if not CLI.exists():
        raise RehearsalFailed("the aws-cdk CLI is not installed: run make node_modules/.installed (npm ci)")
    server, port = emulator.start()
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="cdk-rehearsal-") as workdir:
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
