"""Pods that request no GPU, through the real kube-scheduler on the generated profile.

The profile lists no ``managedResources``, so kube-scheduler asks the extender about every pod it
schedules, and ``fgd_cpu`` keeps a CPU-only pod off a node whose free GPUs its CPU would strand
(docs/scheduling.md, "One policy for every pod"). ``--gpu-pods-only`` puts ``managedResources`` back:
the same pod then goes where kube-scheduler's own plugins send it.

Two T4 nodes (4 GPUs, 47.81 cores, 178 GiB): ``t4-busy`` has its 4 GPUs taken by 1-core pods and
most of its CPU free; ``t4-thin`` has all 4 GPUs free but 7.81 cores left, and little memory. A
CPU-only pod of 7.5 cores fits both. On ``t4-thin`` it would leave 0.31 cores, and the typical
1-core GPU pod could use none of its GPUs. kube-scheduler's MostAllocated prefers ``t4-thin``,
the fuller node.
"""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_core.simulator.synthetic import CATALOGUE, make_node, make_pod
from testing.control_plane import ControlPlane
from testing.product import Processes, requests_served
from tests.e2e.conftest import start_scheduler

T4 = next(shape for shape in CATALOGUE if shape.model == "T4")
NAMESPACE = "cpu-only"


def cpu_pod(name: str, cpu: str, memory: str, node_name: str | None = None) -> dict[str, Any]:
    pod = make_pod(name, 0, namespace=NAMESPACE, node_name=node_name)
    pod["spec"]["containers"][0]["resources"]["requests"].update(cpu=cpu, memory=memory)
    return pod


@pytest.fixture(scope="module")
def serve_url(cluster: ControlPlane, product: Processes) -> str:
    cluster.add_nodes([make_node("t4-busy", T4, "us-east-1a"), make_node("t4-thin", T4, "us-east-1a")])
    cluster.ensure_namespaces([NAMESPACE])
    busy = [make_pod(f"gpu-{i}", 1, namespace=NAMESPACE, node_name="t4-busy") for i in range(4)]
    cluster.create_pods([*busy, cpu_pod("hog", "40", "150Gi", node_name="t4-thin")])
    return product.serve("serve", ["--watch", "--kubeconfig", str(cluster.kubeconfig_of("scheduler"))])


def place(cluster: ControlPlane, name: str) -> str:
    cluster.create_pods([cpu_pod(name, "7500m", "2Gi")])
    node = cluster.wait_bound(NAMESPACE, name, timeout_s=60)
    cluster.delete_pod(NAMESPACE, name)
    return node


def test_a_cpu_only_pod_is_placed_by_the_extender_where_it_strands_no_gpu(
    cluster: ControlPlane, serve_url: str
) -> None:
    config = start_scheduler(cluster, serve_url)
    assert "managedResources" not in config["extenders"][0]
    before = requests_served(serve_url)
    try:
        assert place(cluster, "batch") == "t4-busy"
    finally:
        cluster.stop_scheduler()
    served = requests_served(serve_url)
    assert served["filter"] > before["filter"] and served["prioritize"] > before["prioritize"]


def test_with_gpu_pods_only_kube_scheduler_places_it_alone_and_strands_the_gpus(
    cluster: ControlPlane, serve_url: str
) -> None:
    config = start_scheduler(cluster, serve_url, "--gpu-pods-only")
    managed = config["extenders"][0]["managedResources"]  # nvidia.com/gpu, then one per MIG profile
    assert managed[0] == {"name": "nvidia.com/gpu", "ignoredByScheduler": False}
    assert all(entry["name"].startswith("nvidia.com/mig-") for entry in managed[1:])
    before = requests_served(serve_url)
    try:
        assert place(cluster, "batch-alone") == "t4-thin"
    finally:
        cluster.stop_scheduler()
    assert requests_served(serve_url) == before  # the extender was never asked
