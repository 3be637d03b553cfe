import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_core.errors import ConfigError
from scheduler_core.k8s.nodes import NodeTable
from scheduler_core.k8s.pods import PodDemand
from scheduler_core.scoring.gpu_fit import Reason, ScoreWeights, filter_nodes, free_gpus
from scheduler_core.scoring.gpu_score import normalize_scores, score_nodes
from scheduler_core.scoring.policy import DEFAULT_SHARE_POLICY, share_policy
from testing.reference import reference_normalize, reference_reasons, reference_scores

A100 = frozenset({"A100"})


def cluster():
    """a100 (8 GPU, 40 GiB), h100 (8, 80 GiB), t4 (4, 15 GiB), bare (8 GPUs, no labels)."""
    return NodeTable.from_columns(
        names=["a100", "h100", "t4", "bare"],
        models=["A100", "H100", "T4", None],
        memory_mib=[40960, 81559, 15360, 0],
        alloc_gpus=[8, 8, 4, 8],
    )


@pytest.mark.parametrize(
    ("demand", "free", "expected"),
    [
        pytest.param(PodDemand(gpus=2), [8, 8, 4, 8], ["FITS"] * 4, id="unconstrained pod fits every node with room"),
        pytest.param(
            PodDemand(gpus=2, models=A100),
            [8, 8, 4, 8],
            ["FITS", "MODEL", "MODEL", "NO_GPU_INFO"],
            id="node with disallowed model is unresolvable",
        ),
        pytest.param(
            PodDemand(gpus=1, min_memory_mib=40960),
            [8, 8, 4, 8],
            ["FITS", "FITS", "MEMORY", "NO_GPU_INFO"],
            id="node with too little memory per GPU is unresolvable",
        ),
        pytest.param(
            PodDemand(gpus=6),
            [8, 8, 4, 8],
            ["FITS", "FITS", "TOO_FEW_GPUS", "FITS"],
            id="node with too few GPUs in total",
        ),
        pytest.param(
            PodDemand(gpus=4), [3, 8, 4, 0], ["TOO_FEW_FREE", "FITS", "FITS", "TOO_FEW_FREE"], id="too few free GPUs"
        ),
        pytest.param(
            PodDemand(gpus=0, models=A100), [0, 0, 0, 0], ["FITS"] * 4, id="pod without GPUs passes every node"
        ),
    ],
)
def test_filter_reasons(demand, free, expected):
    result = filter_nodes(cluster(), free, demand)
    assert [Reason(r).name for r in result.reason] == expected


def test_unresolvable_and_resolvable_failures_go_to_their_own_maps():
    result = filter_nodes(cluster(), [1, 8, 4, 8], PodDemand(gpus=2, models=frozenset({"A100", "T4"})))
    assert result.failed == {"a100": "1 of 8 GPUs free, pod needs 2"}
    assert result.failed_unresolvable == {
        "h100": "GPU model H100 not in A100,T4",
        "bare": "no GPU model/memory labels (pod wants A100,T4)",
    }


def test_reasons_are_short_and_readable():
    table = cluster()
    assert filter_nodes(table, [8] * 4, PodDemand(gpus=1, min_memory_mib=20000)).failed_unresolvable == {
        "t4": "GPU memory 15360 MiB < 20000 MiB per GPU requested",
        "bare": "no GPU model/memory labels (pod wants any)",
    }
    assert filter_nodes(table, [8] * 4, PodDemand(gpus=6)).failed_unresolvable == {
        "t4": "4 GPUs allocatable, pod needs 6"
    }


def test_node_with_label_error_reports_that_error():
    table = NodeTable.from_columns(alloc_gpus=[8, 8])
    table = type(table)(**{**table.__dict__, "gpu_info_errors": {1: "label gpu.nvidia.com/memory='x' is not ..."}})
    result = filter_nodes(table, [8, 8], PodDemand(gpus=1, models=A100))
    assert result.failed_unresolvable["node-1"] == "no usable GPU labels: label gpu.nvidia.com/memory='x' is not ..."
    assert result.failed_unresolvable["node-0"].startswith("no GPU model/memory labels")


def test_free_gpus_never_go_negative():
    table = NodeTable.from_columns(alloc_gpus=[8, 4])
    assert free_gpus(table, [10, 1]).tolist() == [0, 3]


def test_best_fit_uses_free_not_total_gpus():
    table = NodeTable.from_columns(alloc_gpus=[8, 8, 4])
    scores = score_nodes(table, [2, 8, 4], [0.0, 0.0, 0.0], PodDemand(gpus=2))
    # The node with exactly 2 free is best although it has 8 in total; the 4-GPU node is next.
    assert scores.score.tolist() == [10, 5, 8]
    assert scores.fit.tolist() == [1.0, pytest.approx(0.4), pytest.approx(0.8)]


def test_lower_utilisation_scores_higher_when_fit_is_equal():
    table = NodeTable.from_columns(alloc_gpus=[8, 8])
    scores = score_nodes(table, [4, 4], [0.9, 0.1], PodDemand(gpus=4))
    assert scores.score[1] > scores.score[0]


def test_weights_blend_fit_and_utilisation():
    table = NodeTable.from_columns(alloc_gpus=[8, 8])
    only_util = score_nodes(table, [2, 8], [0.5, 0.0], PodDemand(gpus=2), ScoreWeights(fit=0.0, utilization=1.0))
    assert only_util.score.tolist() == [5, 10]
    only_fit = score_nodes(table, [2, 8], [0.5, 0.0], PodDemand(gpus=2), ScoreWeights(fit=1.0, utilization=0.0))
    assert only_fit.score.tolist() == [10, 4]


def test_nodes_that_do_not_fit_and_pods_without_gpus_score_zero():
    table = NodeTable.from_columns(alloc_gpus=[8, 8])
    assert score_nodes(table, [1, 8], [0, 0], PodDemand(gpus=2)).score.tolist() == [0, 10]
    assert score_nodes(table, [1, 8], [0, 0], PodDemand(gpus=0)).score.tolist() == [0, 0]


def test_nan_utilisation_counts_as_idle():
    table = NodeTable.from_columns(alloc_gpus=[8, 8])
    scores = score_nodes(table, [8, 8], [np.nan, 0.0], PodDemand(gpus=8))
    assert scores.raw[0] == scores.raw[1] and scores.score.tolist() == [10, 10]  # the tie is the policy's to break


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param([0.3, 0.3, 0.3], [10, 10, 10], id="all equal scores give every node the same score"),
        pytest.param([0.0, 0.0], [0, 0], id="all zero stays zero"),
        pytest.param([0.7, 1.0], [7, 10], id="exact ratios are not floored by float error"),
        pytest.param([1.0, 0.95, 0.93, 0.91, 0.5], [10, 9, 8, 7, 5], id="levels folded into one integer step down"),
        pytest.param([1.0, 0.6, 0.59, 0.58, 0.5], [10, 6, 5, 4, 3], id="the last run steps down as far as 1"),
        pytest.param(
            [1.0, 0.55, 0.54, 0.53, 0.52, 0.3], [10, 5, 4, 4, 4, 3], id="but never down to a lower level's score"
        ),
        pytest.param([0.1 + 0.2, 0.3, 0.2], [10, 10, 6], id="scores equal on paper are one level despite float error"),
        pytest.param([np.nan, -1.0, 2.0], [0, 0, 10], id="nan and negative count as zero"),
        pytest.param([], [], id="no nodes"),
    ],
)
def test_normalize_scores(raw, expected):
    assert normalize_scores(raw).tolist() == expected


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        pytest.param(ScoreWeights(fit=1.5), r"weights.fit: must be in \[0, 1\], got 1.5", id="above one"),
        pytest.param(ScoreWeights(utilization=-0.1), r"weights.utilization: must be in \[0, 1\]", id="negative"),
        pytest.param(ScoreWeights(0.0, 0.0), "^weights: fit \\+ utilization must be > 0", id="both zero"),
    ],
)
def test_invalid_weights_are_rejected_with_field_paths(weights, message):
    with pytest.raises(ConfigError, match=message):
        weights.validated()


def test_every_weight_problem_is_reported_at_once():
    assert len(ScoreWeights(fit=2.0, utilization=-1.0).problems()) == 2


def test_shape_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"free: expected shape \(4,\) to match the node table, got \(3,\)"):
        filter_nodes(cluster(), [1, 2, 3], PodDemand(gpus=1))


# -- properties against the loop-based reference ----------------------------------------------------
MODELS = ["A100", "H100", "T4", "L40S"]


@st.composite
def random_cluster(draw):
    n = draw(st.integers(min_value=0, max_value=40))
    models = draw(st.lists(st.sampled_from([*MODELS, None]), min_size=n, max_size=n))
    alloc = draw(st.lists(st.integers(0, 16), min_size=n, max_size=n))
    memory = draw(st.lists(st.sampled_from([0, 15360, 24576, 40960, 81559]), min_size=n, max_size=n))
    free = [draw(st.integers(0, a)) for a in alloc]
    util = draw(st.lists(st.floats(0.0, 1.0) | st.just(float("nan")), min_size=n, max_size=n))
    table = NodeTable.from_columns(models=models, alloc_gpus=alloc, memory_mib=memory)
    return table, free, util


demands = st.builds(
    PodDemand,
    gpus=st.integers(0, 10),
    models=st.none() | st.frozensets(st.sampled_from(MODELS), min_size=1),
    min_memory_mib=st.sampled_from([0, 16384, 40960, 81920]),
)
weights_st = st.builds(ScoreWeights, fit=st.floats(0.05, 1.0), utilization=st.floats(0.0, 1.0))


@settings(max_examples=300, deadline=None)
@given(random_cluster(), demands, weights_st)
def test_vectorised_core_equals_reference(data, demand, weights):
    table, free, util = data
    result = filter_nodes(table, free, demand)
    assert result.reason.tolist() == reference_reasons(table, free, demand)
    scores = share_policy("gpu_packing").scores(table, np.asarray(free), np.asarray(util), demand, weights,
                                                result.feasible)  # fmt: skip
    expected = reference_scores(free, util, result.feasible.tolist(), demand.gpus, weights, names=table.names)
    assert scores.score.tolist() == expected


@settings(max_examples=200, deadline=None)
@given(random_cluster(), demands)
def test_every_node_is_kept_or_has_a_reason_and_kept_is_a_subset(data, demand):
    table, free, _ = data
    result = filter_nodes(table, free, demand)
    kept = {table.names[i] for i in np.flatnonzero(result.feasible)}
    failed, unresolvable = result.failed, result.failed_unresolvable
    assert kept | failed.keys() | unresolvable.keys() == set(table.names)
    assert not (kept & failed.keys()) and not (kept & unresolvable.keys()) and not (failed.keys() & unresolvable.keys())
    assert all(reason for reason in [*failed.values(), *unresolvable.values()])


@settings(max_examples=200, deadline=None)
@given(random_cluster(), demands)
def test_scores_are_integers_in_0_to_10(data, demand):
    table, free, util = data
    scores = score_nodes(table, free, util, demand).score
    assert scores.dtype.kind == "i"
    assert ((scores >= 0) & (scores <= 10)).all()


@settings(max_examples=200, deadline=None)
@given(random_cluster(), demands, st.randoms(use_true_random=False))
def test_reordering_nodes_changes_nothing(data, demand, rnd):
    table, free, util = data
    order = list(range(table.n_nodes))
    rnd.shuffle(order)
    shuffled = table.take(order)
    before = filter_nodes(table, free, demand)
    after = filter_nodes(shuffled, [free[i] for i in order], demand)
    assert before.failed == after.failed and before.failed_unresolvable == after.failed_unresolvable
    s_before = score_nodes(table, free, util, demand).score
    s_after = score_nodes(shuffled, [free[i] for i in order], [util[i] for i in order], demand).score
    assert dict(zip(table.names, s_before.tolist(), strict=True)) == dict(
        zip(shuffled.names, s_after.tolist(), strict=True)
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.05, 0.3, 0.5, 0.51, 0.52, 0.53, 0.55, 0.9, 0.91, 0.95, 1.0, 1.7]), max_size=40))
def test_normalized_scores_keep_the_order_within_the_proportional_bound(raw: list[float]) -> None:
    got = normalize_scores(raw).tolist()
    assert got == reference_normalize(raw)
    best = max(raw, default=0.0)
    for i, a in enumerate(raw):
        proportional = math.floor(10 * a / best + 1e-9) if best > 0 else 0
        assert 0 <= got[i] <= proportional  # never above its proportional value
        assert (got[i] == 10) == (a == best > 0)  # the best alone scores 10
        for j, b in enumerate(raw):
            if a == b:
                assert got[i] == got[j]  # ties stay ties
            elif a > b:
                assert got[i] >= got[j]  # order never reversed


def test_pods_of_every_kind_break_a_tie_toward_the_same_node():
    """A share, whole GPUs and a CPU-only pod that the policy scores alike on several nodes all get the
    same one of them at 10 (NodeTable.tie_rank), the other tied ones 9 and the rest one lower than
    before: left to kube-scheduler, a CPU-only pod's tie went elsewhere than the shares', and its CPU
    stranded their GPUs (docs/benchmarks.md, "kube-scheduler's arithmetic in the simulator")."""
    table = NodeTable.from_columns(alloc_gpus=[8] * 5, names=[f"gpu-node-{i}" for i in range(5)])
    fit = np.array([1.0, 1.0, 1.0, 0.5, 0.0])
    free = np.full(5, 8)
    util = np.zeros(5)
    winners = set()
    for demand in (PodDemand(gpus=1, share=250), PodDemand(gpus=2), PodDemand(gpus=0)):
        policy = share_policy(DEFAULT_SHARE_POLICY)
        score = policy.scores(table, free, util, demand, ScoreWeights(), free >= 0, fit=fit).score
        assert np.count_nonzero(score == 10) == 1
        winners.add(int(np.argmax(score)))
        others = [i for i in range(3) if i != int(np.argmax(score))]
        assert score[others].tolist() == [9, 9] and 1 <= score[3] < 9
    assert len(winners) == 1
