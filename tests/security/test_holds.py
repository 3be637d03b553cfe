"""Hostile input to consolidation: a holds document someone else wrote (the extender reads it on the hot
path) and pods whose fields would steer the planner. Each is refused with the field named, or read as the
safer thing; the extender keeps serving from the last good book, and nothing raises past the edge."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from adapters.holds_source import HoldsSource
from adapters.snapshot_store import FileSnapshotStore
from scheduler_core.consolidation.holds import MAX_DOCUMENT_BYTES, Hold, HoldBook, HoldsFormatError, Steer
from scheduler_core.consolidation.plan import plan_consolidation
from scheduler_core.extender.facade import Extender
from scheduler_core.state.cluster import ClusterState
from tests.scheduler_core.consolidation.conftest import gpu_node, gpu_pod

GOOD = HoldBook((Hold("ml", "big", "uid-big", "a", 8, 1e9 + 600),))
HOSTILE = [
    pytest.param(b"[" * 100_000 + b"]" * 100_000, id="deeply nested"),
    pytest.param(b" " * (MAX_DOCUMENT_BYTES + 1), id="over the size bound"),
    pytest.param(json.dumps({"version": 1, "holds": [GOOD.to_json().decode()] * 65}).encode(), id="too many holds"),
    pytest.param(json.dumps({"version": 1, "evictions": [0] * 4097}).encode(), id="too many evictions"),
    pytest.param(b'{"version": 1, "evictions": [NaN]}', id="NaN time"),
    pytest.param(
        b'{"version": 1, "holds": [{"namespace": "ml", "name": "x", "uid": "u", "node": "a", "gpus": true,'
        b' "until": 1}]}',
        id="a boolean for a count",
    ),
    pytest.param(
        json.dumps(
            {
                "version": 1,
                "holds": [{"namespace": "ml", "name": "x" * 254, "uid": "u", "node": "a", "gpus": 1, "until": 1}],
            }
        ).encode(),
        id="a name past 253",
    ),
    pytest.param(b"\xff\xfe not utf-8", id="not text"),
    pytest.param(b'{"version": 1, "evictions": [' + b"9" * 400 + b"]}", id="an integer of 400 digits"),
]


@pytest.mark.parametrize("document", HOSTILE)
def test_a_hostile_document_is_refused_by_name_and_the_extender_keeps_its_last_good_book(
    document: bytes, tmp_path: Path
):
    with pytest.raises(HoldsFormatError):
        HoldBook.from_json(document)
    path = tmp_path / "holds.json"
    path.write_bytes(GOOD.to_json())
    ticks = iter(range(100))
    source = HoldsSource(
        FileSnapshotStore(path), refresh_s=1.0, clock=lambda: 1e9, monotonic=lambda: float(next(ticks)) * 2
    )
    assert source()[0] == GOOD
    path.write_bytes(document)
    assert source()[0] == GOOD and "refused, the last ones kept" in source.problem
    state = ClusterState.from_objects([gpu_node("a"), gpu_node("b")], [])
    extender = Extender(cluster=lambda: state, holds=source)
    status, body = extender.handle(
        "filter", json.dumps({"Pod": gpu_pod("p", owner=""), "NodeNames": ["a", "b"]}).encode()
    )
    assert status == 200 and json.loads(body)["NodeNames"] == ["b"]


def hostile_pods() -> list[dict[str, Any]]:
    cost = gpu_pod("cost", "a", annotations={"controller.kubernetes.io/pod-deletion-cost": "-99999999999999999999"})
    owners = gpu_pod("owners", "a")
    owners["metadata"]["ownerReferences"] = [{"controller": True, "kind": ["ReplicaSet"], "uid": {"x": 1}}, "junk"]
    selector = gpu_pod("selector", "a", nodeSelector={"pool": ["not", "a", "string"]})
    affinity = gpu_pod(
        "affinity", "a", affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": 7}}
    )
    tolerations = gpu_pod("tolerations", "a", tolerations="everything")
    models = gpu_pod("models", "a", annotations={"gpu.nvidia.com/model": "A" * 5000})
    return [cost, owners, selector, affinity, tolerations, models]


def test_pods_with_hostile_fields_are_planned_safely_or_left_in_place():
    nodes = [gpu_node("a"), gpu_node("b")]
    pods = [
        *hostile_pods(),
        gpu_pod("fill", "b", gpus=7, movable=False),
        gpu_pod("big", gpus=8, owner="", pending=True),
    ]
    result = plan_consolidation(nodes, pods, [{"spec": "junk"}, 7], max_moves=8, max_moves_per_plan=8)
    moved = {m.pod.name for p in result.plans for m in p.moves}
    assert "owners" not in moved and "models" not in moved  # no controller; a model list past its bound
    assert sum(result.unmovable.values()) + result.movable == 7  # every bound pod of the profile accounted for
    for plan in result.plans:
        for move in plan.moves:
            assert move.cost == 0.0 or move.pod.name != "cost"  # an out-of-range cost counts as none


def test_a_hold_or_steer_set_further_ahead_than_any_plan_sets_one_is_not_obeyed():
    """Only the consolidator writes the book, and its holds last ``HOLD_S`` (an hour at most): one that
    would last longer is a bad write, and the filter ignores it rather than keep a node from every pod."""
    forever = HoldBook(
        (Hold("ml", "big", "uid-big", "a", 8, 1e12),),
        (Steer("ml", "ReplicaSet", "rs", "uid-rs-rs", "ml/x", "b", 0.0, 1e12),),
    )
    replacement = gpu_pod("r", owner="rs")
    replacement["metadata"]["creationTimestamp"] = "2026-12-06T10:00:00Z"
    state = ClusterState.from_objects([gpu_node("a"), gpu_node("b")], [])
    extender = Extender(cluster=lambda: state, holds=lambda: (forever, 1.8e9))
    for pod in (gpu_pod("p", owner=""), replacement):
        status, body = extender.handle("filter", json.dumps({"Pod": pod, "NodeNames": ["a", "b"]}).encode())
        assert status == 200 and json.loads(body)["NodeNames"] == ["a", "b"]
    within = HoldBook((Hold("ml", "big", "uid-big", "a", 8, 1.8e9 + 3600),))
    extender = Extender(cluster=lambda: state, holds=lambda: (within, 1.8e9))
    status, body = extender.handle(
        "filter", json.dumps({"Pod": gpu_pod("p", owner=""), "NodeNames": ["a", "b"]}).encode()
    )
    assert json.loads(body)["NodeNames"] == ["b"]


def test_a_pod_with_malformed_owner_references_is_filtered_under_steers_without_a_fault():
    book = HoldBook((), (Steer("ml", "ReplicaSet", "rs", "uid-rs-rs", "ml/x", "b", 0.0, 1.8e9 + 60),))
    state = ClusterState.from_objects([gpu_node("a"), gpu_node("b")], [])
    extender = Extender(cluster=lambda: state, holds=lambda: (book, 1.8e9))
    for refs in (5, "x", [5, {"controller": True, "uid": {"a": 1}}], None):
        pod = gpu_pod("p", owner="")
        pod["metadata"]["ownerReferences"] = refs
        status, body = extender.handle("filter", json.dumps({"Pod": pod, "NodeNames": ["a", "b"]}).encode())
        assert status == 200 and json.loads(body)["NodeNames"] == ["a", "b"], body
