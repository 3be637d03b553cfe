"""Synthetic GPU clusters: what ``gpu-scheduler demo`` schedules, and what the tests build on.

v1 ``Node`` and ``Pod`` objects, exactly as the API server and kube-scheduler send them, drawn from
:data:`CATALOGUE` (EKS GPU instance types as EC2 and GPU Feature Discovery report them). It is
installed with the core because the demo runs on a runtime-only install; the larger test and benchmark builders
(100,000-node tables, EKS-sized pod lists) are in ``testing/synthetic.py``. Randomness comes only
from the ``rng`` passed in.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scheduler_core.k8s.names import (
    GFD_COUNT,
    GFD_MEMORY,
    GFD_PRODUCT,
    GPU_RESOURCE,
    LABEL_COUNT,
    LABEL_INSTANCE_TYPE,
    LABEL_MEMORY,
    LABEL_MODEL,
    LABEL_ZONE,
    MILLI_RESOURCE,
)


@dataclass(frozen=True)
class InstanceShape:
    instance_type: str
    model: str
    gfd_product: str
    gpus: int
    memory_mib: int
    cpu: str
    memory: str


# GPU instance types as EC2 DescribeInstanceTypes and GFD report them.
CATALOGUE: tuple[InstanceShape, ...] = (
    InstanceShape("p4d.24xlarge", "A100", "NVIDIA-A100-SXM4-40GB", 8, 40960, "95690m", "1149Gi"),
    InstanceShape("p5.48xlarge", "H100", "NVIDIA-H100-80GB-HBM3", 8, 81559, "191450m", "1999Gi"),
    InstanceShape("g6e.12xlarge", "L40S", "NVIDIA-L40S", 4, 46068, "47810m", "371Gi"),
    InstanceShape("g4dn.12xlarge", "T4", "Tesla-T4", 4, 15360, "47810m", "178Gi"),
)
DEMO_MIX = (0.3, 0.15, 0.25, 0.3)
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")


def make_node(
    name: str, shape: InstanceShape, zone: str, *, gfd: bool = True, project_labels: bool = True
) -> dict[str, Any]:
    """A v1 Node as the API server returns it, labelled like a GPU node on EKS.

    ``project_labels=False`` leaves off ``gpu.nvidia.com/*``, as on a node the refresher has not
    labelled yet; ``shape.gpus == 0`` makes a node with no GPU resource.
    """
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        LABEL_INSTANCE_TYPE: shape.instance_type,
        LABEL_ZONE: zone,
        "topology.kubernetes.io/region": zone[:-1],
    }
    if project_labels:
        labels |= {LABEL_MODEL: shape.model, LABEL_MEMORY: str(shape.memory_mib), LABEL_COUNT: str(shape.gpus)}
    if gfd:
        labels |= {
            GFD_PRODUCT: shape.gfd_product,
            GFD_MEMORY: str(shape.memory_mib),
            GFD_COUNT: str(shape.gpus),
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.replicas": "1",
        }
    resources = {"cpu": shape.cpu, "memory": shape.memory, "pods": "110"}
    if shape.gpus:
        resources[GPU_RESOURCE] = str(shape.gpus)
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": labels},
        "spec": {"providerID": f"aws:///{zone}/i-{zlib.crc32(name.encode()):08x}"},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def make_pod(
    name: str,
    gpus: int,
    *,
    namespace: str = "default",
    models: str | None = None,
    memory: str | None = None,
    node_name: str | None = None,
    phase: str = "Pending",
    milli: int = 0,
) -> dict[str, Any]:
    """A v1 Pod for the ``gpu-scheduler`` profile, with GPU annotations when given; ``milli`` asks for
    ``gpu-scheduler.io/gpu-milli``."""
    annotations = {}
    if models is not None:
        annotations[LABEL_MODEL] = models
    if memory is not None:
        annotations[LABEL_MEMORY] = memory
    resources = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {}}
    if gpus:
        resources["requests"][GPU_RESOURCE] = str(gpus)
        resources["limits"][GPU_RESOURCE] = str(gpus)
    if milli:
        resources["requests"][MILLI_RESOURCE] = resources["limits"][MILLI_RESOURCE] = str(milli)
    spec: dict[str, Any] = {
        "schedulerName": "gpu-scheduler",
        "containers": [
            {"name": "main", "image": "nvcr.io/nvidia/cuda:12.2.0-base-ubuntu22.04", "resources": resources}
        ],
    }
    if node_name is not None:
        spec["nodeName"] = node_name
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{name}",
            "annotations": annotations,
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def synthetic_cluster(
    n_nodes: int,
    rng: np.random.Generator,
    *,
    used_fraction: float = 0.4,
    mix: Sequence[float] = DEMO_MIX,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Nodes across :data:`ZONES` and bound pods that partly use about ``used_fraction`` of them.

    Every other node carries GFD labels; all carry the project labels.
    """
    nodes: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    shapes = rng.choice(len(CATALOGUE), size=n_nodes, p=np.asarray(mix) / np.sum(mix))
    for i, shape_id in enumerate(shapes.tolist()):
        shape = CATALOGUE[shape_id]
        name = f"{shape.model.lower()}-{i:04d}"
        nodes.append(make_node(name, shape, ZONES[i % len(ZONES)], gfd=i % 2 == 0))
        if rng.random() < used_fraction:
            used = int(rng.integers(1, shape.gpus))
            pods.append(make_pod(f"running-{i:04d}", used, namespace="batch", node_name=name, phase="Running"))
    return nodes, pods


def demo_pod_stream(n_pods: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    """Pending GPU pods with a realistic mix: mostly 1-2 GPUs, some 4 and 8, some constrained."""
    gpus = rng.choice([1, 2, 4, 8], size=n_pods, p=[0.45, 0.3, 0.15, 0.1])
    kind = rng.choice(4, size=n_pods, p=[0.55, 0.2, 0.15, 0.1])
    pods = []
    for i, (count, k) in enumerate(zip(gpus.tolist(), kind.tolist(), strict=True)):
        models = {1: "A100,H100", 3: "T4,L40S"}.get(k)
        memory = "40Gi" if k == 2 else None
        # T4 and L40S instances carry 4 GPUs: do not ask them for 8.
        count = min(count, 4) if k == 3 else count
        pods.append(make_pod(f"train-{i:04d}", count, namespace="ml", models=models, memory=memory))
    return pods
