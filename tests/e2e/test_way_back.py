"""The way back (docs/deploy.md#the-way-back), through the real kube-scheduler, on what
``gpu-scheduler scheduler-config`` generates:

- with the extender unreachable, the generated configuration fails every pod of the profile, CPU-only
  ones included: the extender is not ignorable, so nothing is placed without its view;
- the break-glass configuration the same ConfigMap carries (what ``GPU_SCHEDULER_CONFIG=break-glass.yaml``
  rolls the Deployment onto) places those pods with kube-scheduler's own plugins, the extender still down:
  whole GPUs counted by kube-scheduler, never more than a node has; a share waits, since only the
  extender's bind can account it;
- the post-deploy smoke check of docs/deploy.md, ``examples/smoke-pod.yaml``, binds through the extender
  with the event the doc shows.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from scheduler_core.simulator.synthetic import CATALOGUE, make_node, make_pod
from testing.control_plane import REPO, ControlPlane
from testing.processes import free_port
from testing.product import Processes, requests_served
from testing.product_manifests import generated_scheduler_config
from tests.e2e.conftest import gpus_of, start_scheduler

T4 = next(shape for shape in CATALOGUE if shape.model == "T4")
NAMESPACE = "way-back"


def pod(name: str, gpus: int = 0, milli: int = 0) -> dict[str, Any]:
    made = make_pod(name, gpus, namespace=NAMESPACE, milli=milli)
    made["spec"]["containers"][0]["resources"]["requests"].update(cpu="100m", memory="64Mi")
    return made


def taken(cluster: ControlPlane) -> int:
    """GPUs held by the bound pods, as kube-scheduler counts them."""
    return sum(gpus_of(p) for p in cluster.pods(NAMESPACE) if p["spec"].get("nodeName"))


@pytest.fixture(scope="module")
def dead_url(cluster: ControlPlane) -> str:
    cluster.add_nodes([make_node("t4-0", T4, "us-east-1a")])
    cluster.ensure_namespaces([NAMESPACE])
    return f"http://127.0.0.1:{free_port()}"  # nothing listens: the extender's API is unreachable


def test_without_the_extender_every_pod_of_the_profile_waits_and_the_break_glass_places_them(
    cluster: ControlPlane, dead_url: str
) -> None:
    start_scheduler(cluster, dead_url, "--sharing")
    try:
        cluster.create_pods([pod("gpu-0", gpus=1), pod("cpu-only")])
        for name in ("gpu-0", "cpu-only"):
            message = cluster.wait_failed(NAMESPACE, name, timeout_s=60)
            assert "connection refused" in message or "connect" in message, message
    finally:
        cluster.stop_scheduler()

    glass = generated_scheduler_config(["--url", dead_url, "--sharing"], "break-glass.yaml")
    assert "extenders" not in glass
    cluster.start_scheduler(glass)
    try:
        # The pods that waited are placed, the extender still down.
        assert cluster.wait_bound(NAMESPACE, "gpu-0", timeout_s=60) == "t4-0"
        assert cluster.wait_bound(NAMESPACE, "cpu-only", timeout_s=60) == "t4-0"
        # kube-scheduler counts whole GPUs itself: the node's 4, no more.
        cluster.create_pods([pod(f"gpu-{i}", gpus=1) for i in range(1, 5)])
        cluster.wait_for(lambda: taken(cluster) == 4, timeout_s=60, what="4 GPUs taken on t4-0")
        (left,) = [p["metadata"]["name"] for p in cluster.pods(NAMESPACE) if not p["spec"].get("nodeName")]
        assert "Insufficient nvidia.com/gpu" in cluster.wait_failed(NAMESPACE, left, timeout_s=60)
        # A share waits: only the extender's bind accounts gpu-milli.
        cluster.create_pods([pod("share", milli=250)])
        assert "Insufficient gpu-scheduler.io/gpu-milli" in cluster.wait_failed(NAMESPACE, "share", timeout_s=60)
        assert taken(cluster) == 4
    finally:
        cluster.stop_scheduler()
        cluster.delete_namespace_pods(NAMESPACE)


def test_the_smoke_pod_of_docs_deploy_binds_through_the_extender_and_says_so_in_its_event(
    cluster: ControlPlane, dead_url: str, product: Processes
) -> None:
    """``examples/smoke-pod.yaml`` as docs/deploy.md applies it, on the generated configuration: bound, with
    a ``Scheduled`` event from ``gpu-scheduler`` (what the doc shows), and the extender asked about it."""
    smoke = yaml.safe_load((REPO / "examples" / "smoke-pod.yaml").read_text())
    serve = product.serve("serve", ["--watch", "--kubeconfig", str(cluster.kubeconfig_of("scheduler"))])
    start_scheduler(cluster, serve)
    before = requests_served(serve)
    try:
        cluster.create_pods([smoke])
        assert cluster.wait_bound("default", "gpu-scheduler-smoke", timeout_s=60) == "t4-0"
        cluster.wait_for(lambda: bool(scheduled_events(cluster)), timeout_s=30, what="a Scheduled event")
        (event,) = scheduled_events(cluster)
    finally:
        cluster.stop_scheduler()
        cluster.delete_pod("default", "gpu-scheduler-smoke")
    assert event["reportingComponent"] == "gpu-scheduler"
    assert event["message"] == "Successfully assigned default/gpu-scheduler-smoke to t4-0"
    assert requests_served(serve)["filter"] > before["filter"]


def scheduled_events(cluster: ControlPlane) -> list[dict[str, Any]]:
    selector = "involvedObject.name=gpu-scheduler-smoke,reason=Scheduled"
    return cluster.api.items(f"/api/v1/namespaces/default/events?fieldSelector={selector}")
