"""``fgd_fit``'s tie rule for whole GPUs: best fit only where FGD scores every feasible node alike."""

from __future__ import annotations

import numpy as np

from scheduler_core.scoring.share_fit import Fragmentation, fgd_fit
from scheduler_core.sharing.model import Workload

# Three 4-GPU nodes with 4, 3 and 2 GPUs free, CPU to spare.
FREE = np.array([[1000] * 4, [1000] * 3 + [0], [1000] * 2 + [0] * 2], dtype=np.int32)
COUNT = np.full(3, 4, dtype=np.int32)
ALL = np.ones(3, dtype=bool)


def fit(*shapes: tuple[int, int]) -> list[float]:
    """``fgd_fit`` for a one-GPU pod, against typical shapes of (GPUs, count)."""
    workload = Workload.from_shapes([((1000, 1000, gpus, ""), count) for gpus, count in shapes], ("A100", ""))
    fragmentation = Fragmentation(np.full(3, 64_000), np.zeros(3, dtype=np.int64), workload, 1000)
    found = fgd_fit(FREE, COUNT, 1, ALL, "fgd_cpu", fragmentation)
    assert found is not None
    return found.round(4).tolist()


def test_when_fgd_scores_every_node_alike_best_fit_decides() -> None:
    # One-GPU shapes only: taking a GPU fragments nothing anywhere, and the fullest node goes first.
    assert fit((1, 1)) == [0.0, 0.5, 1.0]


def test_fgds_top_tie_stays_a_tie_for_the_node_order_to_break() -> None:
    # Two-GPU shapes too: the third node's pair would be broken up, the other two lose nothing and
    # tie, left for the node order as in simulate (best fit would have put the second node first).
    assert fit((1, 1), (2, 1)) == [1.0, 1.0, 0.0]
