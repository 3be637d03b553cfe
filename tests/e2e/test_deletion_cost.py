"""Deletion cost through the real ReplicaSet controller: ``gpu-scheduler refresh deletion-cost`` writes
costs from a real Prometheus, and scaling the Deployment down removes the pod with the lowest cost.

The pods are placed by the generated scheduler (they ask for no GPU, so the extender is never called;
its URL here answers nothing) and marked Running and Ready as a kubelet would, so that the controller's
earlier criteria (assigned, phase, readiness) tie and the cost decides.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler_core.k8s.names import DELETION_COST_ANNOTATION, DELETION_COST_LABEL, DISRUPTION_COST_ANNOTATION
from testing.control_plane import ControlPlane
from testing.prometheus import MISSING, PROMETHEUS, PROMTOOL, prometheus_with
from tests.e2e.conftest import start_scheduler

NAMESPACE = "web"
LABELS = {"app": "frontend", DELETION_COST_LABEL: "managed"}
CONFIG = {
    "hysteresis": 0,
    "workloads": [{
        "namespace": NAMESPACE, "selector": "app=frontend", "policy": "metrics",
        "queries": {
            "active_requests": 'sum by (namespace, pod) (app_active_requests{namespace="{namespace}"})',
            "cache_hit_rate": 'avg by (namespace, pod) (app_cache_hit_ratio{namespace="{namespace}"})',
            "avg_response_time_ms": 'avg by (namespace, pod) (app_latency_ms{namespace="{namespace}"})',
        },
    }],
}  # fmt: skip
# Per pod, in name order: active requests, cache hit rate, mean latency (ms).
SIGNALS = ((40, 0.9, 50), (2, 0.5, 300), (20, 0.8, 700))


def expected_cost(active: float, hit: float, latency_ms: float) -> int:
    """docs/deletion-cost.md's metrics policy, written out apart from the core."""
    bonus = 50 if latency_ms < 100 else 20 if latency_ms < 500 else 0
    return min(1000, math.floor(5 * active) + math.floor(100 * hit) + bonus)


def deployment(replicas: int) -> dict[str, Any]:
    container = {"name": "web", "image": "nginx", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "frontend", "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas, "selector": {"matchLabels": {"app": "frontend"}},
            "template": {"metadata": {"labels": LABELS},
                         "spec": {"schedulerName": "gpu-scheduler", "terminationGracePeriodSeconds": 0,
                                  "containers": [container]}},
        },
    }  # fmt: skip


@pytest.fixture(scope="module")
def frontend(cluster: ControlPlane) -> Iterator[list[str]]:
    """Three running replicas of a managed Deployment; their names, sorted."""
    if not (PROMETHEUS and PROMTOOL):
        pytest.skip(MISSING)
    from scheduler_core.simulator.synthetic import CATALOGUE, make_node

    cluster.add_nodes([make_node(f"node-{i}", CATALOGUE[0], "us-east-1a") for i in range(2)])
    cluster.start_controller_manager()
    # No extender answers here: with the GPU pods only calling it, these CPU-only replicas never ask.
    start_scheduler(cluster, "http://127.0.0.1:1", "--gpu-pods-only")
    cluster.ensure_namespaces([NAMESPACE])
    cluster.api.request("POST", f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments", deployment(3))
    cluster.wait_for(lambda: len(bound(cluster)) == 3, 60, "three bound replicas")
    names = sorted(bound(cluster))
    for name in names:
        cluster.mark_running(NAMESPACE, name)
    yield names
    cluster.stop_scheduler()


def bound(cluster: ControlPlane) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in cluster.pods(NAMESPACE) if p["spec"].get("nodeName")}


@pytest.fixture(scope="module")
def prometheus(frontend: list[str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    families: dict[str, dict[tuple[tuple[str, str], ...], float]] = {
        "app_active_requests": {}, "app_cache_hit_ratio": {}, "app_latency_ms": {}
    }  # fmt: skip
    for name, (active, hit, latency) in zip(frontend, SIGNALS, strict=True):
        labels = (("namespace", NAMESPACE), ("pod", name))
        families["app_active_requests"][labels] = active
        families["app_cache_hit_ratio"][labels] = hit
        families["app_latency_ms"][labels] = latency
    with prometheus_with(families, tmp_path_factory.mktemp("prometheus")) as url:
        yield url


def refresh_once(cluster: ControlPlane, prometheus: str, config: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "gpu_scheduler", "refresh", "deletion-cost", "--once", "--kubeconfig",
         str(cluster.kubeconfig_of("deletion-cost")), "--prometheus", prometheus, "--config", str(config)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return report


def test_the_refresher_writes_costs_from_prometheus_and_a_scale_down_removes_the_cheapest_pod(
    cluster: ControlPlane, frontend: list[str], prometheus: str, tmp_path: Path
):
    # A pod of the same app without the opt-in label is never read or written.
    unmanaged = {
        "metadata": {"name": "unmanaged", "namespace": NAMESPACE, "labels": {"app": "frontend-canary"}},
        "spec": {"schedulerName": "gpu-scheduler", "containers": [{"name": "c", "image": "nginx"}]},
    }
    cluster.create_pods([unmanaged])
    config = tmp_path / "costs.json"
    config.write_text(json.dumps(CONFIG))

    report = refresh_once(cluster, prometheus, config)

    assert report["status"] == "ok"
    costs = {
        name: pod["metadata"].get("annotations", {}).get(DELETION_COST_ANNOTATION)
        for name, pod in bound(cluster).items()
    }
    assert costs == {
        **{name: str(expected_cost(*signals)) for name, signals in zip(frontend, SIGNALS, strict=True)},
        "unmanaged": None,
    }
    cheapest = min(frontend, key=lambda name: int(costs[name] or 0))
    assert cheapest == frontend[1]

    cluster.api.patch(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/frontend", {"spec": {"replicas": 2}})
    cluster.wait_for(lambda: set(bound(cluster)) == {*frontend, "unmanaged"} - {cheapest}, 60, "the scale-down")

    # A second run with nothing changed writes nothing.
    again = refresh_once(cluster, prometheus, config)
    assert again["status"] == "ok" and again["passes"][0]["cost_patches"] == 0, again


def karpenter(gate: bool) -> dict[str, Any]:
    """Karpenter's Deployment as its Helm chart writes it (no replicas: only its spec is read here)."""
    env = [{"name": "FEATURE_GATES", "value": f"SpotToSpotConsolidation=false,PodDeletionCostManagement={gate}"}]
    container = {"name": "controller", "image": "public.ecr.aws/karpenter/controller:1.14.1", "env": env}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "karpenter", "namespace": "kube-system"},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "karpenter"}},
                 "template": {"metadata": {"labels": {"app": "karpenter"}}, "spec": {"containers": [container]}}},
    }  # fmt: skip


def test_with_karpenters_gate_on_the_refresher_writes_its_disruption_cost_and_no_pod_deletion_cost(
    cluster: ControlPlane, frontend: list[str], prometheus: str, tmp_path: Path
):
    """Karpenter's ``PodDeletionCostManagement`` gate, read from its Deployment by the refresher's own
    identity: on, the costs go to ``karpenter.sh/disruption-cost`` and ``pod-deletion-cost`` is left to
    Karpenter; off again, the refresher writes ``pod-deletion-cost`` as before. Runs after the scale-down
    above: the two replicas left carry their ``pod-deletion-cost``."""
    config = tmp_path / "costs.json"
    config.write_text(json.dumps(CONFIG))
    path = "/apis/apps/v1/namespaces/kube-system/deployments"
    cluster.api.request("POST", path, karpenter(True))
    managed = sorted(set(bound(cluster)) & set(frontend))
    before = {name: bound(cluster)[name]["metadata"]["annotations"][DELETION_COST_ANNOTATION] for name in managed}
    # Karpenter, as the gate makes it, takes pod-deletion-cost over: what it writes there stays.
    for name in managed:
        cluster.api.patch(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}",
                          {"metadata": {"annotations": {DELETION_COST_ANNOTATION: "-7"}}})  # fmt: skip

    on = refresh_once(cluster, prometheus, config)

    assert on["status"] == "ok" and on["passes"][0]["cost_annotation"] == DISRUPTION_COST_ANNOTATION, on
    pods = bound(cluster)
    written = {name: pods[name]["metadata"]["annotations"].get(DISRUPTION_COST_ANNOTATION) for name in managed}
    assert written == before, json.dumps(on["passes"])
    assert {pods[name]["metadata"]["annotations"][DELETION_COST_ANNOTATION] for name in managed} == {"-7"}

    gate_off = karpenter(False)
    gate_off["metadata"]["resourceVersion"] = cluster.api.get(f"{path}/karpenter")["metadata"]["resourceVersion"]
    cluster.api.request("PUT", f"{path}/karpenter", gate_off)
    off = refresh_once(cluster, prometheus, config)

    assert off["status"] == "ok" and off["passes"][0]["cost_annotation"] == DELETION_COST_ANNOTATION, off
    pods = bound(cluster)
    assert {name: pods[name]["metadata"]["annotations"][DELETION_COST_ANNOTATION] for name in managed} == before
    cluster.api.request("DELETE", f"{path}/karpenter")
