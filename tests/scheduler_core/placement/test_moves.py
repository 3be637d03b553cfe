"""Moves in the simulator: the plans, their budget, and ``simulate(..., moves=K)``."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest

from scheduler_core.placement.model import Cluster, Task, Workload
from scheduler_core.placement.moves import Move, Placed, plan_moves
from scheduler_core.simulator.simulate import simulate
from scheduler_core.simulator.traces import synthetic_trace

WHOLE = Task(1000, 1024, 1, 1000)


def _cluster(*nodes: tuple[int, int, int]) -> Cluster:
    """Nodes of (CPU milli, memory MiB, GPUs), all of one model."""
    return Cluster.build([n[0] for n in nodes], [n[1] for n in nodes], [n[2] for n in nodes], ["G2"] * len(nodes))


def _run(cluster: Cluster, *running: tuple[int, Task]) -> Placed:
    """``running`` placed in order (on the GPUs placement would give them), as arrivals 0, 1, ..."""
    placed = Placed(cluster.n_nodes)
    for arrival, (node, task) in enumerate(running):
        gpus = [] if not task.num_gpu else [int(np.argmin(np.where(cluster.gpu_left[node] >= task.gpu_milli,
                                                                     cluster.gpu_left[node], 10**9)))]  # fmt: skip
        cluster.place(node, task, gpus)
        placed.add(arrival, node, task, tuple(gpus))
    return placed


def _fits_after(cluster: Cluster, plan_moves_of: tuple[Move, ...], task: Task, target: int) -> bool:
    trial = cluster.copy()
    for move in plan_moves_of:
        trial.release(move.src, move.task, move.src_gpus)
        trial.place(move.dst, move.task, move.dst_gpus)
    return bool(trial.feasible(task)[target])


def test_one_move_puts_two_shares_on_one_gpu_and_frees_the_other() -> None:
    cluster = _cluster((8000, 8192, 1), (8000, 8192, 1))
    placed = _run(cluster, (0, Task(1000, 1024, 1, 500)), (1, Task(1000, 1024, 1, 400)))
    before = (cluster.gpu_left.copy(), cluster.cpu_left.copy(), [dict(on) for on in placed.on])
    assert not cluster.feasible(WHOLE).any()

    plan = plan_moves(cluster, placed, Workload.typical([WHOLE], cluster.models), WHOLE, budget=1)

    assert plan is not None and len(plan.moves) == 1
    move = plan.moves[0]
    assert (move.arrival, move.src, move.dst, plan.target) == (1, 1, 0, 1)  # the smaller share joins the other
    assert plan.cost == (1, 0.0, 400)
    assert _fits_after(cluster, plan.moves, WHOLE, plan.target)
    # planning changes nothing
    assert (cluster.gpu_left == before[0]).all() and (cluster.cpu_left == before[1]).all()
    assert [dict(on) for on in placed.on] == before[2]


def test_no_budget_or_nowhere_to_go_is_no_plan() -> None:
    cluster = _cluster((8000, 8192, 1), (8000, 8192, 1))
    placed = _run(cluster, (0, Task(1000, 1024, 1, 600)), (1, Task(1000, 1024, 1, 600)))
    work = Workload.typical([WHOLE], cluster.models)
    assert plan_moves(cluster, placed, work, WHOLE, budget=0) is None
    assert plan_moves(cluster, placed, work, WHOLE, budget=4) is None  # 600 + 600 fit on no GPU


def test_a_task_holding_the_cpu_moves_to_a_node_with_cpu_and_frees_the_gpu() -> None:
    # node 0: a free GPU, but a CPU-only task holds its CPU; node 1: no GPU free, CPU to spare
    cluster = _cluster((4000, 8192, 1), (16000, 8192, 1))
    placed = _run(cluster, (0, Task(3500, 1024, 0, 0)), (1, Task(1000, 1024, 1, 1000)))
    plan = plan_moves(cluster, placed, Workload.typical([WHOLE], cluster.models), WHOLE, budget=1)
    assert plan is not None and plan.target == 0
    assert [(m.arrival, m.src, m.dst, m.dst_gpus) for m in plan.moves] == [(0, 0, 1, ())]


def test_two_moves_where_one_is_not_enough() -> None:
    # No single move makes room for a whole GPU with 1,600 milli-CPU: node 1's 300 share fits nowhere
    # until node 2's CPU-only task goes to node 3 (which has no GPU), and node 2 frees its GPU only by
    # sending its 600 share to node 1, which leaves it short of CPU unless the CPU-only task goes too.
    cluster = _cluster((8000, 8192, 1), (8000, 8192, 1), (2500, 8192, 1), (8000, 8192, 0))
    placed = _run(
        cluster,
        (0, Task(1000, 1024, 1, 800)),
        (1, Task(1500, 1024, 1, 300)),
        (2, Task(500, 1024, 1, 600)),
        (2, Task(1000, 1024, 0, 0)),
    )
    task = Task(1600, 1024, 1, 1000)
    work = Workload.typical([task], cluster.models)
    assert not cluster.feasible(task).any()
    assert plan_moves(cluster, placed, work, task, budget=1) is None
    plan = plan_moves(cluster, placed, work, task, budget=2)
    assert plan is not None and len(plan.moves) == 2
    assert _fits_after(cluster, plan.moves, task, plan.target)


def test_no_moves_is_the_protocol_bit_for_bit_and_moves_keep_the_books() -> None:
    cluster, tasks = synthetic_trace(60, 900, np.random.default_rng(3))
    plain = simulate(cluster, tasks, "fgd_cpu", 7)
    none = simulate(cluster, tasks, "fgd_cpu", 7, moves=0)
    assert all(
        np.array_equal(a, b, equal_nan=True) if isinstance(a, np.ndarray) else a == b or key == "seconds"
        for (key, a), b in zip(asdict(plain).items(), asdict(none).values(), strict=True)
    )
    moved = simulate(cluster, tasks, "fgd_cpu", 7, moves=4, arrived_pct=100)
    kept = simulate(cluster, tasks, "fgd_cpu", 7, arrived_pct=100)
    assert moved.moves > 0 and moved.moves_per_1000 == pytest.approx(1000 * moved.moves / moved.tasks)
    assert moved.tasks == kept.tasks and moved.failed < kept.failed  # plans placed tasks that failed without
    assert moved.at("unallocated_pct", 100) < kept.at("unallocated_pct", 100)


@pytest.mark.parametrize("bad", [-1, True, 1.5, "2"])
def test_a_move_budget_must_be_a_whole_number(bad: object) -> None:
    cluster, tasks = synthetic_trace(4, 10, np.random.default_rng(0))
    with pytest.raises(ValueError, match="moves must be a whole number"):
        simulate(cluster, tasks, "fgd_cpu", 1, moves=bad)  # type: ignore[arg-type]
