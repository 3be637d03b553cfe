"""Churn: tasks arriving and ending at the trace's times, the queue, and moves for a waiting task."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler_core.errors import InvalidArgsError
from scheduler_core.placement.model import Cluster, Task
from scheduler_core.simulator.churn import churn, compression_for
from scheduler_core.simulator.traces import read_tasks, read_times

WHOLE = Task(1000, 1024, 1, 1000)


def _one_gpu_nodes(count: int) -> Cluster:
    return Cluster.build([8000] * count, [8192] * count, [1] * count, ["G2"] * count)


def test_a_task_that_fits_nowhere_waits_until_one_ends() -> None:
    tasks = [WHOLE, WHOLE, Task(1000, 1024, 0, 0)]
    times = [(0, 100), (10, 60), (20, 30)]  # the second waits from 10 to 100, then runs 50 s
    result = churn(_one_gpu_nodes(1), tasks, times, "fgd_cpu", 1, load=0.5)
    assert result.compression == 1.0  # the trace's own clock already asks for the whole GPU
    assert (result.arrivals, result.waited, result.never_placed, result.moves) == (3, 1, 0, 0)
    assert result.waited_pct == pytest.approx(100 / 3)
    assert result.gpu_hours_waited == pytest.approx(90 / 3600)
    assert result.gpu_hours_run == pytest.approx((100 + 50) / 3600)


def test_a_move_places_the_waiting_task_at_once() -> None:
    # node 0: one GPU, 3.6 cores; node 1: no GPU, 4 cores, full until t=5. The CPU-only task that comes at
    # t=0 can only go to node 0, and when the whole-GPU task comes at t=10 it holds node 0's CPU.
    cluster = Cluster.build([3600, 4000], [8192, 8192], [1, 0], ["G2", "G2"])
    tasks = [Task(4000, 1024, 0, 0), Task(3500, 1024, 0, 0), WHOLE]
    times = [(0, 5), (0, 1000), (10, 20)]
    without = churn(cluster, tasks, times, "fgd_cpu", 1, load=0.01)
    assert without.waited == 1 and without.gpu_hours_waited == pytest.approx(990 / 3600)
    moved = churn(cluster, tasks, times, "fgd_cpu", 1, load=0.01, moves=1)
    assert (moved.waited, moved.gpu_hours_waited, moved.moves) == (0, 0.0, 1)
    assert moved.moves_per_1000 == pytest.approx(1000 / 3)
    assert cluster.cpu_left.tolist() == [3600, 4000]  # the caller's cluster is not touched


def test_a_task_never_placed_waits_until_the_last_event() -> None:
    tasks = [WHOLE, Task(1000, 1024, 2, 1000)]  # two GPUs on a one-GPU cluster
    result = churn(_one_gpu_nodes(1), tasks, [(0, 50), (5, 10)], "fgd_cpu", 1, load=0.5)
    assert (result.waited, result.never_placed) == (1, 1)
    assert result.gpu_hours_waited == 0.0 and result.gpu_hours_never_placed == pytest.approx(2 * (50 - 5) / 3600)


def test_the_arrivals_are_compressed_until_the_peak_asks_for_the_load() -> None:
    tasks = [WHOLE] * 4
    times = [(0, 10), (100, 110), (200, 210), (300, 310)]
    factor = compression_for(tasks, times, 4000, 0.5)  # two at once: gaps of 100 s must shrink under 10 s
    assert 10 <= factor <= 10.001
    with pytest.raises(InvalidArgsError, match="never asks for 2"):
        compression_for(tasks, times, 4000, 2.0)
    with pytest.raises(InvalidArgsError, match="load must be above 0"):
        compression_for(tasks, times, 1000, 0)


def test_bad_arguments_are_refused_by_name() -> None:
    with pytest.raises(InvalidArgsError, match=r"1 \(creation, deletion\) times for 2 tasks"):
        churn(_one_gpu_nodes(1), [WHOLE, WHOLE], [(0, 1)], "fgd_cpu", 1)
    with pytest.raises(InvalidArgsError, match="moves must be a whole number"):
        churn(_one_gpu_nodes(1), [WHOLE], [(0, 1)], "fgd_cpu", 1, moves=-1)


def test_times_are_read_beside_the_tasks_and_checked(tmp_path: Path) -> None:
    good = tmp_path / "pods.csv"
    good.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\np0,1000,10,1,500,5,9\n")
    assert read_tasks(good) == [Task(1000, 10, 1, 500)] and read_times(good) == [(5, 9)]
    backwards = tmp_path / "backwards.csv"
    backwards.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\np0,1,1,0,0,9,5\n")
    with pytest.raises(InvalidArgsError, match=r"backwards.csv:2: deletion_time 5 is before creation_time 9"):
        read_times(backwards)
    untimed = tmp_path / "multigpu.csv"
    untimed.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,0,0\n")
    with pytest.raises(InvalidArgsError, match="missing columns creation_time, deletion_time"):
        read_times(untimed)
