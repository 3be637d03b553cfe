"""Slow, loop-based reference for the whole-GPU filter and score.

Written for clarity, one node at a time, straight from the rules in DESIGN section 4. Tests compare
the vectorised core against it on random clusters; ``gpu-scheduler bench extender`` reports the
speed-up over it. Do not use it on a hot path.
"""

from __future__ import annotations

import math

from scheduler_core.gpu_fit import FIT_STEP_GPUS, MAX_EXTENDER_PRIORITY, Reason, ScoreWeights
from scheduler_core.nodes import NodeTable
from scheduler_core.pods import PodDemand


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
    free: list[int], utilization: list[float], feasible: list[bool], gpus: int, weights: ScoreWeights
) -> list[int]:
    if gpus == 0:
        return [0] * len(free)
    raw = []
    for row, node_free in enumerate(free):
        if not feasible[row]:
            raw.append(0.0)
            continue
        fit = min(1.0, max(0.0, 1.0 - (node_free - gpus) / FIT_STEP_GPUS))
        util = utilization[row]
        util = 0.0 if math.isnan(util) else min(1.0, max(0.0, util))
        raw.append((weights.fit * fit + weights.utilization * (1.0 - util)) / (weights.fit + weights.utilization))
    best = max(raw, default=0.0)
    if best <= 0.0:
        return [0] * len(free)
    return [math.floor(MAX_EXTENDER_PRIORITY * value / best + 1e-9) for value in raw]
