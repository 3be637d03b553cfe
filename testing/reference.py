"""Slow, loop-based reference for the whole-GPU filter and score.

Written for clarity, one node at a time, straight from the rules in DESIGN section 4. Tests compare
the vectorised core against it on random clusters; ``gpu-scheduler bench extender`` reports the
speed-up over it. Do not use it on a hot path.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

from scheduler_core.deletion_cost.policy import CostPolicy
from scheduler_core.k8s.nodes import NodeTable
from scheduler_core.k8s.pods import PodDemand
from scheduler_core.scoring.gpu_fit import MAX_EXTENDER_PRIORITY, Reason, ScoreWeights
from scheduler_core.scoring.gpu_score import FIT_STEP_GPUS


def reference_reasons(table: NodeTable, free: list[int], demand: PodDemand) -> list[int]:
    reasons = []
    for row in range(table.n_nodes):
        model = table.model_name(row)
        memory = int(table.memory_mib[row])
        alloc = int(table.alloc_gpus[row])
        if demand.gpus == 0:
            reasons.append(Reason.FITS)
        elif model is None and (demand.models is not None or demand.min_memory_mib > 0):
            reasons.append(Reason.NO_GPU_INFO)
        elif demand.models is not None and model not in demand.models:
            reasons.append(Reason.MODEL)
        elif memory < demand.min_memory_mib:
            reasons.append(Reason.MEMORY)
        elif alloc < demand.gpus:
            reasons.append(Reason.TOO_FEW_GPUS)
        elif free[row] < demand.gpus:
            reasons.append(Reason.TOO_FEW_FREE)
        else:
            reasons.append(Reason.FITS)
    return [int(r) for r in reasons]


def reference_scores(
    free: list[int],
    utilization: list[float],
    feasible: list[bool],
    gpus: int,
    weights: ScoreWeights,
    locality: list[float] | None = None,
    names: Sequence[str] | None = None,
) -> list[int]:
    """With ``names``, a tie at the top goes to the name whose CRC-32 is smallest; every other score
    above 1 drops one."""
    if gpus == 0 and locality is None:
        return [0] * len(free)
    raw = []
    for row, node_free in enumerate(free):
        if not feasible[row]:
            raw.append(0.0)
            continue
        local = 0.0 if locality is None or math.isnan(locality[row]) else min(1.0, max(0.0, locality[row]))
        if gpus == 0:
            raw.append(local)
            continue
        fit = min(1.0, max(0.0, 1.0 - (node_free - gpus) / FIT_STEP_GPUS))
        util = utilization[row]
        util = 0.0 if math.isnan(util) else min(1.0, max(0.0, util))
        local_weight = weights.locality if locality is not None else 0.0
        total = weights.fit + weights.utilization + local_weight
        raw.append((weights.fit * fit + weights.utilization * (1.0 - util) + local_weight * local) / total)
    scores = reference_normalize(raw)
    top = [row for row, score in enumerate(scores) if score == MAX_EXTENDER_PRIORITY]
    if names is not None and len(top) > 1:
        winner = min(top, key=lambda row: zlib.crc32(names[row].encode()))
        scores = [score - 1 if row != winner and score > 1 else score for row, score in enumerate(scores)]
    return scores


def reference_normalize(raw: list[float]) -> list[int]:
    """``normalize_scores`` by its docstring, one level at a time."""
    levels = sorted({round(value, 9) for value in raw if round(value, 9) > 0}, reverse=True)
    if not levels:
        return [0] * len(raw)
    proportional = [math.floor(MAX_EXTENDER_PRIORITY * level / levels[0] + 1e-9) for level in levels]
    score: dict[float, int] = {}
    for j, level in enumerate(levels):
        first = proportional.index(proportional[j])  # where this level's run starts
        lower = [p for p in proportional if p < proportional[j]]
        floor = max(lower) + 1 if lower else min(proportional[j], 1)
        score[level] = max(proportional[j] - (j - first), floor)
    return [score.get(round(value, 9), 0) for value in raw]


def reference_locality(
    peers: list[tuple[float, dict[int, int], dict[int, int]]],
    candidate_rows: list[int],
    candidate_zones: list[int],
    zone_value: list[list[float]],
) -> list[float]:
    """Locality straight from its definition, one candidate and one peer pod group at a time.

    ``peers`` holds (weight, pods per node row, pods per zone); ``zone_value[a][b]`` is the value of
    a peer pod in zone b for a candidate in zone a (the same-node value is 1.0).
    """
    total_weight = sum(weight for weight, _, _ in peers)
    scores = []
    for row, zone in zip(candidate_rows, candidate_zones, strict=True):
        value = 0.0
        for weight, by_node, by_zone in peers:
            total = sum(by_node.values())
            if total == 0:
                continue
            here = by_node.get(row, 0) if row >= 0 else 0
            near = 0.0
            if zone >= 0:
                near = sum(pods * zone_value[zone][other] for other, pods in by_zone.items())
                near -= here * zone_value[zone][zone]  # those pods are on the node itself
            value += weight * (here * 1.0 + near) / total
        scores.append(min(1.0, max(0.0, value / total_weight)) if total_weight > 0 else 0.0)
    return scores


def reference_cost(policy: CostPolicy, metrics: dict[str, float], age_s: float, ready: bool) -> int | None:
    """One pod's deletion cost straight from the formula; None means "no new value"."""
    if not ready:
        return policy.not_ready_cost
    if age_s < policy.warmup_s:
        return policy.warmup_cost
    needed = {
        "metrics": ("active_requests", "cache_hit_rate", "avg_response_time_ms"),
        "connections": ("active_connections",),
        "static": (),
    }[policy.policy]
    for name in needed:
        value = metrics.get(name)
        if value is None or math.isnan(value) or value < 0:
            return None
    if policy.policy == "metrics":
        latency = metrics["avg_response_time_ms"]
        bonus = policy.fast_bonus if latency < policy.fast_ms else policy.ok_bonus if latency < policy.ok_ms else 0
        hit = min(metrics["cache_hit_rate"], 1.0)
        raw = (
            math.floor(policy.per_request * metrics["active_requests"])
            + math.floor(policy.hit_rate_points * hit)
            + bonus
        )
    elif policy.policy == "connections":
        raw = math.floor(policy.per_connection * metrics["active_connections"])
    else:
        raw = policy.static_cost
    return int(max(policy.min_cost, min(policy.cap, raw)))
