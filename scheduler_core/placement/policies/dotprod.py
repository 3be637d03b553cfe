"""DotProd (Tetris-style): the node whose free vector has the smallest dot product with the demand.

free = [cpu_left / 128000, sum(gpu_left) / 8000]; demand = [cpu / 128000, num_gpu x gpu_milli / 8000];
score = floor(100 x (1 - dot / 2)). Sharing tasks take the tightest GPU that fits.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from scheduler_core.placement.model import Task, tightest
from scheduler_core.placement.policies.base import CPU_NORM, GPU_NORM, Context, Scores, no_gpu


def score(ctx: Context, task: Task, nodes: npt.NDArray[np.intp]) -> Scores:
    cluster = ctx.cluster
    left = cluster.gpu_left[nodes]
    dot = (cluster.cpu_left[nodes] / CPU_NORM) * (task.cpu / CPU_NORM) + (left.sum(axis=1) / GPU_NORM) * (
        task.gpu_demand / GPU_NORM
    )
    scores = np.floor(100.0 * (1.0 - dot / 2.0)).astype(np.int64)
    return scores, tightest(left, task.gpu_milli) if task.sharing else no_gpu(nodes)
