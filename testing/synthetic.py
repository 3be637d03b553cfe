"""Synthetic clusters for tests and benchmarks: 100,000-node tables, snapshots, EKS-sized pod lists.

Built on the demo's generator (:mod:`scheduler_core.simulator.synthetic`). Randomness comes only from the
``rng`` passed in.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from scheduler_core.k8s.names import LABEL_MODEL, MILLI_PER_GPU
from scheduler_core.k8s.nodes import NodeTable
from scheduler_core.scoring.locality import AppIndex
from scheduler_core.simulator.synthetic import CATALOGUE, DEMO_MIX, ZONES, InstanceShape, make_node, make_pod
from scheduler_core.state.cluster import ClusterState
from scheduler_core.state.snapshot import node_utilization


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
) -> ClusterState:
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
    return ClusterState(
        table, used, node_util, apps=apps, free_milli=free_milli, generated_at=generated_at, cluster=cluster,
        gpu_utilization=util,
    )  # fmt: skip


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
    nodes, free = _eks_nodes(n_nodes)
    gpu_rows = [i for i in range(n_nodes) if free[i]]
    cpu_rows = [i for i in range(n_nodes) if not free[i]]
    pods: list[dict[str, Any]] = []
    draws = rng.random(n_pods)
    for j, draw in enumerate(draws.tolist()):
        name = f"pod-{j:06d}"
        if draw < 0.8 and gpu_rows:
            row = gpu_rows[int(rng.integers(len(gpu_rows)))]
            pod = _bound_gpu_pod(name, nodes[row]["metadata"]["name"], free[row], rng, share=draw < 0.08)
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


def _eks_nodes(n_nodes: int) -> tuple[list[dict[str, Any]], list[list[int]]]:
    """:func:`eks_cluster`'s nodes, of each kind by position, and the free milli of each node's GPUs (all
    free; none for a CPU node)."""
    nodes: list[dict[str, Any]] = []
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
    return nodes, free


def _bound_gpu_pod(name: str, node: str, gpus: list[int], rng: np.random.Generator, *, share: bool) -> dict[str, Any]:
    """A running pod on ``node``, whose GPUs have ``gpus`` milli free (what the pod takes is taken from it):
    with ``share``, a 250 or 500 milli share with its ``assigned-gpus`` annotation (neither where no GPU
    has room); else 1 or 2 whole GPUs (as many of those as are whole)."""
    if share:
        milli = int(rng.choice([250, 500]))
        target = next((g for g, left in enumerate(gpus) if left >= milli), None)
        pod = make_pod(name, 0, namespace="ml", node_name=node, phase="Running")
        if target is not None:
            gpus[target] -= milli
            pod["metadata"]["annotations"]["gpu-scheduler.io/assigned-gpus"] = f"{target}:{milli}"
            pod["spec"]["containers"][0]["resources"]["limits"]["gpu-scheduler.io/gpu-milli"] = str(milli)
        return pod
    whole = sum(1 for left in gpus if left == MILLI_PER_GPU)
    want = min(int(rng.integers(1, 3)), whole)
    taken = 0
    for g, left in enumerate(gpus):
        if taken < want and left == MILLI_PER_GPU:
            gpus[g] = 0
            taken += 1
    return make_pod(name, want, namespace="ml", node_name=node, phase="Running")


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
