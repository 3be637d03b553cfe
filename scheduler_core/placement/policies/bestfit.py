"""BestFit: the least leftover, half CPU and half GPU, min-max normalised over the nodes to 0..100.

leftover = 0.5 x (cpu_left - cpu) / 128000 + 0.5 x (free - num_gpu x gpu_milli) / 8000;
score = (1 - leftover) x 100. Sharing tasks take the tightest GPU that fits.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from scheduler_core.placement.model import Task, tightest
from scheduler_core.placement.policies.base import CPU_NORM, GPU_NORM, Context, Scores, no_gpu


def score(ctx: Context, task: Task, nodes: npt.NDArray[np.intp]) -> Scores:
    cluster = ctx.cluster
    left = cluster.gpu_left[nodes]
    leftover = (
        0.5 * (cluster.cpu_left[nodes] - task.cpu) / CPU_NORM + 0.5 * (left.sum(axis=1) - task.gpu_demand) / GPU_NORM
    )
    raw = np.floor((1.0 - leftover) * 100.0).astype(np.int64)
    low, high = raw.min(), raw.max()
    scores = (raw - low) * 100 // (high - low) if high > low else np.zeros_like(raw)
    return scores, tightest(left, task.gpu_milli) if task.sharing else no_gpu(nodes)
