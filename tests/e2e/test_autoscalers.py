"""Karpenter's choices, bound through the real kube-scheduler, and its NodePool schema on the real API
server.

For each of the twelve pod shapes of ``tests/scheduler_core/test_autoscaler_shapes.py``, in turn: the
test model of Karpenter (``testing/karpenter.py``) lists the instance types it could launch for the pod as
the product leaves it, on the NodePools the product generates; a node of the first of them is added as
Karpenter launches one (its labels and the pool's taints, before GFD or the node-state refresher label
its GPUs); and the pod must bind, on the generated configuration with sharing, to a node of one of those
types (an earlier shape's node may take it). The product runs as itself: ``serve`` as the second
scheduler's identity.

Then Karpenter's v1 NodePool CRD (``aws/karpenter-provider-aws`` v1.14.1, from the machine's folder of
Karpenter's files) is installed, and the API server validates the generated NodePools against its schema
and CEL rules; a broken one is refused, so the validation is live.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from adapters.gpu_ledger import LedgerStore
from manifests.nodepool import gpu_nodepools
from testing.control_plane import ControlPlane
from testing.karpenter import karpenter_node, karpenter_source, launchable, pending
from testing.kube_rest import KubeError
from tests.e2e.conftest import ServeSharing, create_ledger, start_scheduler
from tests.scheduler_core.test_autoscaler_shapes import BY_TYPE, POOLS, SHAPES

TABLE = "gpu-ledger-autoscalers"
NS = "autoscalers"
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")


@pytest.fixture(scope="module")
def ledger(moto_env: dict[str, str]) -> LedgerStore:
    return create_ledger(moto_env, TABLE)


@pytest.fixture(scope="module")
def outcomes(cluster: ControlPlane, ledger: LedgerStore, serve_sharing: ServeSharing) -> Iterator[dict[str, Any]]:
    url, _ = serve_sharing(TABLE)
    cluster.ensure_namespaces([NS])
    found: dict[str, Any] = {}
    try:
        for i, shape in enumerate(SHAPES):
            pod = shape.as_left(shape.pod(NS))
            picks = sorted(launchable(pending(shape.provisioned_for(pod)), POOLS))
            pool, instance_type = picks[0]
            name = f"k{i:02d}-{instance_type.replace('.', '-')}"
            node = karpenter_node(name, BY_TYPE[instance_type], next(p for p in POOLS if p.name == pool), ZONES[i % 3])
            cluster.add_nodes([node])  # which clears the taints admission gave it: the pool's go back on
            cluster.api.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": node["spec"]["taints"]}})
            cluster.create_pods([pod])
            bound = cluster.wait_bound(NS, shape.name, timeout_s=60)
            types = {n["metadata"]["name"]: n["metadata"]["labels"]["node.kubernetes.io/instance-type"]
                     for n in cluster.api.items("/api/v1/nodes")}  # fmt: skip
            found[shape.name] = {"picks": {t for _, t in picks}, "node": bound, "type": types[bound]}
    finally:
        cluster.stop_scheduler()
    found["url"] = url
    yield found
    cluster.delete_namespace_pods(NS)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_each_shape_binds_on_a_node_of_a_type_karpenter_would_launch_for_it(outcomes: dict[str, Any], shape):
    outcome = outcomes[shape.name]
    assert outcome["type"] in outcome["picks"], outcome


def test_a_new_node_takes_the_pod_as_soon_as_its_device_plugin_reports_the_gpus(
    cluster: ControlPlane, outcomes: dict[str, Any]
):
    """A node Karpenter launched registers before its device plugin reports its GPUs: kube-scheduler
    refuses the pod by its own count, then retries it the moment the node's allocatable changes, and the
    extender, whose watch may not have that change yet, must not refuse the node as having no GPUs (an
    unresolvable refusal, after which the pod would wait minutes for another event)."""
    from scheduler_core.simulator.synthetic import make_pod

    pool = next(p for p in POOLS if p.name == "gpu-whole")
    node = karpenter_node("late-gpus", BY_TYPE["g6e.48xlarge"], pool, "us-east-1b")
    for part in ("capacity", "allocatable"):
        node["status"][part]["nvidia.com/gpu"] = "0"
    serve_url = outcomes["url"]
    start_scheduler(cluster, serve_url, "--sharing")
    try:
        cluster.add_nodes([node])
        pod = make_pod("eight-l40s", 8, namespace=NS, models="L40S")
        pod["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        cluster.create_pods([pod])
        assert "Insufficient nvidia.com/gpu" in cluster.wait_failed(NS, "eight-l40s")
        # Karpenter marks the node initialized, and the device plugin reports the GPUs a moment later: the
        # first change starts serve's rebuild, which makes the next wait (at least 25 ms), the window in
        # which kube-scheduler asks about the second.
        current = cluster.api.patch("/api/v1/nodes/late-gpus", {"metadata": {"labels": {"e2e/step": "initialized"}}})
        for part in ("capacity", "allocatable"):
            current["status"][part]["nvidia.com/gpu"] = "8"
        cluster.api.request("PUT", "/api/v1/nodes/late-gpus/status", current)
        assert cluster.wait_bound(NS, "eight-l40s", timeout_s=20) == "late-gpus"
    finally:
        cluster.stop_scheduler()


def test_a_pod_no_node_takes_is_told_in_its_event_which_instance_types_would_fit(
    cluster: ControlPlane, outcomes: dict[str, Any]
):
    """No node of the cluster has a B200: kube-scheduler's FailedScheduling event quotes the extender's
    refusals, which end with the instance types an autoscaler could add, and with what to write for a pod
    whose GPU needs only the annotation says; ``explain`` says the same."""
    from scheduler_core.simulator.synthetic import make_pod

    start_scheduler(cluster, outcomes["url"], "--sharing")
    try:
        pod = make_pod("wants-b200", 1, namespace=NS, models="B200")
        pod["spec"]["tolerations"] = [{"operator": "Exists"}]
        cluster.create_pods([pod])
        message = cluster.wait_failed(NS, "wants-b200")
    finally:
        cluster.stop_scheduler()
    assert "GPU model H100 not in B200; instance types that fit: p6-b200.48xlarge; an autoscaler cannot see" in message
    explained = subprocess.run(
        [sys.executable, "-m", "gpu_scheduler", "explain", f"{NS}/wants-b200", "--kubeconfig", str(cluster.kubeconfig),
         "--json"], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert explained.returncode == 0, explained.stderr
    assert json.loads(explained.stdout)["autoscaler"].startswith("instance types that fit: p6-b200.48xlarge")


def test_the_generated_nodepools_validate_against_karpenters_v1_crd(cluster: ControlPlane):
    source = karpenter_source()
    if isinstance(source, str):
        pytest.skip(source)
    crd = yaml.safe_load((source / "karpenter.sh_nodepools.yaml").read_text())
    cluster.api.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/nodepools.karpenter.sh"

    def established() -> bool:
        conditions = cluster.api.get(path).get("status", {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    cluster.wait_for(established, 30, "Karpenter's NodePool CRD to be served")
    pools = [*gpu_nodepools("default", sharing=True), *gpu_nodepools("gpu", consolidation="WhenEmptyOrUnderutilized")]
    created = []
    for i, pool in enumerate(pools):
        pool = json.loads(json.dumps(pool))
        pool["metadata"]["name"] += f"-{i}"
        created.append(cluster.api.request("POST", "/apis/karpenter.sh/v1/nodepools", pool)["metadata"]["name"])
    assert len(created) == 3
    broken = json.loads(json.dumps(pools[0]))
    broken["metadata"]["name"] = "broken"
    broken["spec"]["disruption"]["consolidateAfter"] = "ten minutes"
    with pytest.raises(KubeError, match="consolidateAfter"):
        cluster.api.request("POST", "/apis/karpenter.sh/v1/nodepools", broken)
