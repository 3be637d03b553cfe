"""Synthetic clusters for tests, the demo and the benchmarks.

Two forms: v1 ``Node`` / ``Pod`` objects, exactly as the API server and kube-scheduler send them
(for the wire path), and prebuilt :class:`NodeTable` columns (for the core at 100,000 nodes, where
building dicts would dominate). Randomness comes only from the ``rng`` passed in.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scheduler_core.allocation import MILLI_PER_GPU
from scheduler_core.cluster import ClusterState
from scheduler_core.locality import AppIndex
from scheduler_core.nodes import (
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
    NodeTable,
)
from scheduler_core.snapshot import ClusterSnapshot, node_utilization


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


def table_from_columns(
    *,
    alloc_gpus: Sequence[int],
    models: Sequence[str | None] | None = None,
    memory_mib: Sequence[int] | None = None,
    zones: Sequence[str] | None = None,
    names: Sequence[str] | None = None,
) -> NodeTable:
    """A small :class:`NodeTable` from plain lists (names default to ``node-0``, ``node-1``, ...).

    >>> table_from_columns(alloc_gpus=[8, 4], models=["A100", None]).model_name(1) is None
    True
    """
    n_nodes = len(alloc_gpus)
    vocab: dict[str, int] = {}
    model_id = [-1 if m is None else vocab.setdefault(m, len(vocab)) for m in (models or [None] * n_nodes)]
    zone_vocab: dict[str, int] = {}
    zone_id = [zone_vocab.setdefault(z, len(zone_vocab)) for z in zones] if zones else [-1] * n_nodes
    return NodeTable(
        names=tuple(names or (f"node-{i}" for i in range(n_nodes))),
        zone_id=np.asarray(zone_id, dtype=np.int32),
        zones=tuple(zone_vocab),
        instance_type_id=np.full(n_nodes, -1, dtype=np.int32),
        instance_types=(),
        model_id=np.asarray(model_id, dtype=np.int32),
        models=tuple(vocab),
        gpu_count=np.asarray(alloc_gpus, dtype=np.int32),
        memory_mib=np.asarray(memory_mib if memory_mib is not None else [0] * n_nodes, dtype=np.int32),
        alloc_gpus=np.asarray(alloc_gpus, dtype=np.int32),
    )


def synthetic_table(n_nodes: int, rng: np.random.Generator, mix: Sequence[float] = DEMO_MIX) -> NodeTable:
    """A large node table drawn from :data:`CATALOGUE`, vectorised (100,000 nodes in milliseconds)."""
    shape_id = rng.choice(len(CATALOGUE), size=n_nodes, p=np.asarray(mix) / np.sum(mix)).astype(np.int32)
    gpus = np.array([s.gpus for s in CATALOGUE], dtype=np.int32)[shape_id]
    memory = np.array([s.memory_mib for s in CATALOGUE], dtype=np.int32)[shape_id]
    return NodeTable(
        names=tuple(f"gpu-{i:06d}" for i in range(n_nodes)),
        zone_id=(np.arange(n_nodes) % len(ZONES)).astype(np.int32),
        zones=ZONES,
        instance_type_id=shape_id,
        instance_types=tuple(s.instance_type for s in CATALOGUE),
        model_id=shape_id,
        models=tuple(s.model for s in CATALOGUE),
        gpu_count=gpus,
        memory_mib=memory,
        alloc_gpus=gpus,
    )


def synthetic_snapshot(
    n_nodes: int, rng: np.random.Generator, *, generated_at: float, cluster: str = "synthetic"
) -> ClusterSnapshot:
    """A snapshot of :func:`synthetic_table` with random whole-GPU use and utilisation."""
    table = synthetic_table(n_nodes, rng)
    used = rng.integers(0, table.alloc_gpus + 1).astype(np.int32)
    max_gpus = int(table.alloc_gpus.max()) if n_nodes else 1
    gpu_index = np.arange(max_gpus)[None, :]
    exists = gpu_index < table.alloc_gpus[:, None]
    free_milli = np.where(exists & (gpu_index >= used[:, None]), MILLI_PER_GPU, 0).astype(np.int32)
    util = np.where(exists, rng.random((n_nodes, max_gpus)), np.nan).astype(np.float32)
    node_util = node_utilization(util, table.alloc_gpus)
    # 50 workloads ("app=svc-0" ..), pods on a fifth of the nodes, for locality scoring.
    hosts = rng.choice(n_nodes, size=n_nodes // 5, replace=False) if n_nodes else np.zeros(0, dtype=np.int64)
    app_id = rng.integers(0, 50, size=hosts.size)
    order = np.lexsort((hosts, app_id))
    entries = np.stack([app_id[order], hosts[order], rng.integers(1, 4, size=hosts.size)]).astype(np.int32)
    zone_counts = np.zeros((50, len(ZONES)), dtype=np.int32)
    np.add.at(zone_counts, (entries[0], table.zone_id[entries[1]]), entries[2])
    apps = AppIndex(tuple(f"app=svc-{i}" for i in range(50)), entries, zone_counts)
    state = ClusterState(table, used, node_util, apps=apps)
    return ClusterSnapshot(cluster, generated_at, state, free_milli, util)


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


CPU_SHAPE = InstanceShape("m5.4xlarge", "", "", 0, 0, "15890m", "57Gi")


def eks_cluster(
    n_nodes: int, n_pods: int, rng: np.random.Generator
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A cluster as the node-state refresher first meets it, for its tests and benchmark.

    Nodes (by position, so counts are exact): 45 % GPU nodes with GFD labels only, 40 % bare GPU nodes
    (instance type only: EC2 must say what they hold), 10 % CPU nodes, 5 % GPU nodes without GFD
    whose ``gpu.nvidia.com/model`` is wrong (``enforce`` corrects it, ``fill`` keeps it).
    Pods: 80 % bound GPU pods (whole GPUs, or a fractional share with ``gpu-scheduler.io/assigned-gpus``
    in one pod of ten) placed only where they fit, 10 % bound CPU pods, 5 % finished, 5 % unbound.
    Pods carry the fields real pods do (owner, labels, conditions, status), about 1.5 KB each.
    """
    nodes: list[dict[str, Any]] = []
    gpu_rows: list[int] = []
    free: list[list[int]] = []  # free milli per GPU, per node
    for i in range(n_nodes):
        kind = (i * 20 // max(n_nodes, 1)) if n_nodes >= 20 else i % 20
        zone = ZONES[i % len(ZONES)]
        if kind < 9:  # GFD only
            shape = CATALOGUE[i % len(CATALOGUE)]
            node = make_node(f"gpu-{i:05d}", shape, zone, gfd=True, project_labels=False)
        elif kind < 17:  # bare
            shape = CATALOGUE[i % len(CATALOGUE)]
            node = make_node(f"gpu-{i:05d}", shape, zone, gfd=False, project_labels=False)
        elif kind < 19:
            shape = CPU_SHAPE
            node = make_node(f"cpu-{i:05d}", shape, zone, gfd=False, project_labels=False)
        else:
            shape = CATALOGUE[0]
            node = make_node(f"gpu-{i:05d}", shape, zone, gfd=False, project_labels=True)
            node["metadata"]["labels"][LABEL_MODEL] = "V100"
        nodes.append(node)
        free.append([MILLI_PER_GPU] * shape.gpus)
        if shape.gpus:
            gpu_rows.append(i)
    cpu_rows = [i for i in range(n_nodes) if not free[i]]
    pods: list[dict[str, Any]] = []
    draws = rng.random(n_pods)
    for j, draw in enumerate(draws.tolist()):
        name = f"pod-{j:06d}"
        if draw < 0.8 and gpu_rows:
            row = gpu_rows[int(rng.integers(len(gpu_rows)))]
            gpus = free[row]
            if draw < 0.08:  # a fractional share
                milli = int(rng.choice([250, 500]))
                target = next((g for g, left in enumerate(gpus) if left >= milli), None)
                pod = make_pod(name, 0, namespace="ml", node_name=nodes[row]["metadata"]["name"], phase="Running")
                if target is not None:
                    gpus[target] -= milli
                    pod["metadata"]["annotations"]["gpu-scheduler.io/assigned-gpus"] = f"{target}:{milli}"
                    pod["spec"]["containers"][0]["resources"]["limits"]["gpu-scheduler.io/gpu-milli"] = str(milli)
            else:
                whole = sum(1 for left in gpus if left == MILLI_PER_GPU)
                want = min(int(rng.integers(1, 3)), whole)
                taken = 0
                for g, left in enumerate(gpus):
                    if taken < want and left == MILLI_PER_GPU:
                        gpus[g] = 0
                        taken += 1
                pod = make_pod(name, want, namespace="ml", node_name=nodes[row]["metadata"]["name"], phase="Running")
        elif draw < 0.9 and cpu_rows:
            row = cpu_rows[int(rng.integers(len(cpu_rows)))]
            pod = make_pod(name, 0, namespace="web", node_name=nodes[row]["metadata"]["name"], phase="Running")
        elif draw < 0.95 and gpu_rows:
            row = gpu_rows[int(rng.integers(len(gpu_rows)))]
            pod = make_pod(name, 1, namespace="ml", node_name=nodes[row]["metadata"]["name"], phase="Succeeded")
        else:
            pod = make_pod(name, 1, namespace="ml")
        _dress(pod, j)
        pods.append(pod)
    return nodes, pods


def _dress(pod: dict[str, Any], j: int) -> None:
    """Add what real pods carry besides their requests, so that sizes and parse costs are honest."""
    metadata = pod["metadata"]
    app = f"svc-{j % 50}"
    metadata["labels"] = {"app": app, "pod-template-hash": f"{zlib.crc32(app.encode()):08x}"[:10]}
    metadata["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{app}-rs", "uid": f"rs-{app}", "controller": True}
    ]
    metadata["creationTimestamp"] = "2026-11-29T19:56:27Z"
    container = pod["spec"]["containers"][0]
    container["env"] = [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"}]
    container["volumeMounts"] = [{"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io"}]
    pod["spec"] |= {
        "restartPolicy": "Always",
        "serviceAccountName": "default",
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    status = pod["status"]
    if pod["spec"].get("nodeName"):
        status |= {
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": "2026-11-29T19:56:30Z"}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
            "hostIP": "10.0.64.45",
            "podIP": f"10.1.{j // 250 % 250}.{j % 250}",
            "startTime": "2026-11-29T19:56:28Z",
            "qosClass": "Burstable",
        }


def managed_pods(n_pods: int, now: float, *, namespace: str = "web", app: str = "frontend") -> list[dict[str, Any]]:
    """Ready, running pods that opt in to deletion costs (``gpu-scheduler.io/deletion-cost=managed``).

    One pod in 50 started 10 s before ``now`` (still warming up); the rest an hour before.
    """
    from datetime import UTC, datetime

    def stamp(seconds_ago: float) -> str:
        return datetime.fromtimestamp(now - seconds_ago, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    pods = []
    for i in range(n_pods):
        pod = make_pod(f"{app}-{i:05d}", 0, namespace=namespace, node_name=f"cpu-{i % 500:05d}", phase="Running")
        _dress(pod, i)
        pod["metadata"]["labels"] = {"app": app, "gpu-scheduler.io/deletion-cost": "managed"}
        pod["status"]["startTime"] = stamp(10 if i % 50 == 0 else 3600)
        pods.append(pod)
    return pods
