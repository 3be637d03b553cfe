"""Random: the feasible nodes get distinct random scores (a random ranking), so the choice is uniform
whatever the tie rule; a sharing task takes a random GPU that fits."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from scheduler_core.placement.model import Task
from scheduler_core.placement.policies.base import Context, Scores, no_gpu


def score(ctx: Context, task: Task, nodes: npt.NDArray[np.intp]) -> Scores:
    scores: npt.NDArray[np.int64] = np.asarray(ctx.rng.permutation(nodes.shape[0]), dtype=np.int64)
    if not task.sharing:
        return scores, no_gpu(nodes)
    fits = ctx.cluster.gpu_left[nodes] >= task.gpu_milli
    # One uniform draw per node among its fitting GPUs.
    keys = np.where(fits, ctx.rng.random(fits.shape), -1.0)
    return scores, np.argmax(keys, axis=1).astype(np.int64)
