"""Why a pod would or would not go to each node: the filter verdict and every score component."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from scheduler_core.cluster import ClusterState
from scheduler_core.gpu_fit import Reason, ScoreWeights, filter_nodes, score_nodes
from scheduler_core.locality import LocalitySettings, locality_scores, peer_placement
from scheduler_core.pods import PodDemand


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
    fit: float
    utilization_score: float
    locality: float
    raw_score: float
    score: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def explain(
    state: ClusterState,
    demand: PodDemand,
    weights: ScoreWeights | None = None,
    locality: LocalitySettings | None = None,
) -> list[NodeExplanation]:
    """Explain the decision for every node of ``state``, best score first, then by name.

    Scores are computed as ``prioritize`` would for the nodes that pass, so the 0..10 values are
    relative to the best feasible node.

    >>> from scheduler_core.synthetic import CATALOGUE, make_node
    >>> state = ClusterState.from_objects([make_node("a", CATALOGUE[0], "z"), make_node("t", CATALOGUE[3], "z")])
    >>> [(row.node, row.passed, row.score) for row in explain(state, PodDemand(gpus=8, models=frozenset({"A100"})))]
    [('a', True, 10), ('t', False, 0)]
    """
    weights = weights or ScoreWeights()
    table = state.table
    free = state.free_gpus
    verdict = filter_nodes(table, free, demand)
    local = None
    if demand.peers:
        peers = (locality or LocalitySettings()).with_self(demand.peers, demand.labels)
        placement = peer_placement(state.apps, table.zones, peers, np.arange(table.n_nodes))
        local = locality_scores(placement, table.zone_id, locality)
    scores = score_nodes(table, free, state.utilization, demand, weights, feasible=verdict.feasible, locality=local)
    messages = verdict.messages
    rows = [
        NodeExplanation(
            node=table.names[row],
            zone=table.zone_name(row),
            model=table.model_name(row),
            memory_mib=int(table.memory_mib[row]),
            gpus_allocatable=int(table.alloc_gpus[row]),
            gpus_used=int(state.used_gpus[row]),
            gpus_free=int(free[row]),
            utilization=float(state.utilization[row]),
            passed=bool(verdict.reason[row] == Reason.FITS),
            unresolvable=bool(verdict.unresolvable[row]),
            reason=messages.get(row, ""),
            fit=round(float(scores.fit[row]), 4),
            utilization_score=round(float(scores.utilization[row]), 4),
            locality=round(float(local[row]), 4) if local is not None else 0.0,
            raw_score=round(float(scores.raw[row]), 4),
            score=int(scores.score[row]),
        )
        for row in np.arange(table.n_nodes).tolist()
    ]
    rows.sort(key=lambda r: (not r.passed, -r.raw_score, r.node))
    return rows
