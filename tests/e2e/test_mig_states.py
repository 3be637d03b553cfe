"""MIG through the real kube-scheduler on the generated configuration, with ``gpu-scheduler serve --watch`` as
the extender: nodes whose MIG layout is unsettled or invalid take no GPU pod; 200 pods of mixed profiles
pack onto 20 H200 nodes in mig-parted's ``all-balanced`` layout under the device plugin's ``mixed``
strategy; a ``single`` node's slices go only to pods that accept them.

The GPU Operator's MIG manager labels a node ``nvidia.com/mig.config.state=pending`` (or ``rebooting``)
while it changes the GPUs' MIG layout, and ``failed`` when it could not; GFD names the product
``...-MIG-INVALID`` when the GPUs' layouts differ under the device plugin's ``single`` strategy. Their
``nvidia.com/gpu`` is then not what the labels say (``scheduler_core.k8s.node_facts.mig_refusal``).
"""

from __future__ import annotations

import random
import time
import zlib
from collections import Counter
from typing import Any

import pytest

from scheduler_core.k8s.mig import mig_resource
from scheduler_core.simulator.synthetic import CATALOGUE, InstanceShape, make_node, make_pod
from testing.control_plane import ControlPlane
from testing.product import Processes
from tests.e2e.conftest import start_scheduler

H100 = next(shape for shape in CATALOGUE if shape.model == "H100")
# p5e.48xlarge: 8 H200 (143771 MiB each, ../shared/fixtures/gpu/h200/query.csv).
H200 = InstanceShape("p5e.48xlarge", "H200", "NVIDIA-H200", 8, 143771, "191450m", "1999Gi")
# mig-parted's all-balanced on an H200, per GPU: 2 x 1g.18gb, 1 x 2g.35gb, 1 x 3g.71gb (its test table); per node:
LAYOUT = {"1g.18gb": 16, "2g.35gb": 8, "3g.71gb": 8}
WORK = "mig-states"
MIXED_NODES = [f"mixed-{i:02d}" for i in range(20)]


def node(name: str, **labels: str) -> dict[str, Any]:
    made = make_node(name, H100, "us-east-1a")
    made["metadata"]["labels"].update(labels)
    return made


def mixed(name: str, **labels: str) -> dict[str, Any]:
    """An H200 node under the mixed strategy, every GPU in all-balanced: GFD keeps the base product and
    adds a count per profile; the device plugin advertises one resource per profile and no nvidia.com/gpu."""
    made = make_node(name, H200, "us-east-1b")
    made["metadata"]["labels"] |= {"nvidia.com/mig.strategy": "mixed", "nvidia.com/mig.config": "all-balanced"}
    made["metadata"]["labels"] |= {f"nvidia.com/mig-{p}.count": str(n) for p, n in LAYOUT.items()} | labels
    for part in ("capacity", "allocatable"):
        del made["status"][part]["nvidia.com/gpu"]
        made["status"][part] |= {mig_resource(p): str(n) for p, n in LAYOUT.items()}
    return made


def single(name: str, product: str = "NVIDIA-H200-MIG-1g.18gb") -> dict[str, Any]:
    """An H200 node under the single strategy, all 8 GPUs in 7 × 1g.18gb: nvidia.com/gpu counts 56 slices
    and GFD writes the slice's product, memory and count."""
    made = make_node(name, H200, "us-east-1c")
    invalid = product.endswith("-INVALID")
    made["metadata"]["labels"] |= {
        "nvidia.com/mig.strategy": "single",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.memory": "0" if invalid else "16384",
        "nvidia.com/gpu.count": "0" if invalid else "56",
    }
    for part in ("capacity", "allocatable"):
        made["status"][part]["nvidia.com/gpu"] = "56"
    return made


def slices_pod(name: str, profile: str) -> dict[str, Any]:
    pod = make_pod(name, 0, namespace=WORK)
    pod["spec"]["containers"][0]["resources"]["limits"] = {mig_resource(profile): "1"}
    return pod


@pytest.fixture(scope="module")
def scheduling(cluster: ControlPlane, product: Processes) -> Any:
    cluster.add_nodes([
        node("settled", **{"nvidia.com/mig.config.state": "success"}),
        node("pending", **{"nvidia.com/mig.config.state": "pending"}),
        node("invalid", **{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-INVALID"}),
        *map(mixed, MIXED_NODES),
        mixed("mixed-pending", **{"nvidia.com/mig.config.state": "pending"}),
        single("single"),
        single("single-invalid", "NVIDIA-H200-MIG-INVALID"),
    ])  # fmt: skip
    url = product.serve("serve", ["--watch", "--kubeconfig", str(cluster.kubeconfig_of("scheduler"))])
    start_scheduler(cluster, url)
    yield url
    cluster.stop_scheduler()
    cluster.delete_namespace_pods(WORK)


def pinned(name: str, where: str) -> dict[str, Any]:
    pod = make_pod(name, 1, namespace=WORK, models="H100")
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": where}
    return pod


def test_gpu_pods_go_only_to_the_settled_node_and_are_told_why_not_the_others(
    cluster: ControlPlane, scheduling: Any
) -> None:
    """Six one-GPU H100 pods: all on the settled node, though the others have 8 GPUs free by every count
    kube-scheduler keeps. A pod that may go only to one of the others stays pending, told why; a CPU-only
    pod still goes there."""
    cluster.create_pods([make_pod(f"gpu-{i}", 1, namespace=WORK, models="H100") for i in range(6)])
    assert {cluster.wait_bound(WORK, f"gpu-{i}") for i in range(6)} == {"settled"}
    cluster.create_pods([pinned("on-pending", "pending"), pinned("on-invalid", "invalid")])
    assert "MIG is being reconfigured on this node (nvidia.com/mig.config.state=pending)" in cluster.wait_failed(
        WORK, "on-pending"
    )
    assert "MIG layouts differ" in cluster.wait_failed(WORK, "on-invalid")
    cpu_only = make_pod("cpu-only", 0, namespace=WORK)
    cpu_only["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "pending"}
    cluster.create_pods([cpu_only])
    assert cluster.wait_bound(WORK, "cpu-only") == "pending"


def test_a_node_whose_reconfiguration_ends_takes_gpu_pods_again(cluster: ControlPlane, scheduling: Any) -> None:
    """The MIG manager writes success: the watch sees the label, and the pending pod binds there."""
    cluster.create_pods([pinned("waits", "pending")])
    cluster.wait_failed(WORK, "waits")

    def label(**labels: str) -> None:
        cluster.api.request(
            "PATCH", "/api/v1/nodes/pending", {"metadata": {"labels": labels}},
            content_type="application/merge-patch+json",
        )  # fmt: skip

    label(**{"nvidia.com/mig.config.state": "success"})
    try:
        where = cluster.wait_bound(WORK, "waits", timeout_s=20)
    except TimeoutError:
        # kube-scheduler retried the pod on the label's event before serve's watch had it (the refusal
        # came from the state); the pod then waits for the node's next event, here one more label.
        label(**{"example.com/touched": "1"})
        where = cluster.wait_bound(WORK, "waits", timeout_s=60)
    assert where == "pending"


def test_the_live_state_counts_the_slices_bound_pods_hold(cluster: ControlPlane, scheduling: Any) -> None:
    """Six 1g pods pinned to the node the tie rule likes least; the watch sees them, and the next 1g pod
    goes to that node, the fullest (with no count of slices in use every node would tie)."""
    fullest = max(MIXED_NODES, key=lambda name: zlib.crc32(name.encode()))
    pinned = [slices_pod(f"pinned-{i}", "1g.18gb") for i in range(6)]
    for pod in pinned:
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": fullest}
    cluster.create_pods(pinned)
    assert {cluster.wait_bound(WORK, f"pinned-{i}") for i in range(6)} == {fullest}
    time.sleep(1.0)  # the watch's events
    cluster.create_pods([slices_pod("follows", "1g.18gb")])
    assert cluster.wait_bound(WORK, "follows") == fullest


def test_200_pods_of_mixed_profiles_pack_onto_the_slices_that_exist(cluster: ControlPlane, scheduling: Any) -> None:
    """120 × 1g.18gb, 40 × 2g.35gb and 40 × 3g.71gb, in random order, on 20 nodes of 16 + 8 + 8 slices: all
    bind, never past a node's slices of their profile, none on the pending node (all of its slices free)
    nor on a node without MIG; and they pack (8 nodes hold the 1g pods at the least, spreading takes 20)."""
    wanted = ["1g.18gb"] * 120 + ["2g.35gb"] * 40 + ["3g.71gb"] * 40
    random.Random(43).shuffle(wanted)
    cluster.create_pods([slices_pod(f"mig-{i:03d}", profile) for i, profile in enumerate(wanted)])
    placed = Counter(
        (cluster.wait_bound(WORK, f"mig-{i:03d}", timeout_s=120), profile) for i, profile in enumerate(wanted)
    )
    nodes = {where for where, _ in placed}
    assert nodes <= set(MIXED_NODES), nodes - set(MIXED_NODES)
    assert all(count <= LAYOUT[profile] for (_, profile), count in placed.items()), placed
    assert 8 <= len(nodes) <= 10, sorted(nodes)


def test_a_profile_no_node_has_stays_pending(cluster: ControlPlane, scheduling: Any) -> None:
    cluster.create_pods([slices_pod("no-7g", "7g.141gb")])
    assert "nvidia.com/mig-7g.141gb" in cluster.wait_failed(WORK, "no-7g")


def test_a_single_nodes_slices_go_only_to_pods_that_accept_them(cluster: ControlPlane, scheduling: Any) -> None:
    """An H200 pod that does not say it accepts a slice is told how to; one that says so binds there, with
    the slice's memory as the GPU's (a floor above it is refused); the invalid single node takes none."""

    def h200(name: str, accept: bool, memory: str | None = None) -> dict[str, Any]:
        pod = make_pod(name, 1, namespace=WORK, models="H200", memory=memory)
        if accept:
            pod["metadata"]["annotations"]["gpu-scheduler.io/accept-mig-slices"] = "true"
        return pod

    cluster.create_pods([h200("whole-h200", False), h200("slice-ok", True), h200("slice-too-small", True, "20Gi")])
    assert 'gpu-scheduler.io/accept-mig-slices: "true"' in cluster.wait_failed(WORK, "whole-h200")
    assert cluster.wait_bound(WORK, "slice-ok") == "single"
    assert "GPU memory 16384 MiB < 20480 MiB" in cluster.wait_failed(WORK, "slice-too-small")
    pinned_invalid = h200("on-single-invalid", True)
    pinned_invalid["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "single-invalid"}
    cluster.create_pods([pinned_invalid])
    assert "MIG layouts differ" in cluster.wait_failed(WORK, "on-single-invalid")
