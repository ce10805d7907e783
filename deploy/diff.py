"""``make diff BASE=REV``: the CloudFormation difference a change makes, per stack, offline.

The base revision (``git archive REV``) and the working tree (tracked and untracked files, as git sees them) are
each copied to a temporary folder and synthesized by the pinned CDK CLI, exactly as ``npx cdk synth`` runs the
app. Each side keeps the pins its cdk.json has: a pin change, the most common deploy change, is what the diff must
show, and a pin that only one side has stays missing on the other (a first pin shows as the endpoint it creates).
Only a pin that neither side has gets a synthetic one, the same on both (deploy/pins.py: the builds' formats), and
the example account, region and repository where cdk.json names none. The pins that differ are printed first,
per environment; then, per stack, ``npx cdk diff --app <working tree's assembly> --template <base's template>
--exclusively STACK`` prints what would change, with no AWS account involved. A stack that only one side has is
reported as added or removed. Exit 0 (the difference is printed, not judged), 2 when a side does not synthesize.

For a pull request against the deployed stacks (which needs read access to the account), see
.github/workflows/cdk-diff.yml and docs/deploy.md, "Review in pull requests".
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Sequence

from deploy import node
from deploy.pins import EXAMPLE_REGION, completed_contexts, pin_values

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
CLI = REPOSITORY_ROOT / "node_modules" / ".bin" / "cdk"


class DiffError(RuntimeError):
    pass


def cli_environment() -> dict[str, str]:
    """No AWS: no credentials, no shared configuration, no metadata service; one region for both sides."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CDK_"))}
    environment.update(AWS_REGION=EXAMPLE_REGION, AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=os.devnull,
                       AWS_SHARED_CREDENTIALS_FILE=os.devnull)
    return node.environment(environment)


def git(repo: Path, *args: str, binary: bool = False) -> bytes | str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=False)
    if done.returncode != 0:
        raise DiffError(f"git {' '.join(args)}: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout if binary else done.stdout.decode()


def export_revision(repo: Path, revision: str, destination: Path) -> None:
    archive = git(repo, "archive", "--format=tar", revision, binary=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(destination, filter="data")


def export_working_tree(repo: Path, destination: Path) -> None:
    """The files git would commit: tracked ones as they are now, and untracked ones that are not ignored."""
    listed = git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard", binary=True)
    for name in filter(None, listed.decode().split("\0")):
        source = repo / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def pin(base: Path, head: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Completes both checkouts' cdk.json for synthesis (deploy.pins.completed_contexts); returns their contexts as
    they were."""
    contents = [json.loads((checkout / "cdk.json").read_text()) for checkout in (base, head)]
    completed = completed_contexts(contents[0]["context"], contents[1]["context"])
    for checkout, content, context in zip((base, head), contents, completed):
        (checkout / "cdk.json").write_text(json.dumps({**content, "context": context}, indent=2))
    return contents[0]["context"], contents[1]["context"]


def pin_changes(base: dict[str, Any], head: dict[str, Any], env: str) -> list[str]:
    """One line per pin of the environment that differs between the two sides' cdk.json."""
    def values(context):
        environment = context.get("environments", {}).get(env)
        return pin_values(environment) if environment is not None else {}
    old, new = values(base), values(head)
    shown = lambda value: "unpinned" if value is None else json.dumps(value, sort_keys=True)  # noqa: E731
    return [f"  {key}: {shown(old.get(key))} -> {shown(new.get(key))}" for key in sorted(set(old) | set(new))
            if old.get(key) != new.get(key)]


def synthesize(checkout: Path, env: str, outdir: Path) -> list[str]:
    """The environment's stack names, synthesized into outdir by the pinned CLI."""
    done = subprocess.run([str(CLI), "synth", "-c", f"env={env}", "--output", str(outdir), "--quiet",
                           "--app", f"{sys.executable} app.py", "--no-notices"], cwd=checkout,
                          env=cli_environment(), capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise DiffError(f"{checkout.name}: npx cdk synth -c env={env} failed:\n{done.stderr[-4000:]}")
    manifest = json.loads((outdir / "manifest.json").read_text())
    return sorted(name for name, artifact in manifest["artifacts"].items()
                  if artifact["type"] == "aws:cloudformation:stack")


def stack_diff(head_assembly: Path, base_template: Path, stack: str, env: str) -> str:
    done = subprocess.run([str(CLI), "diff", "--app", str(head_assembly), "--template", str(base_template),
                           "--exclusively", stack, "-c", f"env={env}", "--no-notices"], cwd=head_assembly.parent,
                          env=cli_environment(), capture_output=True, text=True, timeout=300)
    if done.returncode not in (0, 1):
        raise DiffError(f"npx cdk diff {stack} failed:\n{done.stderr[-4000:]}")
    return (done.stdout + done.stderr).strip()


def diff(repo: Path, base: str, environments: Sequence[str], out=sys.stdout) -> int:
    """Prints, per environment and stack, the difference from base to the working tree; the number of stacks
    that differ."""
    if not CLI.exists():
        raise DiffError("the aws-cdk CLI is not installed: run make node_modules/.installed (npm ci)")
    revision = git(repo, "rev-parse", "--verify", f"{base}^{{commit}}").strip()
    differing = 0
    with tempfile.TemporaryDirectory(prefix="cdk-diff-") as scratch:
        root = Path(scratch)
        sides = {"base": root / "base", "head": root / "head"}
        export_revision(repo, revision, sides["base"])
        export_working_tree(repo, sides["head"])
        contexts = dict(zip(sides, pin(sides["base"], sides["head"])))
        for env in environments:
            assemblies = {side: root / f"{side}-{env}.out" for side in sides}
            stacks = {side: synthesize(sides[side], env, assemblies[side]) for side in sides}
            print(f"=== -c env={env}: {base} ({revision[:12]}) -> working tree", file=out)
            changes = pin_changes(contexts["base"], contexts["head"], env)
            print("pins changed:\n" + "\n".join(changes) if changes else "pins unchanged", file=out)
            for stack in sorted(set(stacks["base"]) | set(stacks["head"])):
                if stack not in stacks["head"]:
                    print(f"Stack {stack}\n[-] removed: the working tree no longer has this stack\n", file=out)
                    differing += 1
                    continue
                base_template = assemblies["base"] / f"{stack}.template.json"
                if stack not in stacks["base"]:
                    base_template = root / "empty.template.json"
                    base_template.write_text("{}")
                text = stack_diff(assemblies["head"], base_template, stack, env)
                if "There were no differences" not in text:
                    differing += 1
                print(text + "\n", file=out)
    print(f"{differing} stack(s) differ", file=out)
    return differing


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.diff", description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the revision to compare with (a branch, tag or commit)")
    parser.add_argument("--env", action="append", dest="environments",
                        help="an environment of cdk.json (repeatable; default: every one)")
    parser.add_argument("--repo", type=Path, default=REPOSITORY_ROOT, help="the repository (default: this one)")
    args = parser.parse_args(argv)
    environments = args.environments or sorted(json.loads((args.repo / "cdk.json").read_text())["context"]
                                                ["environments"])
    try:
        diff(args.repo.resolve(), args.base, environments)
    except DiffError as error:
        print(f"deploy.diff: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
