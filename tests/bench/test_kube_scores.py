"""``bench/kube_scores.py``: kube-scheduler's score arithmetic over the extender's 0..10, in the simulator."""

from __future__ import annotations

import numpy as np
import pytest

from bench.kube_scores import KubeScheduler, balanced_allocation, most_allocated, one_seed, profile_weights, run
from scheduler_core.k8s.nodes import NodeTable
from scheduler_core.placement.model import Task, Workload
from scheduler_core.simulator.simulate import simulate
from scheduler_core.simulator.traces import synthetic_trace
from tests.conftest import context


def one(value: int) -> np.ndarray:
    return np.array([value], dtype=np.int64)


def test_most_allocated_is_the_weighted_mean_of_the_requested_percentages() -> None:
    """Upstream's case "nothing scheduled, resources requested, differently sized nodes": 3 of 4 cores
    (75) and 5000 of 10000 memory (50) score 62; a resource the pod does not request is left out."""
    weights = {"cpu": 1, "memory": 1, "nvidia.com/gpu": 1}
    cpu_mem = {"cpu": one(3000), "memory": one(5000)}
    allocatable = {"cpu": one(4000), "memory": one(10000), "nvidia.com/gpu": one(8)}
    assert most_allocated(cpu_mem, allocatable, weights).tolist() == [62]
    with_gpus = {**cpu_mem, "nvidia.com/gpu": one(8)}
    assert most_allocated(with_gpus, allocatable, weights).tolist() == [(75 + 50 + 100) // 3]
    assert most_allocated(with_gpus, allocatable, {**weights, "nvidia.com/gpu": 5}).tolist() == [(75 + 50 + 500) // 7]
    # Requests over allocatable count as full; a node without the resource leaves it out.
    assert most_allocated({"cpu": one(9000), "memory": one(0)}, allocatable, weights).tolist() == [50]
    no_gpus = {**allocatable, "nvidia.com/gpu": one(0)}
    assert most_allocated(with_gpus, no_gpus, weights).tolist() == [62]


def test_balanced_allocation_scores_the_gap_between_cpu_and_memory_fractions() -> None:
    assert balanced_allocation(one(3000), one(4000), one(5000), one(10000)).tolist() == [87]  # 1 - 0.25 / 2
    assert balanced_allocation(one(2000), one(4000), one(5000), one(10000)).tolist() == [100]
    assert balanced_allocation(one(8000), one(4000), one(0), one(10000)).tolist() == [50]  # capped at 1


def test_the_profiles_most_allocated_weights_are_read_from_the_generated_profile() -> None:
    assert profile_weights() == {"cpu": 1, "memory": 1, "nvidia.com/gpu": 1}


def model(weight: int, plugins: tuple[str, ...], n_nodes: int = 40, n_tasks: int = 300):
    cluster, tasks = synthetic_trace(n_nodes, n_tasks, np.random.default_rng(3))
    names = [f"node-{i:05d}" for i in range(cluster.n_nodes)]
    table = NodeTable.from_columns(alloc_gpus=cluster.gpu_count.tolist(), names=names)
    return cluster, tasks, KubeScheduler(table, cluster, weight, plugins)


def test_without_plugins_every_pod_goes_to_a_node_the_extender_scores_ten() -> None:
    cluster, tasks, scorer = model(weight=5, plugins=())
    seen: list[tuple[int, bool]] = []

    def watched(ctx, task, nodes):
        total, gpus = scorer(ctx, task, nodes)
        feasible = np.zeros(ctx.cluster.n_nodes, dtype=bool)
        feasible[nodes] = True
        extender = scorer.extender_scores(ctx, task, feasible)[nodes]
        seen.append((int(extender[np.argmax(total)]), bool(task.num_gpu)))
        return total, gpus

    simulate(cluster, tasks, watched, 42, workload=Workload.typical(tasks, cluster.models), tie="random")
    assert len(seen) > 200
    assert {score for score, _ in seen} == {10}


def test_with_weight_zero_most_allocated_sends_a_pod_to_the_fullest_node() -> None:
    cluster, _, scorer = model(weight=0, plugins=("most_allocated",), n_nodes=3)
    state = cluster.copy()
    state.cpu_left[1] -= state.cpu_left[1] // 2  # node 1 is half full of CPU
    ctx = context(state, Workload.typical([Task(1000, 1024, 1, 1000)], state.models))
    total, _ = scorer(ctx, Task(1000, 1024, 0, 0), np.arange(3))
    assert int(np.argmax(total)) == 1 and total[1] > total[0]


def test_bad_arguments_are_refused_with_the_flag_named() -> None:
    cluster, _, _ = model(weight=5, plugins=())
    table = NodeTable.from_columns(alloc_gpus=cluster.gpu_count.tolist())
    with pytest.raises(ValueError, match="--plugins: unknown image_locality"):
        KubeScheduler(table, cluster, 5, ("image_locality",))
    with pytest.raises(ValueError, match="--weight"):
        KubeScheduler(table, cluster, -1)


def test_a_trace_the_openb_folder_lacks_is_refused_before_any_run(tmp_path) -> None:
    (tmp_path / "openb_pod_list_default.csv").write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n")
    with pytest.raises(ValueError, match="--traces: unknown nope; choose from default"):
        run(["nope"], seeds=1, openb=tmp_path)
    with pytest.raises(ValueError, match="--seeds"):
        run(["default"], seeds=0, openb=tmp_path)


def test_one_seed_reports_simulate_and_the_model_on_the_same_trace() -> None:
    cluster, tasks = synthetic_trace(30, 200, np.random.default_rng(5))
    names = [f"node-{i:05d}" for i in range(cluster.n_nodes)]
    simulated, modelled = one_seed(names, cluster, tasks, 42, 5, ("most_allocated", "balanced_allocation"))
    again = simulate(cluster, tasks, "fgd_cpu", 42, workload=Workload.typical(tasks, cluster.models))
    assert simulated == again.at("unallocated_pct", 100)
    assert 0 <= modelled <= 100
    assert one_seed(names, cluster, tasks, 42, 5, ("most_allocated", "balanced_allocation"))[1] == modelled
