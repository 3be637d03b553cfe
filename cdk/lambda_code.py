"""The Lambda bundles ``make package`` built, checked against what the stack deploys."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from scheduler_core.errors import ConfigError

RUNTIME = lambda_.Runtime.PYTHON_3_14  # the newest Python runtime this aws-cdk-lib offers
RUNTIME_PYTHON = "3.14"
ARCHITECTURES = {"arm64": lambda_.Architecture.ARM_64, "x86_64": lambda_.Architecture.X86_64}
FUNCTIONS = ("extender", "node_state", "deletion_cost", "consolidation")
MANIFEST = "package.json"  # written by tools/package_lambda.py


class PackageMissingError(ConfigError):
    """The bundles are absent or were built for another architecture or Python."""


@dataclass(frozen=True)
class LambdaPackage:
    """``build/lambda``: one zip per function and the layers each one runs with.

    >>> LambdaPackage.load(Path("/nonexistent"), "arm64")
    Traceback (most recent call last):
    ...
    cdk.lambda_code.PackageMissingError: no Lambda package in /nonexistent: run `make package LAMBDA_ARCH=arm64` first
    """

    directory: Path
    arch: str
    layers_by_function: dict[str, tuple[str, ...]]

    @classmethod
    def load(cls, directory: Path, arch: str) -> LambdaPackage:
        fix = f"run `make package LAMBDA_ARCH={arch}` first"
        manifest = directory / MANIFEST
        if not manifest.is_file():
            raise PackageMissingError(f"no Lambda package in {directory}: {fix}")
        try:
            report = json.loads(manifest.read_text())
            built_arch, python = report["arch"], report["python"]
            layers = {name: tuple(f["layers"]) for name, f in report["functions"].items()}
        except (ValueError, KeyError, TypeError) as exc:
            raise PackageMissingError(f"{manifest} is unreadable ({exc!r}): {fix}") from exc
        if built_arch != arch:
            raise PackageMissingError(f"{directory} holds {built_arch} bundles and the stack deploys {arch}: {fix}")
        if python != RUNTIME_PYTHON:
            raise PackageMissingError(
                f"{directory} was built for Python {python} and the stack runs {RUNTIME_PYTHON}: "
                f"run `make package LAMBDA_ARCH={arch} LAMBDA_PYTHON={RUNTIME_PYTHON}`"
            )
        missing = [
            name
            for name in (*(f"{fn}.zip" for fn in FUNCTIONS), *(z for fn in FUNCTIONS for z in layers.get(fn, ())))
            if not (directory / name).is_file()
        ]
        missing += [fn for fn in FUNCTIONS if fn not in layers]
        if missing:
            raise PackageMissingError(f"{directory} lacks {', '.join(sorted(set(missing)))}: {fix}")
        return cls(directory=directory, arch=arch, layers_by_function=layers)

    @property
    def architecture(self) -> lambda_.Architecture:
        return ARCHITECTURES[self.arch]

    def code(self, function: str) -> lambda_.Code:
        return lambda_.Code.from_asset(str(self.directory / f"{function}.zip"))

    def layers(self, scope: Construct, function: str) -> list[lambda_.ILayerVersion]:
        """The function's layers; each zip becomes one LayerVersion, shared by the functions in ``scope``."""
        found = []
        for zip_name in self.layers_by_function[function]:
            layer_id = "Layer-" + zip_name.removesuffix(".zip")
            existing = scope.node.try_find_child(layer_id)
            if existing is None:
                existing = lambda_.LayerVersion(
                    scope,
                    layer_id,
                    code=lambda_.Code.from_asset(str(self.directory / zip_name)),
                    compatible_architectures=[self.architecture],
                    compatible_runtimes=[RUNTIME],
                    description=f"eks-gpu-scheduler dependencies ({zip_name})",
                )
            found.append(existing)
        return found
