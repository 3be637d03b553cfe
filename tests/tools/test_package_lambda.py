"""``make package``: bundles and layers are complete, small enough, and each Lambda runs from them alone."""

import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from cdk.lambda_code import RUNTIME_PYTHON, LambdaPackage, PackageMissingError
from scheduler_core.state.snapshot import build_snapshot, write_snapshot
from tests.conftest import REPO, make_nodes, make_pod

sys.path.insert(0, str(REPO / "tools"))
from package_lambda import LAMBDA_UNZIPPED_LIMIT, build

pytestmark = pytest.mark.slow  # builds the Lambda bundles with pip


@pytest.fixture(scope="module")
def local_bundle(tmp_path_factory):
    """Built for this machine (x86_64, this Python) so that it can be imported here."""
    out = tmp_path_factory.mktemp("lambda")
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    return out, build(out, "x86_64", python)


def unpacked(out: Path, names: tuple[str, ...], root: Path) -> Path:
    """The archives ``names`` of ``out`` extracted together into ``root``, as Lambda lays out a function's
    code and its layers."""
    for name in names:
        with zipfile.ZipFile(out / name) as archive:
            archive.extractall(root)
    return root


def lambda_runtime(tmp_path: Path) -> Path:
    """What the Lambda runtime provides besides the layers (its own boto3, as /var/runtime has it): links to
    this environment's copies."""
    import boto3
    import botocore
    import jmespath
    import s3transfer

    runtime = tmp_path / "runtime"
    runtime.mkdir()
    for module in (boto3, botocore, jmespath, s3transfer):
        (runtime / module.__name__).symlink_to(Path(module.__file__).parent)
    return runtime


def test_bundle_is_under_the_lambda_limit_and_has_no_kubernetes(local_bundle):
    out, report = local_bundle
    assert set(report["functions"]) == {"extender", "node_state", "deletion_cost", "consolidation"}
    assert all(f["unzipped_bytes"] < LAMBDA_UNZIPPED_LIMIT for f in report["functions"].values())
    assert report["functions"]["extender"]["layers"] == ["layer-x86_64.zip"]
    for name in ("extender.zip", "layer-x86_64.zip"):
        with zipfile.ZipFile(out / name) as archive:
            names = archive.namelist()
        assert not [n for n in names if "kubernetes" in n.split("/")], name
    with zipfile.ZipFile(out / "extender.zip") as archive:
        code = set(archive.namelist())
    assert {"lambdas/extender/handler.py", "scheduler_core/extender/facade.py", "adapters/snapshot_store.py"} <= code
    assert not [n for n in code if n.startswith(("gpu_scheduler/", "bench/", "tests/"))]
    with zipfile.ZipFile(out / "consolidation.zip") as archive:
        code = set(archive.namelist())
    assert {"lambdas/consolidation/handler.py", "application/consolidation/service.py",
            "scheduler_core/consolidation/plan.py", "adapters/holds_source.py"} <= code  # fmt: skip
    assert report["functions"]["consolidation"]["layers"] == ["layer-x86_64.zip", "layer-kube-x86_64.zip"]
    with zipfile.ZipFile(out / "layer-x86_64.zip") as archive:
        layer = archive.namelist()
    assert any(n.startswith("python/numpy/") for n in layer)
    assert not [n for n in layer if n.startswith(("python/botocore/", "python/boto3/", "python/numpy/_core/tests/"))]


def test_the_package_manifest_tells_the_cdk_app_what_was_built(local_bundle):
    out, report = local_bundle
    assert json.loads((out / "package.json").read_text()) == report
    package = LambdaPackage.load(out, "x86_64") if report["python"] == RUNTIME_PYTHON else None
    if package is None:  # built for this interpreter, not the Lambda runtime: the CDK app says so
        with pytest.raises(PackageMissingError, match=f"built for Python {report['python']}"):
            LambdaPackage.load(out, "x86_64")
    else:
        assert package.layers_by_function["node_state"] == ("layer-x86_64.zip", "layer-kube-x86_64.zip")


def test_bundle_plus_layer_serve_a_request_with_nothing_else_installed(local_bundle, tmp_path):
    out, _ = local_bundle
    root = unpacked(out, ("extender.zip", "layer-x86_64.zip"), tmp_path / "task")
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


def test_the_node_state_refresher_runs_from_its_bundle_and_layers(local_bundle, tmp_path, monkeypatch):
    """Code + both layers + what the Lambda runtime provides (boto3), against the API double and moto's server."""
    import boto3
    from moto.server import ThreadedMotoServer

    from testing.kube_double import KubeApiDouble
    from testing.synthetic import eks_cluster

    out, _ = local_bundle
    root = unpacked(out, ("node_state.zip", "layer-x86_64.zip", "layer-kube-x86_64.zip"), tmp_path / "task")
    runtime = lambda_runtime(tmp_path)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
               "AWS_ENDPOINT_URL": endpoint}  # fmt: skip
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="snapshots")
        nodes, pods = eks_cluster(40, 200, np.random.default_rng(1))
        with KubeApiDouble(tokens=["t"]) as api:
            api.load("nodes", nodes)
            api.load("pods", pods)
            code = (
                "import json, sys\n"
                "from lambdas.node_state.handler import lambda_handler\n"
                "class C:\n"
                "    function_name='f'; memory_limit_in_mb=1024; invoked_function_arn='arn'; aws_request_id='r'\n"
                "    def get_remaining_time_in_millis(self): return 60000\n"
                "print('RESULT' + json.dumps(lambda_handler({}, C())))\n"
                "import kubernetes, msgspec\n"
                "print('FROM' + json.dumps([kubernetes.__file__, msgspec.__file__]))\n"
            )
            proc = subprocess.run(
                [sys.executable, "-S", "-c", code],
                capture_output=True,
                text=True,
                env={**env, "PYTHONPATH": f"{root}:{root / 'python'}:{runtime}", "PATH": "/usr/bin:/bin",
                     "KUBE_API_URL": api.url, "KUBE_TOKEN": "t", "SNAPSHOT_URI": "s3://snapshots/cluster.npz"},
                timeout=300,
            )  # fmt: skip
            labelled = sum("gpu.nvidia.com/model" in n["metadata"]["labels"] for n in api.objects("nodes"))
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    result = json.loads(next(line for line in lines if line.startswith("RESULT"))[6:])
    assert result["status"] == "ok" and result["nodes_seen"] == 40 and result["nodes_labeled"] == 34
    assert labelled == 36  # 34 labelled now, plus the 2 that carried stale labels already
    assert all(path.startswith(str(root)) for path in json.loads(next(x for x in lines if x.startswith("FROM"))[4:]))


def test_the_consolidator_runs_from_its_bundle_and_layers(local_bundle, tmp_path, monkeypatch):
    """Code + both layers + the runtime's boto3, against the API double and moto's S3: one run evicts the
    one pod its plan moves and writes the holds."""
    import boto3
    from moto.server import ThreadedMotoServer

    from testing.kube_double import KubeApiDouble
    from tests.scheduler_core.consolidation.conftest import gpu_node, gpu_pod

    out, _ = local_bundle
    root = unpacked(out, ("consolidation.zip", "layer-x86_64.zip", "layer-kube-x86_64.zip"), tmp_path / "task")
    runtime = lambda_runtime(tmp_path)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
               "AWS_ENDPOINT_URL": endpoint}  # fmt: skip
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        s3.create_bucket(Bucket="state")
        with KubeApiDouble(tokens=["t"]) as api:
            api.load("nodes", [gpu_node("a"), gpu_node("b")])
            api.load("pods", [gpu_pod("a0", "a"), gpu_pod("b0", "b"), gpu_pod("big", gpus=8, owner="", pending=True)])
            code = (
                "import json, sys\n"
                "from lambdas.consolidation.handler import lambda_handler\n"
                "class C:\n"
                "    function_name='f'; memory_limit_in_mb=1024; invoked_function_arn='arn'; aws_request_id='r'\n"
                "    def get_remaining_time_in_millis(self): return 60000\n"
                "print('RESULT' + json.dumps(lambda_handler({}, C())))\n"
            )
            proc = subprocess.run(
                [sys.executable, "-S", "-c", code],
                capture_output=True,
                text=True,
                env={**env, "PYTHONPATH": f"{root}:{root / 'python'}:{runtime}", "PATH": "/usr/bin:/bin",
                     "KUBE_API_URL": api.url, "KUBE_TOKEN": "t", "HOLDS_URI": "s3://state/consolidation/holds.json",
                     "SETTLE_S": "0"},
                timeout=300,
            )  # fmt: skip
            left = {p["metadata"]["name"] for p in api.objects("pods")}
        book = json.loads(s3.get_object(Bucket="state", Key="consolidation/holds.json")["Body"].read())
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT"))[6:])
    assert result["status"] == "ok" and result["evictions"] == 1, result
    assert len(left) == 2 and "big" in left
    assert [hold["name"] for hold in book["holds"]] == ["big"] and len(book["evictions"]) == 1
