"""``gpu-scheduler bench share-policy``: which policy the extender should place GPU shares with.

This runs the FGD protocol with every task that is not a share placed by our policy (``fgd_cpu``),
and the shares placed by each candidate:

- ``fgd``: FGD as the simulator runs it: the whole trace's typical shapes known in advance, and the
  GPU FGD prefers;
- ``extender``: ``fgd_cpu`` as the extender runs it (``SHARE_POLICY=fgd_cpu``). It knows only what
  a snapshot carries: each node's free CPU, and the shapes of the pods placed so far (refreshed
  every :data:`REFRESH` placements, at most ``MAX_SHAPES``), and the bind takes the tightest GPU;
- ``fgd_cpu_blind``: FGD with the shapes' CPU set to 0, so that node CPU plays no part;
- each other policy the extender offers (``gpu_packing``, ``bestfit``, ``dotprod``): they need only free
  GPU milli.

What it cannot model: kube-scheduler adds its own scores to the extender's, and breaks ties at
random per decision, where the simulator, as the authors' does, gives them to the node that comes first
in an order shuffled once per run.

Reported: unallocated GPU % at 100 % arrived, mean over the seeds, on the openb trace when
``../shared/data/openb`` has it and on a synthetic openb-like trace otherwise.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bench import check_choices
from bench.policies import load
from scheduler_core.k8s.pods import PodDemand
from scheduler_core.placement.model import MAX_SHAPES, Task, Workload, keep_typical, shape_of, tightest
from scheduler_core.placement.policies import Context, Scores, registry
from scheduler_core.scoring.policy import DEFAULT_SHARE_POLICY, SHARE_POLICIES, Fragmentation, share_policy
from scheduler_core.simulator.simulate import simulate
from scheduler_core.simulator.traces import openb_dir

CANDIDATES = ("fgd", "extender", "fgd_cpu_blind", *(p for p in SHARE_POLICIES if p != DEFAULT_SHARE_POLICY))
"""FGD as the simulator runs it, the default policy as the extender runs it and blind to CPU, and each other
policy the extender offers."""


@dataclass
class SharesBy:
    """A scorer: shares by policy ``share``, every other task by the default share policy (``fgd_cpu``)."""

    share: str
    placed: list[Task] = field(default_factory=list)
    live: Workload | None = None

    def __call__(self, ctx: Context, task: Task, nodes: npt.NDArray[np.intp]) -> Scores:
        self.placed.append(task)  # every task scored has a feasible node, and is placed
        if not task.sharing:
            return share_policy(DEFAULT_SHARE_POLICY).declared(ctx, task, nodes)
        if self.share == "extender":
            return self._as_extender(ctx, task, nodes)
        if self.share != "fgd_cpu_blind":
            return registry()[self.share](ctx, task, nodes)
        blind = replace(ctx.workload, cpu=np.zeros_like(ctx.workload.cpu))
        return _fgd_with(ctx, blind, task, nodes)

    def _as_extender(self, ctx: Context, task: Task, nodes: npt.NDArray[np.intp]) -> Scores:
        """What the extender knows: the shapes of the pods running when the snapshot was taken (here:
        placed so far, refreshed every ``REFRESH`` placements), capped as the snapshot caps them; and
        the bind takes the tightest GPU, not FGD's. The scores are the extender's policy's own
        (:meth:`~scheduler_core.scoring.policy.SharePolicy.node_scores`), its fallback included."""
        if self.live is None or len(self.placed) % REFRESH == 0:
            shapes = keep_typical(Counter(map(shape_of, self.placed)), limit=MAX_SHAPES)
            self.live = Workload.from_shapes(shapes, ctx.cluster.models)
        cluster = ctx.cluster
        left = cluster.gpu_left[nodes].astype(np.int32)
        model_id = cluster.model_id[nodes].astype(np.int64)
        fragmentation = Fragmentation(cluster.cpu_left[nodes], model_id, self.live, task.cpu)
        demand = PodDemand(gpus=1, share=task.gpu_milli)
        everywhere = np.ones(nodes.shape[0], dtype=bool)
        policy = share_policy(DEFAULT_SHARE_POLICY)
        scores = policy.node_scores(left, cluster.gpu_count[nodes].astype(np.int32), demand, everywhere, fragmentation)
        assert scores is not None  # every policy places shares
        return scores, tightest(cluster.gpu_left[nodes], task.gpu_milli)


REFRESH = 200
"""Placements between two snapshots in the ``extender`` candidate: one minute of a busy cluster."""


def _fgd_with(ctx: Context, workload: Workload, task: Task, nodes: npt.NDArray[np.intp]) -> Scores:
    cluster = ctx.cluster
    frag = np.zeros(cluster.n_nodes)
    frag[nodes] = workload.fragmentation(cluster.gpu_left[nodes], cluster.cpu_left[nodes], cluster.model_id[nodes])
    return registry()["fgd"](replace(ctx, workload=workload, frag=frag), task, nodes)


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
    openb = openb or openb_dir()
    name = load(trace, openb)[0]
    jobs_list = [(trace, share, 42 + s, openb) for share in candidates for s in range(seeds)]
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        runs = list(pool.map(_one, *zip(*jobs_list, strict=True)))
    return {
        "suite": "share-policy",
        "trace": name,
        "seeds": [42 + s for s in range(seeds)],
        "others_by": DEFAULT_SHARE_POLICY,
        "unallocated_gpu_pct_100": {
            share: round(float(np.mean([u for s, _, u in runs if s == share])), 3) for share in candidates
        },
    }
