"""Cluster state: the nodes, what bound pods use on them, and GPU utilisation.

It answers the one question the extender cannot answer from a kube-scheduler request: how many GPUs
are free on each node, and how busy they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler_core.errors import InvalidArgsError
from scheduler_core.k8s.dra import DraFacts, dra_facts_of
from scheduler_core.k8s.mig import MIG_MODES
from scheduler_core.k8s.names import DRA_OBJECTS
from scheduler_core.k8s.nodes import NodeTable
from scheduler_core.placement.model import MAX_SHAPES, Shape, Workload, keep_typical
from scheduler_core.scoring.gpu_fit import free_gpus
from scheduler_core.scoring.locality import DEFAULT_LABEL_KEYS, AppIndex, index_placements
from scheduler_core.state.allocation import PodUse, node_cpu_milli, pod_use, usage_of


@dataclass(frozen=True, eq=False)
class NodeFacts:
    """The node table, each node's allocatable CPU (milli-cores), and what could not be read: the part of
    a state that depends on the nodes alone."""

    table: NodeTable
    cpu_milli: npt.NDArray[np.int64]
    problems: tuple[str, ...] = ()

    @classmethod
    def of(cls, nodes: Sequence[Any]) -> NodeFacts:
        table = NodeTable.from_nodes(nodes)
        cpu, problems = node_cpu_milli(nodes)
        return cls(table, cpu, tuple(problems))

    @property
    def max_gpus(self) -> int:
        """Columns of the per-GPU arrays: the most GPUs any node has (at least 1)."""
        return max(1, int(self.table.alloc_gpus.max(initial=0)))


@dataclass(frozen=True, eq=False)
class ClusterState:
    """Nodes plus per-node usage, all aligned with ``table``.

    Attributes
    ----------
    used_gpus : ndarray of shape (n_nodes,), int32
        GPUs requested by non-terminal pods bound to the node.
    utilization : ndarray of shape (n_nodes,), float64
        Mean GPU utilisation in [0, 1]; 0 where unknown.
    problems : tuple of str
        Input that was skipped while building the state (for example a pod with an invalid GPU
        quantity), so that callers can report it.
    """

    table: NodeTable
    used_gpus: npt.NDArray[np.int32]
    utilization: npt.NDArray[np.float64]
    problems: tuple[str, ...] = ()
    apps: AppIndex = field(default_factory=AppIndex.empty)
    """Pods per label selector, per node and per zone, for locality scoring."""
    free_milli: npt.NDArray[np.int32] | None = None
    """Shape (n_nodes, max_gpus): free thousandths of each GPU, 0 past a node's GPUs; None if unknown."""
    generated_at: float | None = None
    """When the pods behind it were listed (Unix seconds), for a snapshot; None otherwise."""
    free_cpu: npt.NDArray[np.int64] | None = None
    """Shape (n_nodes,): allocatable milli-cores less the requests of the pods bound there; None if
    unknown (a snapshot from before this field)."""
    shapes: tuple[tuple[Shape, int], ...] = ()
    """The typical shapes of the pods on GPU nodes, with their counts: what FGD scores against."""
    cluster: str = ""
    """The cluster's name, for a snapshot."""
    gpu_utilization: npt.NDArray[np.float32] | None = None
    """Shape (n_nodes, max_gpus): per-GPU utilisation in [0, 1], NaN unknown; None if never measured."""
    utilization_at: float | None = None
    """When the utilisation was measured (Unix seconds); older than ``generated_at`` when the
    refresher kept the last known values because the metrics query failed, None if never."""
    whole_gpus: npt.NDArray[np.int32] | None = None
    """Shape (n_nodes,): the part of ``used_gpus`` that pods hold as ``nvidia.com/gpu``, which
    kube-scheduler counts itself; the rest are GPUs that shares hold, which it cannot see. None if
    unknown (a snapshot from before this field)."""
    mig_used: npt.NDArray[np.int32] | None = None
    """Shape (n_nodes, len(table.mig_profiles)): MIG slices of each profile that bound pods request; None
    if unknown (a snapshot from before this field)."""
    dra_gpus: npt.NDArray[np.int32] | None = None
    """Shape (n_nodes,): GPUs that DRA publishes on the node (:class:`~scheduler_core.k8s.dra.DraFacts`);
    None if unknown (DRA not read)."""
    claimed_gpus: npt.NDArray[np.int32] | None = None
    """Shape (n_nodes,): GPUs that DRA claims hold on the node, whatever pod holds them: part of
    ``used_gpus`` (and busy in ``free_milli``) up to the GPUs the node advertises, never of ``whole_gpus``;
    None if unknown (DRA not read)."""
    dra_extended: bool = False
    """A DeviceClass maps ``nvidia.com/gpu`` to DRA devices (KEP-5004): kube-scheduler serves that request
    from DRA on nodes that do not advertise it (:meth:`dra_serves_at`)."""

    @cached_property
    def workload(self) -> Workload:
        """:attr:`shapes` over the table's models, plus a last row for a node of unknown model (-1),
        which only the shapes that allow any model may use."""
        return Workload.from_shapes(self.shapes, (*self.table.models, ""))

    @cached_property
    def workload_key(self) -> tuple[object, ...]:
        """What :attr:`workload` is, as a hashable: the shapes, their popularity and the models. Counts that
        grow in proportion (a burst of one shape) leave it the same, so FGD's kept scores stay valid."""
        shapes = tuple(shape for shape, _count in self.shapes)
        return shapes, tuple(self.workload.popularity.tolist()), self.table.models

    @cached_property
    def free_gpus(self) -> npt.NDArray[np.int32]:
        """Shape (n_nodes,): computed once, since the state never changes."""
        return free_gpus(self.table, self.used_gpus)

    @classmethod
    def from_objects(
        cls,
        nodes: Sequence[Any],
        pods: Sequence[Any] = (),
        utilization: Mapping[str, Any] | None = None,
        label_keys: Sequence[str] = DEFAULT_LABEL_KEYS,
        dra: DraFacts | None = None,
    ) -> ClusterState:
        """Build from v1 Node and Pod objects and an optional ``{node name: utilisation}`` map.

        >>> node = {"metadata": {"name": "n1"}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}
        >>> pod = {"spec": {"nodeName": "n1", "containers": [{"resources": {"limits": {"nvidia.com/gpu": "3"}}}]}}
        >>> ClusterState.from_objects([node], [pod]).free_gpus.tolist()
        [5]
        """
        uses = [pod_use(pod, position) for position, pod in enumerate(pods)]
        return cls.from_uses(NodeFacts.of(nodes), uses, utilization, label_keys, dra)

    @classmethod
    def from_uses(
        cls,
        facts: NodeFacts,
        uses: Sequence[PodUse],
        utilization: Mapping[str, Any] | None = None,
        label_keys: Sequence[str] = DEFAULT_LABEL_KEYS,
        dra: DraFacts | None = None,
    ) -> ClusterState:
        """:meth:`from_objects` from nodes and pods already read: a live state keeps both and rereads
        only what changed (:class:`NodeFacts`, :func:`~scheduler_core.state.allocation.pod_use`).
        ``dra``: what DRA publishes and claims hold, where it was read (None: it was not)."""
        table = facts.table
        if dra is not None and dra.over_cap:  # nodes DRA makes invalid: as those over a cap of their own
            index = table.index
            table = table.with_invalid({index[name]: why for name, why in dra.over_cap.items() if name in index})
        usage = usage_of(table, uses, facts.max_gpus, dra.claimed if dra is not None else None)
        used, problems = usage.busy_gpus(table.alloc_gpus), list(usage.problems) + list(facts.problems)
        if dra is not None:
            problems.extend(dra.problems)
        apps = index_placements(table, ((u.node, u.labels) for u in uses if u.node and u.labels), label_keys)
        util = np.zeros(table.n_nodes, dtype=np.float64)
        for name, value in (utilization or {}).items():
            row = table.index.get(name)
            if row is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
                problems.append(f"utilization[{name!r}]: expected a number in [0, 1], got {value!r}")
                continue
            util[row] = value
        return cls(
            table=table,
            used_gpus=used,
            utilization=util,
            problems=tuple(problems),
            apps=apps,
            free_milli=usage.free_milli(table.alloc_gpus),
            free_cpu=facts.cpu_milli - usage.used_cpu,
            shapes=tuple(keep_typical(usage.shapes, limit=MAX_SHAPES)),
            whole_gpus=usage.whole_gpus.astype(np.int32),
            mig_used=usage.mig_used,
            dra_gpus=None if dra is None else _per_row(table, dra.published),
            claimed_gpus=None if dra is None else _per_row(table, dra.claimed),
            dra_extended=dra is not None and dra.extended,
        )

    @classmethod
    def from_document(cls, document: Any) -> ClusterState:
        """Build from ``{"nodes": [v1 Node...], "pods": [v1 Pod...], "utilization": {name: 0.3}}``, and DRA's
        ``"resourceslices"``, ``"resourceclaims"`` and ``"deviceclasses"`` where any of them is given (lists
        of those objects: :func:`~scheduler_core.k8s.dra.dra_facts`); or from what ``kubectl get
        nodes,pods -A -o json`` prints, a v1 ``List`` (or a ``NodeList``, ``PodList``) whose items are sorted
        by their ``kind`` (:func:`document_of_list`).

        Raises
        ------
        InvalidArgsError
            If the document does not have that shape; the message names the field.
        """
        if isinstance(document, Mapping) and document.get("kind") in LIST_KINDS:
            document = document_of_list(document)
        if not isinstance(document, Mapping):
            raise InvalidArgsError(f"cluster document: expected an object with 'nodes', got {type(document).__name__}")
        nodes = document.get("nodes")
        pods = document.get("pods", [])
        utilization = document.get("utilization", {})
        if not isinstance(nodes, list):
            raise InvalidArgsError("cluster document: 'nodes' must be a list of v1 Node objects")
        if not isinstance(pods, list):
            raise InvalidArgsError("cluster document: 'pods' must be a list of v1 Pod objects")
        if not isinstance(utilization, Mapping):
            raise InvalidArgsError("cluster document: 'utilization' must map node names to numbers in [0, 1]")
        dra = None
        if any(kind in document for kind in DRA_OBJECTS):
            lists = {kind: document.get(kind, []) for kind in DRA_OBJECTS}
            for kind, items in lists.items():
                if not isinstance(items, list):
                    raise InvalidArgsError(f"cluster document: {kind!r} must be a list of resource.k8s.io objects")
            dra = dra_facts_of(lists)
        return cls.from_objects(nodes, pods, utilization, dra=dra)

    @property
    def max_gpus(self) -> int:
        """Columns of the per-GPU arrays: the most GPUs any node has (at least 1)."""
        if self.free_milli is not None:
            return int(self.free_milli.shape[1])
        return max(1, int(self.table.alloc_gpus.max(initial=0)))

    def utilization_by_node(self) -> dict[str, list[float]]:
        """Per-GPU utilisation by node name for nodes with any known value (NaN: unknown GPU)."""
        if self.gpu_utilization is None:
            return {}
        known = ~np.isnan(self.gpu_utilization).all(axis=1)
        names = self.table.names
        return {names[row]: self.gpu_utilization[row].tolist() for row in np.nonzero(known)[0]}

    def age_s(self, now: float) -> float:
        """Seconds since the state was generated (``now`` is Unix seconds); 0 for a state without a stamp."""
        return 0.0 if self.generated_at is None else now - self.generated_at

    def usage_at(self, rows: npt.NDArray[np.intp]) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float64]]:
        """Used GPUs and utilisation at ``rows`` (from ``table.rows_of``); 0 where a row is -1.

        Returns
        -------
        used_gpus : ndarray of shape (len(rows),), int32
        utilization : ndarray of shape (len(rows),), float64
        """
        return values_at(self.used_gpus, rows, 0).astype(np.int32), values_at(self.utilization, rows, 0.0)

    def mig_free_at(self, rows: npt.NDArray[np.intp], profiles: Sequence[str]) -> npt.NDArray[np.int32]:
        """Free MIG slices, shape (len(rows), len(profiles)): the state's allocatable less what bound pods
        request, at ``rows`` (from ``table.rows_of``); 0 where a row is -1 or the state lacks the profile."""
        free = np.zeros((rows.size, len(profiles)), dtype=np.int32)
        known = self.table.mig_profiles
        pairs = [(k, known.index(profile)) for k, profile in enumerate(profiles) if profile in known]
        if not pairs or rows.size == 0:
            return free
        wanted, columns = (list(side) for side in zip(*pairs, strict=True))
        at = np.where(rows >= 0, rows, 0)
        have = self.table.mig_counts[np.ix_(at, columns)]
        if self.mig_used is not None:
            have = have - self.mig_used[np.ix_(at, columns)]
        free[:, wanted] = np.where((rows >= 0)[:, None], np.maximum(have, 0), 0)
        return free

    def mig_summary(self) -> dict[str, Any]:
        """Nodes per MIG mode (``none`` left out), and per profile the slices allocatable, in use, free and
        *stranded*: free on a node where some profile of its layout has none free, so the node can no
        longer take every kind of pod its layout was cut for and the rest waits (a re-layout would free
        it).

        >>> node = {"metadata": {"name": "n", "labels": {"nvidia.com/mig.strategy": "mixed"}},
        ...         "status": {"allocatable": {"nvidia.com/mig-1g.10gb": "2", "nvidia.com/mig-3g.40gb": "1"}}}
        >>> slice_3g = {"resources": {"limits": {"nvidia.com/mig-3g.40gb": "1"}}}
        >>> pod = {"spec": {"nodeName": "n", "containers": [slice_3g]}}
        >>> ClusterState.from_objects([node], [pod]).mig_summary()["slices"]["1g.10gb"]
        {'allocatable': 2, 'used': 0, 'free': 2, 'stranded': 2}
        """
        table = self.table
        modes = np.bincount(table.mig_modes, minlength=len(MIG_MODES)).tolist()
        summary: dict[str, Any] = {"nodes": {m: n for m, n in zip(MIG_MODES, modes, strict=True) if n and m != "none"}}
        slices = table.mig_counts
        used = self.mig_used if self.mig_used is not None else np.zeros_like(slices)
        free = np.maximum(slices - used, 0)
        exhausted = ((slices > 0) & (free == 0)).any(axis=1)
        stranded = np.where(exhausted[:, None], free, 0)
        summary["slices"] = {
            profile: {
                "allocatable": int(slices[:, k].sum()),
                "used": int(used[:, k].sum()),
                "free": int(free[:, k].sum()),
                "stranded": int(stranded[:, k].sum()),
            }
            for k, profile in enumerate(table.mig_profiles)
        }
        return summary

    def dra_managed_at(self, rows: npt.NDArray[np.intp]) -> npt.NDArray[np.bool_] | None:
        """Whether DRA manages the GPUs of the node at each of ``rows`` (False where a row is -1); None when
        the state did not read DRA."""
        if self.dra_gpus is None or self.claimed_gpus is None:
            return None
        managed: npt.NDArray[np.bool_] = values_at((self.dra_gpus > 0) | (self.claimed_gpus > 0), rows, False)
        return managed.astype(bool)

    def dra_serves_at(self, rows: npt.NDArray[np.intp]) -> npt.NDArray[np.bool_] | None:
        """Whether kube-scheduler serves ``nvidia.com/gpu`` from DRA on the node at each of ``rows`` (KEP-5004:
        a DeviceClass maps it, DRA publishes GPUs there, and the node advertises none itself); it counts and
        allocates those GPUs itself, as claims. None where no DeviceClass maps it."""
        if not self.dra_extended or self.dra_gpus is None:
            return None
        serves: npt.NDArray[np.bool_] = values_at((self.dra_gpus > 0) & (self.table.alloc_gpus == 0), rows, False)
        return serves.astype(bool)

    def held_by_shares(self, rows: npt.NDArray[np.intp]) -> npt.NDArray[np.int32] | None:
        """GPUs at ``rows`` that shares or DRA claims hold, which kube-scheduler's count of
        ``nvidia.com/gpu`` cannot see (0 where a row is -1); None when the state does not know (no
        per-GPU figures).

        >>> node = {"metadata": {"name": "n"}, "status": {"allocatable": {"nvidia.com/gpu": "4"}}}
        >>> def pod(resources, annotation):
        ...     return {"metadata": {"name": annotation, "annotations": {"gpu-scheduler.io/assigned-gpus": annotation}},
        ...             "spec": {"nodeName": "n", "containers": [{"resources": {"limits": resources}}]}}
        >>> state = ClusterState.from_objects([node], [pod({"nvidia.com/gpu": "1"}, "0:1000"),
        ...                                            pod({"gpu-scheduler.io/gpu-milli": "250"}, "1:250")])
        >>> state.used_gpus.tolist(), state.held_by_shares(np.array([0, -1])).tolist()
        ([2], [1, 0])
        """
        if self.whole_gpus is None or self.free_milli is None:
            return None
        shares = values_at(self.used_gpus - self.whole_gpus, rows, 0)
        held: npt.NDArray[np.int32] = np.maximum(shares, 0).astype(np.int32)
        return held


LIST_KINDS = ("List", "NodeList", "PodList")
_ITEM_KINDS = {
    "Node": "nodes", "Pod": "pods", "ResourceSlice": "resourceslices", "ResourceClaim": "resourceclaims",
    "DeviceClass": "deviceclasses",
}  # fmt: skip


def document_of_list(document: Mapping[str, Any]) -> dict[str, Any]:
    """A cluster document from a v1 ``List`` (``kubectl get nodes,pods -A -o json``): its items by ``kind``,
    those of a ``NodeList`` or ``PodList`` without one taken for its kind; items of other kinds (a
    ``kubectl get all`` brings Services too) are left out.

    >>> listed = {"kind": "List", "items": [{"kind": "Node", "metadata": {"name": "n"}},
    ...                                     {"kind": "Service", "metadata": {"name": "s"}}]}
    >>> {kind: len(items) for kind, items in document_of_list(listed).items()}
    {'nodes': 1, 'pods': 0}
    """
    items = document.get("items")
    if not isinstance(items, list):
        raise InvalidArgsError(f"cluster document: a {document.get('kind')} must have a list of 'items'")
    implied = {"NodeList": "Node", "PodList": "Pod"}.get(str(document.get("kind")))
    found: dict[str, Any] = {"nodes": [], "pods": []}
    for position, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise InvalidArgsError(f"cluster document: items[{position}] is not an object")
        field = _ITEM_KINDS.get(str(item.get("kind") or implied))
        if field is not None:
            found.setdefault(field, []).append(item)
    return found


def _per_row(table: NodeTable, counts: Mapping[str, int]) -> npt.NDArray[np.int32]:
    """``counts`` by node name as a column of ``table`` (0 for the nodes it does not name)."""
    column = np.zeros(table.n_nodes, dtype=np.int32)
    for name, count in counts.items():
        if (row := table.index.get(name)) is not None:
            column[row] = count
    return column


def values_at(values: npt.NDArray[Any], rows: npt.NDArray[np.intp], fill: float) -> npt.NDArray[Any]:
    """``values`` at ``rows`` (state rows, from ``table.rows_of``), ``fill`` where a row is -1.

    >>> values_at(np.array([5, 7]), np.array([1, -1, 0]), 0).tolist()
    [7, 0, 5]
    """
    known = rows >= 0
    if values.shape[0] == 0:
        return np.full(rows.shape, fill, dtype=np.result_type(values, type(fill)))
    return np.where(known, values[np.where(known, rows, 0)], fill)
