"""``gpu-scheduler bench policies``: what each placement policy costs per decision, one seed each.

Runs one seed of the FGD protocol per policy in this one process, one after another (no other run
beside it), on the openb trace when ``../shared/data/openb`` has it and on a synthetic openb-like trace
otherwise. Reported per policy: wall seconds for the seed, decisions (every task that arrives, placed
or not), microseconds per decision, and unallocated GPU % at 100 % arrived. A policy whose scores are per
node (FGD's) runs twice, side by side: as ``simulate`` runs it, with its scores kept between decisions
(:mod:`scheduler_core.placement.policies.memo`), and recomputed on every decision; both runs' seconds are
process CPU time, and ``same_placements`` says whether the two runs' curves are identical.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import check_choices
from scheduler_core.placement.model import Cluster, Task, Workload
from scheduler_core.placement.policies import registry
from scheduler_core.simulator.simulate import simulate
from scheduler_core.simulator.traces import openb_dir, openb_traces, read_nodes, read_tasks, synthetic_trace


def load(trace: str, openb: Path) -> tuple[str, Cluster, list[Task]]:
    """The openb trace ``trace`` when ``openb`` is there (ValueError naming the traces it has, for a name it
    lacks); a synthetic openb-like trace when ``openb`` is absent."""
    if not openb.is_dir():
        cluster, tasks = synthetic_trace(300, 2500, np.random.default_rng(0))
        return f"synthetic, openb-like (300 nodes; {openb} is absent)", cluster, tasks
    pods = openb / f"openb_pod_list_{trace}.csv"
    if not pods.is_file():
        raise ValueError(f"--trace: {trace!r} is not in {openb}; choose from {', '.join(openb_traces(openb))}")
    return f"openb {trace}", read_nodes(openb / "openb_node_list_gpu_node.csv"), read_tasks(pods)


def run(policies: list[str], trace: str = "default", seed: int = 42, openb: Path | None = None) -> dict[str, Any]:
    check_choices(policies, registry(), "--policies")
    name, cluster, tasks = load(trace, openb or openb_dir())
    workload = Workload.typical(tasks, cluster.models)
    results = []
    for policy in policies:
        started = time.process_time()
        result = simulate(cluster, tasks, policy, seed, workload=workload)
        cpu_s = time.process_time() - started
        row: dict[str, Any] = {
            "policy": policy,
            "seconds": round(result.seconds, 2),
            "decisions": result.tasks,
            "us_per_decision": round(1e6 * result.seconds / result.tasks, 1),
            "unallocated_gpu_pct_100": round(result.at("unallocated_pct", 100), 2),
        }
        if registry()[policy].per_node:
            started = time.process_time()
            plain = simulate(cluster, tasks, registry()[policy], seed, workload=workload)
            plain_s = time.process_time() - started
            row["kept_scores"] = {
                "cpu_s": round(cpu_s, 2),
                "cpu_s_recomputed_every_decision": round(plain_s, 2),
                "speedup": round(plain_s / cpu_s, 2),
                "same_placements": plain.failed == result.failed
                and all(
                    np.array_equal(getattr(plain, curve), getattr(result, curve), equal_nan=True)
                    for curve in ("unallocated_pct", "frag_amount_pct", "frag_ratio_pct")
                ),
            }
        results.append(row)
    return {"suite": "policies", "trace": name, "nodes": cluster.n_nodes, "seed": seed, "results": results}
