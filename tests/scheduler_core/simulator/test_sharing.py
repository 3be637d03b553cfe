"""Fractional GPU model, fragmentation, the six published policies, ours, and the simulator protocol."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from scheduler_core.errors import InvalidArgsError
from scheduler_core.placement.model import Cluster, Task, Workload, whole_gpus
from scheduler_core.placement.policies import Context, registry
from scheduler_core.placement.policies.base import no_gpu
from scheduler_core.placement.policies.fgd import deltas, state_fragmentation
from scheduler_core.simulator.simulate import TIES, simulate, tune_order, until
from scheduler_core.simulator.traces import synthetic_trace
from tests.conftest import SHARED, context, two_nodes, workload

OPENB = SHARED / "data" / "openb"


def test_fragmentation_follows_the_four_rules() -> None:
    cluster = two_nodes()
    # A 300-milli shape: on node 1 only the 200 left is too small for it.
    assert workload((1000, 300, 1, 1.0)).fragmentation(
        cluster.gpu_left, cluster.cpu_left, cluster.model_id
    ).tolist() == [0, 200]
    # CPU-only: all free GPU counts.
    assert workload((1000, 0, 0, 1.0)).fragmentation(cluster.gpu_left, cluster.cpu_left, cluster.model_id).tolist() == [
        8000,
        6700,
    ]
    # CPU too short: all free GPU counts.
    short = cluster.copy()
    short.cpu_left[:] = 500
    assert workload((1000, 300, 1, 1.0)).fragmentation(short.gpu_left, short.cpu_left, short.model_id).tolist() == [
        8000,
        6700,
    ]
    # A model the shape does not allow: all free.
    disallowed = Workload(np.array([0]), np.array([300]), np.array([1]), np.array([1.0]), np.array([[False]]))
    assert disallowed.fragmentation(cluster.gpu_left, cluster.cpu_left, cluster.model_id).tolist() == [8000, 6700]
    # Popularity weights the shapes.
    mixed = workload((1000, 300, 1, 0.5), (1000, 0, 0, 0.5))
    assert mixed.fragmentation(cluster.gpu_left, cluster.cpu_left, cluster.model_id).tolist() == [4000, 3450]


def test_typical_workload_keeps_shapes_to_95_percent_with_descending_ties() -> None:
    tasks = [Task(1000, 1, 1, 500)] * 50 + [Task(2000, 1, 0, 0)] * 45 + [Task(3000, 1, 1, 1000)] * 3 + [
        Task(4000, 1, 1, 1000)] * 3  # fmt: skip
    work = Workload.typical(tasks, ["G2"])
    # 50 + 45 = 95 of 101 is under 95 %: one more shape, and of the two with 3 the larger cpu wins the tie.
    assert work.cpu.tolist() == [1000, 2000, 4000]
    assert work.popularity.tolist() == pytest.approx([50 / 98, 45 / 98, 3 / 98])


def test_fgd_scores_and_gpu_choice_by_hand() -> None:
    cluster = two_nodes()
    ctx = context(cluster, workload((1000, 600, 1, 0.6), (1000, 0, 0, 0.4)))
    # Before: node 0 has no fragment for the 600 shape, node 1 has 500 + 200; CPU-only counts all free.
    assert ctx.frag.tolist() == pytest.approx([0.4 * 8000, 0.6 * 700 + 0.4 * 6700])
    scores, gpus = registry()["fgd"](ctx, Task(1000, 1, 1, 500), np.arange(2))
    # Node 0: a 500 fragment appears (0.6 x 500) and free drops by 500 (0.4 x 500): d = -100.
    # Node 1, GPU 0 (500 -> 0): the 500 fragment is used up, free drops: d = 0.6 x 500 + 0.4 x 500 = 500.
    sigmoid = [math.floor(100 / (1 + math.exp(-d / 1000))) for d in (-100, 500)]
    assert scores.tolist() == sigmoid == [47, 62]
    assert gpus.tolist() == [0, 0]


def test_fgd_deltas_equal_a_loop_reference() -> None:
    rng = np.random.default_rng(5)
    cluster, tasks = synthetic_trace(60, 400, rng)
    work = Workload.typical(tasks, cluster.models)
    for task in tasks[:250]:  # fill the cluster partly, at random
        nodes = np.nonzero(cluster.feasible(task))[0]
        if nodes.size:
            node = int(rng.choice(nodes))
            gpus = [int(rng.choice(np.nonzero(cluster.gpu_left[node] >= task.gpu_milli)[0]))] if task.sharing else (
                whole_gpus(cluster.gpu_left[node], task))  # fmt: skip
            cluster.place(node, task, gpus)
    ctx = context(cluster, work)
    for task in (Task(2000, 1, 1, 300), Task(4000, 1, 1, 1000), Task(8000, 1, 0, 0), Task(16000, 1, 2, 1000)):
        nodes = np.nonzero(cluster.feasible(task))[0]
        d, option_gpu, rows = deltas(ctx, task, nodes)
        for k in range(rows.shape[0]):
            node = int(nodes[rows[k]])
            left = cluster.gpu_left[node].copy()
            for gpu in [int(option_gpu[k])] if task.sharing else whole_gpus(left, task):
                left[gpu] -= task.gpu_milli
            after = work.fragmentation(
                left[None], np.array([cluster.cpu_left[node] - task.cpu]), cluster.model_id[[node]]
            )
            assert d[k] == pytest.approx(ctx.frag[node] - after[0]), (task, node)


def test_state_fragmentation_equals_fragmentation_row_by_row_whatever_the_gpu_order() -> None:
    rng = np.random.default_rng(7)
    cluster, tasks = synthetic_trace(40, 300, rng)
    work = Workload.typical(tasks, cluster.models)
    for task in tasks[:120]:  # some nodes partly used, most still alike
        nodes = np.nonzero(cluster.feasible(task))[0]
        if nodes.size and task.num_gpu:
            node = int(rng.choice(nodes))
            gpus = (
                [int(np.argmax(cluster.gpu_left[node]))] if task.sharing else whole_gpus(cluster.gpu_left[node], task)
            )
            cluster.place(node, task, gpus)
    # Each node twice: once as it is and once with its GPUs in another order (the same state).
    left = np.vstack([cluster.gpu_left, rng.permuted(cluster.gpu_left, axis=1)])
    cpu, models = np.tile(cluster.cpu_left, 2), np.tile(cluster.model_id, 2)
    found = state_fragmentation(work, left, cpu, models)
    assert found.tolist() == pytest.approx(
        [work.fragmentation(left[[i]], cpu[[i]], models[[i]])[0] for i in range(len(cpu))]
    )
    assert found[: len(cluster.cpu_left)].tolist() == found[len(cluster.cpu_left) :].tolist()


def test_baseline_scores_on_hand_built_nodes() -> None:
    cluster = two_nodes()
    ctx = context(cluster, workload((1000, 300, 1, 1.0)))
    nodes = np.arange(2)
    policies = registry()
    share = Task(12_800, 1, 1, 150)
    # DotProd: floor(100 x (1 - dot / 2)), dot = cpu part + gpu part.
    dot = [(96_000 / 128_000) * (12_800 / 128_000) + (free / 8000) * (150 / 8000) for free in (8000, 6700)]
    scores, gpus = policies["dotprod"](ctx, share, nodes)
    assert scores.tolist() == [math.floor(100 * (1 - x / 2)) for x in dot]
    assert gpus.tolist() == [0, 1]  # the tightest GPU that fits: node 1's 200
    # GpuPacking: node 1's shared GPU (a); node 0 is idle (c): 33 less its 8 GPUs, at least 8.
    scores, gpus = policies["gpu_packing"](ctx, share, nodes)
    assert scores.tolist() == [33 - 8, max(100 - (200 * 100 // 1000) // 10, 50)]
    small = Cluster.build([32_000] * 2, [262_144] * 2, [2, 1], ["T4", "T4"])
    scores, _ = policies["gpu_packing"](context(small, workload((1000, 300, 1, 1.0))), share, np.arange(2))
    assert scores.tolist() == [33 - 2, 33 - 1]  # the smaller idle node first
    # The authors' own cases (gpu_packing_score_test.go): 2 whole GPUs on a partly used 4-GPU node (48),
    # on an idle 4-GPU node (29) and on an idle 8-GPU node (25).
    three = Cluster.build([96_000] * 3, [786_432] * 3, [4, 4, 8], ["1080"] * 3)
    three.gpu_left[0, :4] = [200, 1000, 1000, 500]
    scores, _ = policies["gpu_packing"](
        context(three, workload((100, 1000, 2, 1.0))), Task(100, 1, 2, 1000), np.arange(3)
    )
    assert scores.tolist() == [48, 29, 25]
    # BestFit: min-max normalised, so the tighter node scores 100 and the other 0.
    scores, _ = policies["bestfit"](ctx, share, nodes)
    assert scores.tolist() == [0, 100]
    # GpuClustering: node 1 hosts only sharing tasks, node 0 nothing yet.
    ctx.classes[1].add("share")
    scores, _ = policies["gpu_clustering"](ctx, share, nodes)
    assert scores.tolist() == [25 + 25 * 0 // 8000, 75 + 25 * (8000 - 6700) // 8000]
    scores, _ = policies["gpu_clustering"](ctx, Task(1000, 1, 1, 1000), nodes)
    assert scores.tolist() == [25, 0 + 25 * 1300 // 8000]
    # Random: a random ranking of the nodes, and a fitting GPU.
    scores, gpus = policies["random"](ctx, share, nodes)
    assert sorted(scores.tolist()) == [0, 1]
    assert all(cluster.gpu_left[n, g] >= 150 for n, g in enumerate(gpus.tolist()))


def test_fgd_cpu_scores_as_fgd_and_breaks_fgds_ties_for_cpu_only_tasks_towards_nodes_without_free_gpus() -> None:
    """Ours: node 0 has 96 cores for 8 free GPUs, node 1 the same cores for 6.7 GPUs, node 2 is a
    CPU-rich 2-GPU node with both GPUs taken. The workload wants 12 cores per GPU and 4 per CPU-only task,
    so a 4-core CPU-only task changes no node's fragmentation and FGD scores all three the same."""
    cluster = Cluster.build([96_000, 96_000, 104_000], [786_432] * 3, [8, 8, 2], ["G2", "G2", "T4"])
    cluster.gpu_left[1, :2] = [500, 200]
    cluster.gpu_left[2, :2] = 0
    work = replace(workload((12_000, 1000, 1, 0.5), (4_000, 0, 0, 0.5)), allowed=np.ones((2, 2), dtype=bool))
    ctx = context(cluster, work)
    nodes = np.arange(3)
    policies = registry()
    cpu_only = Task(4_000, 1, 0, 0)
    fgd_scores, _ = policies["fgd"](ctx, cpu_only, nodes)
    assert len(set(fgd_scores.tolist())) == 1  # a tie: FGD leaves the choice to the tie rule
    scores, gpus = policies["fgd_cpu"](ctx, cpu_only, nodes)
    assert scores.tolist() == [2 * s + (n == 2) for n, s in enumerate(fgd_scores.tolist())]
    assert int(np.argmax(scores)) == 2 and gpus.tolist() == [-1, -1, -1]  # where no GPU needs the CPU
    for task in (Task(12_000, 1, 1, 1000), Task(2_000, 1, 1, 300), Task(8_000, 1, 2, 1000)):
        ours, ours_gpus = policies["fgd_cpu"](ctx, task, nodes)
        theirs, their_gpus = policies["fgd"](ctx, task, nodes)
        assert ours.tolist() == theirs.tolist() and ours_gpus.tolist() == their_gpus.tolist()


@pytest.mark.slow  # reads openb
@pytest.mark.skipif(not OPENB.is_dir(), reason=f"{OPENB} is absent")
def test_fgd_cpu_leaves_fewer_gpus_unallocated_than_fgd_on_the_openb_gpuspec10_trace() -> None:
    """Where sending CPU-only tasks to nodes without free GPUs pays most: `gpuspec10`, better on 10 of 10
    seeds (-0.28 on the mean; seed 43: -0.42). Elsewhere the two are close (docs/research/fgd-fidelity.md)."""
    from scheduler_core.simulator.traces import read_nodes, read_tasks

    cluster = read_nodes(OPENB / "openb_node_list_gpu_node.csv")
    tasks = read_tasks(OPENB / "openb_pod_list_gpuspec10.csv")
    ours = simulate(cluster, tasks, "fgd_cpu", 43).at("unallocated_pct", 100)
    theirs = simulate(cluster, tasks, "fgd", 43).at("unallocated_pct", 100)
    assert ours < theirs - 0.1, (ours, theirs)


def test_a_written_trace_reads_back_and_nodes_come_in_name_order(tmp_path) -> None:
    """With ``tie="first"`` equal top scores go to the first node, which must be the node whose name
    sorts first."""
    from scheduler_core.simulator.traces import read_nodes, read_tasks, write_trace

    cluster, tasks = synthetic_trace(12, 40, np.random.default_rng(1))
    tasks.append(Task(4000, 8192, 1, 500, frozenset({"T4", "G2"})))
    write_trace(cluster, tasks, tmp_path / "nodes.csv", tmp_path / "pods.csv")
    back = read_nodes(tmp_path / "nodes.csv")
    assert back.gpu_count.tolist() == cluster.gpu_count.tolist() and back.cpu_left.tolist() == cluster.cpu_left.tolist()
    assert read_tasks(tmp_path / "pods.csv") == tasks
    (tmp_path / "named.csv").write_text(
        "sn,cpu_milli,memory_mib,gpu,model\nnode-b,2000,1,2,T4\nnode-c,0,1,0,CPU\nnode-a,1000,1,8,G2\n"
    )
    named = read_nodes(tmp_path / "named.csv")
    assert named.cpu_left.tolist() == [1000, 2000] and named.gpu_count.tolist() == [8, 2]


def test_tune_appends_copies_up_to_the_limit() -> None:
    tasks = [Task(1000, 1, 1, 1000), Task(1000, 1, 0, 0), Task(1000, 1, 1, 500)]
    order = tune_order(tasks, total_gpus=4, tune=1.3, rng=np.random.default_rng(1))
    assert sorted(order[:3]) == [0, 1, 2]
    requested = sum(tasks[i].gpu_demand for i in order)
    assert requested <= 1.3 * 4 * 1000 < requested + 1000


def test_until_cuts_the_order_where_arrived_rounds_past_the_limit() -> None:
    tasks = [Task(1000, 1024, 1, 1000), Task(1000, 1024, 1, 500), Task(1000, 1024, 0, 0)]
    # 10 GPUs: arrivals 10 %, 15 %, 15 %, 25 %, 30 %...
    assert until([0, 1, 2, 0, 1], tasks, 10, 15) == [0, 1, 2]
    assert until([0, 1, 2, 0, 1], tasks, 10, 100) == [0, 1, 2, 0, 1]


def test_simulating_up_to_an_arrived_share_is_the_full_run_cut_there() -> None:
    cluster, tasks = synthetic_trace(40, 300, np.random.default_rng(2))
    full = simulate(cluster, tasks, "fgd_cpu", 7)
    cut = simulate(cluster, tasks, "fgd_cpu", 7, arrived_pct=100)
    assert cut.tasks < full.tasks and cut.unallocated_pct.shape[0] == 101
    assert np.array_equal(cut.unallocated_pct[:100], full.unallocated_pct[:100], equal_nan=True)


@pytest.mark.parametrize("tie", TIES)
@pytest.mark.parametrize("policy", sorted(registry()))
def test_simulation_is_deterministic_per_seed_and_never_overcommits(policy: str, tie: str) -> None:
    cluster, tasks = synthetic_trace(40, 300, np.random.default_rng(2))
    a = simulate(cluster, tasks, policy, 7, tie=tie)
    b = simulate(cluster, tasks, policy, 7, tie=tie)
    assert np.array_equal(a.unallocated_pct, b.unallocated_pct, equal_nan=True) and a.failed == b.failed
    assert np.nanmin(a.unallocated_pct) >= 0 and np.nanmax(a.unallocated_pct) <= 100
    assert a.failed > 0  # 130 % of capacity cannot all fit
    assert cluster.gpu_left.max() == 1000  # the input cluster is not modified


def _nodes_used(tie: str, seed: int) -> frozenset[int]:
    """Every score ties: 48 one-GPU tasks (0.3 x the capacity of 20 idle 8-GPU nodes). Which nodes do
    they land on?"""
    cluster = Cluster.build([64_000] * 20, [1 << 20] * 20, [8] * 20, ["G2"] * 20)
    seen: list[Context] = []

    def all_equal(ctx: Context, task: Task, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        seen.append(ctx)
        return np.zeros(nodes.shape[0], dtype=np.int64), no_gpu(nodes)

    simulate(cluster, [Task(1000, 1, 1, 1000)] * 10, all_equal, seed, tune=0.3, tie=tie)
    left = seen[-1].cluster.gpu_left
    return frozenset(np.nonzero(left.sum(axis=1) < 8000)[0].tolist())


def test_shuffled_ties_fill_one_node_after_another_in_an_order_drawn_from_the_seed() -> None:
    """The authors' simulator: equal top scores go to the node whose name sorts first, and every node's
    name starts with its place in a seeded permutation. Ties consolidate, on nodes the seed picks."""
    first = {_nodes_used("first", seed) for seed in range(5)}
    shuffled = {_nodes_used("shuffled", seed) for seed in range(5)}
    assert first == {frozenset(range(6))}  # 48 GPUs fill six nodes: always the first six
    assert all(len(used) == 6 for used in shuffled) and len(shuffled) > 1 and frozenset(range(6)) not in shuffled
    assert _nodes_used("shuffled", 3) == _nodes_used("shuffled", 3)
    assert len(_nodes_used("random", 0)) > 6  # per-decision random ties spread the tasks


def test_a_trace_the_protocol_cannot_run_is_refused_by_name() -> None:
    cluster = Cluster.build([64_000], [1 << 20], [2], ["T4"])
    with pytest.raises(InvalidArgsError, match="no task in the pod list asks for a GPU"):
        simulate(cluster, [Task(1000, 1, 0, 0)], "fgd", 1)  # inflating it would never stop
    with pytest.raises(InvalidArgsError, match="no task in the pod list asks for a GPU"):
        simulate(cluster, [], "fgd", 1)
    with pytest.raises(InvalidArgsError, match="no GPU node"):
        simulate(Cluster.build([64_000], [1 << 20], [0], [""]), [Task(1000, 1, 1, 1000)], "fgd", 1)
    with pytest.raises(ValueError, match="tie must be one of shuffled, first, random"):
        simulate(cluster, [Task(1000, 1, 1, 1000)], "fgd", 1, tie="last")


def test_tune_refuses_tasks_that_ask_for_no_gpu_rather_than_loop_for_ever() -> None:
    with pytest.raises(InvalidArgsError, match="no task in the pod list asks for a GPU"):
        tune_order([Task(1000, 1, 0, 0)], total_gpus=4, tune=1.3, rng=np.random.default_rng(1))


def test_fgd_beats_random_on_a_synthetic_trace() -> None:
    cluster, tasks = synthetic_trace(60, 500, np.random.default_rng(4))
    fgd = np.mean([simulate(cluster, tasks, "fgd", s).at("unallocated_pct", 100) for s in (1, 2, 3)])
    rnd = np.mean([simulate(cluster, tasks, "random", s).at("unallocated_pct", 100) for s in (1, 2, 3)])
    assert fgd < rnd


@pytest.mark.slow  # reads openb
@pytest.mark.skipif(not OPENB.is_dir(), reason=f"{OPENB} is absent")
def test_openb_trace_reads_as_the_notes_describe() -> None:
    from scheduler_core.simulator.traces import read_nodes, read_tasks

    cluster = read_nodes(OPENB / "openb_node_list_gpu_node.csv")
    tasks = read_tasks(OPENB / "openb_pod_list_default.csv")
    assert (cluster.n_nodes, cluster.total_gpus, len(tasks)) == (1213, 6212, 8152)
    work = Workload.typical(tasks, cluster.models)
    assert work.n_shapes == 35
    # Initial fragmentation of the empty cluster, against the authors' released curve (13.9-14.0 %).
    frag = work.fragmentation(cluster.gpu_left, cluster.cpu_left, cluster.model_id)
    assert 100 * frag.sum() / (6212 * 1000) == pytest.approx(13.94, abs=0.05)


RELEASED = OPENB / "published_results" / "fgd_unalloc_gpu_summary_derived.csv"


@pytest.mark.slow  # reads openb
@pytest.mark.skipif(not RELEASED.is_file(), reason=f"{RELEASED} is absent")
@pytest.mark.parametrize(
    ("policy", "released_name"),
    [
        ("random", "01-Random"), ("dotprod", "02-DotProd"), ("gpu_clustering", "03-GpuClustering"),
        ("gpu_packing", "04-GpuPacking"), ("bestfit", "05-BestFit"), ("fgd", "06-FGD"),
    ],
)  # fmt: skip
def test_fidelity_to_the_released_numbers_on_one_seed(policy: str, released_name: str) -> None:
    """Seed 42 of `default` against the authors' 10-seed mean of unallocated GPU % at 100 % arrived,
    within the issue's 0.5 points. (The 10-seed means in docs/research/fgd-fidelity.md are within 0.2; one seed of the
    packing policies spreads by up to 0.7 around its mean, and seed 42 is 0.35 off at most.)"""
    import csv

    from scheduler_core.simulator.traces import read_nodes, read_tasks

    with RELEASED.open() as handle:
        released = next(
            float(row["unalloc_gpu_pct_mean"]) for row in csv.DictReader(handle)
            if row["workload"] == "openb_pod_list_default" and row["sc_policy"] == released_name
            and row["arrived_pct"] == "100"
        )  # fmt: skip
    cluster = read_nodes(OPENB / "openb_node_list_gpu_node.csv")
    tasks = read_tasks(OPENB / "openb_pod_list_default.csv")
    result = simulate(cluster, tasks, policy, 42)
    assert abs(result.at("unallocated_pct", 100) - released) <= 0.5, (result.at("unallocated_pct", 100), released)


def test_the_openb_trace_is_looked_for_beside_the_checkout_unless_openb_dir_says(monkeypatch) -> None:
    """``../shared/data/openb`` beside the checkout, wherever the module reading it sits in the tree (moving
    it one folder deeper once sent the replay test to look inside the checkout, where it skipped)."""
    from scheduler_core.simulator.traces import openb_dir

    monkeypatch.delenv("OPENB_DIR", raising=False)
    assert openb_dir() == SHARED / "data" / "openb"
    monkeypatch.setenv("OPENB_DIR", "/elsewhere/openb")
    assert str(openb_dir()) == "/elsewhere/openb"
