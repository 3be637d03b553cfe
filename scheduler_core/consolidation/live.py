"""The cluster as the consolidation planner sees it (:class:`LiveCluster`): the nodes' free CPU, memory and
per-GPU milli as kube-scheduler counts them, the nodes that take part, and where each pod may go."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler_core.k8s.names import LABEL_MEMORY
from scheduler_core.k8s.node_affinity import match_nodes, required_affinity
from scheduler_core.k8s.pods import pod_demand
from scheduler_core.k8s.resources import node_allocatable, pod_requests
from scheduler_core.k8s.taints import untolerated
from scheduler_core.placement.model import MAX_GPUS, Cluster, Workload
from scheduler_core.state.allocation import PodUse, pod_use
from scheduler_core.state.cluster import ClusterState, NodeFacts

MIB = 1 << 20


@dataclass
class LiveCluster:
    """The nodes as the planner sees them: a :class:`Cluster` (free resources now) and, per row, the node
    object, its labels, and whether it takes part (:attr:`open`)."""

    nodes: list[Mapping[str, Any]]
    names: tuple[str, ...]
    labels: list[Mapping[str, Any]]
    cluster: Cluster
    workload: Workload
    open: npt.NDArray[np.bool_]
    uses: dict[int, PodUse]
    """Position in the pod list -> what the pod holds (bound pods only)."""
    annotated: list[set[int]]
    """Per row, the GPUs a pod's ``assigned-gpus`` names (shares, and whole GPUs the extender bound)."""
    requested: dict[int, int]
    """Position in the pod list -> the bound pod's memory request, bytes (readable ones only)."""
    tainted: npt.NDArray[np.bool_]
    """Per row: the node has taints (only those are checked against a pod's tolerations)."""
    memory_mib: npt.NDArray[np.int64]
    """Per row: memory per GPU (MiB; 0 unknown), for a pod's ``gpu.nvidia.com/memory``."""
    _allowed: dict[str, npt.NDArray[np.bool_]] = field(default_factory=dict)

    @classmethod
    def of(cls, nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]]) -> LiveCluster:
        every = [pod_use(p, i) for i, p in enumerate(pods)]
        state = ClusterState.from_uses(NodeFacts.of(nodes), every)
        table = state.table
        by_name = {str(_mapping(n.get("metadata")).get("name") or ""): n for n in nodes if isinstance(n, Mapping)}
        ordered = [by_name.get(name, {}) for name in table.names]
        count = np.where(table.alloc_gpus <= MAX_GPUS, table.alloc_gpus, 0).astype(np.int64)
        gpu_left = np.zeros((table.n_nodes, MAX_GPUS), dtype=np.int64)
        free = state.free_milli if state.free_milli is not None else np.zeros((table.n_nodes, 0), dtype=np.int32)
        width = min(MAX_GPUS, free.shape[1])
        gpu_left[:, :width] = free[:, :width]
        gpu_left[count == 0] = 0
        cpu = state.free_cpu if state.free_cpu is not None else np.zeros(table.n_nodes, dtype=np.int64)
        uses = {i: use for i, use in enumerate(every) if use.node}
        memory, requested = _free_memory(ordered, table.index, pods, uses)
        models = (*table.models, "")
        model_id = np.where(table.model_id < 0, len(table.models), table.model_id).astype(np.int64)
        cluster = Cluster(cpu.astype(np.int64), memory, gpu_left, count, model_id, models)
        annotated: list[set[int]] = [set() for _ in range(table.n_nodes)]
        for use in uses.values():
            row = table.index.get(use.node)
            if row is not None and use.assigned:
                annotated[row].update(gpu for gpu, _ in use.assigned)
        is_open = ~table.invalid_mask & (table.mig_modes == 0) & np.array([_schedulable(n) for n in ordered], bool)
        is_open &= table.alloc_gpus <= MAX_GPUS  # the planner's rows hold 8 GPUs: a larger node takes no part
        if state.dra_gpus is not None:
            is_open &= state.dra_gpus == 0
        workload = Workload.from_shapes(state.shapes, models)
        labels = [_mapping(_mapping(n.get("metadata")).get("labels")) for n in ordered]
        tainted = np.array([bool(_mapping(n.get("spec")).get("taints")) for n in ordered], dtype=bool)
        return cls(
            ordered, table.names, labels, cluster, workload, is_open, uses, annotated, requested, tainted,
            np.asarray(table.memory_mib, dtype=np.int64),
        )  # fmt: skip

    def allowed(self, pod: Mapping[str, Any]) -> npt.NDArray[np.bool_]:
        """Shape (n_nodes,): the open nodes the pod's node selector, required node affinity and
        tolerations admit (none when its affinity cannot be read). Computed once per distinct set of those
        (the pods of one controller share it), and read-only."""
        spec = _mapping(pod.get("spec"))
        memory = _mapping(_mapping(pod.get("metadata")).get("annotations")).get(LABEL_MEMORY)
        key = json.dumps(
            [spec.get("nodeSelector"), _mapping(spec.get("affinity")).get("nodeAffinity"), spec.get("tolerations"),
             memory],
            sort_keys=True, default=str,
        )  # fmt: skip  # fmt: skip
        if key not in self._allowed:
            self._allowed[key] = self._compute_allowed(pod)
            self._allowed[key].flags.writeable = False
        return self._allowed[key]

    def _compute_allowed(self, pod: Mapping[str, Any]) -> npt.NDArray[np.bool_]:
        mask = self.open.copy()
        try:
            affinity = required_affinity(pod)
            minimum = pod_demand(pod).min_memory_mib
        except ValueError:
            return np.zeros_like(mask)
        if minimum:  # the extender's rule: a node of unknown memory is refused too
            mask &= self.memory_mib >= minimum
        if affinity is not None:
            mask &= match_nodes(affinity, self.names, self.labels)
        selector = _mapping(_mapping(pod.get("spec")).get("nodeSelector"))
        rows = np.flatnonzero(mask) if selector else np.flatnonzero(mask & self.tainted)
        for row in rows.tolist():
            labels = self.labels[row]
            if any(labels.get(k) != v for k, v in selector.items()) or untolerated(self.nodes[row], pod):
                mask[row] = False
        return mask


def _free_memory(
    nodes: Sequence[Mapping[str, Any]], index: Mapping[str, int], pods: Sequence[Mapping[str, Any]],
    uses: Mapping[int, PodUse],
) -> tuple[npt.NDArray[np.int64], dict[int, int]]:  # fmt: skip
    """Shape (n_nodes,): allocatable memory less the bound pods' requests, in MiB (a pod whose requests
    cannot be read counts none); and each bound pod's memory request in bytes, by position."""
    allocatable = node_allocatable(nodes)[:, 1]
    used = np.zeros(len(nodes), dtype=np.int64)
    requested: dict[int, int] = {}
    for position, use in uses.items():
        try:
            requested[position] = int(pod_requests(pods[position])[1])
        except ValueError:
            continue
        row = index.get(use.node)
        if row is not None:
            used[row] += requested[position]
    return np.maximum(allocatable - np.minimum(used, allocatable), 0) // MIB, requested


def _schedulable(node: Mapping[str, Any]) -> bool:
    if _mapping(node.get("spec")).get("unschedulable"):
        return False
    conditions = _mapping(node.get("status")).get("conditions") or []
    return any(isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
