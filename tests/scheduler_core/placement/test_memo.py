"""Incremental FGD: the scores kept between calls are the scorer's, call after call, in the simulator
and in the extender."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_core.k8s.pods import PodDemand
from scheduler_core.placement.model import Cluster, Task, Workload
from scheduler_core.placement.policies import Context, registry
from scheduler_core.placement.policies.fgd import state_fragmentation
from scheduler_core.placement.policies.memo import ScoreMemo
from scheduler_core.scoring.policy import Fragmentation, SharePolicy, share_policy
from scheduler_core.simulator.simulate import simulate
from tests.conftest import SHARED

OPENB = SHARED / "data" / "openb"
SHAPES = Workload.from_shapes(
    [((8000, 500, 1, ""), 5), ((16000, 1000, 1, ""), 3), ((4000, 1000, 2, "A100"), 2), ((2000, 0, 0, ""), 4)],
    ("A100", "T4", ""),
)
TASKS = [Task(2000, 0, 0, 0), Task(8000, 0, 1, 500), Task(16000, 0, 1, 1000), Task(4000, 0, 2, 1000)]


def _cluster(rng: np.random.Generator, n: int) -> Cluster:
    left = rng.choice([0, 190, 500, 810, 1000], (n, 4)).astype(np.int64)
    return Cluster(
        rng.choice([0, 4000, 16000, 64000], n).astype(np.int64), np.zeros(n, dtype=np.int64), left,
        np.full(n, 4, dtype=np.int64), rng.integers(-1, 2, n).astype(np.int64), ("A100", "T4"),
    )  # fmt: skip


def _direct(policy: str, cluster: Cluster, task: Task, nodes: np.ndarray) -> tuple[list[int], list[int]]:
    frag = SHAPES.fragmentation(cluster.gpu_left, cluster.cpu_left, cluster.model_id)
    scores, gpus = registry()[policy](Context(cluster, SHAPES, frag, np.random.default_rng(0)), task, nodes)
    return scores.tolist(), gpus.tolist()


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), policy=st.sampled_from(["fgd", "fgd_cpu"]))
def test_every_call_gives_the_scorers_scores_while_rows_change_repeat_and_go_unkept(seed: int, policy: str) -> None:
    """Rows change between calls (a few, or all), candidates repeat a slot with other inputs, some have no
    slot, and a token marks rows as unchanged: each call must still be the scorer's own answer."""
    rng = np.random.default_rng(seed)
    cluster, memo, scorer = _cluster(rng, 12), ScoreMemo(max_tasks=2), registry()[policy]
    token = object()
    for _call in range(25):
        if rng.random() < 0.4:  # some rows change; the token (the immutable state) changes with them
            changed = rng.choice(12, size=int(rng.integers(1, 12)), replace=False)
            cluster.gpu_left[changed] = rng.choice([0, 190, 500, 1000], (changed.size, 4))
            cluster.cpu_left[changed] = rng.choice([0, 4000, 64000], changed.size)
            token = object()
        # Candidates: state rows, with slots; sometimes a repeated slot read with other inputs (a ledger
        # reading laid over one row), and sometimes a node the state lacks (slot -1).
        nodes = rng.choice(12, size=int(rng.integers(1, 12)), replace=False)
        view = Cluster(
            cluster.cpu_left[nodes].copy(), cluster.mem_left[nodes], cluster.gpu_left[nodes].copy(),
            cluster.gpu_count[nodes], cluster.model_id[nodes], cluster.models,
        )  # fmt: skip
        slots = nodes.astype(np.intp)
        fixed = np.ones(nodes.size, dtype=bool)
        if rng.random() < 0.3:
            view.gpu_left[0] = np.maximum(view.gpu_left[0] - 500, 0)
            fixed[0] = False
        if rng.random() < 0.2:
            slots = slots.copy()
            slots[-1] = -1
        task = TASKS[int(rng.integers(len(TASKS)))]
        positions = np.arange(nodes.size)
        expected = _direct(policy, view, task, positions)

        def inputs(at: np.ndarray, view: Cluster = view) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            return view.gpu_left[at], view.cpu_left[at], view.model_id[at]

        def compute(at: np.ndarray, view: Cluster = view, task: Task = task) -> tuple[np.ndarray, np.ndarray]:
            frag = SHAPES.fragmentation(view.gpu_left, view.cpu_left, view.model_id)
            return scorer(Context(view, SHAPES, frag, np.random.default_rng(0)), task, at)

        got = memo.scores("shapes", task, slots, 4, inputs, compute, token, fixed)
        assert (got[0].tolist(), got[1].tolist()) == expected


def test_a_call_computes_only_the_rows_that_changed_and_a_new_workload_drops_what_was_kept() -> None:
    rng = np.random.default_rng(3)
    cluster, memo = _cluster(rng, 50), ScoreMemo()
    computed: list[int] = []
    nodes = np.arange(50)

    def inputs(at: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return cluster.gpu_left[at], cluster.cpu_left[at], cluster.model_id[at]

    def compute(at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        computed.append(at.size)
        frag = SHAPES.fragmentation(cluster.gpu_left[at], cluster.cpu_left[at], cluster.model_id[at])
        sub = Cluster(cluster.cpu_left[at], cluster.mem_left[at], cluster.gpu_left[at], cluster.gpu_count[at],
                      cluster.model_id[at], cluster.models)  # fmt: skip
        return registry()["fgd"](Context(sub, SHAPES, frag, np.random.default_rng(0)), TASKS[1], np.arange(at.size))

    memo.scores("a", TASKS[1], nodes, 4, inputs, compute)
    memo.scores("a", TASKS[1], nodes, 4, inputs, compute)
    cluster.gpu_left[[3, 17]] = 0
    memo.scores("a", TASKS[1], nodes, 4, inputs, compute)
    memo.scores("b", TASKS[1], nodes, 4, inputs, compute)
    assert computed == [50, 2, 50]


def test_a_rows_fragmentation_does_not_depend_on_the_rows_computed_with_it() -> None:
    """FGD's score for a task that changes nothing is the sign of F before minus F after, computed in
    different batches; with a BLAS product they differed in the last bit and scored 49 instead of 50."""
    rng = np.random.default_rng(0)
    workload = Workload.from_shapes(
        [((int(c), int(m), 1, ""), int(k)) for c, m, k in rng.integers(1, 1000, (35, 3))], ("A100", "")
    )
    left = rng.choice([0, 190, 500, 810, 1000], (2000, 8)).astype(np.int64)
    cpu, model = rng.integers(0, 96_000, 2000), np.zeros(2000, dtype=np.int64)
    whole = state_fragmentation(workload, left, cpu, model)
    for row in range(0, 2000, 97):
        alone = state_fragmentation(workload, left[row : row + 1], cpu[row : row + 1], model[row : row + 1])
        assert alone[0] == whole[row]


@pytest.mark.slow  # reads openb
@pytest.mark.skipif(not OPENB.is_dir(), reason="the openb trace is not in ../shared/data/openb")
@pytest.mark.parametrize("policy", ["fgd", "fgd_cpu"])
def test_simulate_places_every_task_as_the_scorer_without_memo_does_on_openb(policy: str) -> None:
    """``gpushare100``, seed 0: where the kept scores first differed from a fresh batch (the BLAS case above)."""
    from scheduler_core.simulator.traces import read_nodes, read_tasks

    cluster = read_nodes(OPENB / "openb_node_list_gpu_node.csv")
    tasks = read_tasks(OPENB / "openb_pod_list_gpushare100.csv")
    kept = simulate(cluster, tasks, policy, 0, arrived_pct=60)
    plain = simulate(cluster, tasks, registry()[policy], 0, arrived_pct=60)
    assert kept.failed == plain.failed
    np.testing.assert_array_equal(kept.unallocated_pct, plain.unallocated_pct)
    np.testing.assert_array_equal(kept.frag_amount_pct, plain.frag_amount_pct)


def _fragmentation(
    state_cpu: np.ndarray, model: np.ndarray, token: object, overlaid: np.ndarray | None
) -> Fragmentation:
    return Fragmentation(state_cpu, model, SHAPES, 8000, np.arange(state_cpu.size), ("shapes",), token, overlaid)


def test_the_extenders_preference_with_kept_scores_equals_a_fresh_policys_across_states_and_readings() -> None:
    rng = np.random.default_rng(11)
    kept = share_policy("fgd_cpu")
    n = 40
    free = rng.choice([0, 190, 500, 810, 1000], (n, 4)).astype(np.int32)
    cpu, model = rng.choice([0, 16000, 64000], n).astype(np.int64), rng.integers(-1, 2, n).astype(np.int64)
    count = np.full(n, 4, dtype=np.int32)
    for step in range(12):
        token = object()  # a new cluster state
        if step % 3 == 1:
            changed = rng.choice(n, 5, replace=False)
            free[changed] = rng.choice([0, 500, 1000], (5, 4))
        view_free, overlaid = free, None
        if step % 4 == 2:  # a ledger reading laid over two rows, this request only
            view_free, overlaid = free.copy(), np.zeros(n, dtype=bool)
            view_free[[4, 9]] = 0
            overlaid[[4, 9]] = True
        feasible = rng.random(n) < 0.8
        for demand in (PodDemand(), PodDemand(gpus=1), PodDemand(gpus=1, share=500), PodDemand(gpus=2)):
            fresh = SharePolicy("fgd_cpu", registry()["fgd_cpu"])
            frag = _fragmentation(cpu, model, token, overlaid)
            expected = fresh.node_scores(view_free, count, demand, feasible, frag)
            got = kept.node_scores(view_free, count, demand, feasible, frag)
            assert expected is not None and got is not None
            assert got.tolist() == expected.tolist(), (step, demand)
