"""Where a share of a GPU goes: the simulator's sharing policies, applied to the extender's nodes.

A pod asking for ``gpu-scheduler.io/gpu-milli`` below 1000 takes part of one GPU. Which node it
should land on is the question the simulator studies (``gpu-scheduler simulate``); the extender asks
the same policy module, on the per-GPU free milli of the snapshot (with what the instance read from
the ledger applied), and the bind takes the tightest GPU that fits.

- ``fgd_cpu`` (the default, ours): for a share it is FGD, the fragmentation gradient of Weng et al.
  (ATC '23), scored against the typical shapes of the pods the snapshot saw on GPU nodes and each
  node's free CPU. A snapshot without those (written before they existed), or whose shapes ask for no
  GPU (no GPU pod has run yet), leaves the share to ``gpu_packing``.
- ``gpu_packing``, ``bestfit``, ``dotprod``: they need only the nodes' free GPU milli.

``fgd_cpu`` places the other pods too (:func:`fgd_fit`): whole GPUs, and the pods that request no
GPU (the generated profile sends the extender those as well), whose CPU must not strand GPUs that the
typical pods would need. With the other policies whole GPUs go by best fit, and a pod without GPUs by
kube-scheduler's plugins alone.

``gpu-scheduler bench share-policy`` measures them on the openb trace, the extender's limits
included (shapes as a snapshot sees them, the tightest GPU at bind). CPU and memory feasibility stay
kube-scheduler's; FGD reads the CPU only to judge which GPUs the typical pods could still use.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scheduler_core.errors import ConfigError
from scheduler_core.k8s.names import MILLI_PER_GPU
from scheduler_core.sharing.model import Cluster, Task, Workload
from scheduler_core.sharing.policies import Context, Scorer, registry
from scheduler_core.sharing.policies.fgd import state_fragmentation

SHARE_POLICIES = ("fgd_cpu", "gpu_packing", "bestfit", "dotprod")
DEFAULT_SHARE_POLICY = "fgd_cpu"
FALLBACK_SHARE_POLICY = "gpu_packing"
"""What ``fgd_cpu`` falls back to without node CPU and pod shapes."""
_NO_WORKLOAD = Workload(
    cpu=np.zeros(0, dtype=np.int64),
    gpu_milli=np.zeros(0, dtype=np.int64),
    num_gpu=np.zeros(0, dtype=np.int64),
    popularity=np.zeros(0, dtype=np.float64),
    allowed=np.zeros((0, 0), dtype=bool),
)


@dataclass(frozen=True)
class Fragmentation:
    """What FGD reads besides the GPUs, per candidate row.

    Attributes
    ----------
    cpu_left : ndarray of shape (n_rows,), int64
        Free milli-cores per node.
    model_id : ndarray of shape (n_rows,), int64
        Row of ``workload.allowed`` per node; -1 (the last row) for a node of unknown model.
    workload : Workload
        The typical pod shapes.
    pod_cpu : int
        The pod's own CPU request, milli-cores.
    """

    cpu_left: npt.NDArray[np.int64]
    model_id: npt.NDArray[np.int64]
    workload: Workload
    pod_cpu: int


_TIE_LEVELS = 1000
"""More than any node's GPUs: a tie-break key below one step of the policy's score."""


def share_policy(name: str) -> Scorer:
    """The scorer called ``name``; :class:`ConfigError` naming the choices for any other name."""
    if name not in SHARE_POLICIES:
        raise ConfigError(f"share policy {name!r}: expected one of {', '.join(SHARE_POLICIES)}")
    return registry()[name]


def effective_policy(policy: str, fragmentation: Fragmentation | None) -> str:
    """``policy``, or the fallback when it is ``fgd_cpu`` and there is nothing to score against: no
    fragmentation inputs, or no shape that asks for a GPU (every node would score the same)."""
    if policy == "fgd_cpu" and (fragmentation is None or not fragmentation.workload.num_gpu.any()):
        return FALLBACK_SHARE_POLICY
    return policy


def share_fit(
    free_milli: npt.NDArray[np.int32],
    gpu_count: npt.NDArray[np.int32],
    share: int,
    feasible: npt.NDArray[np.bool_],
    policy: str = DEFAULT_SHARE_POLICY,
    fragmentation: Fragmentation | None = None,
) -> npt.NDArray[np.float64]:
    """The policy's preference per node, scaled to [0, 1] over the ``feasible`` nodes (0 elsewhere).

    Parameters
    ----------
    free_milli : ndarray of shape (n_nodes, max_gpus)
        Free thousandths of each GPU; 0 past a node's GPUs.
    share : int
        The pod's milli of one GPU, 1..999.
    fragmentation : Fragmentation, optional
        For ``fgd_cpu``; without it (or with no GPU shape) ``gpu_packing`` places the share.

    With ``gpu_packing``: the shared GPU first, then the smaller idle node (1 GPU) just above the 2-GPU one.

    >>> free = np.array([[1000, 1000], [400, 1000], [1000, 0]], dtype=np.int32)
    >>> share_fit(free, np.array([2, 2, 1]), 300, np.array([True, True, True]), "gpu_packing").round(3).tolist()
    [0.0, 1.0, 0.015]
    """
    policy = effective_policy(policy, fragmentation)
    return _policy_fit(free_milli, gpu_count, 1, share, feasible, policy, fragmentation)


def fgd_fit(
    free_milli: npt.NDArray[np.int32],
    gpu_count: npt.NDArray[np.int32],
    gpus: int,
    feasible: npt.NDArray[np.bool_],
    policy: str = DEFAULT_SHARE_POLICY,
    fragmentation: Fragmentation | None = None,
) -> npt.NDArray[np.float64] | None:
    """``fgd_cpu``'s preference for a pod of ``gpus`` whole GPUs, or of none (0), as :func:`share_fit`
    scales it; None when the policy is another (whole GPUs are then best fit's,
    :mod:`scheduler_core.scoring.gpu_fit`, and a pod without GPUs nobody's) or there is nothing to
    score against.

    One policy for every pod, as ``simulate`` runs it: on openb ``default`` through the real
    kube-scheduler, whole GPUs by best fit left 5.4 % of GPUs unallocated where FGD left 4.7
    (``docs/scheduling.md#one-policy-for-every-pod``). Where FGD scores every feasible node alike for
    whole GPUs (a placement fragments nothing anywhere: early on, or one pod shape), best fit decides
    (the fewest GPUs left free): FGD alone would have no preference, and kube-scheduler's
    PodTopologySpread would spread a Service's pods over empty nodes. Only then: best fit among FGD's
    tied top nodes put the ``gpuspec`` traces 0.4-0.6 points above ``simulate``, where the node order
    breaks that tie (``docs/benchmarks.md#the-gpuspec-gap-best-fit-among-fgds-ties``). The CPU a pod
    takes on a node can leave that node's free GPUs unusable for the typical pods: FGD counts that as
    fragmentation, and ``fgd_cpu`` sends a pod without GPUs, among the nodes where it changes nothing,
    to those with no free GPU milli.

    >>> from scheduler_core.sharing.model import Workload
    >>> shapes = Workload.from_shapes([((8000, 1000, 1, ""), 1)], ("A100", ""))
    >>> free = np.array([[1000, 1000], [0, 0], [1000, 0]], dtype=np.int32)
    >>> frag = Fragmentation(np.array([16000, 16000, 9000]), np.zeros(3, dtype=np.int64), shapes, 2000)
    >>> fgd_fit(free, np.array([2, 2, 2]), 0, np.ones(3, dtype=bool), "fgd_cpu", frag).round(3).tolist()
    [0.98, 1.0, 0.0]
    >>> fgd_fit(free, np.array([2, 2, 2]), 1, np.array([True, False, True]), "fgd_cpu", frag).round(3).tolist()
    [0.0, 0.0, 1.0]
    """
    if effective_policy(policy, fragmentation) != "fgd_cpu":
        return None
    milli = MILLI_PER_GPU if gpus else 0
    return _policy_fit(free_milli, gpu_count, gpus, milli, feasible, "fgd_cpu", fragmentation, best_fit_ties=gpus > 0)


def _policy_fit(
    free_milli: npt.NDArray[np.int32],
    gpu_count: npt.NDArray[np.int32],
    num_gpu: int,
    milli: int,
    feasible: npt.NDArray[np.bool_],
    policy: str,
    fragmentation: Fragmentation | None,
    *,
    best_fit_ties: bool = False,
) -> npt.NDArray[np.float64]:
    """The scorer ``policy``'s scores for a task of ``num_gpu`` x ``milli`` on the ``feasible`` rows,
    min-max scaled to [0, 1] (0 elsewhere; 1 everywhere when they all tie); with ``best_fit_ties``,
    when the policy scores every row alike, they rank by the whole GPUs the task leaves free, fewer
    first."""
    fit = np.zeros(free_milli.shape[0], dtype=np.float64)
    rows = np.flatnonzero(feasible)
    if rows.size == 0:
        return fit
    left = free_milli[rows].astype(np.int64)
    zeros = np.zeros(rows.size, dtype=np.int64)
    cpu, model_id, workload, frag, pod_cpu = zeros, zeros, _NO_WORKLOAD, np.zeros(rows.size), 0
    if policy == "fgd_cpu":
        assert fragmentation is not None  # effective_policy falls back without it
        cpu, model_id, workload = fragmentation.cpu_left[rows], fragmentation.model_id[rows], fragmentation.workload
        frag, pod_cpu = state_fragmentation(workload, left, cpu, model_id), fragmentation.pod_cpu
    cluster = Cluster(cpu, zeros, left, gpu_count[rows].astype(np.int64), model_id, ())
    context = Context(cluster, workload, frag, np.random.default_rng(0))
    scores, _gpus = share_policy(policy)(context, Task(pod_cpu, 0, num_gpu, milli), np.arange(rows.size))
    if best_fit_ties and scores.min() == scores.max():
        left_free = np.count_nonzero(left >= MILLI_PER_GPU, axis=1) - num_gpu
        scores = scores * _TIE_LEVELS + (_TIE_LEVELS - 1 - np.clip(left_free, 0, _TIE_LEVELS - 1))
    low, high = int(scores.min()), int(scores.max())
    fit[rows] = (scores - low) / (high - low) if high > low else 1.0
    return fit
