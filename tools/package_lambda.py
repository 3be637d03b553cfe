"""Build the Lambda bundles and their dependency layers without Docker.

``make package`` (or ``python tools/package_lambda.py --arch arm64``) writes, under ``build/lambda/``:

- ``extender.zip``, ``node_state.zip``, ``deletion_cost.zip``: our code only (``scheduler_core``,
  ``adapters``, ``manifests``, ``shares``, and that Lambda's handler and application packages);
- ``layer-<arch>.zip``: ``python/`` with numpy, msgspec, Powertools and the X-Ray SDK, for every Lambda;
- ``layer-kube-<arch>.zip``: ``python/`` with the ``kubernetes`` client, for the two
  refreshers only. The extender never ships it (its hot path must not import ``kubernetes``);
- ``package.json``: the size report below, which also tells the CDK app the architecture and Python.

Layers are installed for the Lambda platform with ``pip --platform ... --only-binary=:all:
--no-compile --target`` (DESIGN section 8), versions pinned from ``requirements.lock``, then trimmed of
what the runtime already has (boto3, botocore, s3transfer) or never imports (numpy's tests and type
stubs, ``kubernetes/aio`` and its aiohttp, ``__pycache__``). A size report per function, as JSON,
is checked against Lambda's 250 MB unzipped limit for function plus layers.
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
LAYER_PACKAGES = (
    "numpy", "msgspec", "aws-lambda-powertools", "jmespath", "typing-extensions", "aws-xray-sdk", "wrapt",
)  # fmt: skip
# kubernetes' own imports at `import kubernetes` (config: yaml, oauthlib; stream: websocket; client:
# pydantic, urllib3, dateutil). aiohttp is left out: only kubernetes.aio uses it. msgspec is in the
# layer every Lambda has (the extender decodes its requests with it).
KUBE_LAYER_PACKAGES = (
    "kubernetes", "pydantic", "pydantic-core", "annotated-types", "typing-inspection",
    "typing-extensions", "python-dateutil", "six", "pyyaml", "websocket-client", "requests",
    "requests-oauthlib", "oauthlib", "urllib3", "certifi", "idna", "charset-normalizer", "durationpy",
)  # fmt: skip
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
    "kubernetes/aio",
    "kubernetes/**/test",
    "kubernetes/**/tests",
)
SHARED_CODE = (
    "scheduler_core", "adapters", "manifests", "shares", "lambdas/__init__.py", "lambdas/refresher.py",
    "application/__init__.py",
)  # fmt: skip
"""Every function's code: the core, the adapters, the objects a function creates (a reservation pod), and what
the refreshers' handlers share."""
FUNCTIONS = {
    # function: (its handler and its application layer, the layers it runs with)
    name: ((f"lambdas/{name}", f"application/{name}"), layers)
    for name, layers in (
        ("extender", ("layer",)),
        ("node_state", ("layer", "layer-kube")),
        ("deletion_cost", ("layer", "layer-kube")),
        ("consolidation", ("layer", "layer-kube")),
    )
}
LAMBDA_UNZIPPED_LIMIT = 250 * 10**6
MANIFEST = "package.json"


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


def install_layer(site: Path, packages: tuple[str, ...], arch: str, python_version: str) -> int:
    """pip-install ``packages`` for the Lambda platform into ``site``; return the bytes trimmed."""
    platform_flags = [flag for p in PLATFORMS[arch] for flag in ("--platform", p)]
    subprocess.run(
        [
            sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
            "--only-binary=:all:", "--no-compile", "--implementation", "cp", "--python-version", python_version,
            *platform_flags, "--target", str(site), *pinned(packages),
        ],
        check=True,
    )  # fmt: skip
    trimmed = 0
    for pattern in TRIM:
        for path in list(site.glob(pattern)):
            if not path.exists():
                continue
            trimmed += tree_bytes(path) if path.is_dir() else path.stat().st_size
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    return trimmed


def copy_code(target_dir: Path, items: tuple[str, ...]) -> None:
    for item in items:
        source = ROOT / item
        target = target_dir / item
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def build(out: Path, arch: str, python_version: str) -> dict[str, object]:
    out.mkdir(parents=True, exist_ok=True)
    layers = {"layer": LAYER_PACKAGES, "layer-kube": KUBE_LAYER_PACKAGES}
    trimmed = 0
    layer_bytes = {}
    for name, packages in layers.items():
        layer_dir = out / f"{name}-{arch}"
        shutil.rmtree(layer_dir, ignore_errors=True)
        trimmed += install_layer(layer_dir / "python", packages, arch, python_version)
        zip_tree(layer_dir, out / f"{name}-{arch}.zip")
        layer_bytes[name] = tree_bytes(layer_dir)
    if any((out / f"layer-{arch}" / "python").glob("kubernetes")):
        raise SystemExit("the base layer contains kubernetes: the extender must not ship or import it")
    functions = {}
    for function, (packages, function_layers) in FUNCTIONS.items():
        code_dir = out / function
        shutil.rmtree(code_dir, ignore_errors=True)
        copy_code(code_dir, (*SHARED_CODE, *packages))
        zip_tree(code_dir, out / f"{function}.zip")
        functions[function] = {
            "zip_bytes": (out / f"{function}.zip").stat().st_size,
            "layers": [f"{name}-{arch}.zip" for name in function_layers],
            "unzipped_bytes": tree_bytes(code_dir) + sum(layer_bytes[name] for name in function_layers),
        }
    base_site = out / f"layer-{arch}" / "python"
    largest = sorted(((p.name, tree_bytes(p)) for p in base_site.iterdir() if p.is_dir()), key=lambda kv: -kv[1])
    report = {
        "arch": arch,
        "python": python_version,
        "functions": functions,
        "layer_zip_bytes": {name: (out / f"{name}-{arch}.zip").stat().st_size for name in layers},
        "unzipped_limit_bytes": LAMBDA_UNZIPPED_LIMIT,
        "trimmed_bytes": trimmed,
        "largest_packages": dict(largest[:8]),
    }
    # The CDK app reads this to find the bundles and to check they match the stack's architecture and runtime.
    (out / MANIFEST).write_text(json.dumps(report, indent=2) + "\n")
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=sorted(PLATFORMS), default="arm64")
    parser.add_argument("--python-version", default="3.14", help="the Lambda runtime's Python")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "lambda")
    args = parser.parse_args()
    report = build(args.out, args.arch, args.python_version)
    print(json.dumps(report, indent=2))
    functions: dict[str, dict[str, int]] = report["functions"]  # type: ignore[assignment]
    over = {name: f["unzipped_bytes"] for name, f in functions.items() if f["unzipped_bytes"] > LAMBDA_UNZIPPED_LIMIT}
    if over:
        print(f"over Lambda's 250 MB unzipped limit: {over}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
