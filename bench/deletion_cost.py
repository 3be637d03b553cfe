"""``gpu-scheduler bench deletion-cost``: cost computation for many managed pods at once."""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from bench.timing import time_us
from scheduler_core.deletion_cost.policy import CostPolicy, PodSignals, compute_costs


def run(n_pods: list[int], repeat: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    results = []
    for n in n_pods:
        metrics = {
            "active_requests": rng.poisson(20, n).astype(float),
            "cache_hit_rate": rng.random(n),
            "avg_response_time_ms": rng.lognormal(5, 1, n),
            "active_connections": rng.poisson(30, n).astype(float),
        }
        metrics["active_requests"][rng.random(n) < 0.02] = np.nan  # some pods without a sample
        signals = PodSignals.build(metrics, rng.uniform(0, 7200, n), rng.random(n) > 0.05)
        row: dict[str, Any] = {"pods": n}
        for policy in ("metrics", "connections"):
            cost_policy = CostPolicy(policy=policy)
            row[policy] = time_us(partial(compute_costs, cost_policy, signals), repeat)
        results.append(row)
    return {"benchmark": "deletion-cost", "results": results}
