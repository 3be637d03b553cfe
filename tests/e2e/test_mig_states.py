"""Nodes whose MIG layout is unsettled or invalid take no GPU pod, through the real kube-scheduler on the
generated configuration, with ``gpu-scheduler serve --watch`` as the extender.

The GPU Operator's MIG manager labels a node ``nvidia.com/mig.config.state=pending`` (or ``rebooting``)
while it changes the GPUs' MIG layout, and ``failed`` when it could not; GFD names the product
``...-MIG-INVALID`` when the GPUs' layouts differ under the device plugin's ``single`` strategy. Their
``nvidia.com/gpu`` is then not what the labels say (``scheduler_core.k8s.nodes.mig_refusal``).
"""

from __future__ import annotations

from typing import Any

import pytest

from gpu_scheduler.synthetic import CATALOGUE, make_node, make_pod
from testing.control_plane import ControlPlane
from testing.product import Processes
from tests.e2e.conftest import start_scheduler

H100 = next(shape for shape in CATALOGUE if shape.model == "H100")
WORK = "mig-states"


def node(name: str, **labels: str) -> dict[str, Any]:
    made = make_node(name, H100, "us-east-1a")
    made["metadata"]["labels"].update(labels)
    return made


@pytest.fixture(scope="module")
def scheduling(cluster: ControlPlane, product: Processes) -> Any:
    cluster.add_nodes([
        node("settled", **{"nvidia.com/mig.config.state": "success"}),
        node("pending", **{"nvidia.com/mig.config.state": "pending"}),
        node("invalid", **{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-INVALID"}),
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
    cluster.api.request(
        "PATCH",
        "/api/v1/nodes/pending",
        {"metadata": {"labels": {"nvidia.com/mig.config.state": "success"}}},
        content_type="application/merge-patch+json",
    )
    assert cluster.wait_bound(WORK, "waits", timeout_s=120) == "pending"
