"""Churn: pods come and go at the trace's times, and a pod that fits nowhere waits.

:func:`~scheduler_core.simulator.simulate.simulate` runs FGD's protocol: arrivals only, and a task that
fits nowhere is dropped. A real cluster is not like that: pods end, their GPUs come free in pieces, and a
pod that fits nowhere waits in the queue until something ends (or, with moves, until a few running pods
are re-placed to make room: :mod:`scheduler_core.placement.moves`). :func:`churn` replays that:

- each task arrives at its ``creation_time`` and runs for ``deletion_time - creation_time`` (at least
  one second) once placed; the tasks are placed by the policy, in arrival order, ties by the seed's node
  order as in ``simulate``;
- a task that fits nowhere waits. Whenever tasks end, the waiting ones are tried again, oldest first;
  each one that fits is placed (kube-scheduler's queue: a waiting pod does not hold back the others);
- with a move budget ``K``: a task that fits nowhere when it arrives, and the oldest waiting task each
  time tasks end, may have up to ``K`` running tasks re-placed so that it fits.

The openb traces' times do not fill the cluster: read as they are, the busiest moment of ``default`` asks
for 1.1 % of its GPUs, and nothing would wait. ``load`` compresses the time between arrivals (the run
lengths are kept) until the busiest moment of the trace, as if every pod were placed at once, asks for
``load`` times the cluster's GPUs: at 1.0 the peak just fits if nothing is fragmented.

Reported (:class:`ChurnResult`): the share of arrivals that waited, the GPU-hours they waited (a pod's
GPUs times its wait), apart those of the tasks never placed (each waiting until the last event: one pod
that fits no node at all would outweigh every other wait), and moves per 1,000 arrivals.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scheduler_core.errors import InvalidArgsError
from scheduler_core.k8s.names import MILLI_PER_GPU
from scheduler_core.placement.model import Cluster, Task, Workload
from scheduler_core.placement.moves import Placed, check_budget
from scheduler_core.placement.policies import registry
from scheduler_core.placement.policies.gpu_clustering import task_class
from scheduler_core.simulator.simulate import Chooser, Recorder, check_trace, make_room

MAX_WAITING_TRIES = 64
"""The most distinct task shapes tried again from the queue each time tasks end: a shape that did not
fit is not tried again in the same pass (its other tasks would not fit either)."""


@dataclass(frozen=True)
class ChurnResult:
    policy: str
    seed: int
    load: float
    moves_budget: int
    arrivals: int
    waited: int
    """Arrivals that fit nowhere when they came (placed later, or never)."""
    never_placed: int
    gpu_hours_waited: float
    """GPU-hours the tasks placed after a wait waited."""
    gpu_hours_never_placed: float
    """GPU-hours the tasks never placed waited, each until the last event."""
    gpu_hours_run: float
    """The GPU-hours the trace's tasks run for: what the waits compare with."""
    moves: int
    compression: float
    """How many times faster than the trace's clock the arrivals come."""
    seconds: float

    @property
    def waited_pct(self) -> float:
        return 100.0 * self.waited / self.arrivals if self.arrivals else 0.0

    @property
    def moves_per_1000(self) -> float:
        return 1000.0 * self.moves / self.arrivals if self.arrivals else 0.0


def compression_for(tasks: Sequence[Task], times: Sequence[tuple[int, int]], capacity_milli: int, load: float) -> float:
    """The factor by which the gaps between arrivals shrink so that the busiest moment, every task placed
    at once, asks for ``load`` x ``capacity_milli`` GPU-milli (found by bisection on a log scale; 1.0
    where the trace's own clock already reaches it).

    >>> tasks = [Task(0, 0, 1, 1000)] * 2
    >>> round(compression_for(tasks, [(0, 10), (100, 110)], 2000, 1.0), 1)  # both at once: gaps / 10 or less
    10.0
    """
    if not 0 < load <= 100:
        raise InvalidArgsError(f"load must be above 0 and at most 100, got {load}")
    starts = np.array([t[0] for t in times], dtype=np.float64)
    runs = np.array([_run_seconds(t) for t in times], dtype=np.float64)
    demand = np.array([task.gpu_demand for task in tasks], dtype=np.float64)
    target = load * capacity_milli
    if _peak(starts, runs, demand) >= target:
        return 1.0
    low, high = 1.0, 1.0
    while _peak((starts - starts.min()) / high, runs, demand) < target:
        low, high = high, high * 2
        if high > 1e12:
            raise InvalidArgsError(f"the trace never asks for {load} x the GPUs, even with every task at once")
    for _ in range(60):
        middle = (low * high) ** 0.5
        if _peak((starts - starts.min()) / middle, runs, demand) >= target:
            high = middle
        else:
            low = middle
    return high


def _peak(starts: npt.NDArray[np.float64], runs: npt.NDArray[np.float64], demand: npt.NDArray[np.float64]) -> float:
    """The most GPU-milli running at once if every task started when it arrived."""
    at = np.concatenate([starts, starts + runs])
    change = np.concatenate([demand, -demand])
    order = np.lexsort((change, at))  # at one instant, ends before starts
    return float(np.cumsum(change[order]).max()) if at.size else 0.0


def _run_seconds(span: tuple[int, int]) -> int:
    return max(span[1] - span[0], 1)


def churn(
    cluster: Cluster, tasks: Sequence[Task], times: Sequence[tuple[int, int]], policy: str, seed: int, *,
    load: float = 1.0, moves: int = 0, workload: Workload | None = None,
) -> ChurnResult:  # fmt: skip
    """Replay ``tasks`` arriving and ending at ``times`` (``(creation, deletion)`` seconds, one per task)
    on ``cluster`` (not modified); see the module docstring."""
    started = time.perf_counter()
    if len(times) != len(tasks):
        raise InvalidArgsError(f"{len(times)} (creation, deletion) times for {len(tasks)} tasks")
    check_budget(moves)
    check_trace(cluster, tasks)
    recorder = Recorder(cluster, tasks, workload)
    factor = compression_for(tasks, times, recorder.capacity, load)
    run = _Run(recorder, tasks, times, policy, seed, moves, factor)
    run.replay()
    return ChurnResult(
        policy=policy, seed=seed, load=load, moves_budget=moves, arrivals=len(tasks), waited=run.waited,
        never_placed=len(run.queue), gpu_hours_waited=run.waited_milli_seconds / MILLI_PER_GPU / 3600,
        gpu_hours_never_placed=run.never_milli_seconds / MILLI_PER_GPU / 3600,
        gpu_hours_run=sum(t.gpu_demand * _run_seconds(s) for t, s in zip(tasks, times, strict=True)) / MILLI_PER_GPU
        / 3600,
        moves=recorder.moves, compression=factor, seconds=time.perf_counter() - started,
    )  # fmt: skip


class _Run:
    """One replay's clock, queue and running tasks."""

    def __init__(
        self, recorder: Recorder, tasks: Sequence[Task], times: Sequence[tuple[int, int]], policy: str, seed: int,
        moves: int, factor: float,
    ) -> None:  # fmt: skip
        self.recorder, self.tasks, self.times, self.budget = recorder, tasks, times, moves
        rng = np.random.default_rng(seed)
        self.ctx = recorder.context(rng)
        rank = rng.permutation(recorder.state.n_nodes)
        self.choose = Chooser(registry()[policy].incremental(), self.ctx, "shuffled", rank)
        first = min((t[0] for t in times), default=0)
        self.arrive_at = [(t[0] - first) / factor for t in times]
        self.placed = Placed(recorder.state.n_nodes)
        self.ends: list[tuple[float, int]] = []  # (time, task) of the running tasks
        self.queue: dict[int, float] = {}  # waiting task -> when it arrived, oldest first
        self.waited = 0
        self.waited_milli_seconds = self.never_milli_seconds = 0.0
        self.now = 0.0

    def replay(self) -> None:
        order = sorted(range(len(self.tasks)), key=lambda i: (self.arrive_at[i], i))
        for index in order:
            self._end_until(self.arrive_at[index])
            self.now = self.arrive_at[index]
            if not self._try(index, plan=True):
                self.queue[index] = self.now
                self.waited += 1
        self._end_until(float("inf"))
        for index, since in self.queue.items():  # never placed: they waited until the last event
            self.never_milli_seconds += self.tasks[index].gpu_demand * (self.now - since)

    def _end_until(self, until: float) -> None:
        """End every task due by ``until``, trying the queue after each instant's ends."""
        while self.ends and self.ends[0][0] <= until:
            self.now = self.ends[0][0]
            while self.ends and self.ends[0][0] == self.now:
                _, index = heapq.heappop(self.ends)
                node, task, gpus = self.placed.take(index)
                self.recorder.leave(node, task, gpus)
            self._retry()

    def _retry(self) -> None:
        """The waiting tasks, oldest first, each placed where it now fits; the oldest may have a plan made
        for it. A shape that did not fit is not tried again in this pass."""
        failed: set[Task] = set()
        for position, index in enumerate(list(self.queue)):
            task = self.tasks[index]
            if task in failed:
                continue
            if self._try(index, plan=position == 0):
                since = self.queue.pop(index)
                self.waited_milli_seconds += task.gpu_demand * (self.now - since)
            else:
                failed.add(task)
                if len(failed) >= MAX_WAITING_TRIES:
                    return

    def _try(self, index: int, *, plan: bool) -> bool:
        """Place task ``index`` now, with a plan of moves if ``plan`` and a budget; whether it was placed."""
        task = self.tasks[index]
        nodes = np.flatnonzero(self.recorder.state.feasible(task))
        if nodes.size == 0 and plan and self.budget:
            nodes = make_room(self.ctx, self.placed, self.recorder, task, self.budget)
        if nodes.size == 0:
            return False
        node, gpus = self.choose(task, nodes)
        self.recorder.take(node, task, gpus)
        self.placed.add(index, node, task, tuple(gpus))
        if task.num_gpu:
            self.ctx.classes[node].add(task_class(task))
        heapq.heappush(self.ends, (self.now + _run_seconds(self.times[index]), index))
        return True
