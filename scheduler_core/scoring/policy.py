"""The share policy: where the extender places a pod, and how it breaks ties. One object, one file.

:class:`SharePolicy` is what ``prioritize``, ``explain``, ``bench kube-scores`` and ``bench
share-policy`` call, and :func:`share_policy` the only place a policy is found by name. A policy is
declared once in :mod:`scheduler_core.placement.policies` (its scorer, whether it reads node CPU and pod
shapes, whether it places whole GPUs and pods without GPUs, what it falls back to); ``simulate`` runs
the same scorer. The policies the extender offers:

- ``fgd_cpu`` (the default, ours): FGD, the fragmentation gradient of Weng et al. (ATC '23), scored
  against the typical shapes of the pods the snapshot saw on GPU nodes and each node's free CPU, for
  every pod: shares, whole GPUs and pods without GPUs. A snapshot without those (written before they
  existed), or whose shapes ask for no GPU (no GPU pod has run yet), leaves the pod to its fallback,
  ``gpu_packing``.
- ``gpu_packing``, ``bestfit``, ``dotprod``: shares only, on the nodes' free GPU milli; whole GPUs go by
  best fit (:func:`~scheduler_core.scoring.gpu_score.score_nodes`), a pod without GPUs by kube-scheduler's
  plugins alone.

The tie rules, all here:

1. **The policy's own scorer** may break its own ties (``fgd_cpu`` sends a pod without GPUs, among the
   nodes FGD scores alike, to those with no free GPU milli: ``scheduler_core/placement/policies/fgd_cpu.py``).
2. **Best fit where the policy has no preference** (:meth:`SharePolicy.node_scores`): for whole GPUs,
   when a policy that places them scores every feasible node alike, the nodes rank by the whole GPUs
   the pod leaves free, fewer first.
3. **One node at the top** (:func:`break_top_tie`): when several nodes reach 10 after the blend with
   utilisation and locality, the first in the node table's fixed order
   (:attr:`~scheduler_core.k8s.nodes.NodeTable.tie_rank`) keeps 10 and the others drop one point.

``gpu-scheduler bench share-policy`` measures the policies on the openb trace, the extender's limits
included (shapes as a snapshot sees them, the tightest GPU at bind). CPU and memory feasibility stay
kube-scheduler's; FGD reads the CPU only to judge which GPUs the typical pods could still use.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from functools import cache

import numpy as np
import numpy.typing as npt

from scheduler_core.errors import ConfigError
from scheduler_core.k8s.names import MILLI_PER_GPU
from scheduler_core.k8s.nodes import NodeTable
from scheduler_core.k8s.pods import PodDemand
from scheduler_core.placement.model import Cluster, Task, Workload
from scheduler_core.placement.policies import Context, Policy, Scores, registry
from scheduler_core.placement.policies.fgd import state_fragmentation
from scheduler_core.placement.policies.memo import ScoreMemo
from scheduler_core.scoring.gpu_fit import MAX_EXTENDER_PRIORITY, ScoreResult, ScoreWeights, true_per_row
from scheduler_core.scoring.gpu_score import score_nodes

SHARE_POLICIES = tuple(name for name, policy in registry().items() if policy.extender)
"""The policies the extender offers, the default first."""
DEFAULT_SHARE_POLICY = SHARE_POLICIES[0]
_NO_WORKLOAD = Workload(
    cpu=np.zeros(0, dtype=np.int64),
    gpu_milli=np.zeros(0, dtype=np.int64),
    num_gpu=np.zeros(0, dtype=np.int64),
    popularity=np.zeros(0, dtype=np.float64),
    allowed=np.zeros((0, 0), dtype=bool),
)
_TIE_LEVELS = 1000
"""More than any node's GPUs: the best-fit key sits below one step of the policy's score."""


@dataclass(frozen=True)
class Fragmentation:
    """What a policy that reads CPU needs besides the GPUs, per candidate row.

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
    slots : ndarray of shape (n_rows,), intp, optional
        Each row's stable position (its row in the cluster state; -1 where the state lacks the node),
        under which a policy whose scores are per node keeps them between calls (:class:`ScoreMemo`);
        None keeps nothing.
    workload_key : hashable
        What the scores kept under ``slots`` depend on besides the rows: the state's shapes, their
        popularity and the models (:attr:`~scheduler_core.state.cluster.ClusterState.workload_key`).
    source : object
        The immutable cluster state the rows come from (None: not immutable).
    overlaid : ndarray of shape (n_rows,), bool, optional
        The rows whose inputs differ from ``source``'s for this request (ledger readings laid over, CPU
        assumed taken): scored from the request's view, never kept under ``source``.
    """

    cpu_left: npt.NDArray[np.int64]
    model_id: npt.NDArray[np.int64]
    workload: Workload
    pod_cpu: int
    slots: npt.NDArray[np.intp] | None = None
    workload_key: Hashable = None
    source: object = None
    overlaid: npt.NDArray[np.bool_] | None = None


def share_policy(name: str) -> SharePolicy:
    """The extender's policy called ``name``; :class:`ConfigError` naming the choices for any other name.

    >>> share_policy("gpu_packing").places_all_pods
    False
    >>> share_policy("fgd")
    Traceback (most recent call last):
    ...
    scheduler_core.errors.ConfigError: share policy 'fgd': expected one of fgd_cpu, gpu_packing, bestfit, dotprod
    """
    if name not in SHARE_POLICIES:
        raise ConfigError(f"share policy {name!r}: expected one of {', '.join(SHARE_POLICIES)}")
    return _policy(name)


@cache
def _policy(name: str) -> SharePolicy:
    return SharePolicy(name, registry()[name])


@dataclass(frozen=True)
class SharePolicy:
    """A declared placement policy, as the extender runs it (see the module docstring)."""

    name: str
    declared: Policy
    memo: ScoreMemo = field(default_factory=ScoreMemo, compare=False, repr=False)
    """The per-node scores kept between calls, for a policy whose scores are per node (FGD's)."""

    @property
    def reads_cpu(self) -> bool:
        """Whether it needs :class:`Fragmentation` (node CPU, GPU models, pod shapes)."""
        return self.declared.reads_cpu

    @property
    def places_all_pods(self) -> bool:
        """Whether it places whole GPUs and pods without GPUs as well as shares."""
        return self.declared.places_all_pods

    def places(self, demand: PodDemand) -> bool:
        """Whether it has a say on ``demand`` (and so needs each GPU's free milli in the view)."""
        return bool(demand.share) or self.places_all_pods

    def assumes_cpu_only(self) -> bool:
        """Whether the extender records its prediction for a pod without GPUs: only a policy that
        places them reads the CPU such a pod takes."""
        return self.places_all_pods and self.reads_cpu

    def effective(self, fragmentation: Fragmentation | None) -> SharePolicy:
        """This policy, or its fallback when it reads CPU and there is nothing to score against: no
        fragmentation inputs, or no shape that asks for a GPU (every node would score the same)."""
        if self.reads_cpu and (fragmentation is None or not fragmentation.workload.num_gpu.any()):
            return _policy(self.declared.fallback)
        return self

    def node_scores(
        self,
        free_milli: npt.NDArray[np.int32],
        gpu_count: npt.NDArray[np.int32],
        demand: PodDemand,
        feasible: npt.NDArray[np.bool_],
        fragmentation: Fragmentation | None = None,
    ) -> npt.NDArray[np.int64] | None:
        """The policy's integer scores on the ``feasible`` rows (in row order), with the best-fit tie
        rule for whole GPUs; None where it has no say on ``demand`` (see :meth:`preference`)."""
        policy = self.effective(fragmentation)
        if not policy.places(demand):
            return None
        rows = np.flatnonzero(feasible)
        if rows.size == 0:
            return np.zeros(0, dtype=np.int64)
        num_gpu = 1 if demand.share else demand.gpus
        milli = demand.share or (MILLI_PER_GPU if demand.gpus else 0)
        count = gpu_count[rows].astype(np.int64)
        if not policy.reads_cpu:
            zeros = np.zeros(rows.size, dtype=np.int64)
            left = np.take(free_milli, rows, axis=0).astype(np.int64)
            task = Task(0, 0, num_gpu, milli)
            scores, _ = _policy_scores(policy.declared, _NO_WORKLOAD, task, count, left, zeros, zeros)
        else:
            assert fragmentation is not None  # effective() falls back without it
            frag, task = fragmentation, Task(fragmentation.pod_cpu, 0, num_gpu, milli)

            def inputs(
                positions: npt.NDArray[np.intp] | None,
            ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
                at = rows if positions is None else rows[positions]
                return np.take(free_milli, at, axis=0).astype(np.int64), frag.cpu_left[at], frag.model_id[at]

            def compute(positions: npt.NDArray[np.intp] | None) -> Scores:
                at_count = count if positions is None else count[positions]
                return _policy_scores(policy.declared, frag.workload, task, at_count, *inputs(positions))

            if policy.declared.per_node and frag.slots is not None:
                fixed = None if frag.overlaid is None else ~frag.overlaid[rows]
                scores, _ = policy.memo.scores(
                    frag.workload_key, task, frag.slots[rows], free_milli.shape[1], inputs, compute,
                    frag.source, fixed,
                )  # fmt: skip
            else:
                scores, _ = compute(None)
        if not demand.share and num_gpu and scores.min() == scores.max():
            left_free = true_per_row(np.take(free_milli, rows, axis=0) >= MILLI_PER_GPU) - num_gpu
            scores = scores * _TIE_LEVELS + (_TIE_LEVELS - 1 - np.clip(left_free, 0, _TIE_LEVELS - 1))
        return scores.astype(np.int64, copy=False)

    def preference(
        self,
        free_milli: npt.NDArray[np.int32],
        gpu_count: npt.NDArray[np.int32],
        demand: PodDemand,
        feasible: npt.NDArray[np.bool_],
        fragmentation: Fragmentation | None = None,
    ) -> npt.NDArray[np.float64] | None:
        """The policy's preference per node, min-max scaled to [0, 1] over the ``feasible`` nodes (0
        elsewhere; 1 everywhere when they all tie): the fit term :meth:`scores` blends. None where the
        policy has no say: a whole-GPU pod or a pod without GPUs under a policy that places only shares
        (whole GPUs then go by best fit, a pod without GPUs by nobody here).

        Parameters
        ----------
        free_milli : ndarray of shape (n_nodes, max_gpus)
            Free thousandths of each GPU; 0 past a node's GPUs.
        gpu_count : ndarray of shape (n_nodes,)
        fragmentation : Fragmentation, optional
            For a policy that reads CPU; without it (or with no GPU shape) its fallback decides.

        With ``gpu_packing``: the shared GPU first, then the smaller idle node (1 GPU) just above the
        2-GPU one.

        >>> free = np.array([[1000, 1000], [400, 1000], [1000, 0]], dtype=np.int32)
        >>> share = PodDemand(gpus=1, share=300)
        >>> share_policy("gpu_packing").preference(free, np.array([2, 2, 1]), share, np.ones(3, bool)).round(3).tolist()
        [0.0, 1.0, 0.015]

        ``fgd_cpu`` sends a pod without GPUs where its CPU strands no GPU, and whole GPUs where they
        fragment the least:

        >>> shapes = Workload.from_shapes([((8000, 1000, 1, ""), 1)], ("A100", ""))
        >>> free = np.array([[1000, 1000], [0, 0], [1000, 0]], dtype=np.int32)
        >>> frag = Fragmentation(np.array([16000, 16000, 9000]), np.zeros(3, dtype=np.int64), shapes, 2000)
        >>> fgd_cpu = share_policy("fgd_cpu")
        >>> fgd_cpu.preference(free, np.array([2, 2, 2]), PodDemand(), np.ones(3, bool), frag).round(3).tolist()
        [0.98, 1.0, 0.0]
        >>> one = PodDemand(gpus=1)
        >>> fgd_cpu.preference(free, np.array([2, 2, 2]), one, np.array([True, False, True]), frag).round(3).tolist()
        [0.0, 0.0, 1.0]
        """
        scores = self.node_scores(free_milli, gpu_count, demand, feasible, fragmentation)
        if scores is None:
            return None
        fit = np.zeros(free_milli.shape[0], dtype=np.float64)
        rows = np.flatnonzero(feasible)
        if rows.size:
            low, high = int(scores.min()), int(scores.max())
            fit[rows] = (scores - low) / (high - low) if high > low else 1.0
        return fit

    def scores(
        self,
        table: NodeTable,
        free: npt.NDArray[np.int32],
        utilization: npt.NDArray[np.float64],
        demand: PodDemand,
        weights: ScoreWeights,
        feasible: npt.NDArray[np.bool_],
        *,
        locality: npt.NDArray[np.float64] | None = None,
        fit: npt.NDArray[np.float64] | None = None,
    ) -> ScoreResult:
        """The extender's 0..10 per node: ``fit`` (:meth:`preference`; best fit where it is None)
        blended with utilisation and ``locality`` by :func:`~scheduler_core.scoring.gpu_score.score_nodes`,
        then one node left at the top (:func:`break_top_tie`)."""
        result = score_nodes(table, free, utilization, demand, weights, feasible=feasible, locality=locality, fit=fit)
        break_top_tie(result.score, table)
        return result


def _policy_scores(
    declared: Policy,
    workload: Workload,
    task: Task,
    gpu_count: npt.NDArray[np.int64],
    left: npt.NDArray[np.int64],
    cpu: npt.NDArray[np.int64],
    model_id: npt.NDArray[np.int64],
) -> Scores:
    """``declared``'s scores for ``task`` on these candidate rows, each row's fragmentation computed
    here when the policy reads CPU."""
    frag = state_fragmentation(workload, left, cpu, model_id) if declared.reads_cpu else np.zeros(left.shape[0])
    cluster = Cluster(cpu, np.zeros_like(cpu), left, gpu_count, model_id, ())
    context = Context(cluster, workload, frag, np.random.default_rng(0))
    return declared(context, task, np.arange(left.shape[0]))


def break_top_tie(score: npt.NDArray[np.int64], table: NodeTable) -> None:
    """Leave one node at the top score: the first of the tied ones in the table's fixed order
    (:attr:`NodeTable.tie_rank`); every other node above 1 drops one point, in place, so the order
    below the winner stays as it was (the tied ones are still above the rest).

    kube-scheduler would break such a tie with its own plugins and then at random, per pod. Broken
    here, it goes to the same node every time, for every kind of pod, so pods consolidate on it as in
    the simulator, where one node order breaks every tie of a run. Pods without GPUs must take part:
    left to ``MostAllocated`` and chance, their CPU went elsewhere than the shares, and stranded the
    shares' GPUs (openb ``gpushare100``, modelled over 5 seeds by ``gpu-scheduler bench kube-scores``:
    15.41 % of GPUs unallocated against 13.49; ``docs/benchmarks.md#kube-schedulers-arithmetic-in-the-simulator``).
    Dropping only the tied ones to the next level would merge them with the nodes that were there.

    >>> table = NodeTable.from_columns(alloc_gpus=[8, 8, 8, 8], names=["a", "b", "c", "d"])
    >>> score = np.array([10, 10, 9, 1])
    >>> break_top_tie(score, table)
    >>> dict(zip(table.names, score.tolist()))  # crc32: "b" ranks before "a"
    {'a': 9, 'b': 10, 'c': 8, 'd': 1}
    """
    top = np.flatnonzero(score == MAX_EXTENDER_PRIORITY)
    if top.size > 1:
        winner = top[int(np.argmin(table.tie_rank[top]))]
        np.subtract(score, 1, out=score, where=score > 1)
        score[winner] = MAX_EXTENDER_PRIORITY
