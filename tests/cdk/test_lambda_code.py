from __future__ import annotations

from pathlib import Path

import pytest

from cdk.lambda_code import LambdaPackage, PackageMissingError

from .conftest import write_stand_in_package


def test_a_missing_package_says_to_run_make_package(tmp_path: Path) -> None:
    with pytest.raises(PackageMissingError, match=r"run `make package LAMBDA_ARCH=x86_64` first"):
        LambdaPackage.load(tmp_path, "x86_64")


def test_a_package_for_another_architecture_is_refused(tmp_path: Path) -> None:
    write_stand_in_package(tmp_path, arch="x86_64")
    with pytest.raises(PackageMissingError, match="holds x86_64 bundles and the stack deploys arm64"):
        LambdaPackage.load(tmp_path, "arm64")


def test_a_package_for_another_python_is_refused(tmp_path: Path) -> None:
    write_stand_in_package(tmp_path, python="3.12")
    with pytest.raises(PackageMissingError, match=r"built for Python 3\.12 and the stack runs 3\.14"):
        LambdaPackage.load(tmp_path, "arm64")


def test_a_missing_zip_is_named(tmp_path: Path) -> None:
    write_stand_in_package(tmp_path)
    (tmp_path / "layer-kube-arm64.zip").unlink()
    with pytest.raises(PackageMissingError, match=r"lacks layer-kube-arm64\.zip"):
        LambdaPackage.load(tmp_path, "arm64")


def test_each_function_gets_the_layers_the_package_lists(tmp_path: Path) -> None:
    package = LambdaPackage.load(write_stand_in_package(tmp_path), "arm64")
    assert package.layers_by_function["extender"] == ("layer-arm64.zip",)
    assert package.layers_by_function["node_state"] == ("layer-arm64.zip", "layer-kube-arm64.zip")
