"""FGD-CPU, our policy: FGD for GPU tasks, and CPU-only tasks where the CPU will not be missed.

On the openb traces, GPUs are stranded by CPU. With FGD at 100 % arrived (``default``, seed 42), 3.3 %
of the cluster's GPU capacity sits free on nodes with under 10 % of their CPU left. FGD places a
CPU-only task by the fragmentation it causes, which is about zero on most nodes, so the task goes
wherever the tie rule sends it, whether or not that node's free GPUs will need the CPU later.

This policy scores a CPU-only task by the CPU a node has to spare once its free GPUs are served:
``cpu_left - cpu - R x free GPU milli``, where ``R`` is the workload's CPU demand per GPU milli (the
typical shapes, weighted by popularity, CPU-only shapes included), floored to a tenth of a core. GPU
tasks are scored exactly as FGD scores them. Measured over the public traces, the README has the figures.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from scheduler_core.policies import Context, Scores, fgd, no_gpu
from scheduler_core.sharing import Task, Workload


def cpu_per_gpu_milli(workload: Workload) -> float:
    """The workload's CPU demand (milli-cores) per GPU milli, popularity-weighted over its shapes."""
    cpu = float((workload.cpu * workload.popularity).sum())
    gpu = float((workload.num_gpu * workload.gpu_milli * workload.popularity).sum())
    return cpu / max(gpu, 1.0)


def score(ctx: Context, task: Task, nodes: npt.NDArray[np.intp]) -> Scores:
    if task.num_gpu:
        return fgd.score(ctx, task, nodes)
    cluster = ctx.cluster
    spare = (cluster.cpu_left[nodes] - task.cpu) - cpu_per_gpu_milli(ctx.workload) * cluster.gpu_left[nodes].sum(axis=1)
    return np.floor(spare / 100.0).astype(np.int64), no_gpu(nodes)
