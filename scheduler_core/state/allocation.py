"""GPU use per node and per GPU, from the pods bound to each node.

Two kinds of request share a node's GPUs:

- whole GPUs, ``nvidia.com/gpu``, handed out by the NVIDIA device plugin. Which devices it chose is
  not visible in the API, so the count is what matters; they are placed on the lowest-index GPUs
  that carry no fractional share. With sharing on, the bind records whole-GPU pods in the annotation
  below too (``0:1000,1:1000``): such a pod is counted on the GPUs it names, once.
- fractions, ``gpu-scheduler.io/gpu-milli`` (1000 is one GPU). The extender's bind records where a
  pod's share went in the annotation ``gpu-scheduler.io/assigned-gpus``, a comma list of
  ``index:milli`` pairs such as ``0:500`` or ``2:250,3:250``. That annotation is authoritative. A
  bound pod that requests milli but carries no valid annotation is still counted, on the GPU with
  the most room, and reported in ``problems`` so that nothing is lost silently.

A GPU reservation pod (``manifests/reservation.py``: in :data:`~scheduler_core.k8s.names.RESERVATION_NAMESPACE`,
labelled ``app.kubernetes.io/name: gpu-reservation``) requests one ``nvidia.com/gpu`` so that Kubernetes
counts a GPU that shares hold; the shares' annotations count that GPU here already, so the reservation
pod's GPU is not counted again (its CPU is, and any GPU past its one). The product grants no tenant
any right in that namespace.

Everything here is pure: the node-state refresher and the local tools feed it v1 Pod objects.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler_core.errors import InvalidPodError
from scheduler_core.k8s.annotations import trusted_assigned_gpus
from scheduler_core.k8s.dra import served_by_claim
from scheduler_core.k8s.names import (
    ASSIGNED_GPUS_ANNOTATION,
    DAEMON_LABEL,
    GPU_RESOURCE,
    LABEL_MODEL,
    MILLI_PER_GPU,
    MILLI_RESOURCE,
    RESERVATION_APP,
    RESERVATION_NAMESPACE,
    RESERVATION_SLOT_LABEL,
    TERMINAL_PHASES,
)
from scheduler_core.k8s.nodes import NodeTable
from scheduler_core.k8s.pod_requests import cpu_milli, requests_with_cpu
from scheduler_core.k8s.pods import mig_request, parse_models
from scheduler_core.k8s.resources import _mapping
from scheduler_core.placement.model import Shape, Task, shape_of

UNKNOWN_CPU = 2**31 - 1
"""Free CPU (milli) of a node whose allocatable CPU is unknown: more than any pod asks (int32, as stored)."""
_RESOURCES = (GPU_RESOURCE, MILLI_RESOURCE)


@dataclass(frozen=True, eq=False)
class GpuUsage:
    """Per-GPU use on every node of a table.

    Attributes
    ----------
    used_milli : ndarray of shape (n_nodes, max_gpus), int32
        Thousandths of each GPU in use, in 0..1000; 0 past a node's allocatable GPUs.
    whole_gpus : ndarray of shape (n_nodes,), int32
        GPUs requested as ``nvidia.com/gpu`` by bound, non-terminal pods.
    problems : tuple of str
        Pods counted by a best guess or not at all, one line each.
    used_cpu : ndarray of shape (n_nodes,), int64
        Milli-cores requested by bound, non-terminal pods (:func:`scheduler_core.k8s.pod_requests.effective_cpu_milli`).
    shapes : Counter of Shape
        The pods bound to GPU nodes, DaemonSets' aside, by shape (CPU, GPU milli, GPUs, allowed
        models): the workload FGD scores against (:func:`scheduler_core.placement.model.keep_typical` keeps
        the common ones). CPU-only pods count, as FGD counts its CPU-only tasks.
    """

    used_milli: npt.NDArray[np.int32]
    whole_gpus: npt.NDArray[np.int32]
    problems: tuple[str, ...]
    used_cpu: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    shapes: Counter[Shape] = field(default_factory=Counter)
    mig_used: npt.NDArray[np.int32] | None = None
    """Shape (n_nodes, len(table.mig_profiles)): MIG slices of each profile that bound pods request."""

    def free_milli(self, alloc_gpus: npt.NDArray[np.int32]) -> npt.NDArray[np.int32]:
        exists = np.arange(self.used_milli.shape[1])[None, :] < alloc_gpus[:, None]
        return np.where(exists, MILLI_PER_GPU - self.used_milli, 0).astype(np.int32)

    def busy_gpus(self, alloc_gpus: npt.NDArray[np.int32]) -> npt.NDArray[np.int32]:
        """GPUs per node that are not entirely free: what a whole-GPU pod cannot have."""
        idle = (self.free_milli(alloc_gpus) == MILLI_PER_GPU).sum(axis=1)
        busy: npt.NDArray[np.int32] = (alloc_gpus - idle).astype(np.int32)
        return busy


@dataclass(frozen=True, eq=False, slots=True)
class PodUse:
    """What one pod holds, read once from its object: the part of :func:`gpu_usage` that depends on the
    pod alone. A live state keeps one per pod and reparses only the pods that change.

    ``node`` is the node a non-terminal pod is bound to ("" otherwise); ``problem`` a request that could
    not be read (the pod is not counted); ``assigned`` the parsed ``assigned-gpus`` pairs, or None with
    ``assigned_problem`` saying why (absent: "").
    """

    node: str
    name: str
    gpus: int = 0
    milli: int = 0
    cpu: int = 0
    problem: str = ""
    cpu_problem: str = ""
    kind: tuple[int, int, int, object] | None = None  # (cpu, gpus, milli, model annotation); None: a DaemonSet's
    assigned: tuple[tuple[int, int], ...] | None = None
    assigned_problem: str = ""
    labels: Mapping[str, Any] | None = None
    mig: tuple[tuple[str, int], ...] = ()
    mig_problem: str = ""


def pod_use(pod: Any, position: int = 0) -> PodUse:
    """Read one pod (see :class:`PodUse`); ``position`` names a pod without a name in messages."""
    if not isinstance(pod, Mapping):
        return PodUse("", f"pods[{position}]", problem=f"expected a v1 Pod object, got {type(pod).__name__}")
    spec, status = pod.get("spec"), pod.get("status")
    node = spec.get("nodeName") if isinstance(spec, Mapping) else None
    phase = status.get("phase") if isinstance(status, Mapping) else None
    metadata = pod.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    name = _pod_name(metadata, position)
    if not isinstance(node, str) or not node or phase in TERMINAL_PHASES:
        return PodUse("", name)
    labels = metadata.get("labels")
    labels = labels if isinstance(labels, Mapping) else None
    try:
        (gpus, milli), cpu, cpu_problem = requests_with_cpu(pod["spec"], _RESOURCES)
    except InvalidPodError as exc:
        return PodUse(node, name, problem=str(exc), labels=labels)
    if gpus and served_by_claim(status):  # KEP-5004: the claim's devices count them (DraFacts.claimed)
        gpus = 0
    try:
        mig, mig_problem = mig_request(pod["spec"]), ""
    except InvalidPodError as exc:  # its GPUs and CPU still count; its slices cannot
        mig, mig_problem = (), str(exc)
    if _reservation(metadata, labels, pod["spec"]):  # one GPU is the shares' (their annotations count it)
        return PodUse(node, name, max(gpus - 1, 0), 0, cpu, "", cpu_problem, None, None, "", labels)
    annotations = metadata.get("annotations")
    kind = None
    if not _daemon(metadata):
        kind = (cpu, gpus, milli, annotations.get(LABEL_MODEL) if type(annotations) is dict else None)
    text = annotations.get(ASSIGNED_GPUS_ANNOTATION) if isinstance(annotations, Mapping) else None
    assigned, assigned_problem = None, ""
    if text is not None:
        try:
            assigned = trusted_assigned_gpus(text, pod["spec"].get("schedulerName"), gpus, milli)
        except InvalidPodError as exc:
            assigned_problem = str(exc)
    return PodUse(
        node, name, gpus, milli, cpu, "", cpu_problem, kind, assigned, assigned_problem, labels, mig, mig_problem
    )


def gpu_usage(table: NodeTable, pods: Iterable[Any], max_gpus: int) -> GpuUsage:
    """Whole and fractional GPU use per GPU (see the module docstring for the placement rules).

    >>> table = NodeTable.from_columns(alloc_gpus=[4], names=["n"])
    >>> def pod(resource, amount, **annotations):
    ...     limits = {resource: amount}
    ...     return {"metadata": {"annotations": annotations}, "spec": {"nodeName": "n", "containers": [
    ...         {"resources": {"limits": limits}}], "schedulerName": "gpu-scheduler"}}
    >>> shared = pod("gpu-scheduler.io/gpu-milli", "250", **{ASSIGNED_GPUS_ANNOTATION: "0:250"})
    >>> gpu_usage(table, [pod("nvidia.com/gpu", "1"), shared], 4).used_milli.tolist()
    [[250, 1000, 0, 0]]
    >>> bound_by_bind = pod("nvidia.com/gpu", "2", **{ASSIGNED_GPUS_ANNOTATION: "2:1000,3:1000"})
    >>> usage = gpu_usage(table, [bound_by_bind, shared], 4)
    >>> usage.used_milli.tolist(), usage.whole_gpus.tolist()
    ([[250, 0, 1000, 1000]], [2])
    """
    return usage_of(table, (pod_use(pod, position) for position, pod in enumerate(pods)), max_gpus)


def usage_of(
    table: NodeTable, uses: Iterable[PodUse], max_gpus: int, claimed: Mapping[str, int] | None = None
) -> GpuUsage:
    """:func:`gpu_usage` from pods already read (:func:`pod_use`). ``claimed`` (node name -> GPUs) are
    GPUs that DRA claims hold (:class:`~scheduler_core.k8s.dra.DraFacts`): busy, placed as the whole GPUs
    that no annotation places are, but not in ``whole_gpus``, since kube-scheduler's count of
    ``nvidia.com/gpu`` does not see them."""
    tally = _tally(table, uses, claimed)
    used = np.zeros((table.n_nodes, max_gpus), dtype=np.int64)
    if tally.shares:
        rows, gpus_at, amounts = np.array(tally.shares, dtype=np.int64).T
        np.add.at(used, (rows, gpus_at), amounts)
    whole = np.asarray(tally.whole, dtype=np.int64)
    _place_whole(used, np.asarray(tally.place, dtype=np.int64), table.alloc_gpus)
    problems = tally.problems
    for row, milli, name in tally.unplaced:
        problems.append(_place_unannotated(used[row], milli, int(table.alloc_gpus[row]), name, table.names[row]))
    int32_max = int(np.iinfo(np.int32).max)
    return GpuUsage(
        used_milli=np.minimum(used, MILLI_PER_GPU).astype(np.int32),
        whole_gpus=np.minimum(whole, int32_max).astype(np.int32),
        problems=tuple(problems),
        used_cpu=np.asarray(tally.cpu, dtype=np.int64),
        shapes=_shapes(tally.kinds),
        mig_used=tally.mig_used,
    )


@dataclass(frozen=True, eq=False)
class _Tally:
    """What :func:`usage_of` counts pod by pod, per row, before it lays the GPUs out: Python lists, since
    numpy scalar updates in the loop cost more than the parse."""

    whole: list[int]  # nvidia.com/gpu requested
    place: list[int]  # the whole GPUs no annotation places (DRA claims' too): they take the lowest free ones
    cpu: list[int]  # milli-cores requested
    kinds: dict[tuple[int, int, int, object], int]  # (cpu, gpus, milli, model annotation): pods
    shares: list[tuple[int, int, int]]  # (row, gpu, milli) from annotations
    unplaced: list[tuple[int, int, str]]  # (row, milli, pod) without a usable annotation
    problems: list[str]
    mig_used: npt.NDArray[np.int32]  # (n_nodes, len(table.mig_profiles)): MIG slices requested


def _tally(table: NodeTable, uses: Iterable[PodUse], claimed: Mapping[str, int] | None) -> _Tally:
    """Count each pod on its node's row (see :func:`usage_of`); pods on no row of the table, or on an
    invalid one, count nowhere."""
    n_nodes = table.n_nodes
    whole_list = [0] * n_nodes  # Python ints in the loop: numpy scalar updates cost more than the parse
    place_list = [0] * n_nodes
    index = table.index
    for node, count in (claimed or {}).items():
        if (at := index.get(node)) is not None:
            place_list[at] += count
    cpu_list = [0] * n_nodes
    alloc_list = table.alloc_gpus.tolist()
    kinds: dict[tuple[int, int, int, object], int] = {}
    shares: list[tuple[int, int, int]] = []
    unplaced: list[tuple[int, int, str]] = []
    problems: list[str] = []
    profile_column = {profile: k for k, profile in enumerate(table.mig_profiles)}
    mig_used = np.zeros((n_nodes, len(profile_column)), dtype=np.int32)
    invalid = table.invalid  # nodes over a cap: what is on them counts nowhere, as on a node not in the table
    for use in uses:
        if not use.node:
            if use.problem:
                problems.append(f"{use.name}: {use.problem}")
            continue
        row = index.get(use.node)
        if row is None or (invalid and row in invalid):
            continue
        if use.problem:
            problems.append(f"pod {use.name} on {use.node}: {use.problem}")
            continue
        if use.cpu_problem:  # its GPUs still count; its CPU cannot
            problems.append(f"pod {use.name} on {use.node}: {use.cpu_problem}; its CPU is not counted")
        if use.mig_problem:
            problems.append(f"pod {use.name} on {use.node}: {use.mig_problem}; its MIG slices are not counted")
        whole_list[row] += use.gpus
        cpu_list[row] += use.cpu
        for profile, count in use.mig:  # a profile no node of the table offers has no column
            if (column := profile_column.get(profile)) is not None:
                mig_used[row, column] += count
        if alloc_list[row] and use.kind is not None:
            kinds[use.kind] = kinds.get(use.kind, 0) + 1
        if use.assigned is None:
            if use.assigned_problem:
                problems.append(f"pod {use.name} on {use.node}: {use.assigned_problem}")
            if use.milli:
                unplaced.append((row, use.milli, use.name))
            place_list[row] += use.gpus
            continue
        alloc = alloc_list[row]
        for gpu, amount in use.assigned:
            if gpu >= alloc:
                problems.append(f"pod {use.name} on {use.node}: assigned GPU {gpu}, but the node has {alloc}")
                continue
            shares.append((row, gpu, amount))
    return _Tally(whole_list, place_list, cpu_list, kinds, shares, unplaced, problems, mig_used)


def _shapes(kinds: Mapping[tuple[int, int, int, object], int]) -> Counter[Shape]:
    shapes: Counter[Shape] = Counter()
    for key, count in kinds.items():
        shapes[_shape(*key)] += count
    return shapes


def _shape(cpu: int, gpus: int, milli: int, models: object) -> Shape:
    """A bound pod's shape; a model annotation the pod's own parse would refuse counts as any model."""
    if not (gpus or milli):
        return shape_of(Task(cpu, 0, 0, 0))
    try:
        allowed = parse_models(models)
    except InvalidPodError:
        allowed = None
    if 0 < milli < MILLI_PER_GPU:
        return shape_of(Task(cpu, 0, 1, milli, allowed))
    return shape_of(Task(cpu, 0, gpus + milli // MILLI_PER_GPU, MILLI_PER_GPU, allowed))


def _daemon(metadata: Mapping[str, Any]) -> bool:
    """A DaemonSet's pod: it runs on every node it may, so where it lands is no scheduling choice.

    Known by :data:`~scheduler_core.k8s.names.DAEMON_LABEL`: the refresher decodes labels anyway, and
    decoding ``ownerReferences`` as well raised its peak RSS by 75 MB over 200,000 pods
    (``gpu-scheduler bench node-state``)."""
    labels = metadata.get("labels")
    return type(labels) is dict and DAEMON_LABEL in labels


def _reservation(metadata: Mapping[str, Any], labels: Mapping[str, Any] | None, spec: Mapping[str, Any]) -> bool:
    """A GPU reservation pod: in the reservation namespace, with the reservation's name label, running as
    the reservation's ServiceAccount. However many GPUs such a pod asks for, one only is discounted."""
    return (
        metadata.get("namespace") == RESERVATION_NAMESPACE
        and labels is not None
        and labels.get("app.kubernetes.io/name") == RESERVATION_APP
        and spec.get("serviceAccountName") == RESERVATION_APP
    )


def reservation_of(pod: Any) -> tuple[str, int] | None:
    """The node and GPU slot a reservation pod holds its GPU for; None for any other pod, or one not bound
    or not running any more (what the reconcile counts as missing).

    >>> reservation_of({"metadata": {"namespace": "gpu-scheduler-reservations", "labels": {
    ...     "app.kubernetes.io/name": "gpu-reservation", "gpu-scheduler.io/slot": "3"}},
    ...     "spec": {"nodeName": "n", "serviceAccountName": "gpu-reservation"}})
    ('n', 3)
    """
    if not isinstance(pod, Mapping):
        return None
    metadata, spec, status = (_mapping(pod.get(key)) for key in ("metadata", "spec", "status"))
    labels = metadata.get("labels")
    if not isinstance(labels, Mapping) or not _reservation(metadata, labels, spec):
        return None
    node, slot = spec.get("nodeName"), labels.get(RESERVATION_SLOT_LABEL)
    if not isinstance(node, str) or not node or not isinstance(slot, str) or not slot.isdigit():
        return None
    if status.get("phase") in TERMINAL_PHASES or metadata.get("deletionTimestamp"):
        return None
    return node, int(slot)


def node_cpu_milli(nodes: Sequence[Any]) -> tuple[npt.NDArray[np.int64], list[str]]:
    """Each node's allocatable CPU in milli-cores (``status.allocatable.cpu``), in row order, and the
    problems found. A node without one, or with a value that is not a quantity, counts as
    :data:`UNKNOWN_CPU`: no CPU limit, rather than none free."""
    values, problems = [], []
    for row, node in enumerate(nodes):
        status = node.get("status") if isinstance(node, Mapping) else None
        allocatable = status.get("allocatable") if isinstance(status, Mapping) else None
        value = allocatable.get("cpu") if isinstance(allocatable, Mapping) else None
        if value is None:
            values.append(UNKNOWN_CPU)
            continue
        try:
            values.append(cpu_milli(value, f"Nodes.items[{row}].status.allocatable.cpu"))
        except InvalidPodError as exc:
            problems.append(str(exc))
            values.append(UNKNOWN_CPU)
    return np.asarray(values, dtype=np.int64), problems


def _pod_name(metadata: Mapping[str, Any], position: int) -> str:
    return f"{metadata.get('namespace', '')}/{metadata.get('name', f'pods[{position}]')}"


def _place_whole(used: npt.NDArray[np.int64], whole: npt.NDArray[np.int64], alloc: npt.NDArray[np.int32]) -> None:
    """Mark ``whole[row]`` GPUs per row as fully used: untouched GPUs first, lowest index first."""
    max_gpus = used.shape[1]
    exists = np.arange(max_gpus)[None, :] < alloc[:, None]
    # Rank each GPU: untouched existing ones first (by index), then shared ones, then missing ones.
    rank = np.where(exists & (used == 0), 0, np.where(exists, 1, 2)) * max_gpus + np.arange(max_gpus)[None, :]
    order = np.argsort(rank, axis=1, kind="stable")
    take = np.arange(max_gpus)[None, :] < np.minimum(whole, alloc)[:, None]
    rows = np.nonzero(take)[0]
    used[rows, order[take]] = MILLI_PER_GPU


def _place_unannotated(used_row: npt.NDArray[np.int64], milli: int, alloc: int, pod: str, node: str) -> str:
    """Count a share with no annotation on the GPU with the most room; whole GPUs for >= 1000."""
    if alloc == 0:
        return f"pod {pod} on {node}: requests {milli} {MILLI_RESOURCE}, but the node has no GPUs"
    remaining, touched = milli, []
    while remaining > 0:
        gpu = int(np.argmin(used_row[:alloc]))
        amount = min(remaining, MILLI_PER_GPU)
        used_row[gpu] += amount
        touched.append(gpu)
        remaining -= amount
        if used_row[:alloc].min() >= MILLI_PER_GPU:
            break
    return (
        f"pod {pod} on {node}: requests {milli} {MILLI_RESOURCE} with no valid {ASSIGNED_GPUS_ANNOTATION};"
        f" counted on GPU {','.join(map(str, touched))}"
    )
