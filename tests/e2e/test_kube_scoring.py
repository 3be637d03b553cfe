"""The demo's model of kube-scheduler's scoring (``gpu_scheduler/kube_scoring.py``) against the real
kube-scheduler, pod by pod: on partly used nodes of four GPU shapes, each pod is created alone, and the
node the real scheduler binds it to must be one of the nodes the model scores highest. Once on the stock
profile (no extender, no ``pluginConfig``: ``LeastAllocated``), once on the generated one through
``gpu-scheduler serve --watch`` (``MostAllocated`` with GPUs, plus the extender's score x 5 x 10). The
extender's scores for the prediction come from the same core on the cluster as the API server lists it,
asked in-process with the nodes kube-scheduler sends: asking ``serve`` itself would change what it answers
kube-scheduler next, since it assumes the pod on the node it scores highest.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from gpu_scheduler.kube_scoring import PRODUCT, STOCK, NodeUse, best, request_of, total_scores
from scheduler_core.extender.facade import Extender, ExtenderConfig
from scheduler_core.extender.wire import ExtenderArgs
from scheduler_core.simulator.synthetic import CATALOGUE, ZONES, make_node, make_pod
from scheduler_core.state.cluster import ClusterState
from testing.control_plane import ControlPlane
from testing.product import Processes
from testing.product_manifests import generated_scheduler_config
from tests.e2e.conftest import start_scheduler

NAMESPACE = "kube-scoring"
SHAPES = [CATALOGUE[i % len(CATALOGUE)] for i in range(12)]
RUNNING = {0: 3, 1: 6, 2: 1, 3: 2, 5: 7, 6: 3, 9: 1}
"""GPUs already taken on some nodes, by index."""
SIZES = [1, 2, 1, 4, 1, 8, 0, 2, 1, 1, 4, 2, 0, 1]
"""The pods' GPUs, in creation order (0: a CPU-only pod)."""


@pytest.fixture(scope="module")
def nodes(cluster: ControlPlane) -> list[dict[str, Any]]:
    made = [make_node(f"n{i:02d}-{s.model.lower()}", s, ZONES[i % 3]) for i, s in enumerate(SHAPES)]
    cluster.add_nodes(made)
    cluster.ensure_namespaces([NAMESPACE])
    running = [
        make_pod(f"running-{i}", gpus, namespace=NAMESPACE, node_name=made[i]["metadata"]["name"], phase="Running")
        for i, gpus in RUNNING.items()
    ]
    cluster.create_pods(running)
    return made


def state(cluster: ControlPlane, nodes: list[dict[str, Any]]) -> list[NodeUse]:
    """The nodes as kube-scheduler sees them: allocatable, and what the bound pods request."""
    uses = {node["metadata"]["name"]: NodeUse.of(node) for node in nodes}
    for pod in cluster.pods(NAMESPACE):
        if pod["spec"].get("nodeName"):
            uses[pod["spec"]["nodeName"]].add(request_of(pod))
    return list(uses.values())


def extender_scores(cluster: ControlPlane, pod: dict[str, Any], names: list[str]) -> dict[str, int]:
    """The extender's filter, then its prioritize of the nodes kept, on the cluster as listed now."""
    state = ClusterState.from_objects(cluster.api.items("/api/v1/nodes"), cluster.pods())
    extender = Extender(ExtenderConfig(assume=False), cluster=lambda: state)
    kept = extender.filter(ExtenderArgs(pod=pod, node_names=names)).kept
    scored = extender.prioritize(ExtenderArgs(pod=pod, node_names=list(kept)))
    return dict(zip(scored.hosts, scored.values, strict=True))


def check_pod_by_pod(
    cluster: ControlPlane, nodes: list[dict[str, Any]], prefix: str, strategy: str, serve: str = ""
) -> list[tuple[str, list[str]]]:
    """Create each pod alone, predict, wait for its bind; the (bound node, model's best) pairs."""
    seen = []
    for i, gpus in enumerate(SIZES):
        pod = make_pod(f"{prefix}-{i:02d}", gpus, namespace=NAMESPACE)
        uses = state(cluster, nodes)
        request = request_of(pod)
        feasible = [u for u in uses if u.fits(request)]
        if not feasible:  # no node has room: the pod waits (kube-scheduler's own count), and goes
            cluster.create_pods([pod])
            assert "Insufficient nvidia.com/gpu" in cluster.wait_failed(NAMESPACE, pod["metadata"]["name"])
            cluster.delete_pod(NAMESPACE, pod["metadata"]["name"])
            seen.append(("", []))
            continue
        extender: dict[str, int] = {}
        if serve:
            extender = extender_scores(cluster, pod, [u.name for u in feasible])
            feasible = [u for u in feasible if u.name in extender]
        predicted = best(total_scores(feasible, request, strategy, extender, weight=5 if serve else 0))
        cluster.create_pods([pod])
        seen.append((cluster.wait_bound(NAMESPACE, pod["metadata"]["name"], timeout_s=60), predicted))
        time.sleep(0.3)  # serve's watch takes the bind in (tens of ms at p99)
    return seen


def test_the_stock_profile_binds_each_pod_where_the_model_scores_highest(
    cluster: ControlPlane, nodes: list[dict[str, Any]]
) -> None:
    config = generated_scheduler_config(["--url", "http://127.0.0.1:1"])
    config.pop("extenders")
    for profile in config["profiles"]:
        profile.pop("pluginConfig", None)
    cluster.start_scheduler(config)
    try:
        seen = check_pod_by_pod(cluster, nodes, "stock", STOCK)
    finally:
        cluster.stop_scheduler()
        for i in range(len(SIZES)):
            cluster.delete_pod(NAMESPACE, f"stock-{i:02d}")
    misses = [(i, bound, predicted) for i, (bound, predicted) in enumerate(seen) if bound and bound not in predicted]
    assert not misses, misses
    # The model is not vacuous: it ruled nodes out at most steps.
    assert sum(len(predicted) < len(nodes) for _, predicted in seen) >= len(SIZES) - 2


def test_the_generated_profile_binds_each_pod_where_the_model_with_the_extender_scores_highest(
    cluster: ControlPlane, nodes: list[dict[str, Any]], product: Processes
) -> None:
    serve = product.serve("serve", ["--watch", "--kubeconfig", str(cluster.kubeconfig_of("scheduler"))])
    start_scheduler(cluster, serve)
    try:
        seen = check_pod_by_pod(cluster, nodes, "ours", PRODUCT, serve)
    finally:
        cluster.stop_scheduler()
    misses = [(i, bound, predicted) for i, (bound, predicted) in enumerate(seen) if bound and bound not in predicted]
    assert not misses, misses
    assert all(bound for bound, _ in seen), "the product packs: every pod finds room"
    assert sum(len(predicted) == 1 for _, predicted in seen) >= len(SIZES) // 2
