"""Twelve pod shapes, as Karpenter would provision for them: every instance type it could launch for a
pod as the product leaves it passes the extender's filter; for the pods as they were before (their
GPU needs in annotations only) it is not so. ``tests/e2e/test_autoscalers.py`` binds the same pods
through the real kube-scheduler on nodes of those types."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pytest

from manifests.nodepool import POOL_LABEL, SHARED_TAINT, gpu_nodepools
from manifests.placeholder import placeholder_pod
from scheduler_core.extender.facade import Extender
from scheduler_core.extender.wire import ExtenderArgs
from scheduler_core.k8s.autoscaler import INSTANCE_TYPES, autoscaler_affinity
from scheduler_core.k8s.pods import pod_demand
from scheduler_core.state.demand import requirements_of
from testing.karpenter import NodePool, karpenter_node, launchable, pending
from tests.conftest import make_pod

POOLS = [NodePool.from_manifest(p) for p in gpu_nodepools("default", sharing=True)]
BY_TYPE = {t.instance_type: t for t in INSTANCE_TYPES}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@dataclass(frozen=True)
class Shape:
    name: str
    gpus: int = 1
    models: str | None = None
    memory: str | None = None
    milli: int = 0
    affinity_only: bool = False
    """The pod says its model on Karpenter's labels itself, as the docs show, with no annotation."""

    def pod(self, namespace: str = "default") -> dict[str, Any]:
        """The pod as its owner writes it."""
        pod = make_pod(self.name, 0 if self.milli else self.gpus, namespace=namespace, milli=self.milli,
                       models=None if self.affinity_only else self.models, memory=self.memory)  # fmt: skip
        pod["spec"]["containers"][0]["resources"].setdefault("requests", {}).update(cpu="100m", memory="64Mi")
        pod["spec"]["tolerations"] = [GPU_TOLERATION]
        if self.milli:
            pod["spec"]["nodeSelector"] = {POOL_LABEL: "shared"}
            pod["spec"]["tolerations"].append({"key": SHARED_TAINT, "operator": "Exists", "effect": "NoSchedule"})
        if self.affinity_only:
            assert self.models is not None
            gpu_name = {"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In", "values": [self.models.lower()]}
            pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [gpu_name]}]}}}  # fmt: skip
        return pod

    def as_left(self, pod: dict[str, Any]) -> dict[str, Any]:
        """The pod as the product leaves it: its GPU needs also in an autoscaler's terms (what the docs
        say to write, and what the product writes into its placeholders)."""
        out = copy.deepcopy(pod)
        terms, why = autoscaler_affinity(out, pod_demand(out))
        assert not why, why
        if terms is not None:
            out["spec"].setdefault("affinity", {})["nodeAffinity"] = {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}  # fmt: skip
        return out

    def provisioned_for(self, pod: dict[str, Any]) -> dict[str, Any]:
        """The pod Karpenter provisions for: the pod itself, or for a share the placeholder the node-state
        refresher makes for it (a share is no resource Karpenter knows)."""
        if not self.milli:
            return pod
        return placeholder_pod("group", 0, requirements_of(pod), image="python:3.12-slim", cpu_milli=100)


SHAPES = (
    Shape("one-h100", models="H100"),
    Shape("two-a100", gpus=2, models="A100"),
    Shape("l40s-or-t4", models="L40S,T4"),
    Shape("eight-h200", gpus=8, models="H200"),
    Shape("four-t4", gpus=4, models="T4"),
    Shape("memory-40gi", memory="40Gi"),
    Shape("memory-80gi", memory="80Gi"),
    Shape("a100-80gi", models="A100", memory="80Gi"),
    Shape("h100-or-h200-80gi", models="H100,H200", memory="80Gi"),
    Shape("l4-by-affinity", models="L4", affinity_only=True),
    Shape("share-of-an-l40s", milli=500, models="L40S"),
    Shape("share-with-20gi", milli=250, memory="20Gi"),
)


def nodes_of(instance_type: str, pool: str) -> list[dict[str, Any]]:
    """A node of the type just as Karpenter launched it (its labels only), and once GFD labelled its
    GPUs where what they report is on record."""
    pool_spec = next(p for p in POOLS if p.name == pool)
    fresh = karpenter_node(f"{instance_type}-new", BY_TYPE[instance_type], pool_spec)
    nodes = [fresh]
    if BY_TYPE[instance_type].reported_mib is not None:
        labelled = copy.deepcopy(fresh)
        labelled["metadata"]["name"] = f"{instance_type}-gfd"
        labelled["metadata"]["labels"] |= {
            "nvidia.com/gpu.product": f"NVIDIA-{BY_TYPE[instance_type].model}",
            "nvidia.com/gpu.memory": str(BY_TYPE[instance_type].reported_mib),
            "nvidia.com/gpu.count": str(BY_TYPE[instance_type].count),
        }
        nodes.append(labelled)
    return nodes


def refused(pod: dict[str, Any], picks: list[tuple[str, str]]) -> list[str]:
    """The nodes of the picked types the extender's filter refuses the pod (and, for a share, its
    placeholder) on."""
    extender = Extender(cluster=lambda: None)
    out = []
    for pool, instance_type in picks:
        for node in nodes_of(instance_type, pool):
            outcome = extender.filter(ExtenderArgs(pod=pod, nodes=[node]))
            if outcome.error or not outcome.kept:
                out.append(f"{node['metadata']['name']}: {outcome.error or outcome.result.messages}")
    return out


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_every_node_karpenter_would_launch_for_the_pod_as_left_passes_the_filter(shape: Shape):
    pod = shape.as_left(shape.pod())
    picks = launchable(pending(shape.provisioned_for(pod)), POOLS)
    assert picks, f"Karpenter would launch nothing for {shape.name}"
    assert refused(pod, picks) == []


@pytest.mark.parametrize("shape", [s for s in SHAPES if not s.affinity_only], ids=lambda s: s.name)
def test_before_this_change_karpenter_could_launch_a_node_the_extender_refuses(shape: Shape):
    pod = shape.pod()  # the annotations only
    provisioned = shape.provisioned_for(pod)
    provisioned["spec"].pop("affinity", None)  # as placeholders were: no autoscaler's terms
    picks = launchable(pending(provisioned), POOLS)
    assert picks and refused(pod, picks), shape.name
