"""``make package``: the bundle and layer are complete, small enough, and free of kubernetes."""

import json
import subprocess
import sys
import time
import zipfile

import pytest

from scheduler_core.snapshot import build_snapshot, write_snapshot
from tests.conftest import REPO, make_nodes, make_pod

sys.path.insert(0, str(REPO / "tools"))
from package_lambda import LAMBDA_UNZIPPED_LIMIT, build


@pytest.fixture(scope="module")
def local_bundle(tmp_path_factory):
    """Built for this machine (x86_64, this Python) so that it can be imported here."""
    out = tmp_path_factory.mktemp("lambda")
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    return out, build(out, "x86_64", python)


def test_bundle_is_under_the_lambda_limit_and_has_no_kubernetes(local_bundle):
    out, report = local_bundle
    assert report["unzipped_bytes"] < LAMBDA_UNZIPPED_LIMIT
    for name in ("extender.zip", "layer-x86_64.zip"):
        with zipfile.ZipFile(out / name) as archive:
            names = archive.namelist()
        assert not [n for n in names if "kubernetes" in n.split("/")], name
    with zipfile.ZipFile(out / "extender.zip") as archive:
        code = set(archive.namelist())
    assert {"lambdas/extender/handler.py", "scheduler_core/extender.py", "adapters/snapshot_store.py"} <= code
    assert not [n for n in code if n.startswith(("gpu_scheduler/", "bench/", "tests/"))]
    with zipfile.ZipFile(out / "layer-x86_64.zip") as archive:
        layer = archive.namelist()
    assert any(n.startswith("python/numpy/") for n in layer)
    assert not [n for n in layer if n.startswith(("python/botocore/", "python/boto3/", "python/numpy/_core/tests/"))]


def test_bundle_plus_layer_serve_a_request_with_nothing_else_installed(local_bundle, tmp_path):
    out, _ = local_bundle
    root = tmp_path / "task"
    for name in ("extender.zip", "layer-x86_64.zip"):
        with zipfile.ZipFile(out / name) as archive:
            archive.extractall(root)
    snapshot = tmp_path / "snapshot.npz"
    pods = [make_pod("r", 4, node_name="a100-0", phase="Running")]
    snapshot.write_bytes(
        write_snapshot(build_snapshot(make_nodes("A100"), pods, cluster="c", generated_at=time.time()))
    )
    event = {
        "path": "/filter",
        "httpMethod": "POST",
        "resource": "/filter",
        "headers": {},
        "requestContext": {},
        "body": json.dumps({"Pod": make_pod("p", 2), "NodeNames": ["a100-0"]}),
        "isBase64Encoded": False,
    }
    code = (
        "import json, sys\n"
        "from lambdas.extender.handler import lambda_handler\n"
        "class C: function_name='f'; memory_limit_in_mb=128; invoked_function_arn='arn'; aws_request_id='r'\n"
        "print('RESULT' + json.dumps(lambda_handler(json.loads(sys.stdin.read()), C())))\n"
        "print('MODULES' + json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    # -S: no site-packages at all, so everything must come from the bundle, the layer or the stdlib.
    proc = subprocess.run(
        [sys.executable, "-S", "-c", code],
        input=json.dumps(event),
        capture_output=True,
        text=True,
        env={"PYTHONPATH": f"{root}:{root / 'python'}", "SNAPSHOT_URI": str(snapshot), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT"))[6:])
    assert result["statusCode"] == 200
    assert json.loads(result["body"])["NodeNames"] == ["a100-0"]
    modules = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("MODULES"))[7:])
    assert "kubernetes" not in modules and "boto3" not in modules
