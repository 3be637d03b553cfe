"""The rules kept in ``bench/tried.py``: tried for issue #7's target, not adopted, still runnable."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.tried import RULES, expected_waste
from scheduler_core.sharing.model import Task, Workload
from scheduler_core.sharing.policies import registry
from tests.conftest import context, two_nodes, workload


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(10, 990), st.integers(1, 50)), min_size=1, max_size=5))
def test_expected_waste_is_between_nothing_and_all_of_what_is_free(shares: list[tuple[int, int]]) -> None:
    work = Workload.from_shapes([((1000, milli, 1, ""), count) for milli, count in shares], ["G2"])
    waste = expected_waste(work)
    smallest = min(milli for milli, _ in shares)
    assert waste[1000] == 0.0  # an unopened GPU wastes nothing yet
    assert np.all(waste[:smallest] == np.arange(smallest))  # nothing fits: all of it is wasted
    assert np.all((waste[:1000] >= 0) & (waste[:1000] <= np.arange(1000)))


def test_expected_waste_changes_a_shares_score_as_the_readme_says() -> None:
    """Node 0 is idle; node 1's GPU 0 has 500 free and GPU 1 has 200. Half the workload is 500-milli
    shares, so W(500) = 250, and W(1000) = 0: a share that fills GPU 0 saves 250, one that opens a GPU
    costs 250."""
    ctx = context(two_nodes(), workload((1000, 500, 1, 0.5), (1000, 1000, 1, 0.5)))
    share = Task(1000, 1, 1, 500)
    fgd_scores, _ = registry()["fgd"](ctx, share, np.arange(2))
    scores, gpus = RULES["expected_waste"](ctx, share, np.arange(2))
    # FGD's d: node 0 -250 (a 500 fragment for whole GPUs), node 1's GPU 0 +250 (its 500 fragment is used).
    assert fgd_scores.tolist() == [math.floor(100 / (1 + math.exp(-d / 1000))) for d in (-250, 250)]
    assert scores.tolist() == [math.floor(100 / (1 + math.exp(-d / 1000))) for d in (-250 - 250, 250 + 250)]
    assert gpus.tolist() == [0, 0]


def test_tasks_that_do_not_share_are_placed_as_fgd_cpu_places_them() -> None:
    ctx = context(two_nodes(), workload((1000, 500, 1, 0.5), (4000, 0, 0, 0.5)))
    for task in (Task(4000, 1, 0, 0), Task(2000, 1, 1, 1000), Task(2000, 1, 2, 1000)):
        ours, ours_gpus = RULES["expected_waste"](ctx, task, np.arange(2))
        theirs, their_gpus = registry()["fgd_cpu"](ctx, task, np.arange(2))
        assert ours.tolist() == theirs.tolist() and ours_gpus.tolist() == their_gpus.tolist()
