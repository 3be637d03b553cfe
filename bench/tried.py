"""Placement rules tried for issue #7's target and not adopted, kept so that their figures can be rerun.

``python -m bench.quality --policies fgd_cpu,expected_waste`` runs one beside our policy; docs/research/tried.md
("Tried ... and not adopted") has the figures and why each was left out.

``expected_waste``: ``fgd_cpu``, except that a share's FGD drop ``d`` is reduced by the change in the
expected final waste of the GPU it takes, ``floor(100 / (1 + exp(-(d - ΔW) / 1000)))``. A GPU with ``h``
milli free is expected to waste ``W(h) = h / 2 + mean(W(h - s)) / 2``, the mean over the workload's shares
``s`` that fit, weighted by their popularity (``W(h) = h`` if none fits), and ``W(1000) = 0``: a GPU no
share has opened wastes nothing yet.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import numpy.typing as npt

from scheduler_core.k8s.names import MILLI_PER_GPU
from scheduler_core.sharing.model import Task, Workload
from scheduler_core.sharing.policies import Context, Scores, fgd, fgd_cpu


@cache
def _expected_waste(sizes: tuple[int, ...], weights: tuple[float, ...]) -> npt.NDArray[np.float64]:
    size = np.asarray(sizes, dtype=np.int64)
    weight = np.asarray(weights, dtype=np.float64)
    waste = np.zeros(MILLI_PER_GPU + 1)
    for free in range(1, MILLI_PER_GPU + 1):
        fits = size <= free
        if not fits.any():
            waste[free] = free
            continue
        filled = float(weight[fits] @ waste[free - size[fits]]) / float(weight[fits].sum())
        waste[free] = free / 2 + filled / 2
    waste[MILLI_PER_GPU] = 0.0
    return waste


def expected_waste(workload: Workload) -> npt.NDArray[np.float64]:
    """``W(h)`` for ``h`` = 0..1000 milli free, from the workload's shares (one GPU, under 1000 milli).

    >>> from scheduler_core.sharing.model import Workload
    >>> w = Workload.from_shapes([((4000, 500, 1, ""), 1), ((8000, 1000, 1, ""), 3)], ["T4"])
    >>> expected_waste(w)[[100, 499, 500, 999, 1000]].tolist()
    [100.0, 499.0, 250.0, 749.0, 0.0]
    """
    share = (workload.num_gpu == 1) & (workload.gpu_milli > 0) & (workload.gpu_milli < MILLI_PER_GPU)
    sizes, where = np.unique(workload.gpu_milli[share], return_inverse=True)
    weights = np.bincount(where.reshape(-1), weights=workload.popularity[share], minlength=sizes.shape[0])
    return _expected_waste(tuple(sizes.tolist()), tuple(weights.tolist()))


def expected_waste_score(ctx: Context, task: Task, nodes: npt.NDArray[np.intp]) -> Scores:
    if not task.sharing:
        return fgd_cpu.score(ctx, task, nodes)
    d, option_gpu, rows = fgd.deltas(ctx, task, nodes)
    waste = expected_waste(ctx.workload)
    free = ctx.cluster.gpu_left[nodes[rows], option_gpu]
    change = waste[free - task.gpu_milli] - waste[free]
    option_score = np.floor(100.0 / (1.0 + np.exp(-(d - change) / 1000.0))).astype(np.int64)
    return fgd.best_per_node(option_score, option_gpu, rows, nodes.shape[0], task)


RULES = {"expected_waste": expected_waste_score}
"""Each rule tried and not adopted, by the name ``bench.quality --policies`` takes."""
