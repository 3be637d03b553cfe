"""The share policy object: its registry, what each policy places, and its tie rules."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from scheduler_core.errors import ConfigError
from scheduler_core.k8s.nodes import NodeTable
from scheduler_core.k8s.pods import PodDemand
from scheduler_core.placement.model import Workload
from scheduler_core.placement.policies import registry
from scheduler_core.scoring.gpu_fit import ScoreWeights
from scheduler_core.scoring.policy import (
    DEFAULT_SHARE_POLICY,
    SHARE_POLICIES,
    Fragmentation,
    break_top_tie,
    share_policy,
)

ROOT = Path(__file__).resolve().parents[3]
# Three 4-GPU nodes with 4, 3 and 2 GPUs free, CPU to spare.
FREE = np.array([[1000] * 4, [1000] * 3 + [0], [1000] * 2 + [0] * 2], dtype=np.int32)
COUNT = np.full(3, 4, dtype=np.int32)
ALL = np.ones(3, dtype=bool)


def fit(*shapes: tuple[int, int]) -> list[float]:
    """``fgd_cpu``'s preference for a one-GPU pod, against typical shapes of (GPUs, count)."""
    workload = Workload.from_shapes([((1000, 1000, gpus, ""), count) for gpus, count in shapes], ("A100", ""))
    fragmentation = Fragmentation(np.full(3, 64_000), np.zeros(3, dtype=np.int64), workload, 1000)
    found = share_policy("fgd_cpu").preference(FREE, COUNT, PodDemand(gpus=1), ALL, fragmentation)
    assert found is not None
    return found.round(4).tolist()


def test_when_fgd_scores_every_node_alike_best_fit_decides() -> None:
    # One-GPU shapes only: taking a GPU fragments nothing anywhere, and the fullest node goes first.
    assert fit((1, 1)) == [0.0, 0.5, 1.0]


def test_fgds_top_tie_stays_a_tie_for_the_node_order_to_break() -> None:
    # Two-GPU shapes too: the third node's pair would be broken up, the other two lose nothing and
    # tie, left for the node order as in simulate (best fit would have put the second node first).
    assert fit((1, 1), (2, 1)) == [1.0, 1.0, 0.0]


def test_the_extenders_policies_are_the_registrys_that_say_so_and_the_default_comes_first() -> None:
    declared = registry()
    assert tuple(name for name, policy in declared.items() if policy.extender) == SHARE_POLICIES
    assert DEFAULT_SHARE_POLICY == SHARE_POLICIES[0] == "fgd_cpu"
    for name in SHARE_POLICIES:
        policy = share_policy(name)
        assert policy.declared is declared[name]
        if policy.reads_cpu:  # it needs a fallback the extender offers, which needs no CPU
            assert policy.declared.fallback in SHARE_POLICIES
            assert not share_policy(policy.declared.fallback).reads_cpu


def test_a_policy_the_extender_does_not_offer_is_refused_naming_the_choices() -> None:
    with pytest.raises(ConfigError, match="share policy 'fgd': expected one of fgd_cpu, gpu_packing, bestfit, dotprod"):
        share_policy("fgd")


@pytest.mark.parametrize("name", SHARE_POLICIES)
def test_each_policy_places_shares_and_only_one_that_says_so_places_the_other_pods(name: str) -> None:
    policy = share_policy(name)
    workload = Workload.from_shapes([((1000, 1000, 1, ""), 1)], ("A100", ""))
    fragmentation = Fragmentation(np.full(3, 64_000), np.zeros(3, dtype=np.int64), workload, 1000)
    share = policy.preference(FREE, COUNT, PodDemand(gpus=1, share=300), ALL, fragmentation)
    assert share is not None and share.max() == 1.0
    for other in (PodDemand(gpus=2), PodDemand()):
        found = policy.preference(FREE, COUNT, other, ALL, fragmentation)
        assert (found is not None) == policy.places_all_pods
    # Without CPU and shapes, a policy that reads CPU hands whole GPUs back to best fit.
    assert policy.preference(FREE, COUNT, PodDemand(gpus=2), ALL, None) is None


def test_one_node_keeps_the_top_score_the_first_in_the_tables_order() -> None:
    table = NodeTable.from_columns(alloc_gpus=[8] * 4, names=["a", "b", "c", "d"])
    score = np.array([10, 10, 9, 1])
    break_top_tie(score, table)
    assert score.tolist() == [9, 10, 8, 1]  # crc32: "b" ranks before "a"
    # Four nodes alike for whole GPUs: the first of all four in the table's order keeps 10.
    tied = share_policy("gpu_packing").scores(
        table, np.full(4, 8), np.zeros(4), PodDemand(gpus=8), ScoreWeights(), np.ones(4, dtype=bool)
    )
    first = int(np.argmin(table.tie_rank))
    assert tied.score.tolist() == [10 if row == first else 9 for row in range(4)]


def _policy_names_tested(path: Path) -> list[str]:
    """``x == "fgd_cpu"``-style comparisons with the name of a policy the extender offers, in ``path``."""
    names = set(SHARE_POLICIES)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                if isinstance(side, ast.Constant) and side.value in names:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {side.value!r}")
    return found


def test_no_policy_name_is_tested_by_string_outside_the_registry() -> None:
    """What a policy needs and places is read from its declaration, never from its name."""
    found = [
        hit
        for package in (
            "scheduler_core",
            "application",
            "shares",
            "lambdas",
            "adapters",
            "gpu_scheduler",
            "cdk",
            "bench",
        )
        for path in sorted((ROOT / package).rglob("*.py"))
        for hit in _policy_names_tested(path)
    ]
    assert found == []
