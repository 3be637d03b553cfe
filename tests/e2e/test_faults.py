"""Faults through the real kube-scheduler, each with the outcome docs/operations.md ("Faults") states:

- a missing, corrupt or stale snapshot: GPU pods get ``FailedScheduling`` saying why, nothing binds, and
  they bind once a good snapshot is in and kube-scheduler retries them;
- the GPU ledger unreachable: a share's bind answers an error naming the ledger, and the pod stays
  unbound with nothing written;
- the API server answering 409 to the Binding: the ledger entry is released and kube-scheduler retries;
  a 409 for a Binding that did land (its reply lost) counts as bound.

Also ``gpu-scheduler refresh node-state --once``: the snapshot it writes, the labels it sets from GFD.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.gpu_ledger import LedgerStore
from scheduler_core.k8s.names import ASSIGNED_GPUS_ANNOTATION, LABEL_COUNT, LABEL_MEMORY, LABEL_MODEL
from scheduler_core.simulator.synthetic import CATALOGUE, make_node, make_pod
from testing.control_plane import ControlPlane
from testing.fault_proxy import FaultProxy
from testing.moto import aws_env, dynamodb_client
from testing.processes import free_port
from testing.product import Processes, share_usage
from testing.reservation_kubelet import ReservationKubelet
from tests.e2e.conftest import start_scheduler

SHAPE = {shape.model: shape for shape in CATALOGUE}
TABLE = "gpu-ledger"


@pytest.fixture(scope="module")
def nodes(cluster: ControlPlane, kubelet: ReservationKubelet) -> list[str]:
    # a100-0 has GFD's labels only: the refresher adds the project's.
    cluster.add_nodes([make_node("a100-0", SHAPE["A100"], "us-east-1a", project_labels=False),
                       make_node("t4-0", SHAPE["T4"], "us-east-1b")])  # fmt: skip
    return ["a100-0", "t4-0"]


def refresh_node_state(cluster: ControlPlane, snapshot: Path, *extra: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "gpu_scheduler", "refresh", "node-state", "--once", "--no-ec2", "--kubeconfig",
         str(cluster.kubeconfig_of("node-state")), "--snapshot", str(snapshot), *extra],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return report


def gpu_pod(name: str, namespace: str, *, milli: int = 0) -> dict[str, Any]:
    pod = make_pod(name, 0 if milli else 1, namespace=namespace, milli=milli)
    pod["spec"]["containers"][0]["resources"]["requests"].update(cpu="100m", memory="64Mi")
    return pod


def poke(cluster: ControlPlane) -> None:
    """A cluster event kube-scheduler acts on (a node's labels change): it retries the pods it parked."""
    cluster.api.patch("/api/v1/nodes/t4-0", {"metadata": {"labels": {"e2e.example/poke": str(time.time_ns())}}})


def test_refresh_node_state_once_writes_the_snapshot_and_labels_from_gfd(
    cluster: ControlPlane, nodes: list[str], tmp_path: Path
):
    snapshot = tmp_path / "snapshot.npz"
    dry = refresh_node_state(cluster, snapshot, "--label-dry-run")
    assert dry["status"] == "ok" and dry["nodes_seen"] == 2
    assert LABEL_MODEL not in cluster.api.get("/api/v1/nodes/a100-0")["metadata"]["labels"]
    report = refresh_node_state(cluster, snapshot)
    assert report["status"] == "ok" and snapshot.stat().st_size > 0
    labels = cluster.api.get("/api/v1/nodes/a100-0")["metadata"]["labels"]
    assert (labels[LABEL_MODEL], labels[LABEL_MEMORY], labels[LABEL_COUNT]) == ("A100", "40960", "8")

    from scheduler_core.state.snapshot import read_snapshot

    state = read_snapshot(snapshot.read_bytes())
    assert sorted(state.table.names) == nodes
    assert state.table.model_name(state.table.index["a100-0"]) == "A100"


SNAPSHOT_FAULTS = {
    "missing": "no cluster snapshot:",
    "corrupt": "no cluster snapshot:",
    "stale": "cluster snapshot is",
}


@pytest.mark.parametrize("fault", sorted(SNAPSHOT_FAULTS))
def test_an_unusable_snapshot_fails_gpu_pods_saying_why_and_they_bind_once_a_good_one_is_in(
    cluster: ControlPlane, nodes: list[str], product: Processes, tmp_path: Path, fault: str
):
    snapshot = tmp_path / "snapshot.npz"
    max_age_s = 3.0
    if fault == "corrupt":
        snapshot.write_bytes(b"PK\x03\x04 but not a whole archive")
    elif fault == "stale":
        refresh_node_state(cluster, snapshot)
    url = product.serve(
        f"serve-{fault}", ["--snapshot", str(snapshot), "--refresh-s", "0.2", "--max-snapshot-age-s", str(max_age_s)]
    )
    if fault == "stale":
        time.sleep(max_age_s + 0.5)
    namespace = f"snapshot-{fault}"
    start_scheduler(cluster, url)
    try:
        cluster.create_pods([gpu_pod("waiting", namespace)])
        message = cluster.wait_failed(namespace, "waiting")
        assert SNAPSHOT_FAULTS[fault] in message, message
        if fault == "stale":
            assert "is the node-state refresher running?" in message
        # A good snapshot arrives (the refresher on a loop), and the next cluster event retries the pod.
        product.refresher(f"refresher-{fault}", ["node-state", "--every", "1s", "--no-ec2", "--kubeconfig",
                                                  str(cluster.kubeconfig_of("node-state")),
                                                  "--snapshot", str(snapshot)])  # fmt: skip
        cluster.wait_for(lambda: bool(product.reports(f"refresher-{fault}")), 60, "the refresher's first run")
        time.sleep(0.5)  # serve re-checks the file every 0.2 s
        poke(cluster)
        assert cluster.wait_bound(namespace, "waiting", timeout_s=30) in nodes
    finally:
        cluster.stop_scheduler()
        product.stop(f"refresher-{fault}")
        product.stop(f"serve-{fault}")
        cluster.delete_namespace_pods(namespace)


@pytest.fixture(scope="module")
def ledger(moto_env: dict[str, str]) -> LedgerStore:
    from adapters.gpu_ledger import create_table

    store = LedgerStore(TABLE, dynamodb_client(moto_env["AWS_ENDPOINT_URL_DYNAMODB"]))
    create_table(store.client, TABLE)
    return store


def test_an_unreachable_ledger_fails_the_bind_naming_it_and_writes_nothing(
    cluster: ControlPlane, nodes: list[str], product: Processes
):
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    url = product.serve(
        "serve-dead-ledger",
        ["--watch", "--kubeconfig", str(cluster.kubeconfig_of("scheduler")), "--ledger-table", TABLE],
        {**aws_env(dead)},
    )
    namespace = "dead-ledger"
    start_scheduler(cluster, url, "--sharing")
    try:
        cluster.create_pods([gpu_pod("share", namespace, milli=500)])
        message = cluster.wait_failed(namespace, "share", timeout_s=60)
        # The step that failed, in fixed words: the table's name and DynamoDB's text go to serve's log only.
        assert "the GPU ledger write failed: DynamoDB did not answer in time" in message, message
        assert TABLE not in message, message
        pod = cluster.pod(namespace, "share")
        assert not pod["spec"].get("nodeName")
        assert ASSIGNED_GPUS_ANNOTATION not in (pod["metadata"].get("annotations") or {})
    finally:
        cluster.stop_scheduler()
        product.stop("serve-dead-ledger")
        cluster.delete_namespace_pods(namespace)


@pytest.fixture
def proxy(cluster: ControlPlane, tmp_path: Path) -> Iterator[FaultProxy]:
    # serve on a snapshot binds as the extender Lambda does: the proxy forwards with its token.
    extender = cluster.api_as("extender")
    fault_proxy = FaultProxy(extender, tmp_path, extender.token)
    yield fault_proxy
    fault_proxy.close()


def is_binding(method: str, path: str) -> bool:
    return method == "POST" and path.split("?", 1)[0].endswith("/binding")


def test_a_409_to_the_binding_releases_the_ledger_entry_and_a_409_after_it_landed_counts_as_bound(
    cluster: ControlPlane,
    nodes: list[str],
    product: Processes,
    ledger: LedgerStore,
    moto_env: dict[str, str],
    proxy: FaultProxy,
    tmp_path: Path,
):
    snapshot = tmp_path / "snapshot.npz"
    refresh_node_state(cluster, snapshot)
    # Bind goes through the proxy; the state comes from the snapshot (a watch would bypass it).
    url = product.serve(
        "serve-409",
        ["--snapshot", str(snapshot), "--max-snapshot-age-s", "3600", "--kubeconfig", str(proxy.kubeconfig),
         "--ledger-table", TABLE], moto_env,
    )  # fmt: skip
    namespace = "conflicts"
    start_scheduler(cluster, url, "--sharing")
    try:
        proxy.fault = lambda method, path: ("instead", 409) if is_binding(method, path) else None
        cluster.create_pods([gpu_pod("refused", namespace, milli=500)])
        message = cluster.wait_failed(namespace, "refused", timeout_s=60)
        assert "another bind placed the pod first" in message, message  # a 409 the pod's state does not explain
        uid = cluster.pod(namespace, "refused")["metadata"]["uid"]
        assert not any(uid in item.assignments for item in ledger.scan()), "a failed bind holds nothing"
        assert not cluster.pod(namespace, "refused")["spec"].get("nodeName")

        # The API server stops refusing: kube-scheduler's retry binds it, with the ledger behind it.
        proxy.fault = lambda method, path: None
        assert cluster.wait_bound(namespace, "refused", timeout_s=60) in nodes

        # A Binding that lands but whose reply is lost: 409 on the retry-less path still counts as bound.
        proxy.fault = lambda method, path: ("after", 409) if is_binding(method, path) else None
        cluster.create_pods([gpu_pod("landed", namespace, milli=500)])
        assert cluster.wait_bound(namespace, "landed", timeout_s=60) in nodes
        assert cluster.failed_scheduling(namespace, "landed") == []
        # The proxy records an answer after the API server has it: the pod can show bound a moment before.
        landed = ("POST", f"/api/v1/namespaces/{namespace}/pods/landed/binding", 409)
        cluster.wait_for(lambda: landed in proxy.seen, 10, "the proxy to record the Binding it answered 409")
        usage = share_usage(cluster.pods(namespace), ledger.scan())
        assert usage["ledger_equals_annotations"] and usage["bound_without_annotation"] == 0, usage

        # A Binding that lands but is answered 500 (its reply lost on the way): the bind reads the pod back,
        # finds it bound there and keeps its GPUs. Releasing them would let the next share take the same milli.
        proxy.fault = lambda method, path: ("after", 500) if is_binding(method, path) else None
        cluster.create_pods([gpu_pod("landed-500", namespace, milli=500)])
        assert cluster.wait_bound(namespace, "landed-500", timeout_s=60) in nodes
        landed_500 = ("POST", f"/api/v1/namespaces/{namespace}/pods/landed-500/binding", 500)
        cluster.wait_for(lambda: landed_500 in proxy.seen, 10, "the proxy to record the Binding it answered 500")
        assert cluster.failed_scheduling(namespace, "landed-500") == []  # bound at the first bind, not a retry
        usage = share_usage(cluster.pods(namespace), ledger.scan())
        assert usage["ledger_equals_annotations"] and usage["gpus_over_1000_milli"] == 0, usage
    finally:
        cluster.stop_scheduler()
        product.stop("serve-409")
        cluster.delete_namespace_pods(namespace)
