"""Where a share of a GPU goes: the simulator's sharing policies, applied to the extender's nodes.

A pod asking for ``gpu-scheduler.io/gpu-milli`` below 1000 takes part of one GPU. Which node it
should land on is the question the simulator studies (``gpu-scheduler simulate``); the extender asks
the same policy module, on the per-GPU free milli of the snapshot (with what the instance read from
the ledger applied), and the bind takes the GPU that policy would (the tightest that fits).

Only the policies that need nothing but the nodes' free GPU milli are offered: ``gpu_packing``
(the default: of these three, it leaves the fewest GPUs unallocated on the openb ``default`` trace),
``bestfit`` and ``dotprod``. ``fgd`` and ``gpu_clustering`` need the typical task shapes of the whole
workload, which the snapshot does not carry, and FGD helps shares only with each node's free CPU known:
blind to CPU it places them worse than ``gpu_packing`` (``gpu-scheduler bench share-policy``). CPU and
memory are kube-scheduler's to account, so the policies see the GPU terms only.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from scheduler_core.errors import ConfigError
from scheduler_core.policies import Context, Scorer, registry
from scheduler_core.sharing import Cluster, Task, Workload

SHARE_POLICIES = ("gpu_packing", "bestfit", "dotprod")
DEFAULT_SHARE_POLICY = "gpu_packing"
_NO_WORKLOAD = Workload(
    cpu=np.zeros(0, dtype=np.int64),
    gpu_milli=np.zeros(0, dtype=np.int64),
    num_gpu=np.zeros(0, dtype=np.int64),
    popularity=np.zeros(0, dtype=np.float64),
    allowed=np.zeros((0, 0), dtype=bool),
)


def share_policy(name: str) -> Scorer:
    """The scorer called ``name``; :class:`ConfigError` naming the choices for any other name."""
    if name not in SHARE_POLICIES:
        raise ConfigError(
            f"share policy {name!r}: expected one of {', '.join(SHARE_POLICIES)}"
            " (fgd and gpu_clustering need the whole workload's task shapes, which the snapshot lacks)"
        )
    return registry()[name]


def share_fit(
    free_milli: npt.NDArray[np.int32],
    gpu_count: npt.NDArray[np.int32],
    share: int,
    feasible: npt.NDArray[np.bool_],
    policy: str = DEFAULT_SHARE_POLICY,
) -> npt.NDArray[np.float64]:
    """The policy's preference per node, scaled to [0, 1] over the ``feasible`` nodes (0 elsewhere).

    Parameters
    ----------
    free_milli : ndarray of shape (n_nodes, max_gpus)
        Free thousandths of each GPU; 0 past a node's GPUs.
    share : int
        The pod's milli of one GPU, 1..999.

    With ``gpu_packing``: the shared GPU first, then the smaller idle node (1 GPU) just above the 2-GPU one.

    >>> free = np.array([[1000, 1000], [400, 1000], [1000, 0]], dtype=np.int32)
    >>> share_fit(free, np.array([2, 2, 1]), 300, np.array([True, True, True])).round(3).tolist()
    [0.0, 1.0, 0.015]
    """
    fit = np.zeros(free_milli.shape[0], dtype=np.float64)
    rows = np.flatnonzero(feasible)
    if rows.size == 0:
        return fit
    left = free_milli[rows].astype(np.int64)
    zeros = np.zeros(rows.size, dtype=np.int64)
    cluster = Cluster(zeros, zeros, left, gpu_count[rows].astype(np.int64), zeros, ())
    context = Context(cluster, _NO_WORKLOAD, np.zeros(rows.size), np.random.default_rng(0))
    scores, _gpus = share_policy(policy)(context, Task(0, 0, 1, share), np.arange(rows.size))
    low, high = int(scores.min()), int(scores.max())
    fit[rows] = (scores - low) / (high - low) if high > low else 1.0
    return fit
