"""CDK test helpers: a tiny stand-in for ``make package``, and stacks synthesised once per context."""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from aws_cdk import App, Stack
from aws_cdk import aws_lambda as lambda_
from aws_cdk.assertions import Template

from cdk.app import build_app
from cdk.stack import GpuSchedulerStack

IMPORTED_NETWORK = {
    "vpcId": "vpc-0123456789abcdef0",
    "subnetIds": "subnet-0aaaaaaaaaaaaaaaa,subnet-0bbbbbbbbbbbbbbbb",
    "routeTableIds": "rtb-0aaaaaaaaaaaaaaaa,rtb-0bbbbbbbbbbbbbbbb",
    "clusterSecurityGroupId": "sg-0cccccccccccccccc",
    "schedulerSecurityGroupId": "sg-0dddddddddddddddd",
}
IMPORTED_ENDPOINT = {**{k: v for k, v in IMPORTED_NETWORK.items() if k != "schedulerSecurityGroupId"},
                     "executeApiEndpointId": "vpce-0eeeeeeeeeeeeeeee"}  # fmt: skip
"""Context: the imported VPC with an imported execute-api endpoint (whose owner admits the scheduler pods)."""
APPLIED_WITH_SHARING = {"applyManifests": True, "sharing": True, **IMPORTED_NETWORK}
"""Context: the imported VPC, with sharing, and the manifests applied by the stack."""
OURS = ("ExtenderFunction", "NodeStateFunction", "DeletionCostFunction")
"""The logical-ID prefixes of the package's three functions."""


def write_stand_in_package(directory: Path, *, arch: str = "arm64", python: str = "3.14") -> Path:
    """Zips holding one small file each, and the package.json the CDK app reads (as make package writes)."""
    directory.mkdir(parents=True, exist_ok=True)
    layers = {"extender": ["layer-arm64.zip"], "node_state": ["layer-arm64.zip", "layer-kube-arm64.zip"]}
    layers["deletion_cost"] = layers["consolidation"] = layers["node_state"]
    for name in ("extender", "node_state", "deletion_cost", "consolidation", "layer-arm64", "layer-kube-arm64"):
        with zipfile.ZipFile(directory / f"{name}.zip", "w") as archive:
            archive.writestr("stand_in.txt", f"stand-in for {name}\n")
    functions = {name: {"layers": zips} for name, zips in layers.items()}
    (directory / "package.json").write_text(json.dumps({"arch": arch, "python": python, "functions": functions}))
    return directory


@pytest.fixture(scope="session")
def package_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_stand_in_package(tmp_path_factory.mktemp("lambda-package"))


@dataclass(frozen=True)
class Synth:
    stack: GpuSchedulerStack
    template: Template
    outdir: Path

    def resources(self, kind: str) -> dict[str, Any]:
        found: dict[str, Any] = self.template.find_resources(kind)
        return found

    def nag_report(self) -> dict[str, Any]:
        (plugin,) = json.loads((self.outdir / "validation-report.json").read_text())["pluginReports"]
        report: dict[str, Any] = plugin
        return report


Synthesise = Callable[..., Synth]


def our_functions(synthesised: Synth) -> dict[str, Any]:
    """The three Lambdas of the package (not the CDK-owned providers)."""
    return {k: v for k, v in synthesised.resources("AWS::Lambda::Function").items() if k.startswith(OURS)}


def by_prefix(resources: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The one resource whose logical ID starts with ``prefix``."""
    (value,) = [v for k, v in resources.items() if k.startswith(prefix)]
    return dict(value)


@pytest.fixture(scope="session")
def synth(package_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Synth]:
    """``synth(**context)``: the whole app with cdk-nag attached, synthesised once per distinct context."""
    cache: dict[str, Synth] = {}

    def run(**context: Any) -> Synth:
        full = {"clusterName": "gpu-prod", "packageDir": str(package_dir), **context}
        key = json.dumps(full, sort_keys=True)
        if key not in cache:
            outdir = tmp_path_factory.mktemp("cdk.out")
            app, stack = build_app(full, str(outdir))
            app.synth()  # runs cdk-nag: raises on any unacknowledged finding
            cache[key] = Synth(stack, Template.from_stack(stack), outdir)
        return cache[key]

    return run


def joined(value: Any, token: str = "TOKEN") -> str:
    """A ``Fn::Join`` (or a plain string) as text: each ``{"Ref": X}`` in it written as ``<X>``, any other
    intrinsic as ``token``."""

    def part(p: Any) -> str:
        if isinstance(p, str):
            return p
        return f"<{p['Ref']}>" if isinstance(p, dict) and set(p) == {"Ref"} else token

    if isinstance(value, dict) and "Fn::Join" in value:
        sep, parts = value["Fn::Join"]
        return str(sep).join(part(p) for p in parts)
    return part(value)


def bare_stack() -> Stack:
    """A stack of its own for one construct (STYLE 16), environment-agnostic like the real one."""
    return Stack(App(), "Bare")


def inline_function(stack: Stack) -> lambda_.Function:
    """A stand-in Lambda function with inline code, for constructs that take one."""
    return lambda_.Function(
        stack,
        "Handler",
        runtime=lambda_.Runtime.PYTHON_3_14,
        handler="index.handler",
        code=lambda_.Code.from_inline("def handler(event, context): pass"),
    )
