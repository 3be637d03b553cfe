"""``gpu-scheduler bench moves`` and ``bench churn``: what moving running tasks buys on openb.

``moves``: FGD's protocol with our policy (``fgd_cpu``) and a move budget ``K``
(:mod:`scheduler_core.placement.moves`), up to 100 % arrived, per trace, seed and ``K``: unallocated
GPU % at 100 % arrived, moves per 1,000 arrivals and the run's seconds; per trace, the mean over the
seeds beside FGD's released mean. ``K = 0`` is ``simulate`` as ``make bench-quality`` runs it.

``churn``: the trace's tasks arriving and ending at their own times, waiting when they fit nowhere
(:mod:`scheduler_core.simulator.churn`), per load, seed and ``K``, side by side: the share of arrivals
that waited, the GPU-hours they waited, those never placed, and moves per 1,000 arrivals.

Both need ``../shared/data/openb`` (the trace is research-use only and is not shipped); JSON on stdout.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bench.quality import pick_traces, released
from scheduler_core.placement.model import Workload
from scheduler_core.simulator.churn import churn
from scheduler_core.simulator.simulate import simulate
from scheduler_core.simulator.traces import openb_dir, openb_traces, read_nodes, read_tasks, read_times

POLICY = "fgd_cpu"


def _need_openb() -> Path:
    openb = openb_dir()
    if not openb.is_dir():
        raise ValueError(f"{openb} is absent: the openb trace is research-use only and is not shipped here")
    return openb


def _moves_one(trace: str, seed: int, budget: int, openb: Path) -> dict[str, Any]:
    cluster = read_nodes(openb / "openb_node_list_gpu_node.csv")
    tasks = read_tasks(openb / f"openb_pod_list_{trace}.csv")
    result = simulate(
        cluster, tasks, POLICY, seed, workload=Workload.typical(tasks, cluster.models), moves=budget, arrived_pct=100
    )
    return {
        "trace": trace, "seed": seed, "K": budget, "unalloc_100": round(result.at("unallocated_pct", 100), 4),
        "failed": result.failed, "moves": result.moves, "moves_per_1000": round(result.moves_per_1000, 2),
        "seconds": round(result.seconds, 1),
    }  # fmt: skip


def run_moves(traces: str, seeds: int, budgets: list[int], jobs: int = 2) -> dict[str, Any]:
    """Every (trace, seed, K); per trace and K, the means."""
    if seeds < 1:
        raise ValueError(f"--seeds: expected at least 1, got {seeds}")
    openb = _need_openb()
    published = released()
    names = pick_traces(traces, openb_traces(openb), {trace for trace, _ in published})
    grid = [(trace, 42 + s, budget, openb) for trace in names for s in range(seeds) for budget in budgets]
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        runs = list(pool.map(_moves_one, *zip(*grid, strict=True)))
    means = {}
    for trace in names:
        row: dict[str, Any] = {"fgd_released": published.get((trace, "06-FGD"))}
        for budget in budgets:
            mine = [r for r in runs if r["trace"] == trace and r["K"] == budget]
            row[f"K{budget}"] = {
                "unalloc_100": round(float(np.mean([r["unalloc_100"] for r in mine])), 3),
                "moves_per_1000": round(float(np.mean([r["moves_per_1000"] for r in mine])), 2),
            }
        means[trace] = row
    return {"suite": "moves", "policy": POLICY, "seeds": [42 + s for s in range(seeds)], "K": budgets,
            "means": means, "runs": runs}  # fmt: skip


def _churn_one(trace: str, seed: int, load: float, budget: int, openb: Path) -> dict[str, Any]:
    cluster = read_nodes(openb / "openb_node_list_gpu_node.csv")
    pods = openb / f"openb_pod_list_{trace}.csv"
    tasks = read_tasks(pods)
    result = churn(
        cluster, tasks, read_times(pods), POLICY, seed, load=load, moves=budget,
        workload=Workload.typical(tasks, cluster.models),
    )  # fmt: skip
    return {
        "trace": trace, "seed": seed, "load": load, "K": budget, "compression": round(result.compression, 1),
        "arrivals": result.arrivals, "waited": result.waited, "waited_pct": round(result.waited_pct, 3),
        "never_placed": result.never_placed, "gpu_hours_waited": round(result.gpu_hours_waited, 3),
        "gpu_hours_never_placed": round(result.gpu_hours_never_placed, 1),
        "gpu_hours_run": round(result.gpu_hours_run, 1), "moves": result.moves,
        "moves_per_1000": round(result.moves_per_1000, 2), "seconds": round(result.seconds, 1),
    }  # fmt: skip


def run_churn(trace: str, seeds: int, loads: list[float], budgets: list[int], jobs: int = 2) -> dict[str, Any]:
    """Every (load, seed, K) on ``trace``, side by side."""
    if seeds < 1:
        raise ValueError(f"--seeds: expected at least 1, got {seeds}")
    openb = _need_openb()
    pick_traces(trace, openb_traces(openb), set())
    grid = [(trace, 42 + s, load, budget, openb) for load in loads for s in range(seeds) for budget in budgets]
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        runs = list(pool.map(_churn_one, *zip(*grid, strict=True)))
    return {"suite": "churn", "trace": trace, "policy": POLICY, "seeds": [42 + s for s in range(seeds)],
            "loads": loads, "K": budgets, "runs": runs}  # fmt: skip
