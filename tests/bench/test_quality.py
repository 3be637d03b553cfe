"""The packing bounds behind ``python -m bench.quality --floor``."""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.quality import share_packing_bounds


def _optimum(items: list[int], capacity: int = 1000) -> int:
    """The fewest bins, by trying every assignment (small inputs only)."""
    for bins in range(1, len(items) + 1):
        for assignment in itertools.product(range(bins), repeat=len(items)):
            load = [0] * bins
            for item, b in zip(items, assignment, strict=True):
                load[b] += item
            if max(load) <= capacity:
                return bins
    return len(items)


def test_bounds_on_hand_built_shares() -> None:
    assert share_packing_bounds([810, 810, 470, 470, 320, 160]) == (4, 4)  # 810+160, 810, 470+470, 320
    assert share_packing_bounds([600, 600, 600]) == (3, 3)  # sum/1000 says 2; no two fit together
    assert share_packing_bounds([]) == (0, 0)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=999), min_size=1, max_size=6))
def test_the_optimum_lies_between_the_lower_bound_and_first_fit_decreasing(items: list[int]) -> None:
    lower, ffd = share_packing_bounds(items)
    assert math.ceil(sum(items) / 1000) <= lower <= _optimum(items) <= ffd <= len(items)
