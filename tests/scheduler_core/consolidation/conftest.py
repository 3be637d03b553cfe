"""Builders for the consolidation tests: GPU nodes and the pods of a ReplicaSet, as the API server returns them."""

from __future__ import annotations

from typing import Any

from scheduler_core.k8s.names import MOVABLE_LABEL


def gpu_node(name: str, gpus: int = 8, model: str = "H100", **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"gpu.nvidia.com/model": model, "gpu.nvidia.com/memory": "81559",
                                              "gpu.nvidia.com/count": str(gpus), **labels}},
        "spec": {},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "96", "memory": "1000Gi", "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip


def gpu_pod(
    name: str,
    node: str | None = None,
    gpus: int = 1,
    *,
    owner: str = "rs",
    movable: bool = True,
    annotations: dict[str, str] | None = None,
    cpu: str = "1",
    pending: bool = False,
    **spec: Any,
) -> dict[str, Any]:
    """A pod of ReplicaSet ``owner`` (``owner=""``: a bare pod), bound to ``node`` or Pending and refused."""
    labels = {"app": owner or name, **({MOVABLE_LABEL: "true"} if movable else {})}
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    pod: dict[str, Any] = {
        "metadata": {
            "name": name, "namespace": "ml", "uid": f"uid-{name}", "labels": labels,
            "annotations": dict(annotations or {}), "creationTimestamp": "2026-12-06T10:00:00Z",
            "ownerReferences": [{"kind": "ReplicaSet", "name": owner, "uid": f"uid-rs-{owner}", "controller": True}]
            if owner else [],
        },
        "spec": {"schedulerName": "gpu-scheduler", **spec, "containers": [
            {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}, "limits": limits}}]},
    }  # fmt: skip
    if node:
        pod["spec"]["nodeName"] = node
        pod["status"] = {"phase": "Running"}
    elif pending:
        pod["status"] = {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}  # fmt: skip
    return pod
