"""The ledger's arithmetic: invariants, the GPU choice against a loop reference, rebuild from annotations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_core.state.ledger import Demand, LedgerError, NodeLedger, choose_gpus, rebuild


def _reference_choice(free: list[int], demand: Demand) -> tuple[tuple[int, int], ...] | None:
    """Slow, obvious version: whole GPUs are the lowest-index fully free ones; a share goes on the GPU
    with the least room that fits, lowest index on ties."""
    if demand.milli == 1000:
        whole = [g for g, f in enumerate(free) if f >= 1000][: demand.num_gpu]
        return tuple((g, 1000) for g in whole) if len(whole) == demand.num_gpu else None
    best = None
    for g, f in enumerate(free):
        if f >= demand.milli and (best is None or f < free[best]):
            best = g
    return None if best is None else ((best, demand.milli),)


demands = st.one_of(
    st.builds(Demand, st.just(1), st.integers(1, 999)),
    st.builds(Demand, st.integers(1, 8), st.just(1000)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 1000), min_size=1, max_size=8), demands)
def test_choice_equals_the_loop_reference(free: list[int], demand: Demand) -> None:
    assert choose_gpus(np.array(free, dtype=np.int64), demand) == _reference_choice(free, demand)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3), st.sampled_from([100, 250, 500, 1000])), max_size=40))
def test_assigning_until_full_never_breaks_an_invariant(pods: list[tuple[int, int]]) -> None:
    ledger = NodeLedger("n", 4)
    for i, (num_gpu, milli) in enumerate(pods):
        demand = Demand(num_gpu if milli == 1000 else 1, milli)
        pairs = choose_gpus(ledger.free(), demand)
        if pairs is None:
            continue
        ledger = ledger.with_assignment(f"uid-{i}", pairs)
        assert ledger.problems() == []
    for uid in list(ledger.assignments):
        ledger = ledger.without(uid)
        assert ledger.problems() == []
    assert ledger.used == (0, 0, 0, 0)


def test_over_allocating_a_gpu_is_refused() -> None:
    ledger = NodeLedger("n", 2).with_assignment("a", ((0, 700),))
    with pytest.raises(LedgerError, match="GPU 0 has 300 milli free, not 400"):
        ledger.with_assignment("b", ((0, 400),))


def test_a_pod_cannot_be_assigned_twice_on_a_node() -> None:
    ledger = NodeLedger("n", 2).with_assignment("a", ((0, 500),))
    with pytest.raises(LedgerError, match="pod a already holds 0:500"):
        ledger.with_assignment("a", ((1, 500),))


def test_each_change_is_a_new_version_and_release_of_an_absent_pod_is_not() -> None:
    first = NodeLedger("n", 2)
    second = first.with_assignment("a", ((1, 250),))
    assert (first.version, second.version, second.used) == (0, 1, (0, 250))
    assert second.without("a").version == 2 and second.without("a").used == (0, 0)
    assert second.without("nobody") is second


@pytest.mark.parametrize(
    ("demand", "message"),
    [(Demand(0, 500), "num_gpu >= 1"), (Demand(1, 1001), "milli in 1..1000"), (Demand(2, 500), "one GPU only")],
    ids=["no GPUs", "more than a GPU", "a share of two GPUs"],
)
def test_invalid_demands_are_refused(demand: Demand, message: str) -> None:
    with pytest.raises(LedgerError, match=message):
        demand.validated()


def test_rebuild_keeps_what_fits_and_names_what_does_not() -> None:
    held = {"a": ((0, 600),), "b": ((0, 600),), "c": ((1, 1000),), "d": ((7, 100),)}
    ledger, problems = rebuild("n", 2, held, version=4)
    assert ledger.version == 5 and ledger.used == (600, 1000)
    assert set(ledger.assignments) == {"a", "c"}
    assert problems == ["n: GPU 0 has 400 milli free, not 600", "n: GPU 7 has 0 milli free, not 100"]


def test_problems_name_a_ledger_whose_sum_disagrees() -> None:
    broken = NodeLedger("n", 2, 3, (500, 0), {"a": ((0, 250),)})
    assert broken.problems() == ["n: GPU 0 records 500 milli but its assignments sum to 250"]
