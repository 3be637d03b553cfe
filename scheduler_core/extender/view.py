"""The nodes of one request as the extender sees them: facts, free GPUs, utilisation, and per-GPU milli.

kube-scheduler sends either full Node objects (``nodeCacheCapable: false``) or names only
(``nodeCacheCapable: true``). Either way, :func:`node_view` lines the request's nodes up with the
cluster state, row for row, and lays this instance's ledger readings over the state's free milli.
Everything :mod:`scheduler_core.extender.decide` computes reads this view and nothing else.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler_core.errors import ClusterStateUnavailableError
from scheduler_core.extender.wire import ExtenderArgs
from scheduler_core.k8s.names import MILLI_PER_GPU
from scheduler_core.k8s.nodes import NodeTable
from scheduler_core.k8s.pod_requests import effective_cpu_milli
from scheduler_core.k8s.pods import PodDemand
from scheduler_core.scoring.gpu_fit import FilterResult, filter_nodes, free_gpus, true_per_row
from scheduler_core.scoring.locality import LocalitySettings, locality_scores, peer_placement
from scheduler_core.scoring.policy import Fragmentation
from scheduler_core.state.allocation import UNKNOWN_CPU
from scheduler_core.state.cluster import ClusterState, values_at
from scheduler_core.state.readings import Observed, Readings, apply_readings, assumed_cpu

FreeMilli = npt.NDArray[np.int32] | None


@dataclass(frozen=True, eq=False)
class NodeView:
    """The request's nodes as a table, with free GPUs and utilisation per row.

    In the full-object form, row i is ``Nodes.items[i]``; in the names form the rows follow the
    request's order, and ``unknown`` lists the names the cluster state does not have.
    ``state_rows`` maps each row to its row in ``state`` (-1 where the state lacks the node).

    Attributes
    ----------
    free : ndarray of shape (n_nodes,), int32
        Free GPUs per row; with ``free_milli``, the GPUs that can take the pod's share (or that are
        wholly free, for a whole-GPU pod).
    utilization : ndarray of shape (n_nodes,), float64
    free_milli : ndarray of shape (n_nodes, max_gpus), int32, or None
        Free thousandths of each GPU, where the request needs them.
    """

    table: NodeTable
    free: npt.NDArray[np.int32]
    utilization: npt.NDArray[np.float64]
    unknown: list[str]
    state: ClusterState | None = None
    state_rows: npt.NDArray[np.intp] | None = None
    names_form: bool = True
    free_milli: FreeMilli = None
    pending: tuple[Observed, ...] = ()
    """The ledger readings laid over the state (see :meth:`free_milli_at`)."""

    def per_gpu(self, free_milli: FreeMilli, demand: PodDemand) -> NodeView:
        """This view with per-GPU free milli; ``free`` then counts the GPUs that can take the pod's
        share, or that are wholly free (which this instance's ledger readings may have changed), for a
        pod that wants GPUs."""
        if free_milli is None:
            return self
        if not demand.wants_gpu:  # nothing to count: a pod without GPUs reads the milli only to be placed
            return replace(self, free_milli=free_milli)
        free = true_per_row(free_milli >= (demand.share or MILLI_PER_GPU))
        return replace(self, free=free, free_milli=free_milli)

    def filter(self, demand: PodDemand, check_free: bool | npt.NDArray[np.bool_] = True) -> FilterResult:
        """:func:`~scheduler_core.scoring.gpu_fit.filter_nodes` on this view: its free GPUs, the nodes whose
        GPUs DRA manages by the state, and those where kube-scheduler serves ``nvidia.com/gpu`` from DRA."""
        managed = serves = None
        if self.state is not None and self.state_rows is not None:
            managed, serves = self.state.dra_managed_at(self.state_rows), self.state.dra_serves_at(self.state_rows)
        return filter_nodes(
            self.table, self.free, demand, check_free=check_free, dra_managed=managed, dra_serves=serves
        )

    def held_by_shares(self) -> npt.NDArray[np.int32] | None:
        """GPUs per row that shares or DRA claims hold (by the state), which kube-scheduler's count cannot
        see; None when the state does not say (:meth:`ClusterState.held_by_shares`)."""
        if self.state is None or self.state_rows is None:
            return None
        return self.state.held_by_shares(self.state_rows)

    def free_milli_at(self, row: int) -> npt.NDArray[np.int32]:
        """Free milli per GPU of one row, readings included: from :attr:`free_milli` when the view has
        them, else from the state (a whole-GPU view keeps counts only)."""
        if self.free_milli is not None:
            at: npt.NDArray[np.int32] = self.free_milli[row]
            return at
        state_row = -1 if self.state_rows is None else int(self.state_rows[row])
        return _row_free_milli(self.state, state_row, self.table, row, self.pending)

    def mig_free(self) -> npt.NDArray[np.int32]:
        """Free MIG slices per row and profile of :attr:`table` (``table.mig_profiles``): the state's
        count where it has the node and the profile, else all of the node's allocatable (a node or a
        layout newer than the state is not taken for full)."""
        table = self.table
        if self.state is None or self.state_rows is None:
            return table.mig_counts.copy()
        free = self.state.mig_free_at(self.state_rows, table.mig_profiles)
        in_state = np.array([p in self.state.table.mig_profiles for p in table.mig_profiles], dtype=bool)
        unknown = (self.state_rows < 0)[:, None] | ~in_state[None, :]
        np.copyto(free, table.mig_counts, where=unknown)
        return free

    @property
    def used(self) -> npt.NDArray[np.int32]:
        """GPUs per row that this view does not count as free for the pod."""
        used: npt.NDArray[np.int32] = (self.table.alloc_gpus - self.free).astype(np.int32)
        return used


def node_view(
    state: ClusterState | None,
    args: ExtenderArgs,
    demand: PodDemand,
    readings: Readings,
    *,
    per_gpu: bool = False,
    assumed: bool = False,
) -> NodeView:
    """The request's nodes with their free GPUs; per GPU (``free_milli``) only where it is needed: a
    share, ledger readings to apply, or ``per_gpu`` (preempt). A whole-GPU pod otherwise reads the
    state's cached free-GPU counts. ``assumed`` lays the extender's own predictions over it too
    (prioritize's view: they may move a score, never refuse a node).

    Raises
    ------
    ClusterStateUnavailableError
        The request names nodes only and there is no cluster state to look them up in.
    """
    if args.nodes is not None:
        table = NodeTable.from_nodes(args.nodes)
        if state is None:
            view = NodeView(table, table.alloc_gpus.copy(), np.zeros(table.n_nodes), [])
            return view.per_gpu(all_free(table), demand) if per_gpu or demand.share else view
        rows = state.table.rows_of(table.names)
        used, utilization = state.usage_at(rows)
        view = NodeView(table, free_gpus(table, used), utilization, [], state, rows, names_form=False)
        return _with_milli(view, state, rows, demand, readings.pending(state.generated_at, assumed=assumed), per_gpu)
    if state is None:
        raise ClusterStateUnavailableError(
            "NodeNames (nodeCacheCapable: true) needs cluster state and this extender has none: "
            "give it a cluster snapshot, or set nodeCacheCapable: false"
        )
    table, rows, unknown = _names_rows(state, args.node_names or [])
    view = NodeView(table, state.free_gpus[rows], state.utilization[rows], unknown, state, rows)
    return _with_milli(view, state, rows, demand, readings.pending(state.generated_at, assumed=assumed), per_gpu)


_LAST_NAMES: weakref.WeakKeyDictionary[NodeTable, tuple[tuple[str, ...], NodeTable, npt.NDArray[np.intp], list[str]]]
_LAST_NAMES = weakref.WeakKeyDictionary()


def _names_rows(state: ClusterState, names: list[str]) -> tuple[NodeTable, npt.NDArray[np.intp], list[str]]:
    """The state's sub-table for ``names`` (in their order), its rows in the state, and the names the
    state lacks. kube-scheduler sends the same list for pod after pod while the feasible nodes stay the
    same, so the last one per node table is kept: a hit skips the lookup and the sub-table (and keeps its
    cached JSON names for the reply). A live state rebuilt for pods only keeps its node table, so the
    hit survives the rebuild after each bind."""
    key = tuple(names)
    last = _LAST_NAMES.get(state.table)
    if last is not None and last[0] == key:
        return last[1], last[2], list(last[3])
    found = state.table.rows_of(names)
    known = found >= 0
    known_names: list[str] = names
    unknown: list[str] = []
    if not known.all():
        flags = known.tolist()
        known_names = [name for name, ok in zip(names, flags, strict=True) if ok]
        unknown = [name for name, ok in zip(names, flags, strict=True) if not ok]
    rows = found[known]
    table = state.table.take(rows, names=known_names)
    _LAST_NAMES[state.table] = (key, table, rows, unknown)
    return table, rows, list(unknown)


def _with_milli(
    view: NodeView,
    state: ClusterState,
    rows: npt.NDArray[np.intp],
    demand: PodDemand,
    pending: list[Observed],
    force: bool,
) -> NodeView:
    if not (force or demand.share or pending):
        return view
    if not (force or demand.share):
        return _with_whole_counts(view, state, rows, pending)
    return replace(view.per_gpu(_free_milli(state, rows, view.table, pending), demand), pending=tuple(pending))


def _with_whole_counts(
    view: NodeView, state: ClusterState, rows: npt.NDArray[np.intp], pending: list[Observed]
) -> NodeView:
    """A whole-GPU pod's view with readings laid over: only the few observed rows' counts of wholly
    free GPUs change, so only those rows are read per GPU (the same figures :func:`_free_milli` and
    :meth:`NodeView.per_gpu` give, without a pass over every node's GPUs)."""
    by_state_row: dict[int, list[Observed]] = {}
    for state_row, reading in zip(state.table.rows_of([r.node for r in pending]).tolist(), pending, strict=True):
        if state_row >= 0:
            by_state_row.setdefault(state_row, []).append(reading)
    if not by_state_row:
        return replace(view, pending=tuple(pending))
    free = view.free.copy()
    observed = np.isin(rows, np.fromiter(by_state_row, dtype=np.intp, count=len(by_state_row)))
    for row in np.flatnonzero(observed).tolist():
        state_row = int(rows[row])
        capped = _row_free_milli(state, state_row, view.table, row, by_state_row[state_row])
        free[row] = np.count_nonzero(capped >= MILLI_PER_GPU)
    return replace(view, free=free, pending=tuple(pending))


def _row_free_milli(
    state: ClusterState | None, state_row: int, table: NodeTable, row: int, pending: Sequence[Observed]
) -> npt.NDArray[np.int32]:
    """Free milli per GPU of ``table``'s ``row`` (the state's ``state_row``, -1 if it lacks the node),
    capped by the readings of that node among ``pending``."""
    if state is None or state.free_milli is None or state_row < 0:
        alloc = int(table.alloc_gpus[row])
        width = max(1, alloc) if state is None or state.free_milli is None else state.free_milli.shape[1]
        free = np.where(np.arange(width) < alloc, MILLI_PER_GPU, 0).astype(np.int32)
    else:
        free = state.free_milli[state_row].copy()
    node = table.names[row]
    mine = [reading for reading in pending if reading.node == node]
    if not mine:
        return free
    capped: npt.NDArray[np.int32] = apply_readings(
        free[None, :], [0] * len(mine), mine, None if state is None else state.generated_at
    )[0]
    return capped


def _free_milli(
    state: ClusterState, rows: npt.NDArray[np.intp], table: NodeTable, pending: list[Observed]
) -> FreeMilli:
    """Free milli per GPU at ``rows`` of ``state`` (-1: a node the state lacks, taken as empty), capped
    by the ledger readings ``pending`` over it; None when the state has no per-GPU figures and there
    are no readings."""
    if state.free_milli is None or state.table.n_nodes == 0:
        if state.free_milli is None and not pending:
            return None
        free = all_free(table)
    else:
        known = rows >= 0
        free = np.take(state.free_milli, np.where(known, rows, 0), axis=0)  # 10x a fancy index's speed for 2-D rows
        if not known.all():
            free = np.where(known[:, None], free, all_free(table, width=free.shape[1]))
    if pending:
        # The readings' nodes as rows of the state (its hash index is built once per state), then of the view.
        view_row = np.full(state.table.n_nodes + 1, -1, dtype=np.intp)  # the extra last entry: unknown (-1)
        view_row[rows[rows >= 0]] = np.flatnonzero(rows >= 0)
        at = view_row[state.table.rows_of([r.node for r in pending])].tolist()
        free = apply_readings(free, at, pending, state.generated_at)
    return free


def all_free(table: NodeTable, width: int | None = None) -> npt.NDArray[np.int32]:
    """Every existing GPU wholly free: 1000 per GPU up to each node's allocatable count.

    >>> all_free(NodeTable.from_columns(alloc_gpus=[2, 1])).tolist()
    [[1000, 1000], [1000, 0]]
    """
    width = max(1, int(table.alloc_gpus.max(initial=0))) if width is None else width
    exists = np.arange(width)[None, :] < table.alloc_gpus[:, None]
    return np.where(exists, MILLI_PER_GPU, 0).astype(np.int32)


def fragmentation_inputs(view: NodeView, pod: Any) -> Fragmentation | None:
    """Free CPU, GPU model and the typical shapes per row of ``view``, from the cluster state; None
    when the state carries no CPU or shapes. A node the state lacks counts as of unknown model with
    no CPU limit. The CPU that this instance's own decisions take and the state may not count yet
    (:func:`~scheduler_core.state.readings.assumed_cpu`) is taken off."""
    state = view.state
    if state is None or state.free_cpu is None or not state.shapes:
        return None
    rows = view.state_rows
    assert rows is not None  # set whenever state is
    cpu = values_at(state.free_cpu, rows, UNKNOWN_CPU)
    overlaid = None
    if view.pending:
        at = view.table.rows_of([r.node for r in view.pending]).tolist()
        taken = assumed_cpu(at, view.pending, view.table.n_nodes, state.generated_at)
        cpu = np.maximum(cpu - taken, 0)
        overlaid = np.zeros(view.table.n_nodes, dtype=bool)
        overlaid[[row for row in at if row >= 0]] = True
    model_id = values_at(state.table.model_id, rows, -1).astype(np.int64)
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    pod_cpu = effective_cpu_milli(spec) if isinstance(spec, Mapping) else 0
    return Fragmentation(cpu, model_id, state.workload, pod_cpu, rows, state.workload_key, state, overlaid)


def locality_inputs(view: NodeView, demand: PodDemand, settings: LocalitySettings) -> npt.NDArray[np.float64] | None:
    """Locality per row of ``view`` for a pod with peers, from the cluster state's app index; None for a
    pod without peers, or without a state."""
    state = view.state
    if not demand.peers or state is None:
        return None
    zones = state.table.zones
    rows = view.state_rows
    assert rows is not None  # set whenever state is
    zone_id: npt.NDArray[np.intp]
    if view.names_form:  # the view's table is the state's: same zone vocabulary
        zone_id = state.table.zone_id[rows].astype(np.intp)
    else:  # full objects: map the request's zone names to the state's
        position = {zone: i for i, zone in enumerate(zones)}
        lookup = np.array([position.get(zone, -1) for zone in view.table.zones] + [-1], dtype=np.intp)
        zone_id = lookup[view.table.zone_id]  # -1 indexes the trailing -1
    peers = settings.with_self(demand.peers, demand.labels)
    placement = peer_placement(state.apps, zones, peers, rows)
    return locality_scores(placement, zone_id, settings)
