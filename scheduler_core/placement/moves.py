"""Moves: when a task fits nowhere, re-place a few running tasks so that it does.

Placement alone stops at FGD's level on openb: once placed, a task never moves, so the GPUs, CPU and
memory a task needs can sit free in pieces on several nodes. With a move budget ``K``
(``simulate(..., moves=K)``, :func:`~scheduler_core.simulator.churn.churn`), a task that fits on no node
gets one more chance: :func:`plan_moves` looks for a *target* node where moving at most ``K`` running
tasks frees what the task needs, and returns the plan that moves the fewest tasks, then the fewest
GPU-milli (a move's cost is the work it interrupts; the product orders real moves by deletion cost,
which ranks pods by what is lost when they go).

How a plan is found, on a scratch copy of the cluster:

- the targets are the nodes whose GPU model the task allows and that have enough GPUs, the
  :data:`TARGETS` nearest to fitting (fewest GPU-milli short, then least CPU and memory short);
- on a target, tasks are taken off greedily: each time one whose leaving brings the task strictly nearer
  to fitting (nearest first, then the smaller task), trying the :data:`CANDIDATES` best;
- a task taken off goes where it fits, other than the nodes the plan is freeing, to the node whose
  fragmentation it raises least (FGD's own measure, :meth:`~scheduler_core.placement.model.Workload.fragmentation`);
  where it fits nowhere, one level deeper: a plan, from what is left of the budget, that frees a node for
  it (a chain: C moves off node m so that B fits there, so that the task fits where B was).

Where a running task could go is the question asked most, and at a busy moment the answer is nearly
always "nowhere": it is answered for the untouched nodes once per plan and task shape, and only the nodes
the plan touched are looked at again.

A plan is only a plan if the task fits once its moves are done; the caller carries the moves out as
planned and places the task on the target. :class:`Placed` is the bookkeeping this needs and the
protocol does not: which tasks run on which node, on which GPUs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from scheduler_core.errors import InvalidArgsError
from scheduler_core.placement.model import Cluster, Task, Workload
from scheduler_core.placement.policies.base import CPU_NORM

TARGETS = 16
"""The most target nodes a blocked task's plan is looked for on (the nearest to fitting)."""
CANDIDATES = 3
"""The most tasks tried at each greedy step on a target (the ones whose leaving helps most)."""
DEEPER_TARGETS = 4
"""The most nodes tried to make room for a task taken off a target that fits nowhere else."""
MEM_NORM = 1 << 20
"""Memory shortfalls are weighed per MiB over 1 TiB, as CPU's per milli-core over :data:`CPU_NORM`."""

Running = dict[int, tuple[Task, tuple[int, ...]]]
"""The tasks on one node: arrival id -> (task, the GPUs it holds there)."""


@dataclass(frozen=True)
class Move:
    """Running task ``arrival`` re-placed from ``src`` (its GPUs there) onto ``dst`` (GPUs ``dst_gpus``)."""

    arrival: int
    task: Task
    src: int
    src_gpus: tuple[int, ...]
    dst: int
    dst_gpus: tuple[int, ...]


@dataclass(frozen=True)
class Plan:
    """Moves, in order, after which the blocked task fits on ``target``; ``weight`` is the sum of the moved
    tasks' costs (:class:`Rules`; 0 in the simulator, which gives none)."""

    target: int
    moves: tuple[Move, ...]
    weight: float = 0.0

    @property
    def cost(self) -> tuple[int, float, int]:
        """Tasks moved, then their costs, then GPU-milli moved: what :func:`plan_moves` minimises."""
        return len(self.moves), self.weight, sum(move.task.gpu_demand for move in self.moves)


@dataclass(frozen=True)
class Rules:
    """What a real cluster adds to a plan (the product's consolidator; the simulator gives none).

    ``costs``: a running task's cost of moving (the product: its pod's deletion cost), minimised after
    the number of moves. ``where``: the nodes a running task may go to (its taints, node affinity,
    cordons), shape (n_nodes,); a task not in it may go wherever it fits. ``targets``: the nodes the
    blocked task may go to, None for all.
    """

    costs: Mapping[int, float] = field(default_factory=dict)
    where: Mapping[int, npt.NDArray[np.bool_]] = field(default_factory=dict)
    targets: npt.NDArray[np.bool_] | None = None
    closed: frozenset[int] = frozenset()
    """Nodes no task is moved onto (those earlier plans of the run freed for their own pod)."""

    def cost(self, arrival: int) -> float:
        return self.costs.get(arrival, 0.0)


NO_RULES = Rules()


class Placed:
    """The tasks running on each node (:data:`Running`), and the node each runs on."""

    def __init__(self, n_nodes: int) -> None:
        self.on: list[Running] = [{} for _ in range(n_nodes)]
        self.node_of: dict[int, int] = {}

    def add(self, arrival: int, node: int, task: Task, gpus: tuple[int, ...]) -> None:
        self.on[node][arrival] = (task, gpus)
        self.node_of[arrival] = node

    def take(self, arrival: int) -> tuple[int, Task, tuple[int, ...]]:
        """Remove task ``arrival``: the node it ran on, the task and its GPUs there."""
        node = self.node_of.pop(arrival)
        task, gpus = self.on[node].pop(arrival)
        return node, task, gpus


@dataclass
class _Fits:
    """Where each task shape fits on the cluster a plan starts from (computed once per shape)."""

    cluster: Cluster
    by_task: dict[Task, npt.NDArray[np.bool_]] = field(default_factory=dict)

    def base(self, task: Task) -> npt.NDArray[np.bool_]:
        if task not in self.by_task:
            self.by_task[task] = self.cluster.feasible(task)
        return self.by_task[task]


@dataclass
class _Scratch:
    """A plan's working copy: the cluster's free resources and the tasks on the nodes it touched."""

    cluster: Cluster
    placed: Placed
    workload: Workload
    fits: _Fits
    rules: Rules = NO_RULES
    touched: dict[int, Running] = field(default_factory=dict)
    moves: list[Move] = field(default_factory=list)

    def running(self, node: int) -> Running:
        return self.touched[node] if node in self.touched else self.placed.on[node]

    def copy(self) -> _Scratch:
        return _Scratch(
            self.cluster.copy(), self.placed, self.workload, self.fits, self.rules,
            {node: dict(tasks) for node, tasks in self.touched.items()}, list(self.moves),
        )  # fmt: skip

    @property
    def weight(self) -> float:
        return sum(self.rules.cost(move.arrival) for move in self.moves)

    def move(self, arrival: int, src: int, dst: int, dst_gpus: tuple[int, ...]) -> None:
        task, gpus = self.running(src)[arrival]
        self.touched.setdefault(src, dict(self.placed.on[src])).pop(arrival)
        self.touched.setdefault(dst, dict(self.placed.on[dst]))[arrival] = (task, dst_gpus)
        self.cluster.release(src, task, gpus)
        self.cluster.place(dst, task, dst_gpus)
        self.moves.append(Move(arrival, task, src, gpus, dst, dst_gpus))

    def fitting(
        self, task: Task, excluded: frozenset[int], allowed: npt.NDArray[np.bool_] | None = None
    ) -> npt.NDArray[np.intp]:
        """The nodes ``task`` fits on now, outside ``excluded`` and inside ``allowed`` (all when None): the
        start's answer, with the nodes this plan touched asked again."""
        fits = self.fits.base(task).copy()
        if self.touched:
            nodes = np.fromiter(self.touched, dtype=np.intp)
            fits[nodes] = self.cluster.feasible(task, nodes)
        if excluded:
            fits[list(excluded)] = False
        if allowed is not None:
            fits &= allowed
        return np.flatnonzero(fits)


def shortfall(task: Task, gpu_left: npt.NDArray[np.int64], cpu_left: npt.NDArray[np.int64],
              mem_left: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:  # fmt: skip
    """Per row: how far the task is from fitting, (GPUs short, CPU and memory short); both 0 where it fits.
    GPUs short is the milli, in GPUs, that the task's ``num_gpu`` roomiest GPUs lack of ``gpu_milli``
    each: it falls whenever a task leaves one of them, so a move that frees part of a GPU counts.

    >>> short = shortfall(Task(1000, 0, 2, 1000), np.array([[1000, 400]]), np.array([0]), np.array([0]))
    >>> [float(s[0]) for s in short]
    [0.6, 0.0078125]
    """
    if task.num_gpu == 0:
        gpus = np.zeros(gpu_left.shape[0])
    else:
        roomiest = -np.sort(-np.minimum(gpu_left, task.gpu_milli), axis=1)[:, : task.num_gpu]
        gpus = (task.num_gpu * task.gpu_milli - roomiest.sum(axis=1)) / 1000.0
    rest = np.clip(task.cpu - cpu_left, 0, None) / CPU_NORM + np.clip(task.mem - mem_left, 0, None) / MEM_NORM
    return gpus, rest


def _short_one(task: Task, gpu_left: list[int], cpu_left: int, mem_left: int) -> tuple[float, float]:
    """:func:`shortfall` for one node, on plain numbers (it is asked for every running task of a target).

    >>> _short_one(Task(1000, 0, 2, 1000), [1000, 400], 0, 0)
    (0.6, 0.0078125)
    """
    gpus = 0.0
    if task.num_gpu:
        roomiest = sorted((min(left, task.gpu_milli) for left in gpu_left), reverse=True)[: task.num_gpu]
        gpus = (task.num_gpu * task.gpu_milli - sum(roomiest)) / 1000.0
    return gpus, max(task.cpu - cpu_left, 0) / CPU_NORM + max(task.mem - mem_left, 0) / MEM_NORM


def check_budget(moves: object) -> None:
    """A move budget is a whole number of at least 0: :class:`InvalidArgsError` naming it otherwise."""
    if isinstance(moves, bool) or not isinstance(moves, int) or moves < 0:
        raise InvalidArgsError(f"moves must be a whole number of at least 0, got {moves!r}")


def plan_moves(
    cluster: Cluster, placed: Placed, workload: Workload, task: Task, budget: int, rules: Rules = NO_RULES
) -> Plan | None:
    """The cheapest plan of at most ``budget`` moves after which ``task`` fits on one node, or None (see
    the module docstring), under ``rules`` (none in the simulator). ``cluster`` and ``placed`` are not
    changed."""
    best: Plan | None = None
    fits = _Fits(cluster)
    for target in _targets(cluster, task, frozenset(), allowed=rules.targets):
        scratch = _Scratch(cluster.copy(), placed, workload, fits, rules)
        if _free(scratch, task, target, budget, frozenset({target}), deeper=True):
            plan = Plan(target, tuple(scratch.moves), scratch.weight)
            if best is None or plan.cost < best.cost:
                best = plan
                if plan.cost[0] <= 1 and not rules.costs:  # no plan has fewer; with costs, a cheaper one may
                    break
    return best


def plan_emptying(
    cluster: Cluster,
    placed: Placed,
    workload: Workload,
    node: int,
    budget: int,
    rules: Rules = NO_RULES,
    excluded: frozenset[int] = frozenset(),
) -> Plan | None:
    """A plan that moves every task :attr:`Placed.on` ``node`` off it (each where FGD's fragmentation rises
    least, outside ``excluded``, the largest first), in at most ``budget`` moves; None when one fits nowhere
    else, or the budget is short. ``cluster`` and ``placed`` are not changed. The product empties a node
    so that an autoscaler can remove it."""
    running = placed.on[node]
    if not running or len(running) > budget:
        return None
    scratch = _Scratch(cluster.copy(), placed, workload, _Fits(cluster), rules)
    for arrival in sorted(running, key=lambda a: (-running[a][0].gpu_demand, a)):
        if not _rehome(scratch, arrival, node, budget, excluded | {node}, deeper=False):
            return None
    return Plan(node, tuple(scratch.moves), scratch.weight)


def _targets(
    cluster: Cluster,
    task: Task,
    excluded: frozenset[int],
    most: int = TARGETS,
    allowed: npt.NDArray[np.bool_] | None = None,
) -> Iterator[int]:
    """The nodes a plan is looked for on (inside ``allowed``, all when None), nearest to fitting first."""
    where = cluster.model_mask(task.models)[cluster.model_id] & (cluster.gpu_count >= task.num_gpu)
    if allowed is not None:
        where &= allowed
    where[list(excluded)] = False
    rows = np.flatnonzero(where)
    gpus, rest = shortfall(task, cluster.gpu_left[rows], cluster.cpu_left[rows], cluster.mem_left[rows])
    for row in rows[np.lexsort((rest, gpus))[:most]].tolist():
        yield int(row)


def _short(scratch: _Scratch, task: Task, node: int) -> tuple[float, float]:
    c = scratch.cluster
    return _short_one(task, c.gpu_left[node].tolist(), int(c.cpu_left[node]), int(c.mem_left[node]))


def _free(scratch: _Scratch, task: Task, node: int, budget: int, excluded: frozenset[int], *, deeper: bool) -> bool:
    """Move tasks off ``node`` on ``scratch`` until ``task`` fits there, at most ``budget`` moves in all;
    whether it fits. ``scratch`` is left as the moves made it (a caller that may back out copies it)."""
    while (short := _short(scratch, task, node)) != (0.0, 0.0):
        if len(scratch.moves) >= budget:
            return False
        for arrival in _helpful(scratch, task, node, short):
            trial = scratch.copy()
            if _rehome(trial, arrival, node, budget, excluded, deeper=deeper):
                scratch.__dict__.update(trial.__dict__)
                break
        else:
            return False
    return True


def _helpful(scratch: _Scratch, task: Task, node: int, short: tuple[float, float]) -> list[int]:
    """The running tasks on ``node`` whose leaving brings ``task`` strictly nearer to fitting there, the
    :data:`CANDIDATES` that help most (then the smallest)."""
    c = scratch.cluster
    gpu_left, cpu_left, mem_left = c.gpu_left[node].tolist(), int(c.cpu_left[node]), int(c.mem_left[node])
    ranked = []
    for arrival, (other, gpus) in scratch.running(node).items():
        after = list(gpu_left)
        for gpu in gpus:
            after[gpu] += other.gpu_milli
        key = _short_one(task, after, cpu_left + other.cpu, mem_left + other.mem)
        if key < short:
            ranked.append((key, scratch.rules.cost(arrival), other.gpu_demand, other.cpu, arrival))
    return [entry[-1] for entry in sorted(ranked)[:CANDIDATES]]


def _rehome(scratch: _Scratch, arrival: int, src: int, budget: int, excluded: frozenset[int], *, deeper: bool) -> bool:
    """Move task ``arrival`` off ``src``: where it fits now (outside ``excluded``), else, ``deeper``, onto a
    node first freed for it by moves of its own. Whether it went."""
    task, _ = scratch.running(src)[arrival]
    allowed = scratch.rules.where.get(arrival)
    excluded = excluded | scratch.rules.closed
    dst = _destination(scratch, task, excluded | {src}, allowed)
    if dst is not None:
        scratch.move(arrival, src, *dst)
        return True
    if not deeper or len(scratch.moves) + 2 > budget:
        return False
    for node in _targets(scratch.cluster, task, excluded | {src}, DEEPER_TARGETS, allowed):
        trial = scratch.copy()
        if _free(trial, task, node, budget - 1, excluded | {src, node}, deeper=False):
            gpus = gpus_on(trial.cluster, task, node)
            trial.move(arrival, src, node, gpus)
            scratch.__dict__.update(trial.__dict__)
            return True
    return False


def _destination(
    scratch: _Scratch, task: Task, excluded: frozenset[int], allowed: npt.NDArray[np.bool_] | None = None
) -> tuple[int, tuple[int, ...]] | None:
    """Where ``task`` goes: among the nodes it fits on, outside ``excluded`` and inside ``allowed``, the one
    whose fragmentation it raises least (the lowest index on a tie); None if it fits nowhere."""
    rows = scratch.fitting(task, excluded, allowed)
    if rows.size == 0:
        return None
    c = scratch.cluster
    taken = _gpus_at(c.gpu_left[rows], task)
    gpu_after = c.gpu_left[rows].copy()
    np.subtract.at(gpu_after, (np.repeat(np.arange(rows.size), taken.shape[1]), taken.ravel()), task.gpu_milli)
    model = c.model_id[rows]
    before = scratch.workload.fragmentation(c.gpu_left[rows], c.cpu_left[rows], model)
    after = scratch.workload.fragmentation(gpu_after, c.cpu_left[rows] - task.cpu, model)
    best = int(np.argmin(after - before))
    return int(rows[best]), tuple(taken[best].tolist())


def gpus_on(cluster: Cluster, task: Task, node: int) -> tuple[int, ...]:
    """The GPUs ``task`` takes on ``node`` (:func:`_gpus_at`): the GPUs a placement takes there."""
    return tuple(_gpus_at(cluster.gpu_left[node : node + 1], task)[0].tolist())


def _gpus_at(gpu_left: npt.NDArray[np.int64], task: Task) -> npt.NDArray[np.intp]:
    """Per row, the GPUs ``task`` takes there, as placement takes them (:func:`whole_gpus`: among those
    with room, the least free first, then the lowest index; for a share that is the tightest fit).

    >>> _gpus_at(np.array([[1000, 300, 600]]), Task(0, 0, 1, 250)).tolist()
    [[1]]
    """
    room = np.where(gpu_left >= task.gpu_milli, gpu_left, np.iinfo(np.int64).max)
    order = np.lexsort((np.broadcast_to(np.arange(gpu_left.shape[1]), gpu_left.shape), room), axis=1)
    taken: npt.NDArray[np.intp] = order[:, : task.num_gpu]
    return taken
