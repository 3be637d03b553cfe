"""``gpu-scheduler bench path``: the hook counts what it says it counts, and the three requests it traces
take the path through the application layer that docs/architecture.md describes."""

from __future__ import annotations

import pytest

from bench.path import run, trace
from scheduler_core.k8s.node_facts import NodeGpuFacts
from scheduler_core.k8s.nodes import _over_caps

pytestmark = pytest.mark.server  # moto and the API server double


def test_the_hook_counts_each_move_between_product_modules_and_each_return() -> None:
    """A node over all four caps: ``_over_caps`` (nodes) calls ``over_cap`` (limits) four times, and each
    call returns to nodes: nine stops in two modules, seven of them returns."""
    liar = NodeGpuFacts(None, 0, 2**31 - 1, 2**31 - 1)
    slices = {f"p{i}": 10 for i in range(40)}
    path = trace(lambda: _over_caps(liar, slices))
    assert path["path"] == ["scheduler_core.k8s.nodes", "scheduler_core.k8s.limits"]
    assert (path["modules"], path["stops"], path["returns"]) == (2, 9, 7)


def test_filter_prioritize_and_bind_enter_at_the_service_and_reach_what_each_needs() -> None:
    out = run()
    for verb in ("filter", "prioritize", "bind"):
        assert out[verb]["path"][:2] == ["application.extender.service", "scheduler_core.extender.facade"], verb
        assert out[verb]["stops"] >= out[verb]["modules"] + out[verb]["returns"] - 1
    assert "scheduler_core.scoring.policy" in out["prioritize"]["path"]
    assert "scheduler_core.scoring.policy" not in out["filter"]["path"]
    assert {"shares.binder", "adapters.gpu_ledger", "shares.reservations"} <= set(out["bind"]["path"])
