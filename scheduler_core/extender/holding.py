"""The extender's filter under a consolidation's holds (:mod:`scheduler_core.consolidation.holds`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from scheduler_core.consolidation.holds import HoldBook, hold_refusals
from scheduler_core.extender.decide import FilterOutcome
from scheduler_core.scoring.gpu_fit import Reason

HoldsSource = Callable[[], tuple[HoldBook, float]]
"""The holds book as the extender last read it, and the time to judge it at (``adapters.holds_source``)."""


def with_holds(outcome: FilterOutcome, pod: Any, source: HoldsSource | None) -> FilterOutcome:
    """``outcome`` with the holds ``source`` gives obeyed (:func:`~scheduler_core.consolidation.holds.hold_refusals`):
    of the nodes that pass, those held for another Pending pod fail as ``Reason.HELD``, and, for a
    replacement the plan steers, every node but its destination as ``Reason.STEERED``. Both are
    unresolvable: preemption frees no hold. No source, or an empty book: ``outcome`` as it is."""
    result, view, demand = outcome.result, outcome.view, outcome.demand
    if source is None or result is None or view is None or demand is None:
        return outcome
    book, now = source()
    if not (book.holds or book.steers):
        return outcome
    held, steered = hold_refusals(book, view.table.index, result.free_gpus, pod, demand, now)
    if not (held.any() or steered.any()):
        return outcome
    reason = result.reason.copy()
    fits = reason == Reason.FITS
    reason[fits & held] = Reason.HELD
    reason[fits & steered] = Reason.STEERED
    refused = replace(result, reason=reason)
    return replace(outcome, result=refused, kept_rows=np.flatnonzero(refused.feasible))
