"""The node-state refresher end to end: the API double, moto (S3, EC2) and a real Prometheus."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import boto3
import numpy as np
import pytest

from adapters.amp import PrometheusClient
from adapters.ec2_gpu import GpuInfoCatalog
from adapters.gpu_ledger import LedgerStore
from adapters.kube import connect_url
from adapters.metric_catalogue import CATALOGUE, NODE_STATE
from adapters.snapshot_store import open_store
from application.node_state import service
from application.node_state.settings import NodeStateSettings
from bench.ledger import TABLE, create_table
from scheduler_core.errors import ConfigError
from scheduler_core.k8s.names import MILLI_RESOURCE
from scheduler_core.k8s.node_labels import OWNED_LABELS
from scheduler_core.k8s.quantity import parse_quantity
from scheduler_core.state.ledger import Demand
from scheduler_core.state.snapshot import read_snapshot
from testing.dra import allocated, h200_devices, resource_slice
from testing.kube_double import KubeApiDouble
from testing.synthetic import eks_cluster
from tests.conftest import (
    FakeLambdaContext,
    assert_catalogued,
    make_nodes,
    make_pod,
    prometheus_with,
    requires_prometheus,
)

pytestmark = pytest.mark.server  # the API server double, Prometheus, moto

TOKEN = "refresher-token"
BUCKET, KEY = "gpu-scheduler-state", "clusters/prod/snapshot.npz"
URI = f"s3://{BUCKET}/{KEY}"
DEAD_PROMETHEUS = "http://127.0.0.1:9"
# Utilisation of the first GPUs of a few nodes, as DCGM reports it (percent).
UTIL = {("gpu-00000", 0): 40.0, ("gpu-00000", 1): 60.0, ("gpu-00004", 3): 90.0}


@pytest.fixture
def aws(aws_session: boto3.session.Session) -> boto3.session.Session:
    aws_session.client("s3").create_bucket(Bucket=BUCKET)
    return aws_session


@pytest.fixture
def cluster() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return eks_cluster(500, 3000, np.random.default_rng(7))


@pytest.fixture
def api(cluster: Any) -> Iterator[KubeApiDouble]:
    nodes, pods = cluster
    with KubeApiDouble(tokens=[TOKEN]) as double:
        double.load("nodes", nodes)
        double.load("pods", pods)
        yield double


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    series = {(("Hostname", node), ("gpu", str(gpu))): value for (node, gpu), value in UTIL.items()}
    with prometheus_with({"DCGM_FI_DEV_GPU_UTIL": series}, tmp_path_factory.mktemp("prometheus")) as url:
        yield url


def services(
    session: Any, api: KubeApiDouble, amp_url: str | None, ledger: LedgerStore | None = None
) -> service.Services:
    return service.Services(
        kube=connect_url(api.url, TOKEN, sleep=lambda _s: None),
        store=open_store(URI, s3_client=session.client("s3")),
        catalog=GpuInfoCatalog(session.client("ec2")),
        prometheus=PrometheusClient(amp_url, timeout_s=3) if amp_url else None,
        ledger=ledger,
    )


def run(
    session: Any, api: KubeApiDouble, amp_url: str | None = None, ledger: LedgerStore | None = None, **settings: Any
) -> service.RunReport:
    config = NodeStateSettings(cluster_name="prod", snapshot_uri=URI, **settings)
    return service.refresh(config, services(session, api, amp_url, ledger), time_left=lambda: 900.0)


def ledger_table(session: Any) -> LedgerStore:
    client = session.client("dynamodb")
    create_table(client)
    return LedgerStore(TABLE, client)


def stored_snapshot(session: Any) -> Any:
    return read_snapshot(session.client("s3").get_object(Bucket=BUCKET, Key=KEY)["Body"].read())


def expected_used_milli(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> dict[str, int]:
    """Used milli per node, straight from the pod specs (whole GPUs x 1000 plus shares)."""
    used = {n["metadata"]["name"]: 0 for n in nodes}
    for pod in pods:
        node, phase = pod["spec"].get("nodeName"), pod["status"]["phase"]
        if not node or phase in ("Succeeded", "Failed"):
            continue
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        used[node] += 1000 * int(limits.get("nvidia.com/gpu", 0)) + int(limits.get(MILLI_RESOURCE, 0))
    return used


def assert_only_the_gpu_labels_were_patched(api: KubeApiDouble, before: dict[str, dict[str, str]]) -> None:
    """425 merge patches of the GPU labels alone; no other label moved, GFD's figures won where a node has
    them, and a bare T4 got EC2's."""
    patches = [r for r in api.writes() if r.method == "PATCH"]
    assert len(patches) == 425 and {r.content_type for r in patches} == {"application/merge-patch+json"}
    for request in patches:
        body = json.loads(request.body)
        assert set(body) == {"metadata"} and set(body["metadata"]) == {"labels"}
        assert set(body["metadata"]["labels"]) <= set(OWNED_LABELS)

    for node in api.objects("nodes"):
        name, labels = node["metadata"]["name"], node["metadata"]["labels"]
        others = {k: v for k, v in labels.items() if k not in OWNED_LABELS}
        assert others == {k: v for k, v in before[name].items() if k not in OWNED_LABELS}, name
        if name.startswith("cpu-"):
            assert not set(OWNED_LABELS) & set(labels)
        elif "nvidia.com/gpu.product" in labels:  # GFD wins
            assert labels["gpu.nvidia.com/memory"] == labels["nvidia.com/gpu.memory"]
            assert labels["gpu.nvidia.com/count"] == labels["nvidia.com/gpu.count"]
    bare_t4 = next(n for n in api.objects("nodes") if n["metadata"]["labels"].get("node.kubernetes.io/instance-type")
                   == "g4dn.12xlarge" and "nvidia.com/gpu.product" not in n["metadata"]["labels"])  # fmt: skip
    assert {k: bare_t4["metadata"]["labels"][k] for k in OWNED_LABELS} == {
        "gpu.nvidia.com/model": "T4", "gpu.nvidia.com/memory": "16384", "gpu.nvidia.com/count": "4"}  # fmt: skip


def assert_the_snapshot_counts_every_bound_pod(
    snapshot: Any, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]
) -> None:
    """GPU milli and CPU used per node as the pod specs add them up, and the workload shapes of what runs on
    GPU nodes."""
    table = snapshot.table
    used = (1000 - snapshot.free_milli).clip(min=0)
    exists = np.arange(snapshot.max_gpus)[None, :] < table.alloc_gpus[:, None]
    per_node = np.where(exists, used, 0).sum(axis=1)
    expected = expected_used_milli(nodes, pods)
    assert {name: int(per_node[row]) for row, name in enumerate(table.names)} == expected
    # CPU: allocatable less every bound, unfinished pod's request; shapes: what runs on GPU nodes.
    cpu_used = {n["metadata"]["name"]: 0 for n in nodes}
    on_gpu_nodes = 0
    for pod in pods:
        node, phase = pod["spec"].get("nodeName"), pod["status"]["phase"]
        if node and phase not in ("Succeeded", "Failed"):
            cpu_used[node] += int(parse_quantity(pod["spec"]["containers"][0]["resources"]["requests"]["cpu"]) * 1000)
            on_gpu_nodes += not node.startswith("cpu-")
    allocatable = {n["metadata"]["name"]: int(parse_quantity(n["status"]["allocatable"]["cpu"]) * 1000) for n in nodes}
    assert dict(zip(table.names, snapshot.free_cpu.tolist(), strict=True)) == {
        name: allocatable[name] - cpu_used[name] for name in table.names
    }
    shapes = dict(snapshot.shapes)
    assert max(shapes, key=shapes.__getitem__) == (1000, 1000, 1, "")  # one whole GPU is the most common
    assert any(0 < milli < 1000 for _, milli, _, _ in shapes), "a share shape is common enough to keep"
    assert sum(shapes.values()) >= 0.95 * on_gpu_nodes


@requires_prometheus
def test_one_run_labels_nodes_writes_the_snapshot_and_a_second_run_patches_nothing(
    aws: Any, api: KubeApiDouble, cluster: Any, prometheus: str
) -> None:
    nodes, pods = cluster
    before = {n["metadata"]["name"]: dict(n["metadata"]["labels"]) for n in nodes}
    report = run(aws, api, prometheus)

    assert report.status == "ok", report.error
    assert report.nodes_seen == 500
    assert report.unlabelled == {"no GFD labels; instance type m5.4xlarge has no GPUs": 50}
    # 225 GFD-only + 200 bare GPU nodes get labels; the 25 with stale labels keep them under "fill".
    assert report.label_patches_planned == report.nodes_labeled == 425
    assert report.label_patch_failures == report.label_patches_skipped == 0
    assert_only_the_gpu_labels_were_patched(api, before)

    snapshot = stored_snapshot(aws)
    table = snapshot.table
    assert table.n_nodes == 500 and snapshot.cluster == "prod"
    assert_the_snapshot_counts_every_bound_pod(snapshot, nodes, pods)
    row = table.index["gpu-00000"]
    assert snapshot.gpu_utilization[row, :2].tolist() == pytest.approx([0.4, 0.6])
    assert np.isnan(snapshot.gpu_utilization[row, 2:]).all()
    assert snapshot.gpu_utilization[table.index["gpu-00004"], 3] == pytest.approx(0.9)
    assert snapshot.utilization_at == pytest.approx(time.time(), abs=60)
    assert report.utilization_source == "amp"
    # A stale-labelled node is an A100 with "V100" on it: the snapshot already reads what the node says.
    stale = next(name for name in table.names if before[name].get("gpu.nvidia.com/model") == "V100")
    assert table.model_name(table.index[stale]) == "V100"

    writes = len(api.writes())
    again = run(aws, api, prometheus)
    assert again.label_patches_planned == 0 and len(api.writes()) == writes
    assert again.status == "ok"


def test_enforce_corrects_stale_labels_and_fill_does_not(aws: Any, api: KubeApiDouble) -> None:
    run(aws, api)
    assert run(aws, api).label_patches_planned == 0
    report = run(aws, api, label_policy="enforce")
    assert report.nodes_labeled == 25
    stale = [n for n in api.objects("nodes") if n["metadata"]["labels"].get("gpu.nvidia.com/model") == "V100"]
    assert stale == []


def test_dry_run_writes_no_labels_but_the_snapshot(aws: Any, api: KubeApiDouble) -> None:
    report = run(aws, api, label_dry_run=True)
    assert report.label_patches_planned == 425 and report.nodes_labeled == 0
    assert api.writes() == []
    snapshot = stored_snapshot(aws)
    # The snapshot already carries what the labels will say.
    bare = next(name for name in snapshot.table.names if name.startswith("gpu-") and
                "nvidia.com/gpu.product" not in api.get("nodes", name)["metadata"]["labels"])  # fmt: skip
    assert snapshot.table.model_name(snapshot.table.index[bare]) is not None


@requires_prometheus
def test_a_failed_metrics_query_keeps_the_last_known_utilisation(aws: Any, api: KubeApiDouble, prometheus: str) -> None:
    first = run(aws, api, prometheus)
    measured_at = stored_snapshot(aws).utilization_at
    report = run(aws, api, DEAD_PROMETHEUS)
    assert first.utilization_source == "amp"
    assert report.status == "ok" and report.amp_query_failed
    assert report.utilization_source == "previous" and report.utilization_age_s is not None
    snapshot = stored_snapshot(aws)
    assert snapshot.utilization_at == measured_at
    assert snapshot.gpu_utilization[snapshot.table.index["gpu-00000"], :2].tolist() == pytest.approx([0.4, 0.6])


def test_no_metrics_and_no_previous_snapshot_means_unknown_utilisation(aws: Any, api: KubeApiDouble) -> None:
    report = run(aws, api, DEAD_PROMETHEUS)
    assert report.status == "ok" and report.utilization_source == "none"
    snapshot = stored_snapshot(aws)
    assert snapshot.utilization_at is None and np.isnan(snapshot.gpu_utilization).all()


def test_one_failing_node_does_not_stop_the_others(aws: Any, api: KubeApiDouble) -> None:
    api.fail_next("PATCH", r"/nodes/gpu-00001$", 500, times=10)
    api.fail_next("PATCH", r"/nodes/gpu-00002$", 422, times=1)
    report = run(aws, api)
    assert report.label_patch_failures == 2 and report.nodes_labeled == 423
    assert "gpu.nvidia.com/model" not in api.get("nodes", "gpu-00001")["metadata"]["labels"]
    assert report.api_retries >= 3  # the 500s were retried, the 422 was not


def test_the_deadline_skips_label_patches_but_not_the_snapshot(aws: Any, api: KubeApiDouble) -> None:
    left = [900.0]
    svc = services(aws, api, None)
    put = svc.store.put

    def put_then_run_out(data: bytes) -> str:
        etag = put(data)
        left[0] = 5.0  # under the 10 s margin: nothing more may start
        return etag

    svc.store.put = put_then_run_out  # type: ignore[method-assign]
    config = NodeStateSettings(cluster_name="prod", snapshot_uri=URI)
    report = service.refresh(config, svc, time_left=lambda: left[0])
    assert report.label_patches_skipped == 425 and report.nodes_labeled == 0
    assert api.writes() == []
    assert stored_snapshot(aws).table.n_nodes == 500


def test_an_unreachable_api_fails_the_run_and_keeps_the_previous_snapshot(aws: Any, api: KubeApiDouble) -> None:
    run(aws, api)
    previous = stored_snapshot(aws).generated_at
    api.fail_next("GET", r"^/api/v1/pods", 503, times=100)
    report = run(aws, api)
    assert report.status == "failed" and "503" in report.error
    assert stored_snapshot(aws).generated_at == previous


def test_a_snapshot_write_failure_is_reported(aws: Any, api: KubeApiDouble) -> None:
    aws.client("s3").delete_bucket(Bucket=BUCKET)
    report = run(aws, api)
    assert report.status == "failed" and "NoSuchBucket" in report.error
    assert report.nodes_labeled == 425  # labels still go out


def test_lambda_handler_emits_the_metrics(
    aws: Any, api: KubeApiDouble, cluster: Any, fresh_handler: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = ledger_table(aws)
    ledger.assign("gpu-00001", 8, "long-gone", Demand(1, 500))
    # Two MIG nodes: one mixed with a 3g slice in use of its one (its 1g slices stranded), one pending.
    mixed = {"nvidia.com/mig-1g.10gb": "2", "nvidia.com/mig-3g.40gb": "1"}
    api.load("nodes", [
        {"metadata": {"name": "mig-mixed", "labels": {"nvidia.com/mig.strategy": "mixed"}},
         "status": {"allocatable": mixed}},
        {"metadata": {"name": "mig-pending", "labels": {"nvidia.com/mig.config.state": "pending"}},
         "status": {"allocatable": mixed}},
    ])  # fmt: skip
    slice_pod = make_pod("slice-3g", 0, node_name="mig-mixed", phase="Running")
    slice_pod["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/mig-3g.40gb": "1"}
    api.load("pods", [slice_pod])
    # DRA served: one node's GPUs in a ResourceSlice, one of them allocated to a claim.
    api.dra_api = "resource.k8s.io/v1"
    api.load("resourceslices", [resource_slice(api.dra_api, "gpu-00002", h200_devices("gpu-00002", 8))])
    api.load("resourceclaims", [allocated(api.dra_api, "ml", "one", "gpu-00002", ["gpu-3"], reserved_for="p")])
    handler = fresh_handler(
        "lambdas.node_state.handler", LEDGER_TABLE=TABLE, KUBE_API_URL=api.url, KUBE_TOKEN=TOKEN, SNAPSHOT_URI=URI,
        WATCH_S="0.1",  # over before the run ends: the watch's metrics, none of its waiting
    )  # fmt: skip

    class Context(FakeLambdaContext):
        def get_remaining_time_in_millis(self) -> int:
            return 60_000

    summary = handler.lambda_handler({"source": "aws.events", "detail-type": "Scheduled Event"}, Context())
    assert summary["status"] == "ok" and summary["nodes_labeled"] == 425
    emf = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line]
    names = {m["Name"] for doc in emf for d in doc["_aws"]["CloudWatchMetrics"] for m in d["Metrics"]}
    assert {"NodesSeen", "NodesLabeled", "LabelPatchFailures", "SnapshotBytes", "SnapshotWriteMs", "AmpQueryMs",
            "RunMs"} <= names  # fmt: skip
    last = {k: v[0] if isinstance(v, list) else v for k, v in emf[-1].items()}
    assert last["NodesSeen"] == 502 and last["NodesLabeled"] == 425 and last["RunFailures"] == 0
    assert assert_catalogued(emf, NODE_STATE) == {m.name for m in CATALOGUE if m.service == NODE_STATE}
    assert last["MigNodesUnsettled"] == 1
    assert (last["DraNodes"], last["DraGpusPublished"], last["DraGpusClaimed"]) == (1, 8, 1)
    by_profile = {(name, doc["profile"]): doc[name] for doc in emf for name in ("MigSlicesFree", "MigSlicesStranded")
                  if name in doc}  # fmt: skip
    assert by_profile == {("MigSlicesFree", "1g.10gb"): [2.0], ("MigSlicesStranded", "1g.10gb"): [2.0],
                          ("MigSlicesFree", "3g.40gb"): [0.0], ("MigSlicesStranded", "3g.40gb"): [0.0]}  # fmt: skip
    assert summary["mig"]["nodes"] == {"mixed": 1, "pending": 1}
    # The ledger starts empty but one leftover: every node whose pods carry assigned-gpus is rebuilt.
    annotated = {
        pod["spec"]["nodeName"]
        for pod in cluster[1]
        if "gpu-scheduler.io/assigned-gpus" in pod["metadata"].get("annotations", {})
        and pod["spec"].get("nodeName")
        and pod["status"]["phase"] not in ("Succeeded", "Failed")
    }
    drift = {doc["kind"]: doc["LedgerDrift"] for doc in emf if "LedgerDrift" in doc}
    assert drift == {"released": [1.0], "rebuilt": [float(len(annotated))]} and len(annotated) > 100


def test_settings_name_every_problem() -> None:
    with pytest.raises(ConfigError) as caught:
        NodeStateSettings.from_env({"LABEL_POLICY": "overwrite", "PATCH_CONCURRENCY": "0", "LABEL_DRY_RUN": "maybe"})
    message = str(caught.value)
    for variable in ("SNAPSHOT_URI", "CLUSTER_NAME", "LABEL_POLICY", "PATCH_CONCURRENCY", "LABEL_DRY_RUN"):
        assert variable in message


# ---- the GPU ledger's reconcile ------------------------------------------------------------------
def shared_pod(name: str, milli: int, node: str | None, assigned: str | None = None) -> dict[str, Any]:
    pod = make_pod(name, 0, milli=milli, node_name=node, phase="Running" if node else "Pending")
    if assigned is not None:
        pod["metadata"]["annotations"]["gpu-scheduler.io/assigned-gpus"] = assigned
    return pod


@pytest.fixture
def small_api() -> Iterator[KubeApiDouble]:
    with KubeApiDouble(tokens=[TOKEN]) as double:
        double.load("nodes", make_nodes("T4", "A100", "H100"))
        yield double


def test_the_reconcile_frees_leftovers_records_and_rebuilds_and_keeps_binds_in_flight(
    aws: Any, small_api: KubeApiDouble
) -> None:
    ledger = ledger_table(aws)
    for uid, milli in (("uid-default-gone", 300), ("uid-default-moved", 200), ("uid-default-inflight", 400),
                       ("uid-default-here", 100), ("uid-default-done", 100)):  # fmt: skip
        ledger.assign("t4-0", 4, uid, Demand(1, milli))
    ledger.assign("a100-1", 8, "uid-default-other", Demand(1, 100))
    small_api.load(
        "pods",
        [
            shared_pod("moved", 200, "a100-1", "0:200"),  # bound elsewhere: t4-0 frees it, a100-1 records it
            shared_pod("other", 100, "a100-1", "0:100"),
            shared_pod("inflight", 400, None),  # pending: a bind in flight wrote the ledger first
            shared_pod("here", 100, "t4-0", "0:100"),
            shared_pod("done", 100, "t4-0", "0:100") | {"status": {"phase": "Succeeded"}},
            shared_pod("lost", 500, "h100-2", "3:500"),  # h100-2 has no item at all
        ],
    )
    report = run(aws, small_api, ledger=ledger)
    assert report.status == "ok" and report.ledger_error == ""
    assert report.ledger_drift == {"released": 3, "recorded": 1, "rebuilt": 1}
    assert sorted(ledger.read("t4-0", 4).assignments) == ["uid-default-here", "uid-default-inflight"]
    assert ledger.read("t4-0", 4).used == (500, 0, 0, 0)
    assert dict(ledger.read("a100-1", 8).assignments) == {
        "uid-default-moved": ((0, 200),),
        "uid-default-other": ((0, 100),),
    }
    assert ledger.read("h100-2", 8).used == (0, 0, 0, 500, 0, 0, 0, 0)
    for node, count in (("t4-0", 4), ("a100-1", 8), ("h100-2", 8)):
        assert ledger.read(node, count).problems() == []
    again = run(aws, small_api, ledger=ledger)
    assert again.ledger_drift == {} and again.ledger_writes == 0  # nothing left to correct


def test_a_bind_between_read_and_write_wins_and_the_reconcile_waits(aws: Any, small_api: KubeApiDouble) -> None:
    from tests.conftest import RacingClient

    ledger = ledger_table(aws)
    ledger.assign("t4-0", 4, "uid-default-gone", Demand(1, 300))
    racing = LedgerStore(TABLE, RacingClient(ledger.client, ledger, 1, "t4-0", 4))
    report = run(aws, small_api, ledger=racing)
    assert report.ledger_drift == {"released": 1} and report.ledger_write_conflicts == 1
    assert "rival-0" in ledger.read("t4-0", 4).assignments  # the bind's write was not overwritten
    # The next run reads the new version; rival-0 is no pod of this cluster, so both go then.
    assert run(aws, small_api, ledger=ledger).ledger_drift == {"released": 2}
    assert ledger.read("t4-0", 4).assignments == {}


def test_an_unreadable_ledger_skips_the_reconcile_but_not_the_snapshot(aws: Any, small_api: KubeApiDouble) -> None:
    report = run(aws, small_api, ledger=LedgerStore("no-such-table", aws.client("dynamodb")))
    assert report.status == "ok" and "ResourceNotFoundException" in report.ledger_error
    assert stored_snapshot(aws).table.n_nodes == 3
