"""Why a pod would or would not go to each node: the filter's verdict and every score component.

A formatter, never a second implementation: :func:`explain` asks the :class:`Extender` for its
``filter`` and ``prioritize`` on every node of its cluster state (the names form, as kube-scheduler
sends it with ``nodeCacheCapable: true``) and lays the two outcomes side by side, so that "why is my
pod Pending" gets the extender's own answer for whole GPUs, shares and locality alike, under its own
configuration (share policy, weights, locality). ``passed``, ``reason`` and ``score`` are exactly
filter's and prioritize's; where the extender leaves the count of ``nvidia.com/gpu`` to kube-scheduler
(whole GPUs on nodes without shares), ``kube_scheduler`` says what kube-scheduler's own count will
refuse, beside the extender's verdict, never in it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from scheduler_core.errors import ClusterStateUnavailableError, InvalidPodError
from scheduler_core.extender.decide import FilterOutcome, PrioritizeOutcome
from scheduler_core.extender.facade import Extender
from scheduler_core.extender.wire import ExtenderArgs
from scheduler_core.k8s.pods import PodDemand
from scheduler_core.scoring.gpu_fit import Reason, filter_nodes


@dataclass(frozen=True)
class NodeExplanation:
    node: str
    zone: str | None
    model: str | None
    memory_mib: int
    gpus_allocatable: int
    gpus_used: int
    gpus_free: int
    utilization: float
    passed: bool
    unresolvable: bool
    reason: str
    kube_scheduler: str
    """Why kube-scheduler's count of ``nvidia.com/gpu`` refuses the node, where the extender leaves
    that count to it; "" otherwise."""
    node_problem: str
    """What the product could not read of the node itself (a garbled GPU label or count: it has no GPU
    facts then), or why it is over a cap; "" for a node read whole. Shown whatever the pod asks."""
    fit: float
    utilization_score: float
    locality: float
    raw_score: float
    score: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Explanation:
    """The pod's demand and one row per node, best score first, then by name."""

    demand: PodDemand
    nodes: list[NodeExplanation]
    autoscaler: str = ""
    """Where no node passes: what an autoscaler could add, as the filter's refusals end
    (:func:`~scheduler_core.k8s.autoscaler.autoscaler_hint`)."""

    @property
    def passing(self) -> int:
        """Nodes the pod may go to: the extender passes them and, where it leaves the count of
        ``nvidia.com/gpu`` to kube-scheduler, kube-scheduler's count does too."""
        return sum(1 for row in self.nodes if row.passed and not row.kube_scheduler)

    def to_json(self) -> dict[str, Any]:
        return {
            "pod": self.demand.key,
            "gpus": self.demand.gpus,
            "share_milli": self.demand.share,
            "mig": {profile: count for profile, count in self.demand.mig},
            "nodes_passing": self.passing,
            "nodes": [row.to_json() for row in self.nodes],
            "autoscaler": self.autoscaler,
        }


def explain(extender: Extender, pod: Mapping[str, Any]) -> Explanation:
    """Explain the extender's decision for ``pod`` on every node of its cluster state.

    Raises
    ------
    ClusterStateUnavailableError
        The extender has no usable cluster state.
    InvalidPodError
        The pod asks for something invalid (the message the filter would put in ``Error``).

    >>> from scheduler_core.state.cluster import ClusterState
    >>> def node(name, product, gpus):
    ...     return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
    ...             "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}}}
    >>> state = ClusterState.from_objects([node("a", "NVIDIA-A100-SXM4-40GB", 8), node("t", "Tesla-T4", 4)])
    >>> pod = {"metadata": {"annotations": {"gpu.nvidia.com/model": "A100"}},
    ...        "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}
    >>> [(row.node, row.passed, row.score) for row in explain(Extender(cluster=lambda: state), pod).nodes]
    [('a', True, 10), ('t', False, 0)]
    """
    state = extender.state()
    if state is None:
        raise ClusterStateUnavailableError(
            "explain needs cluster state: give the extender a snapshot or a cluster file"
        )
    args = ExtenderArgs(pod=pod, node_names=list(state.table.names))
    verdict = extender.filter(args)
    if verdict.error:
        if verdict.error_kind == "invalid_pod":
            raise InvalidPodError(verdict.error)
        raise ClusterStateUnavailableError(verdict.error, verdict.error_kind)
    rows = explanation_rows(verdict, extender.prioritize(args))
    return Explanation(verdict.demand or PodDemand(), rows, verdict.hint)


def explanation_rows(verdict: FilterOutcome, scored: PrioritizeOutcome) -> list[NodeExplanation]:
    """One row per node of the view both outcomes were computed on, best score first, then by name."""
    view, result, scores = scored.view, verdict.result, scored.scores
    if view is None or result is None or scores is None:  # an outcome with an error: no rows
        return []
    table = view.table
    messages = result.messages
    theirs: dict[int, str] = {}
    if verdict.demand is not None and verdict.demand.counted_by_scheduler:
        # The extender leaves this count to kube-scheduler's NodeResourcesFit: shown beside its verdict.
        counted = filter_nodes(table, view.free, verdict.demand)
        theirs = {row: text for row, text in counted.messages.items() if result.reason[row] == Reason.FITS}
    used = view.used
    local = scored.locality
    rows = [
        NodeExplanation(
            node=table.names[row],
            zone=table.zone_name(row),
            model=table.model_name(row),
            memory_mib=int(table.memory_mib[row]),
            gpus_allocatable=int(table.alloc_gpus[row]),
            gpus_used=int(used[row]),
            gpus_free=int(view.free[row]),
            utilization=float(view.utilization[row]),
            passed=bool(result.reason[row] == Reason.FITS),
            unresolvable=bool(result.unresolvable[row]),
            reason=messages.get(row, ""),
            kube_scheduler=theirs.get(row, ""),
            node_problem=table.invalid.get(row) or table.gpu_info_errors.get(row, ""),
            fit=round(float(scores.fit[row]), 4),
            utilization_score=round(float(scores.utilization[row]), 4),
            locality=round(float(local[row]), 4) if local is not None else 0.0,
            raw_score=round(float(scores.raw[row]), 4),
            score=int(scores.score[row]),
        )
        for row in np.arange(table.n_nodes).tolist()
    ]
    rows.sort(key=lambda r: (not r.passed, -r.score, -r.raw_score, r.node))
    return rows
