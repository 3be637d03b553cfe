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
(:func:`gpu_scheduler.traces.read_nodes` orders openb's nodes by name, so the same few P100 nodes win
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
from scheduler_core.sharing.model import Cluster, Task, Workload, whole_gpus
from scheduler_core.sharing.policies import Context, Scorer, registry
from scheduler_core.sharing.policies.gpu_clustering import task_class


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

    def at(self, curve: str, arrived: int) -> float:
        values: npt.NDArray[np.float64] = getattr(self, curve)
        return float(values[arrived]) if arrived < values.shape[0] else float("nan")


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


TIES = ("shuffled", "first", "random")


def simulate(
    cluster: Cluster, tasks: Sequence[Task], policy: str | Scorer, seed: int, *, tune: float = 1.3,
    workload: Workload | None = None, tie: str = "shuffled",
) -> SimResult:  # fmt: skip
    """Run the protocol once; ``cluster`` is not modified."""
    started = time.perf_counter()
    if tie not in TIES:
        raise ValueError(f"tie must be one of {', '.join(TIES)}, got {tie!r}")
    check_trace(cluster, tasks)
    scorer = registry()[policy] if isinstance(policy, str) else policy
    name = policy if isinstance(policy, str) else getattr(policy, "__module__", "custom")
    rng = np.random.default_rng(seed)
    state = cluster.copy()
    workload = workload or Workload.typical(tasks, state.models)
    frag = workload.fragmentation(state.gpu_left, state.cpu_left, state.model_id)
    ctx = Context(state, workload, frag, rng, [set() for _ in range(state.n_nodes)])
    capacity = state.total_gpus * MILLI_PER_GPU
    order = tune_order(tasks, state.total_gpus, tune, rng)
    rank = rng.permutation(state.n_nodes) if tie == "shuffled" else np.arange(state.n_nodes)
    n = len(order)
    arrived_pct = np.empty(n, dtype=np.int64)
    allocated_pct = np.empty(n)
    frag_amount = np.empty(n)
    frag_ratio = np.empty(n)
    arrived = allocated = 0
    failed = 0
    frag_total = float(frag.sum())
    for step, index in enumerate(order):
        task = tasks[index]
        arrived += task.gpu_demand
        nodes = np.nonzero(state.feasible(task))[0]
        if nodes.size == 0:
            failed += 1
        else:
            scores, gpus = scorer(ctx, task, nodes)
            top = np.nonzero(scores == scores.max())[0]
            if top.shape[0] == 1:
                pick = int(top[0])
            elif tie == "random":
                pick = int(top[rng.integers(top.shape[0])])
            else:
                pick = int(top[np.argmin(rank[nodes[top]])])
            node = int(nodes[pick])
            chosen = [int(gpus[pick])] if task.sharing else whole_gpus(state.gpu_left[node], task)
            state.place(node, task, chosen)
            allocated += task.gpu_demand
            if task.num_gpu:
                ctx.classes[node].add(task_class(task))
            row = slice(node, node + 1)
            new = float(workload.fragmentation(state.gpu_left[row], state.cpu_left[row], state.model_id[row])[0])
            frag_total += new - frag[node]
            frag[node] = new
        arrived_pct[step] = round(100 * arrived / capacity)
        allocated_pct[step] = 100 * allocated / capacity
        frag_amount[step] = 100 * frag_total / capacity
        idle = capacity - allocated
        frag_ratio[step] = 100 * frag_total / idle if idle else 0.0
    return SimResult(
        policy=name,
        seed=seed,
        unallocated_pct=100 - _bucket_mean(arrived_pct, allocated_pct),
        frag_amount_pct=_bucket_mean(arrived_pct, frag_amount),
        frag_ratio_pct=_bucket_mean(arrived_pct, frag_ratio),
        tasks=n,
        failed=failed,
        seconds=time.perf_counter() - started,
    )


def _bucket_mean(keys: npt.NDArray[np.int64], values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    size = int(keys.max()) + 1 if keys.size else 1
    count = np.bincount(keys, minlength=size)
    total = np.bincount(keys, weights=values, minlength=size)
    mean: npt.NDArray[np.float64] = np.divide(total, count, out=np.full(size, np.nan), where=count > 0)
    return mean
