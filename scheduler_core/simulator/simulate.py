"""The FGD experiment protocol (``FGD_NOTES.md`` sections 2-3): a trace, a policy, a seed.

1. shuffle the tasks with the seed;
2. "tune": append tasks drawn at random (with replacement) until the GPU request would pass
   ``tune`` x the cluster's GPUs (the stop test adds the candidate's per-GPU ``gpu_milli``, as the
   authors' code does);
3. schedule one task at a time, no departures; a task that fits nowhere is dropped;
4. after every arrival, log arrived % (rounded) and the allocation, fragmentation amount and ratio.

Per integer arrived %, values are averaged over the arrivals that round to it.

Equal top scores (``tie``). FGD_NOTES.md says kube-scheduler breaks them at random; the authors'
simulator does something else, in two steps. Its vendored ``generic_scheduler.go`` replaces
``selectHost``'s reservoir sampling with "the smallest lexicographical order if the score remains the
same", and its ``syncClusterResourceList`` renames every node before creating it, prefixing the name
with its place in ``rand.Perm`` of the nodes (``"%04d-" + name``), drawn from the run's seed. So an
equal top score goes to the node that comes first in an order of the nodes shuffled once per run: the
same node keeps winning its ties all run long (ties consolidate), but which node that is, is random.
``tie="shuffled"``, the default, does that, with the order drawn from the seed's generator after the
task order. ``tie="first"`` gives ties to the first node in the node list
(:func:`scheduler_core.simulator.traces.read_nodes` orders openb's nodes by name, so the same few P100 nodes win
every tie), and ``tie="random"`` to one of the tied nodes uniformly at random, per decision.

On ``default`` (10 seeds, FGD at 100 % arrived; released 4.77) FGD leaves 4.73 % unallocated with
shuffled ties, 4.92 with ``first`` and 10.5 with ``random``: with per-decision random ties FGD spreads
whole-GPU tasks over the cluster and the 8-GPU tasks find no free node. GpuPacking and GpuClustering
score every CPU-only task 0 everywhere; with ``first`` those tasks fill the P100 nodes and strand their
GPUs, which put both 0.7-0.8 points above the released numbers until ties were shuffled.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scheduler_core.errors import InvalidArgsError
from scheduler_core.k8s.names import MILLI_PER_GPU
from scheduler_core.placement.model import Cluster, Task, Workload, whole_gpus
from scheduler_core.placement.moves import Placed, check_budget, plan_moves
from scheduler_core.placement.policies import Context, Scorer, registry
from scheduler_core.placement.policies.gpu_clustering import task_class


@dataclass(frozen=True)
class SimResult:
    """Curves indexed by integer arrived % (NaN where no arrival rounded to that value)."""

    policy: str
    seed: int
    unallocated_pct: npt.NDArray[np.float64]
    frag_amount_pct: npt.NDArray[np.float64]
    frag_ratio_pct: npt.NDArray[np.float64]
    tasks: int
    failed: int
    seconds: float
    moves: int = 0
    """Running tasks re-placed so that a blocked one fits (``simulate(..., moves=K)``; :mod:`.moves`)."""

    @property
    def moves_per_1000(self) -> float:
        """Moves per 1,000 arrivals."""
        return 1000.0 * self.moves / self.tasks if self.tasks else 0.0

    def at(self, curve: str, arrived: int) -> float:
        """``curve``'s value once ``arrived`` % of the capacity has arrived: at that percent, or, where no
        placement fell on it (a trace of a few dozen tasks arrives in steps of several percent), the last
        one before it; NaN past the end of the run.

        >>> curve = np.array([50.0, np.nan, np.nan, 40.0])
        >>> result = SimResult("p", 0, curve, curve, curve, tasks=4, failed=0, seconds=0.0)
        >>> result.at("unallocated_pct", 2), result.at("unallocated_pct", 3), result.at("unallocated_pct", 9)
        (50.0, 40.0, nan)
        """
        values: npt.NDArray[np.float64] = getattr(self, curve)
        if arrived >= values.shape[0]:
            return float("nan")
        seen = values[: arrived + 1][~np.isnan(values[: arrived + 1])]
        return float(seen[-1]) if seen.size else float("nan")


def check_trace(cluster: Cluster, tasks: Sequence[Task]) -> None:
    """Refuse what the protocol cannot run: no GPU node (GPU % has no denominator), or no task asking for
    a GPU (inflating to a multiple of the GPU capacity would never stop)."""
    if cluster.total_gpus <= 0:
        raise InvalidArgsError("the node list has no GPU node: unallocated GPU % is undefined")
    _require_gpu_tasks(tasks)


def _require_gpu_tasks(tasks: Sequence[Task]) -> None:
    if not any(task.gpu_milli > 0 for task in tasks):
        raise InvalidArgsError(
            "no task in the pod list asks for a GPU: it cannot be inflated to a multiple of the GPU capacity"
        )


def tune_order(tasks: Sequence[Task], total_gpus: int, tune: float, rng: np.random.Generator) -> list[int]:
    """Task indices: the originals shuffled, then random copies up to ``tune`` x the GPU capacity.
    Without a task that asks for a GPU the copies would never stop: that is refused here."""
    _require_gpu_tasks(tasks)
    order: list[int] = rng.permutation(len(tasks)).tolist()
    requested = sum(t.gpu_demand for t in tasks)
    limit = tune * total_gpus * MILLI_PER_GPU
    while True:
        pick = int(rng.integers(len(tasks)))
        if requested + tasks[pick].gpu_milli > limit:
            return order
        order.append(pick)
        requested += tasks[pick].gpu_demand


def until(order: Sequence[int], tasks: Sequence[Task], total_gpus: int, arrived_pct: float) -> list[int]:
    """``order`` cut before the first task whose arrival rounds the arrived GPU demand past
    ``arrived_pct`` % of the capacity (the protocol's x-axis)."""
    kept, arrived, capacity = [], 0, total_gpus * MILLI_PER_GPU
    for index in order:
        arrived += tasks[index].gpu_demand
        if round(100 * arrived / capacity) > arrived_pct:
            break
        kept.append(index)
    return kept


TIES = ("shuffled", "first", "random")


class Recorder:
    """The protocol's bookkeeping (steps 3-4): the cluster as tasks are placed, its fragmentation, and the
    curves, one arrival at a time. :func:`simulate` places the tasks itself; ``gpu-scheduler replay``
    records where the real kube-scheduler placed them, with the same definitions.

    ``state``, ``workload`` and ``frag`` (per-node fragmentation) are updated in place.
    """

    def __init__(self, cluster: Cluster, tasks: Sequence[Task], workload: Workload | None = None) -> None:
        self.state = cluster.copy()
        self.workload = workload or Workload.typical(tasks, self.state.models)
        self.frag = self.workload.fragmentation(self.state.gpu_left, self.state.cpu_left, self.state.model_id)
        self.capacity = self.state.total_gpus * MILLI_PER_GPU
        self._frag_total = float(self.frag.sum())
        self._arrived = self._allocated = 0
        self.failed = self.moves = 0
        self._rows: list[tuple[int, float, float, float]] = []  # arrived %, allocated %, frag amount, frag ratio

    def arrive(self, task: Task, node: int | None, gpus: Sequence[int] = ()) -> None:
        """One arrival: placed on ``node`` on GPUs ``gpus`` (indices on the node), or failed (None)."""
        self._arrived += task.gpu_demand
        if node is None:
            self.failed += 1
        else:
            self.take(node, task, gpus)
        idle = self.capacity - self._allocated
        self._rows.append((
            round(100 * self._arrived / self.capacity), 100 * self._allocated / self.capacity,
            100 * self._frag_total / self.capacity, 100 * self._frag_total / idle if idle else 0.0,
        ))  # fmt: skip

    def take(self, node: int, task: Task, gpus: Sequence[int]) -> None:
        """``task`` placed on ``node``, on GPUs ``gpus`` (its resources taken, the node's fragmentation
        updated); :meth:`arrive` logs it, :func:`~scheduler_core.simulator.churn.churn` does not."""
        self.state.place(node, task, list(gpus))
        self._allocated += task.gpu_demand
        self._refragment(node)

    def leave(self, node: int, task: Task, gpus: Sequence[int]) -> None:
        """A running task ended: what :meth:`take` took is given back."""
        self.state.release(node, task, list(gpus))
        self._allocated -= task.gpu_demand
        self._refragment(node)

    def move(self, task: Task, src: int, src_gpus: Sequence[int], dst: int, dst_gpus: Sequence[int]) -> None:
        """A running task re-placed: off ``src`` (GPUs ``src_gpus``), onto ``dst`` (``dst_gpus``). Nothing
        arrives, and the allocation stays; both nodes' fragmentation changes."""
        self.leave(src, task, src_gpus)
        self.take(dst, task, dst_gpus)
        self.moves += 1

    def context(self, rng: np.random.Generator) -> Context:
        """What a policy reads: this state, workload and fragmentation (kept current here)."""
        return Context(self.state, self.workload, self.frag, rng, [set() for _ in range(self.state.n_nodes)])

    def _refragment(self, node: int) -> None:
        state, row = self.state, slice(node, node + 1)
        new = float(self.workload.fragmentation(state.gpu_left[row], state.cpu_left[row], state.model_id[row])[0])
        self._frag_total += new - self.frag[node]
        self.frag[node] = new

    def result(self, policy: str, seed: int, seconds: float) -> SimResult:
        keys = np.array([r[0] for r in self._rows], dtype=np.int64)
        columns = np.array([r[1:] for r in self._rows], dtype=np.float64).reshape(-1, 3)
        return SimResult(
            policy=policy,
            seed=seed,
            unallocated_pct=100 - _bucket_mean(keys, columns[:, 0]),
            frag_amount_pct=_bucket_mean(keys, columns[:, 1]),
            frag_ratio_pct=_bucket_mean(keys, columns[:, 2]),
            tasks=len(self._rows),
            failed=self.failed,
            seconds=seconds,
            moves=self.moves,
        )


def simulate(
    cluster: Cluster, tasks: Sequence[Task], policy: str | Scorer, seed: int, *, tune: float = 1.3,
    workload: Workload | None = None, tie: str = "shuffled", arrived_pct: float | None = None,
    tie_order: int | None = None, moves: int = 0,
) -> SimResult:  # fmt: skip
    """Run the protocol once (up to ``arrived_pct`` % arrived, when given); ``cluster`` is not modified.

    ``tie_order`` draws the shuffled tie order from its own generator (``[seed, tie_order]``) instead of
    the seed's, after the task order: the same tasks in the same order, under another tie order.
    ``moves``: a task that fits nowhere may have up to that many running tasks re-placed so that it does
    (:mod:`scheduler_core.placement.moves`); 0, the protocol's, never moves one.
    """
    started = time.perf_counter()
    if tie not in TIES:
        raise ValueError(f"tie must be one of {', '.join(TIES)}, got {tie!r}")
    check_budget(moves)
    check_trace(cluster, tasks)
    scorer = registry()[policy].incremental() if isinstance(policy, str) else policy
    name = policy if isinstance(policy, str) else getattr(policy, "__module__", "custom")
    rng = np.random.default_rng(seed)
    recorder = Recorder(cluster, tasks, workload)
    state = recorder.state
    ctx = recorder.context(rng)
    order = tune_order(tasks, state.total_gpus, tune, rng)
    ties = rng if tie_order is None else np.random.default_rng([seed, tie_order])
    rank = ties.permutation(state.n_nodes) if tie == "shuffled" else np.arange(state.n_nodes)
    if arrived_pct is not None:
        order = until(order, tasks, state.total_gpus, arrived_pct)

    choose = Chooser(scorer, ctx, tie, rank)

    placed = Placed(state.n_nodes) if moves else None
    for arrival, index in enumerate(order):
        task = tasks[index]
        nodes = np.nonzero(state.feasible(task))[0]
        if nodes.size == 0 and placed is not None:
            nodes = make_room(ctx, placed, recorder, task, moves)
        if nodes.size == 0:
            recorder.arrive(task, None)
            continue
        node, chosen = choose(task, nodes)
        recorder.arrive(task, node, chosen)
        if placed is not None:
            placed.add(arrival, node, task, tuple(chosen))
        if task.num_gpu:
            ctx.classes[node].add(task_class(task))
    return recorder.result(name, seed, time.perf_counter() - started)


@dataclass
class Chooser:
    """The policy's node among the feasible ones, ties broken by the run's rule (``tie``: the node first in
    ``rank``, or one at random), and the GPUs the task takes there."""

    scorer: Scorer
    ctx: Context
    tie: str
    rank: npt.NDArray[np.intp]

    def __call__(self, task: Task, nodes: npt.NDArray[np.intp]) -> tuple[int, list[int]]:
        scores, gpus = self.scorer(self.ctx, task, nodes)
        top = np.nonzero(scores == scores.max())[0]
        if top.shape[0] == 1:
            pick = int(top[0])
        elif self.tie == "random":
            pick = int(top[self.ctx.rng.integers(top.shape[0])])
        else:
            pick = int(top[np.argmin(self.rank[nodes[top]])])
        node = int(nodes[pick])
        return node, [int(gpus[pick])] if task.sharing else whole_gpus(self.ctx.cluster.gpu_left[node], task)


def make_room(ctx: Context, placed: Placed, recorder: Recorder, task: Task, budget: int) -> npt.NDArray[np.intp]:
    """Carry out the cheapest plan of at most ``budget`` moves after which ``task`` fits
    (:func:`~scheduler_core.placement.moves.plan_moves`); the node it then fits on as the only candidate,
    or none."""
    plan = plan_moves(ctx.cluster, placed, recorder.workload, task, budget)
    if plan is None:
        return np.zeros(0, dtype=np.intp)
    for move in plan.moves:
        placed.take(move.arrival)
        recorder.move(move.task, move.src, move.src_gpus, move.dst, move.dst_gpus)
        placed.add(move.arrival, move.dst, move.task, move.dst_gpus)
        if move.task.num_gpu:
            ctx.classes[move.dst].add(task_class(move.task))
    if not ctx.cluster.feasible(task)[plan.target]:  # the plan was made on a copy of this very state
        raise AssertionError(f"a plan of {len(plan.moves)} moves left the task unfit for node {plan.target}")
    return np.array([plan.target], dtype=np.intp)


def _bucket_mean(keys: npt.NDArray[np.int64], values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    size = int(keys.max()) + 1 if keys.size else 1
    count = np.bincount(keys, minlength=size)
    total = np.bincount(keys, weights=values, minlength=size)
    mean: npt.NDArray[np.float64] = np.divide(total, count, out=np.full(size, np.nan), where=count > 0)
    return mean
