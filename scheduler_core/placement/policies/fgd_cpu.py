"""FGD-CPU, our policy: FGD, with CPU-only tasks sent first where their CPU can strand no GPU.

FGD scores a CPU-only task by the fragmentation it causes, which is about zero on most nodes: many
nodes tie, and the tie rule picks one (the authors' simulator: the first node of an order shuffled once
per run). That node may have free GPUs that will need the CPU later, while another node that ties with
it has no free GPU at all, and no use for its CPU.

This policy scores every task as FGD does, and breaks FGD's ties for a CPU-only task in favour of the
nodes with no free GPU milli: ``2 x FGD's score + 1`` there, ``2 x FGD's score`` elsewhere, so it never
overrides a better FGD score. (Taking CPU can only raise a node's fragmentation, so FGD's top score for
a CPU-only task goes to the nodes where it changes nothing; every node without a free GPU is one.) GPU
tasks are scored exactly as FGD scores them. ``docs/research/fgd-fidelity.md`` has the figures over the public and
unreleased openb traces.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from scheduler_core.placement.model import Task
from scheduler_core.placement.policies.base import Context, Scores
from scheduler_core.placement.policies.fgd import score as fgd_score


def score(ctx: Context, task: Task, nodes: npt.NDArray[np.intp]) -> Scores:
    scores, gpus = fgd_score(ctx, task, nodes)
    if task.num_gpu:
        return scores, gpus
    no_free_gpu = ctx.cluster.gpu_left[nodes].sum(axis=1) == 0
    return 2 * scores + no_free_gpu, gpus
