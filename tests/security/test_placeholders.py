"""Placeholders cannot be multiplied (issue "Safe to deploy, third pass"): shares are grouped by what an
autoscaler acts on, a group's milli is summed onto whole GPUs, and however the shares vary, no more
placeholders stand than the caps allow, per namespace of the shares and in all; what the caps hold back is
counted. ``tests/e2e/test_reserved_shares.py`` runs the refresher on the real API server with the same 40."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_core.state.demand import PlaceholderCaps, cap_demand, plan_placeholders, share_demand
from tests.conftest import make_pod

REFUSED = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}


def share(name: str, milli: int, namespace: str = "team-a", tolerations: list[dict[str, Any]] | None = None) -> Any:
    pod = make_pod(name, 0, namespace=namespace, models="H100", milli=milli)
    pod["status"] = REFUSED
    if tolerations is not None:
        pod["spec"]["tolerations"] = tolerations
    return pod


def dummy(k: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"key": f"dummy-{k}", "operator": "Exists", "effect": "NoSchedule", **extra}]


def placeholders(pods: list[Any], caps: PlaceholderCaps) -> int:
    return len(plan_placeholders(cap_demand(share_demand(pods), caps), []).create)


def test_forty_one_milli_shares_with_forty_tolerations_stand_within_the_cap() -> None:
    pods = [share(f"s-{k}", 1, tolerations=dummy(k)) for k in range(40)]
    caps = PlaceholderCaps(per_namespace=3, total=64)
    demand = cap_demand(share_demand(pods), caps)
    assert placeholders(pods, caps) == 3
    assert sum(d.held_back for d in demand) == 37 and sum(d.gpus for d in demand) == 40


def test_tolerations_that_read_the_same_to_a_taint_make_one_group_and_their_milli_is_summed() -> None:
    variants = [
        [],
        [{"key": "x", "operator": "Exists", "effect": "PreferNoSchedule"}],  # keeps no pod off a node
        dummy(0, tolerationSeconds=30),  # how long it stays, not where it may go
        dummy(0) + dummy(0),  # twice
        [*dummy(0), "not a toleration"],
    ]
    pods = [share(f"s-{k}", 1, tolerations=t) for k, t in enumerate(variants)]
    groups = {len(d.requirements["tolerations"]): d for d in share_demand(pods)}
    assert sorted(groups) == [0, 1]  # none, and dummy-0 NoSchedule
    assert (groups[0].gpus, groups[0].shares, groups[1].gpus, groups[1].shares) == (1, 2, 1, 3)
    assert groups[1].requirements["tolerations"] == dummy(0)


def test_the_total_cap_is_shared_out_namespace_by_namespace() -> None:
    pods = [share(f"s-{n}-{k}", 600, namespace=f"team-{n}", tolerations=dummy(k)) for n in range(10) for k in range(8)]
    caps = PlaceholderCaps(per_namespace=5, total=12)
    demand = cap_demand(share_demand(pods), caps)
    per_namespace: dict[str, int] = {}
    for group in demand:
        per_namespace[group.namespace] = per_namespace.get(group.namespace, 0) + group.placeholders
    assert sum(per_namespace.values()) == 12 and max(per_namespace.values()) - min(per_namespace.values()) <= 1
    assert placeholders(pods, caps) == 12


@pytest.mark.parametrize("caps", [PlaceholderCaps(0, 64), PlaceholderCaps(16, 0)], ids=["no namespace", "none"])
def test_a_cap_of_zero_stands_no_placeholder(caps: PlaceholderCaps) -> None:
    assert placeholders([share("s", 250)], caps) == 0


def test_placeholders_past_a_lowered_cap_are_deleted() -> None:
    pods = [share(f"s-{k}", 600) for k in range(6)]
    demand = cap_demand(share_demand(pods), PlaceholderCaps(per_namespace=2, total=64))
    (group,) = demand
    existing = [
        {"metadata": {"name": f"gpu-placeholder-{group.key}-{i}", "labels": {"gpu-scheduler.io/placeholder-group":
         group.key}}, "spec": {}}
        for i in range(6)
    ]  # fmt: skip
    plan = plan_placeholders(demand, existing)
    assert plan.create == () and len(plan.delete) == 4


def test_caps_out_of_range_are_named() -> None:
    assert PlaceholderCaps(-1, 10**6).problems() == [
        "placeholders.per_namespace: expected an integer in 0..10000, got -1",
        "placeholders.total: expected an integer in 0..10000, got 1000000",
    ]
