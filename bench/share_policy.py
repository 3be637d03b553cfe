"""``gpu-scheduler bench share-policy``: which policy the extender should place GPU shares with.

The extender chooses a node for a share from the snapshot's per-GPU free milli; it does not know the
nodes' free CPU, nor the workload's typical task shapes. This runs the FGD protocol with every task
that is not a share placed by our policy (``fgd_cpu``), and the shares placed by each candidate:

- ``fgd``: FGD as the simulator runs it, node CPU and task shapes known (what ``fgd_cpu`` does with
  shares; a reference the extender cannot reach today);
- ``fgd_cpu_blind``: FGD with the shapes' CPU set to 0, so that node CPU plays no part (what the
  extender could do with typical shapes but no CPU);
- ``gpu_packing``, ``bestfit``, ``dotprod``: the policies the extender offers (``SHARE_POLICY``).

Reported: unallocated GPU % at 100 % arrived, mean over the seeds, on the openb trace when
``../shared/data/openb`` has it and on a synthetic openb-like trace otherwise.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bench import check_choices
from bench.policies import load
from scheduler_core.policies import Context, Scores, fgd_cpu, registry
from scheduler_core.sharing import Task, Workload
from scheduler_core.simulate import simulate
from scheduler_core.traces import OPENB_DIR

CANDIDATES = ("fgd", "fgd_cpu_blind", "gpu_packing", "bestfit", "dotprod")


@dataclass(frozen=True)
class SharesBy:
    """A scorer: shares by policy ``share``, every other task by ``fgd_cpu``."""

    share: str

    def __call__(self, ctx: Context, task: Task, nodes: npt.NDArray[np.intp]) -> Scores:
        if not task.sharing:
            return fgd_cpu.score(ctx, task, nodes)
        if self.share != "fgd_cpu_blind":
            return registry()[self.share](ctx, task, nodes)
        blind = replace(ctx.workload, cpu=np.zeros_like(ctx.workload.cpu))
        cluster = ctx.cluster
        frag = np.zeros(cluster.n_nodes)
        frag[nodes] = blind.fragmentation(cluster.gpu_left[nodes], cluster.cpu_left[nodes], cluster.model_id[nodes])
        return registry()["fgd"](replace(ctx, workload=blind, frag=frag), task, nodes)


def _one(trace: str, share: str, seed: int, openb: Path) -> tuple[str, int, float]:
    _, cluster, tasks = load(trace, openb)
    result = simulate(cluster, tasks, SharesBy(share), seed, workload=Workload.typical(tasks, cluster.models))
    return share, seed, result.at("unallocated_pct", 100)


def run(
    candidates: list[str], trace: str = "default", seeds: int = 10, jobs: int = 2, openb: Path | None = None
) -> dict[str, Any]:
    if seeds < 1:
        raise ValueError(f"--seeds: expected at least 1, got {seeds}")
    check_choices(candidates, CANDIDATES, "--candidates")
    openb = openb or OPENB_DIR
    name = load(trace, openb)[0]
    jobs_list = [(trace, share, 42 + s, openb) for share in candidates for s in range(seeds)]
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        runs = list(pool.map(_one, *zip(*jobs_list, strict=True)))
    return {
        "suite": "share-policy",
        "trace": name,
        "seeds": [42 + s for s in range(seeds)],
        "others_by": "fgd_cpu",
        "unallocated_gpu_pct_100": {
            share: round(float(np.mean([u for s, _, u in runs if s == share])), 3) for share in candidates
        },
    }
