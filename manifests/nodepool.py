"""Karpenter NodePools (``karpenter.sh/v1``) for the GPU nodes the product places on.

Two pools, both on the NVIDIA instance families the product knows
(:data:`~scheduler_core.k8s.autoscaler.INSTANCE_TYPES`), x86 (``amd64``: ``g5g``'s Arm GPUs would need
every GPU image built for Arm), and tainted ``nvidia.com/gpu:NoSchedule`` (GPU pods tolerate it: the EKS
GPU AMIs' convention, and what keeps other pods off GPU nodes):

- ``gpu-whole``, for pods that take whole GPUs. Consolidation replaces a node only when it is empty
  (``WhenEmpty``) by default: Karpenter's simulation of where the pods of an underutilised node would
  go reads their requests and node affinity, not the extender's rules, so it may move a pod to a node
  the extender then refuses, and a training job loses its progress either way.
- ``gpu-shared`` (with ``--sharing``), for nodes that hold shares: always ``WhenEmpty``. A share
  (``gpu-scheduler.io/gpu-milli``) is no resource Karpenter knows; only the reservation pod of each
  shared GPU (``nvidia.com/gpu: 1``) tells it a GPU is in use, and it cannot tell whether the shares of
  a node would fit on another's GPUs. A node it consolidates anyway (drift, expiry) is drained: the
  shares are evicted, their ledger entries released by the refresher, and they are placed again.
  Shares reach the pool by its label, ``gpu-scheduler.io/pool: shared``, in their node selector (the
  placeholders that stand for them carry it too), and tolerate its taint ``gpu-scheduler.io/shared``.

Both disruption budgets allow one node in ten at a time (``10%``).
"""

from __future__ import annotations

from typing import Any

from scheduler_core.k8s.autoscaler import INSTANCE_TYPES
from scheduler_core.k8s.names import GPU_RESOURCE, KARPENTER_GPU_MANUFACTURER

API_VERSION = "karpenter.sh/v1"
POOL_LABEL = "gpu-scheduler.io/pool"
SHARED_TAINT = "gpu-scheduler.io/shared"
FAMILIES = tuple(sorted({t.instance_type.split(".")[0] for t in INSTANCE_TYPES}))
"""The instance families of the GPU instance types the product knows."""
CONSOLIDATION_POLICIES = ("WhenEmpty", "WhenEmptyOrUnderutilized")


def gpu_nodepools(
    node_class: str,
    *,
    sharing: bool = False,
    consolidation: str = "WhenEmpty",
    consolidate_after: str = "10m",
    capacity_types: tuple[str, ...] = ("on-demand",),
) -> list[dict[str, Any]]:
    """The NodePools above, on the ``EC2NodeClass`` named ``node_class`` (the cluster's own: its AMI,
    subnets and roles are the deployment's). ``consolidation`` is ``gpu-whole``'s policy."""
    if consolidation not in CONSOLIDATION_POLICIES:
        raise ValueError(f"consolidation: expected one of {', '.join(CONSOLIDATION_POLICIES)}, got {consolidation!r}")
    pools = [_pool("gpu-whole", node_class, consolidation, consolidate_after, capacity_types, shared=False)]
    if sharing:
        pools.append(_pool("gpu-shared", node_class, "WhenEmpty", consolidate_after, capacity_types, shared=True))
    return pools


def _pool(
    name: str, node_class: str, consolidation: str, after: str, capacity_types: tuple[str, ...], *, shared: bool
) -> dict[str, Any]:
    taints = [{"key": GPU_RESOURCE, "value": "true", "effect": "NoSchedule"}]
    labels = {"app.kubernetes.io/managed-by": "gpu-scheduler"}
    if shared:
        taints.append({"key": SHARED_TAINT, "value": "true", "effect": "NoSchedule"})
        labels[POOL_LABEL] = "shared"
    requirements = [
        {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": list(FAMILIES)},
        {"key": KARPENTER_GPU_MANUFACTURER, "operator": "In", "values": ["nvidia"]},
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": list(capacity_types)},
        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
    ]
    budgets: list[dict[str, Any]] = [{"nodes": "10%"}]
    return {
        "apiVersion": API_VERSION,
        "kind": "NodePool",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "gpu-scheduler"}},
        "spec": {
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": node_class},
                    "requirements": requirements,
                    "taints": taints,
                    "expireAfter": "720h",
                },
            },
            "disruption": {"consolidationPolicy": consolidation, "consolidateAfter": after, "budgets": budgets},
        },
    }
