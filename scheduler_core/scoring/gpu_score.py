"""Whole-GPU score, vectorised over nodes: best fit on free GPUs blended with low GPU utilisation (and
network locality, for pods that name peers), then mapped to the extender's integers 0..10.

``score_nodes`` ranks the nodes that :func:`~scheduler_core.scoring.gpu_fit.filter_nodes` kept; it takes
a :class:`~scheduler_core.k8s.nodes.NodeTable` and per-node arrays aligned with it, and never loops over
nodes in Python. ``normalize_scores`` is the one map from raw scores to 0..10.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from scheduler_core.k8s.nodes import NodeTable
from scheduler_core.k8s.pods import PodDemand
from scheduler_core.scoring.gpu_fit import MAX_EXTENDER_PRIORITY, ScoreResult, ScoreWeights, node_column

FIT_STEP_GPUS = 10
"""Best fit loses 1/10 of its score per GPU left over, as in the source's sample (on free GPUs)."""


def score_nodes(
    table: NodeTable,
    free: npt.ArrayLike,
    utilization: npt.ArrayLike,
    demand: PodDemand,
    weights: ScoreWeights | None = None,
    feasible: npt.ArrayLike | None = None,
    locality: npt.ArrayLike | None = None,
    fit: npt.ArrayLike | None = None,
) -> ScoreResult:
    """Score nodes for ``demand``: best fit on free GPUs, blended with low GPU utilisation.

    ``fit = clip(1 - (free - gpus) / 10, 0, 1)``: the fewer GPUs a placement leaves free, the better
    (the source's sample, corrected to use free rather than total GPUs).
    ``utilization score = 1 - clip(utilization, 0, 1)``.
    ``raw = (w_fit * fit + w_util * utilization score) / (w_fit + w_util)``, then
    :func:`normalize_scores`. Nodes outside ``feasible`` (default: those with enough free GPUs)
    score 0. A pod that requests no GPU is scored by ``fit`` alone (the CPU-only placement of
    :meth:`~scheduler_core.scoring.policy.SharePolicy.preference`), and 0 everywhere without one: the
    extender has no opinion.

    With ``locality`` (shape (n_nodes,), in [0, 1]; see :mod:`scheduler_core.scoring.locality`) it joins the
    weighted mean with weight ``w_locality``.

    Nodes may tie at the top here; the extender leaves the top to one node afterwards
    (:func:`scheduler_core.scoring.policy.break_top_tie`, with the rest of the tie rules).

    Parameters
    ----------
    free : array-like of shape (n_nodes,), int
    utilization : array-like of shape (n_nodes,), float
        Mean GPU utilisation per node in [0, 1]; NaN means unknown and counts as 0.
    feasible : array-like of shape (n_nodes,), bool, optional
    fit : array-like of shape (n_nodes,), float in [0, 1], optional
        Replaces the best-fit term: a share of a GPU, or a pod that requests no GPU, is placed by a
        sharing policy instead (:mod:`scheduler_core.scoring.policy`).

    Examples
    --------
    >>> t = NodeTable.from_columns(alloc_gpus=[8, 8, 8])
    >>> score_nodes(t, [2, 8, 3], [0.0, 0.0, 0.0], PodDemand(gpus=2)).score.tolist()
    [10, 5, 9]
    """
    free_arr = node_column(table, free, "free", np.int32)
    util = node_column(table, utilization, "utilization", np.float64)
    mask = free_arr >= demand.gpus if feasible is None else node_column(table, feasible, "feasible", np.bool_)
    local = None if locality is None else node_column(table, locality, "locality", np.float64)
    fit_arr = None if fit is None else node_column(table, fit, "fit", np.float64)
    return _compute_scores(free_arr, util, mask, demand.gpus, (weights or ScoreWeights()).validated(), local, fit_arr)


def normalize_scores(raw: npt.ArrayLike, max_score: int = MAX_EXTENDER_PRIORITY) -> npt.NDArray[np.int64]:
    """Map non-negative raw scores to integers 0..``max_score``: proportionally to the best, keeping the
    policy's order where the integers leave room.

    kube-scheduler multiplies the result by ten times the extender's weight and adds its plugins'
    scores. Its own ``DefaultNormalizeScore``, ``p = floor(max_score * raw / max(raw))``, folds close raw
    scores into one integer, and kube-scheduler then breaks that tie with its plugins. Here each
    proportional value ``p`` is the most a node can score, and distinct raw levels that fold into one
    ``p`` step down one by one, best first, into the integers between ``p`` and the next lower level's
    ``p`` (exclusive); those that do not fit there share the lowest. So the best node alone scores
    ``max_score``, ties stay ties, no node scores above its proportional value, and a node never drops
    to the score of a lower level. When every node scores the same, every node gets ``max_score``: a
    tie the profile's plugins break (by packing, in the generated profile), never a spread made up
    here. Raw scores equal to 9 decimals are one level.

    >>> normalize_scores([0.5, 1.0, 0.25]).tolist()
    [5, 10, 2]
    >>> normalize_scores([1.0, 0.95, 0.93, 0.5]).tolist()
    [10, 9, 8, 5]
    >>> normalize_scores([0.3, 0.3, 0.0]).tolist()
    [10, 10, 0]
    """
    values = np.asarray(raw, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"raw: expected shape (n_nodes,), got {values.shape}")
    # NaN or negative raw scores carry no preference: count them as 0.
    return _compute_normalized(np.where(np.isfinite(values) & (values > 0), values, 0.0), max_score)


def _compute_normalized(values: npt.NDArray[np.float64], max_score: int) -> npt.NDArray[np.int64]:
    """``normalize_scores`` for finite, non-negative ``values``."""
    scores = np.zeros(values.shape, dtype=np.int64)
    # Round away float noise first: two raw scores equal on paper must be one level, not two.
    rounded = np.round(values, 9)
    positive = rounded > 0
    if not positive.any():
        return scores
    levels, level_of = np.unique(rounded[positive], return_inverse=True)  # ascending
    levels, level_of = levels[::-1], levels.size - 1 - level_of.reshape(-1)  # best first
    # +1e-9 undoes float error, so that a ratio that is exactly 7/10 on paper is not floored to 6.
    proportional = np.floor(levels * (max_score / levels[0]) + 1e-9).astype(np.int64)
    # Levels that share a proportional value form a run; each steps down one per place in its run,
    # but not below the next run's value + 1 (the last run: not below 1, or 0 if it is 0 already).
    starts = np.flatnonzero(np.r_[True, proportional[1:] != proportional[:-1]])
    run = np.cumsum(np.r_[True, proportional[1:] != proportional[:-1]]) - 1
    place = np.arange(levels.size) - starts[run]
    next_value = np.r_[proportional[starts[1:]], -1][run]
    floor = np.where(next_value >= 0, next_value + 1, np.minimum(proportional, 1))
    scores[positive] = np.maximum(proportional - place, floor)[level_of]
    return scores


def _compute_scores(
    free: npt.NDArray[np.int32],
    utilization: npt.NDArray[np.float64],
    feasible: npt.NDArray[np.bool_],
    gpus: int,
    weights: ScoreWeights,
    locality: npt.NDArray[np.float64] | None = None,
    fit: npt.NDArray[np.float64] | None = None,
) -> ScoreResult:
    score = np.zeros(free.shape[0], dtype=np.int64)
    opinion = gpus > 0 or locality is not None or fit is not None
    rows = np.flatnonzero(feasible) if opinion else np.zeros(0, dtype=np.intp)
    if rows.size == 0:
        empty = np.zeros(0)
        return ScoreResult(score, rows, empty, empty, empty)
    if gpus == 0:
        # No GPU to fit: the CPU-only placement (fit) and locality are the only opinions (NaN and
        # out-of-range values clamped into [0, 1]).
        zeros = np.zeros(rows.size)
        fit_only = zeros if fit is None else np.fmin(np.fmax(fit[rows], 0.0), 1.0)
        local_only = None if locality is None else np.fmin(np.fmax(locality[rows], 0.0), 1.0)
        raw = fit_only if local_only is None else local_only
        if fit is not None and local_only is not None and weights.fit + weights.locality > 0:
            raw = (fit_only * weights.fit + local_only * weights.locality) / (weights.fit + weights.locality)
        score[rows] = _compute_normalized(raw, MAX_EXTENDER_PRIORITY)
        return ScoreResult(score, rows, fit_only, zeros, raw, local_only)
    # Work on the feasible rows only (the others score 0), in place to spare allocations.
    if fit is not None:
        fit_rows = fit[rows]
    else:
        fit_rows = (gpus - free[rows]).astype(np.float64)  # minus the GPUs left, <= 0
        fit_rows *= 1.0 / FIT_STEP_GPUS
        fit_rows += 1.0
    # Clamp to [0, 1]: 10 or more GPUs left earn no fit credit, and a caller's ``feasible`` mask
    # may include nodes with fewer free GPUs than requested, which earn no more than a perfect fit.
    np.clip(fit_rows, 0.0, 1.0, out=fit_rows)
    util_rows = utilization[rows]
    # fmax/fmin ignore NaN, so unknown utilisation (NaN) counts as idle; the pair clamps to [0, 1].
    np.fmax(util_rows, 0.0, out=util_rows)
    np.fmin(util_rows, 1.0, out=util_rows)
    np.subtract(1.0, util_rows, out=util_rows)
    local_weight = weights.locality if locality is not None else 0.0
    total = weights.fit + weights.utilization + local_weight
    raw_rows = fit_rows * (weights.fit / total)
    raw_rows += util_rows * (weights.utilization / total)
    local_rows: npt.NDArray[np.float64] | None = None
    if locality is not None:
        local_rows = np.fmin(np.fmax(locality[rows], 0.0), 1.0)
        raw_rows += local_rows * (local_weight / total)
    score[rows] = _compute_normalized(raw_rows, MAX_EXTENDER_PRIORITY)
    return ScoreResult(score, rows, fit_rows, util_rows, raw_rows, local_rows)
