"""The consolidator with GPU sharing, through the real kube-scheduler and kube-controller-manager: a
whole-GPU pod waits while shares hold every GPU; one move frees a GPU, its reservation pod goes, and the
pod binds there.

``gpu-scheduler serve --watch --ledger-table --holds`` binds as the second scheduler's ServiceAccount, with
:class:`ReservationKubelet` playing the device plugin for reservation pods. Two 8-GPU A100 nodes:

- ``s-0``: eight 600-milli shares of the ReplicaSet ``shards`` (movable), one per GPU (two do not fit on
  one): every GPU is held by its reservation pod, so no whole GPU is free;
- ``s-1``: a 7-GPU pod that may not move, and a 300-milli share that may not move on the last GPU: 700
  milli free there, room for one shard and for no whole GPU.

Pending: ``whole``, one A100. The plan moves one shard from ``s-0`` to ``s-1``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.gpu_ledger import create_table
from manifests.reservation import NAMESPACE as RESERVATIONS
from scheduler_core.k8s.names import MOVABLE_LABEL
from scheduler_core.simulator.synthetic import CATALOGUE, make_node, make_pod
from testing.control_plane import ControlPlane
from testing.moto import dynamodb_client
from testing.reservation_kubelet import ReservationKubelet
from tests.e2e.conftest import ServeSharing
from tests.e2e.test_consolidation import consolidate, placement
from tests.e2e.test_reserved_shares import share

NAMESPACE = "ml"
TABLE = "consolidation-ledger"
A100 = next(shape for shape in CATALOGUE if shape.model == "A100")


def shard(name: str = "") -> dict[str, Any]:
    """A 600-milli share of ``shards``: a pod (``name``) or, without one, its ReplicaSet's template."""
    pod = share(name or "template", 600, "A100", NAMESPACE)
    pod["metadata"]["labels"] = {"app": "shards", MOVABLE_LABEL: "true"}
    pod["spec"]["terminationGracePeriodSeconds"] = 0
    return pod


def cordon(cluster: ControlPlane, node: str, on: bool) -> None:
    cluster.api.patch(f"/api/v1/nodes/{node}", {"spec": {"unschedulable": on or None}})


@pytest.fixture(scope="module")
def shared(
    cluster: ControlPlane, moto_env: dict[str, str], serve_sharing: ServeSharing, kubelet: ReservationKubelet,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Path]:  # fmt: skip
    """The cluster of the module docstring, ``whole`` refused; the holds file's path."""
    holds = tmp_path_factory.mktemp("holds") / "holds.json"
    create_table(dynamodb_client(moto_env["AWS_ENDPOINT_URL_DYNAMODB"]), TABLE)
    cluster.add_nodes([make_node("s-0", A100, "us-east-1a"), make_node("s-1", A100, "us-east-1a")])
    cluster.start_controller_manager()
    serve_sharing(TABLE, "--holds", str(holds))
    cluster.ensure_namespaces([NAMESPACE])
    cordon(cluster, "s-1", True)
    cluster.create_pods([shard(f"shards-{i}") for i in range(8)])
    for i in range(8):
        assert cluster.wait_bound(NAMESPACE, f"shards-{i}", timeout_s=60) == "s-0"
        cluster.mark_running(NAMESPACE, f"shards-{i}")
    template = shard()
    replica_set = {
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "shards", "namespace": NAMESPACE},
        "spec": {"replicas": 8, "selector": {"matchLabels": {"app": "shards"}},
                 "template": {"metadata": {"labels": template["metadata"]["labels"],
                                           "annotations": template["metadata"]["annotations"]},
                              "spec": template["spec"]}},
    }  # fmt: skip
    cluster.api.request("POST", f"/apis/apps/v1/namespaces/{NAMESPACE}/replicasets", replica_set)
    cluster.wait_for(lambda: all(p["metadata"].get("ownerReferences") for p in cluster.pods(NAMESPACE)), 60,
                     "the ReplicaSet to adopt its shards")  # fmt: skip
    cluster.create_pods([make_pod("wide", 7, namespace=NAMESPACE, node_name="s-1", phase="Running")])
    cordon(cluster, "s-0", True)
    cordon(cluster, "s-1", False)
    cluster.create_pods([share("small", 300, "A100", NAMESPACE)])
    assert cluster.wait_bound(NAMESPACE, "small") == "s-1"
    cordon(cluster, "s-0", False)
    cluster.create_pods([make_pod("whole", 1, namespace=NAMESPACE, models="A100")])
    assert "Insufficient nvidia.com/gpu" in cluster.wait_failed(NAMESPACE, "whole")
    yield holds
    cluster.stop_scheduler()


def test_one_move_frees_a_gpu_its_reservation_pod_goes_and_the_whole_gpu_pod_binds_there(
    cluster: ControlPlane, shared: Path
):
    before = placement(cluster)
    reserved_before = len(cluster.pods(RESERVATIONS))

    report, _ = consolidate(cluster, "--holds", str(shared), "--settle-s", "2")

    assert report["status"] == "ok" and report["evictions"] == 1, report
    (plan,) = report["plans"]
    assert (plan["pod"], plan["node"]) == (f"{NAMESPACE}/whole", "s-0")
    (move,) = plan["moves"]
    assert (move["owner"], move["source"], move["destination"], move["milli"]) == (
        "ReplicaSet/shards",
        "s-0",
        "s-1",
        600,
    )
    assert cluster.wait_bound(NAMESPACE, "whole", timeout_s=90) == "s-0"

    def replaced() -> bool:
        new = [p for p in cluster.pods(NAMESPACE) if p["metadata"]["uid"] not in before]
        return any(p["spec"].get("nodeName") == "s-1" for p in new)

    cluster.wait_for(replaced, 60, "the shard's replacement on s-1")
    # s-0: seven shards on seven GPUs (seven reservation pods) and the whole GPU; s-1 unchanged in GPUs held.
    on_s0 = [p for p in cluster.pods(RESERVATIONS) if p["spec"].get("nodeName") == "s-0"]
    assert len(on_s0) == 7 and len(cluster.pods(RESERVATIONS)) == reserved_before - 1
    assert {name for name, node in placement(cluster).values() if node == "s-1"} >= {"wide", "small"}
