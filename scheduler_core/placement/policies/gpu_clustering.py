"""GpuClustering: keep tasks of one class (share, or k whole GPUs) together.

Bands, higher is better: the node hosts only this class (75); this class among others (50); no GPU
task yet (25); other classes only (0). Within a band: + 25 x (8000 - free GPU milli) // 8000.
CPU-only tasks score 0 everywhere (random placement). Sharing tasks take the tightest GPU that fits.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from scheduler_core.placement.model import Task, tightest
from scheduler_core.placement.policies.base import Context, Scores, no_gpu


def task_class(task: Task) -> object:
    return "share" if task.sharing else task.num_gpu


def score(ctx: Context, task: Task, nodes: npt.NDArray[np.intp]) -> Scores:
    if task.num_gpu == 0:
        return np.zeros(nodes.shape[0], dtype=np.int64), no_gpu(nodes)
    mine = task_class(task)
    band = np.empty(nodes.shape[0], dtype=np.int64)
    for i, node in enumerate(nodes.tolist()):
        hosted = ctx.classes[node]
        band[i] = 25 if not hosted else (75 if hosted == {mine} else 50 if mine in hosted else 0)
    left = ctx.cluster.gpu_left[nodes]
    scores = band + 25 * (8000 - left.sum(axis=1)) // 8000
    return scores, tightest(left, task.gpu_milli) if task.sharing else no_gpu(nodes)
