"""GpuPacking: fill GPUs that are already shared, then partly used nodes, then idle ones.

(a) the task fits on already-shared GPUs: 100 - (sum of the chosen GPUs' free %) // 10, at least 50;
(b) it needs fully free GPUs on a partly used node: 50 - the number of fully free GPUs it takes, at
least 33; (c) the node is idle: 33 - the node's GPU count, at least that count (so smaller idle nodes
come first: 2 GPUs score 31, 8 GPUs 25). CPU-only tasks score 0. Sharing tasks take the tightest GPU
that fits (a shared one when one fits).

(c) is the authors' ``gpu_packing_score.go``: its "#GPUs" is the node's count of fully free GPUs, which
on an idle node is all of them, not the task's.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from scheduler_core.k8s.names import MILLI_PER_GPU
from scheduler_core.placement.model import Task, tightest
from scheduler_core.placement.policies.base import Context, Scores, no_gpu


def score(ctx: Context, task: Task, nodes: npt.NDArray[np.intp]) -> Scores:
    if task.num_gpu == 0:
        return np.zeros(nodes.shape[0], dtype=np.int64), no_gpu(nodes)
    cluster = ctx.cluster
    left = cluster.gpu_left[nodes]
    capacity = cluster.gpu_count[nodes] * MILLI_PER_GPU
    count = cluster.gpu_count[nodes]
    idle = left.sum(axis=1) == capacity
    scores: npt.NDArray[np.int64] = np.where(idle, np.maximum(33 - count, count), max(50 - task.num_gpu, 33)).astype(
        np.int64
    )
    if not task.sharing:
        return scores, no_gpu(nodes)
    gpu = tightest(left, task.gpu_milli)
    chosen_left = left[np.arange(nodes.shape[0]), gpu]
    shared = chosen_left < MILLI_PER_GPU
    free_pct = chosen_left * 100 // MILLI_PER_GPU
    scores = np.where(shared, np.maximum(100 - free_pct // 10, 50), scores).astype(np.int64)
    return scores, gpu
