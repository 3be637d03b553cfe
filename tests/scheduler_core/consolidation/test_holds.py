from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from scheduler_core.consolidation.holds import Hold, HoldBook, HoldsFormatError, Steer, hold_refusals
from scheduler_core.extender.facade import Extender
from scheduler_core.k8s.pods import PodDemand
from scheduler_core.state.cluster import ClusterState
from tests.scheduler_core.consolidation.conftest import gpu_node, gpu_pod

UNTIL = 1000.0
BOOK = HoldBook(
    holds=(Hold("ml", "big", "uid-big", "a", 8, UNTIL),),
    steers=(Steer("ml", "ReplicaSet", "web", "uid-rs-web", "ml/web-0", "b", since=500.0, until=UNTIL),),
    evictions=(500.0, 100.0),
)
INDEX = {"a": 0, "b": 1, "c": 2}
FREE = np.array([8, 8, 8], dtype=np.int32)
CREATED_AFTER = "1970-01-01T00:08:30Z"  # 510 s: after the steer was written


def refusals(pod: dict[str, Any], demand: PodDemand, now: float = 600.0) -> tuple[list[bool], list[bool]]:
    held, steered = hold_refusals(BOOK, INDEX, FREE, pod, demand, now)
    return held.tolist(), steered.tolist()


def test_the_book_reads_back_what_it_wrote_and_drops_what_lapsed():
    assert HoldBook.from_json(BOOK.to_json()) == BOOK
    assert HoldBook.from_json(b'{"version": 1}') == HoldBook()
    later = BOOK.live(3000.0)
    assert later.holds == () and later.steers == () and later.evictions == (500.0, 100.0)
    assert BOOK.live(3700.0).evictions == (500.0,)  # an hour after 100.0
    assert BOOK.live(4100.0).evictions == ()


def test_a_hold_refuses_other_gpu_pods_on_its_node_and_not_its_own_pod_nor_cpu_only_pods():
    other = gpu_pod("other", owner="")
    assert refusals(other, PodDemand(gpus=1)) == ([True, False, False], [False, False, False])
    own = gpu_pod("big", owner="")
    assert refusals(own, PodDemand(gpus=8)) == ([False, False, False], [False, False, False])
    assert refusals(other, PodDemand()) == ([False, False, False], [False, False, False])
    # Once it lapses, nothing is held.
    assert refusals(other, PodDemand(gpus=1), now=UNTIL) == ([False, False, False], [False, False, False])


def test_a_node_with_room_beside_the_hold_still_takes_other_pods():
    held, _ = hold_refusals(
        BOOK, {"a": 0}, np.array([10], dtype=np.int32), gpu_pod("x", owner=""), PodDemand(gpus=2), 600.0
    )
    assert held.tolist() == [False]
    held, _ = hold_refusals(
        BOOK, {"a": 0}, np.array([10], dtype=np.int32), gpu_pod("x", owner=""), PodDemand(gpus=3), 600.0
    )
    assert held.tolist() == [True]


def test_a_replacement_is_steered_to_its_node_and_an_older_pod_of_the_same_owner_is_not():
    replacement = gpu_pod("web-new", owner="web")
    replacement["metadata"]["creationTimestamp"] = CREATED_AFTER
    assert refusals(replacement, PodDemand(gpus=1))[1] == [True, False, True]
    older = gpu_pod("web-1", owner="web")  # created 2026 in the builder: compare a pod created long before
    older["metadata"]["creationTimestamp"] = "1970-01-01T00:01:40Z"
    assert refusals(older, PodDemand(gpus=1))[1] == [False, False, False]
    stranger = gpu_pod("api-new", owner="api")
    stranger["metadata"]["creationTimestamp"] = CREATED_AFTER
    assert refusals(stranger, PodDemand(gpus=1))[1] == [False, False, False]
    assert refusals(replacement, PodDemand(gpus=1), now=UNTIL)[1] == [False, False, False]


def filter_reply(extender: Extender, pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
    status, body = extender.handle("filter", json.dumps({"Pod": pod, "NodeNames": names}).encode())
    assert status == 200
    reply: dict[str, Any] = json.loads(body)
    return reply


def test_the_extenders_filter_obeys_the_holds_and_says_why():
    state = ClusterState.from_objects([gpu_node("a"), gpu_node("b"), gpu_node("c")], [])
    extender = Extender(cluster=lambda: state, holds=lambda: (BOOK, 600.0))
    reply = filter_reply(extender, gpu_pod("other", owner=""), ["a", "b", "c"])
    assert reply["NodeNames"] == ["b", "c"]
    assert "holds this node's GPUs for another Pending pod" in reply["FailedAndUnresolvableNodes"]["a"]
    replacement = gpu_pod("web-new", owner="web")
    replacement["metadata"]["creationTimestamp"] = CREATED_AFTER
    reply = filter_reply(extender, replacement, ["a", "b", "c"])
    assert reply["NodeNames"] == ["b"]
    assert set(reply["FailedAndUnresolvableNodes"]) == {"a", "c"}
    assert "sends this pod to another node" in reply["FailedAndUnresolvableNodes"]["c"]
    # The same extender with no holds keeps every node.
    assert filter_reply(Extender(cluster=lambda: state), replacement, ["a", "b", "c"])["NodeNames"] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("document", "named"),
    [
        (b"[]", "expected a JSON object"),
        (b'{"version": 2}', "version 2, this reads 1"),
        (b'{"version": 1, "holds": {}}', "holds: expected a list"),
        (
            b'{"version": 1, "holds": [{"namespace": "a", "name": "b", "uid": "c", "node": "d", "gpus": 129}]}',
            "holds[0].gpus",
        ),
        (b'{"version": 1, "steers": [{"namespace": "a"}]}', "steers[0].owner_kind"),
        (b'{"version": 1, "evictions": [-1]}', "evictions[0]"),
        (b'{"version": 1, "evictions": "x"}', "evictions: expected a list"),
    ],
)
def test_a_document_that_is_wrong_is_refused_with_the_field_named(document: bytes, named: str):
    with pytest.raises(HoldsFormatError, match=named.replace("[", r"\[").replace("]", r"\]")):
        HoldBook.from_json(document)
