"""The extender's weight in the generated profile, against kube-scheduler's own score plugins.

Pods behind one Service get PodTopologySpread's default constraints (spread over hosts and zones,
``ScheduleAnyway``). At the default weight the GPU policy must still pack them; without the extender,
the same profile spreads them. ``gpu-scheduler bench e2e-weights`` measures every weight.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

from scheduler_core.simulator.synthetic import CATALOGUE, make_node, make_pod
from testing.bind_watch import BindWatch
from testing.control_plane import ControlPlane
from testing.product import Processes
from testing.product_manifests import generated_scheduler_config

A100 = next(shape for shape in CATALOGUE if shape.model == "A100")
NAMESPACE = "weights"
NODES = [make_node(f"a100-{i:02d}", A100, ("us-east-1a", "us-east-1b", "us-east-1c")[i % 3]) for i in range(12)]
PODS = 24  # three full nodes


def trainers() -> list[dict[str, Any]]:
    pods = [make_pod(f"trainer-{i:02d}", 1, namespace=NAMESPACE) for i in range(PODS)]
    for pod in pods:
        pod["metadata"].setdefault("labels", {})["app"] = "trainer"
        pod["spec"]["containers"][0]["resources"]["requests"].update(cpu="100m", memory="64Mi")
    return pods


def drain(cluster: ControlPlane, config: dict[str, Any]) -> Counter[str]:
    """The pods created with the scheduler stopped, then scheduled at once: pods per node."""
    cluster.create_pods(trainers())
    watch = BindWatch(cluster.api, NAMESPACE)
    try:
        cluster.start_scheduler(config)
        assert watch.wait(PODS, timeout_s=120), f"{len(watch.node_of)} of {PODS} bound"
        cluster.stop_scheduler()
    finally:
        watch.close()
    cluster.delete_namespace_pods(NAMESPACE)
    return Counter(watch.node_of.values())


def test_at_the_default_weight_the_gpu_policy_packs_what_topology_spread_would_spread(
    cluster: ControlPlane, product: Processes
) -> None:
    cluster.add_nodes(NODES)
    cluster.ensure_namespaces([NAMESPACE])
    service = {"metadata": {"name": "trainer"}, "spec": {"selector": {"app": "trainer"}, "ports": [{"port": 80}]}}
    cluster.api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/services", service, ok=(201,))
    url = product.serve("serve", ["--watch", "--kubeconfig", str(cluster.kubeconfig_of("scheduler"))])
    config = generated_scheduler_config(["--url", url])
    assert config["extenders"][0]["weight"] == 5
    packed = drain(cluster, config)
    assert len(packed) <= 4, packed  # the ideal is 3; PodTopologySpread may still move one pod
    without = copy.deepcopy(config)
    without.pop("extenders")
    spread = drain(cluster, without)
    assert len(spread) >= 8, spread  # the same profile with no extender: the spread wins
