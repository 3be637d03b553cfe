"""Build the extender Lambda bundle and its dependency layer without Docker.

``make package`` (or ``python tools/package_lambda.py --arch arm64``) writes:

- ``build/lambda/extender.zip``: our code only (``scheduler_core``, ``adapters``, ``lambdas/extender``);
- ``build/lambda/layer-<arch>.zip``: ``python/`` with numpy, Powertools and the X-Ray SDK, installed
  for the Lambda platform with ``pip --platform ... --only-binary=:all: --no-compile --target``
  (DESIGN section 8), versions pinned from ``requirements.lock``.

It trims what the runtime already has (boto3, botocore, s3transfer) or never needs (numpy's tests and
type stubs, ``__pycache__``), refuses a bundle that contains ``kubernetes``, and prints a size report
as JSON. Lambda's limit is 250 MB unzipped for function plus layers.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYER_PACKAGES = ("numpy", "aws-lambda-powertools", "jmespath", "typing-extensions", "aws-xray-sdk", "wrapt")
PLATFORMS = {
    "arm64": ("manylinux_2_28_aarch64", "manylinux2014_aarch64"),
    "x86_64": ("manylinux_2_28_x86_64", "manylinux2014_x86_64"),
}
# Provided by the Lambda Python runtime, or never imported at run time.
TRIM = (
    "boto3",
    "botocore",
    "s3transfer",
    "numpy/_core/tests",
    "numpy/*/tests",
    "numpy/tests",
    "numpy/_pyinstaller",
    "numpy/typing/tests",
    "**/__pycache__",
    "**/*.pyi",
    "numpy.libs/*.a",
)
CODE = ("scheduler_core", "adapters", "lambdas/__init__.py", "lambdas/extender")
LAMBDA_UNZIPPED_LIMIT = 250 * 10**6


def pinned(names: tuple[str, ...]) -> list[str]:
    """``name==version`` for each name, from requirements.lock (names compared PEP 503-normalised)."""

    def norm(name: str) -> str:
        return name.lower().replace("_", "-").replace(".", "-")

    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if "==" in line:
            name, version = line.split("==", 1)
            pins[norm(name)] = version.strip()
    missing = [n for n in names if norm(n) not in pins]
    if missing:
        raise SystemExit(f"requirements.lock lacks {', '.join(missing)}")
    return [f"{n}=={pins[norm(n)]}" for n in names]


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def zip_tree(source: Path, target: Path) -> None:
    target.unlink(missing_ok=True)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as archive:
        for path in sorted(source.rglob("*")):
            if path.is_file():
                archive.write(path, path.relative_to(source))


def build(out: Path, arch: str, python_version: str) -> dict[str, object]:
    out.mkdir(parents=True, exist_ok=True)
    layer_dir, code_dir = out / f"layer-{arch}", out / "extender"
    for stale in (layer_dir, code_dir):
        shutil.rmtree(stale, ignore_errors=True)
    site = layer_dir / "python"
    platform_flags = [flag for p in PLATFORMS[arch] for flag in ("--platform", p)]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--only-binary=:all:",
            "--no-compile",
            "--implementation",
            "cp",
            "--python-version",
            python_version,
            *platform_flags,
            "--target",
            str(site),
            *pinned(LAYER_PACKAGES),
        ],
        check=True,
    )
    trimmed = 0
    for pattern in TRIM:
        for path in list(site.glob(pattern)):
            trimmed += tree_bytes(path) if path.is_dir() else path.stat().st_size
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    for item in CODE:
        source = ROOT / item
        target = code_dir / item
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    for tree in (site, code_dir):
        if any(tree.glob("kubernetes")) or any(tree.glob("*/kubernetes")):
            raise SystemExit(f"{tree} contains kubernetes: the extender must not ship or import it")
    zip_tree(layer_dir, out / f"layer-{arch}.zip")
    zip_tree(code_dir, out / "extender.zip")
    packages = sorted(((p.name, tree_bytes(p)) for p in site.iterdir() if p.is_dir()), key=lambda kv: -kv[1])
    unzipped = tree_bytes(site) + tree_bytes(code_dir)
    return {
        "arch": arch,
        "python": python_version,
        "extender_zip_bytes": (out / "extender.zip").stat().st_size,
        "layer_zip_bytes": (out / f"layer-{arch}.zip").stat().st_size,
        "unzipped_bytes": unzipped,
        "unzipped_limit_bytes": LAMBDA_UNZIPPED_LIMIT,
        "trimmed_bytes": trimmed,
        "largest_packages": dict(packages[:8]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=sorted(PLATFORMS), default="arm64")
    parser.add_argument("--python-version", default="3.13", help="the Lambda runtime's Python")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "lambda")
    args = parser.parse_args()
    report = build(args.out, args.arch, args.python_version)
    print(json.dumps(report, indent=2))
    if report["unzipped_bytes"] > LAMBDA_UNZIPPED_LIMIT:  # type: ignore[operator]
        print(f"unzipped size {report['unzipped_bytes']} exceeds Lambda's 250 MB limit", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
