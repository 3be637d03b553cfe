"""FGD: the placement that lowers expected fragmentation the most (Weng et al., ATC '23).

For each way to place the task on node n (each GPU that fits, for a sharing task; the lowest-index
fully free GPUs, for whole-GPU tasks; CPU only otherwise), d = F_n(M) - F_n'(M) and the score is
floor(100 / (1 + exp(-d / 1000))). A node scores its best placement; its GPU is the argmax, lowest
index on ties. Identical hypothetical node states are evaluated once.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from scheduler_core.placement.model import Task, Workload
from scheduler_core.placement.policies.base import Context, Scores, no_gpu


def deltas(
    ctx: Context, task: Task, nodes: npt.NDArray[np.intp]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64], npt.NDArray[np.intp]]:
    """Fragmentation drop d per candidate placement, the GPU it uses (-1: whole or none), and its node's
    position in ``nodes``."""
    cluster, workload = ctx.cluster, ctx.workload
    left = cluster.gpu_left[nodes]
    cpu_after = cluster.cpu_left[nodes] - task.cpu
    if task.sharing:
        # One option per (node, distinct free value among fitting GPUs): the same value gives the same F.
        fits = left >= task.gpu_milli
        rows, gpus = np.nonzero(fits)
        values = left[rows, gpus]
        keys = rows * 1001 + values
        _, first = np.unique(keys, return_index=True)  # np.nonzero is row-major: first = lowest index
        rows, gpus, values = rows[first], gpus[first], values[first]
        # Many candidates share a state (idle nodes of one type): evaluate each state's options once.
        unique, inverse = unique_rows(np.column_stack([cluster.model_id[nodes], cpu_after, np.sort(left, axis=1)]))
        option_keys, frag_after = _share_options(workload, unique, task.gpu_milli)
        frag = frag_after[np.searchsorted(option_keys, inverse[rows] * 1001 + values)]
        return ctx.frag[nodes][rows] - frag, gpus.astype(np.int64), rows
    rows = np.arange(nodes.shape[0])
    after = left.copy()
    if task.num_gpu:
        # Take num_gpu GPUs with room, smallest free first then lowest index.
        room = np.where(after >= task.gpu_milli, after, np.iinfo(np.int64).max)
        order = np.lexsort((np.broadcast_to(np.arange(after.shape[1]), after.shape), room), axis=1)
        take = order[:, : task.num_gpu]
        np.subtract.at(after, (np.repeat(rows, task.num_gpu), take.ravel()), task.gpu_milli)
    frag_after = state_fragmentation(workload, after, cpu_after, cluster.model_id[nodes])
    return ctx.frag[nodes] - frag_after, np.full(rows.shape[0], -1, dtype=np.int64), rows


def state_fragmentation(
    workload: Workload,
    gpu_left: npt.NDArray[np.int64],
    cpu_left: npt.NDArray[np.int64],
    model_id: npt.NDArray[np.int64],
) -> npt.NDArray[np.float64]:
    """:meth:`Workload.fragmentation` per row, each distinct (model, CPU, free milli in any GPU order)
    evaluated once: many rows share a state (empty nodes of one type, early on).

    >>> w = Workload(np.array([0]), np.array([500]), np.array([1]), np.array([1.0]), np.array([[True]]))
    >>> state_fragmentation(w, np.array([[300, 1000], [1000, 300]]), np.array([8000, 8000]), np.array([0, 0])).tolist()
    [300.0, 300.0]
    """
    unique, inverse = unique_rows(np.column_stack([model_id, cpu_left, np.sort(gpu_left, axis=1)]))
    result: npt.NDArray[np.float64] = workload.fragmentation(unique[:, 2:], unique[:, 1], unique[:, 0])[inverse]
    return result


def _share_options(
    workload: Workload, states: npt.NDArray[np.int64], milli: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """F after a share of ``milli`` on each distinct fitting value of each state (model, CPU after,
    GPUs' free milli), keyed ``state * 1001 + value`` in ascending order. One GPU goes from v to
    v - milli, so the state's per-threshold counts are updated rather than every GPU re-read."""
    left = states[:, 2:]
    rows, gpus = np.nonzero(left >= milli)
    keys, first = np.unique(rows * 1001 + left[rows, gpus], return_index=True)
    rows = rows[first]
    v = left[rows, gpus[first]][:, None]
    w = v - milli
    count, small = workload.by_threshold(left)
    thresholds = workload.thresholds[0][None, :]
    count_after = count[rows] - (v >= thresholds) + (w >= thresholds)
    small_after = small[rows] - np.where(v < thresholds, v, 0) + np.where(w < thresholds, w, 0)
    free_after = left.sum(axis=1)[rows] - milli
    return keys, workload.fragmentation_from(count_after, small_after, free_after, states[rows, 1], states[rows, 0])


def unique_rows(rows: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.intp]]:
    """Distinct rows and, per input row, the index of its distinct row. ``np.unique(axis=0)`` sorts a
    structured view and costs 10x more here.

    >>> unique, inverse = unique_rows(np.array([[1, 2], [0, 5], [1, 2]]))
    >>> unique.tolist(), inverse.tolist()
    ([[0, 5], [1, 2]], [1, 0, 1])
    """
    order = np.lexsort(rows.T[::-1])
    ordered = rows[order]
    new = np.ones(rows.shape[0], dtype=bool)
    new[1:] = np.any(ordered[1:] != ordered[:-1], axis=1)
    inverse = np.empty(rows.shape[0], dtype=np.intp)
    inverse[order] = np.cumsum(new) - 1
    return ordered[new], inverse


def score(ctx: Context, task: Task, nodes: npt.NDArray[np.intp]) -> Scores:
    d, option_gpu, rows = deltas(ctx, task, nodes)
    option_score = np.floor(100.0 / (1.0 + np.exp(-d / 1000.0))).astype(np.int64)
    if not task.sharing:
        return option_score, no_gpu(np.arange(nodes.shape[0]))
    return best_per_node(option_score, option_gpu, rows, nodes.shape[0])


def best_per_node(
    option_score: npt.NDArray[np.int64],
    option_gpu: npt.NDArray[np.int64],
    rows: npt.NDArray[np.intp],
    n: int,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Each of ``n`` nodes' best option score, and its GPU (highest score, then lowest GPU index); ``rows``
    is each option's node."""
    order = np.lexsort((option_gpu, -option_score, rows))
    first = np.ones(order.shape[0], dtype=bool)
    first[1:] = rows[order][1:] != rows[order][:-1]
    best = order[first]
    scores = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    gpus = np.full(n, -1, dtype=np.int64)
    scores[rows[best]] = option_score[best]
    gpus[rows[best]] = option_gpu[best]
    return scores, gpus
