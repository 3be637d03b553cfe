"""The live state: lists, then watches; rebuilt off the hot path; confirms or drops the extender's readings;
hands gone shares to the ledger; lists again on 410. The real API server's side is in tests/e2e."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from adapters.kube_transport import KubeApiError, ListExpiredError
from adapters.ledger_readings import LedgerReadings
from adapters.live_state import LiveState, prometheus_text
from scheduler_core.errors import ClusterStateUnavailableError
from scheduler_core.k8s.names import ASSIGNED_GPUS_ANNOTATION
from testing.dra import allocated, device_classes, h200_devices, resource_slice
from tests.conftest import make_nodes, make_pod

pytestmark = pytest.mark.server  # the API server double


class ScriptedKube:
    """A Kubernetes source that lists what it is given and then plays the events pushed to it; a watch
    ends when the script says so (``None``), and a ``410`` pushed makes it raise ListExpiredError."""

    def __init__(
        self,
        nodes: list[dict[str, Any]],
        pods: list[dict[str, Any]],
        dra: dict[str, list[dict[str, Any]]] | None = None,
    ) -> None:
        self.items = {"nodes": nodes, "pods": pods, **(dra or {})}
        self.queues: dict[str, list[Any]] = {kind: [] for kind in self.items}
        self.cond = threading.Condition()
        self.lists = dict.fromkeys(self.items, 0)
        self.watched_from: list[tuple[str, str]] = []
        self.dra = dra is not None
        self.dra_version = ""
        self.discovery_failures = 0
        self.closed = False

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def dra_api(self) -> str:
        with self.cond:
            if self.discovery_failures:
                self.discovery_failures -= 1
                raise KubeApiError(503, "ServiceUnavailable", "the API server is starting")
        return "resource.k8s.io/v1" if self.dra else ""

    def list_with_version(self, kind: str, **_: Any) -> tuple[list[dict[str, Any]], str]:
        self.lists[kind] += 1
        return list(self.items[kind]), "100"

    def watch(self, kind: str, version: str, **_: Any) -> Iterator[tuple[str, dict[str, Any]]]:
        self.watched_from.append((kind, version))
        while True:
            with self.cond:
                while not self.queues[kind]:
                    if self.closed:  # the test is over: end the watch, so that its thread ends too
                        return
                    self.cond.wait(timeout=0.05)
                item = self.queues[kind].pop(0)
            if item is None:
                return
            if item == 410:
                raise ListExpiredError(410, "Expired", "too old resource version")
            if isinstance(item, Exception):
                raise item
            yield item

    def push(self, kind: str, item: Any) -> None:
        with self.cond:
            self.queues[kind].append(item)
            self.cond.notify_all()


def _bound(name: str, node: str, *, gpus: int = 1, milli: int = 0, assigned: str = "", rv: int = 101) -> dict[str, Any]:
    pod = make_pod(name, gpus, node_name=node, phase="Running", milli=milli)
    pod["metadata"]["resourceVersion"] = str(rv)
    if assigned:
        pod["metadata"]["annotations"][ASSIGNED_GPUS_ANNOTATION] = assigned
    return pod


def _until(condition: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@contextmanager
def synced(kube: ScriptedKube, **options: Any) -> Iterator[LiveState]:
    """A live state on ``kube``, started, with its first lists in; closed after."""
    live = LiveState(lambda: kube, **options).start()
    try:
        assert live.wait_synced(5)
        yield live
    finally:
        live.close()


@pytest.fixture
def kube() -> Iterator[ScriptedKube]:
    scripted = ScriptedKube(make_nodes("A100", "T4"), [_bound("w", "a100-0", gpus=3)])
    yield scripted
    scripted.close()


def test_filter_waits_for_the_first_list_and_then_sees_it(kube: ScriptedKube) -> None:
    live = LiveState(lambda: kube, min_interval_s=0.0)
    with pytest.raises(ClusterStateUnavailableError, match="still listing") as caught:
        live()
    assert caught.value.kind == "syncing"
    live.start()
    try:
        assert live.wait_synced(5)
        state = live()
        assert dict(zip(state.table.names, state.free_gpus.tolist(), strict=True)) == {"a100-0": 5, "t4-1": 4}
        assert state.generated_at is not None
    finally:
        live.close()


def test_events_reach_the_state_and_forget_the_readings_about_their_pods(kube: ScriptedKube) -> None:
    readings = LedgerReadings(margin_s=60)
    with synced(kube, readings=readings, min_interval_s=0.0) as live:
        pod = _bound("p", "t4-1", gpus=2, rv=102)
        readings.observe("t4-1", (0, 0, 1000, 1000), pod["metadata"]["uid"])  # the extender's prediction
        readings.observe("a100-0", (0, 0, 0), "uid-of-a-pod-never-seen")
        kube.push("pods", ("ADDED", pod))
        _until(lambda: live().free_gpus.tolist() == [5, 2])
        # The state shows p now: its reading is gone; the other pod's stays until the state shows it.
        assert [r.uid for r in readings.pending(None)] == ["uid-of-a-pod-never-seen"]
        kube.push("pods", ("DELETED", pod))
        _until(lambda: live().free_gpus.tolist() == [5, 4])
        assert live.stats()["events"] == 2 and live.stats()["lag_max_s"] < 5


def test_a_pending_pods_event_keeps_the_prediction_made_for_it(kube: ScriptedKube) -> None:
    """kube-scheduler asks about a pod moments after it is created, so the state's rebuild for the pod's
    ADDED event often comes after prioritize predicted its node: that rebuild shows the pod pending,
    and must not drop the prediction (the next pod would be scored on the node as if this one were not
    coming). Its binding, or its deletion, does."""
    readings = LedgerReadings(margin_s=60)
    with synced(kube, readings=readings, min_interval_s=0.0) as live:
        pending = make_pod("p", 0, milli=250)
        uid = pending["metadata"]["uid"]
        readings.assume("t4-1", ((0, 250),), uid)  # prioritize's prediction
        kube.push("pods", ("ADDED", pending))
        kube.push("pods", ("ADDED", _bound("other", "a100-0", gpus=1, rv=102)))
        _until(lambda: live().free_gpus.tolist() == [4, 4])  # a state built after both events
        assert [r.uid for r in readings.pending(None, assumed=True)] == [uid]
        kube.push("pods", ("MODIFIED", _bound("p", "t4-1", gpus=0, milli=250, assigned="0:250", rv=103)))
        _until(lambda: live().free_milli is not None and live().free_milli[1, 0] == 750)
        assert readings.pending(None, assumed=True) == []  # the state shows it bound: the prediction goes
        gone = make_pod("q", 0, milli=250)
        readings.assume("t4-1", ((0, 250),), gone["metadata"]["uid"])
        kube.push("pods", ("ADDED", gone))
        kube.push("pods", ("DELETED", gone))  # deleted before it was scheduled
        kube.push("pods", ("DELETED", _bound("other", "a100-0", gpus=1, rv=104)))
        _until(lambda: live().free_gpus.tolist() == [5, 3])  # p's share holds one of t4-1's GPUs
        assert readings.pending(None, assumed=True) == []


def test_a_gone_or_finished_share_is_handed_to_the_ledger(kube: ScriptedKube) -> None:
    released: list[tuple[str, str]] = []
    with synced(kube, on_gone=lambda node, uid: released.append((node, uid)), min_interval_s=0.0) as live:
        share = _bound("s", "t4-1", gpus=0, milli=250, assigned="1:250")
        whole = _bound("whole", "t4-1", gpus=1)
        kube.push("pods", ("ADDED", share))
        kube.push("pods", ("ADDED", whole))
        _until(lambda: live().free_milli is not None and live().free_milli[1, :4].tolist() == [0, 750, 1000, 1000])
        kube.push("pods", ("DELETED", whole))  # no share: nothing to release
        kube.push("pods", ("DELETED", share))  # a pod deleted, or finished (it leaves the watched set)
        _until(lambda: released == [("t4-1", share["metadata"]["uid"])])


def test_catch_up_waits_for_a_deletion_received_but_not_yet_built_and_not_for_a_bind(kube: ScriptedKube) -> None:
    with synced(kube, min_interval_s=1.0) as live:  # rebuilds at least 1 s apart
        _until(lambda: live.catch_up(0.0) is False)  # the first state holds everything listed
        assert live.catch_up(1.0) is False  # nothing received since
        kube.push("pods", ("ADDED", _bound("bound", "t4-1", gpus=1, rv=102)))
        _until(lambda: live.stats()["events"] == 1)
        assert live.catch_up(1.0) is False  # a bind takes capacity; no refusal waits for it
        kube.push("pods", ("DELETED", _bound("w", "a100-0", gpus=3, rv=103)))
        _until(lambda: live.stats()["events"] == 2)
        assert live().free_gpus.tolist()[0] == 5  # received, not built yet
        assert live.catch_up(0.001) is False  # not in time
        assert live.catch_up(3.0) is True
        assert live().free_gpus.tolist() == [8, 3]
        assert live.catch_up(1.0) is False and live.stats()["catch_ups"] == 2


def test_catch_up_waits_briefly_for_the_deletion_of_a_terminating_pod_on_a_refused_node(kube: ScriptedKube) -> None:
    with synced(kube, min_interval_s=0.0) as live:
        terminating = _bound("w", "a100-0", gpus=3, rv=102)
        terminating["metadata"]["deletionTimestamp"] = "2026-12-04T00:00:00Z"
        kube.push("pods", ("MODIFIED", terminating))
        _until(lambda: live.stats()["events"] == 1 and live.catch_up(0.0) is False)
        assert live.catch_up(1.0, ["t4-1"]) is False  # nothing terminates there: no wait
        started = time.monotonic()
        assert live.catch_up(1.0, ["a100-0"]) is False  # its deletion does not come: a short wait, then no
        assert 0.04 <= time.monotonic() - started < 0.5
        threading.Timer(0.01, kube.push, ("pods", ("DELETED", terminating))).start()
        assert live.catch_up(1.0, ["a100-0"]) is True  # it came: the state has it now
        assert live().free_gpus.tolist() == [8, 4]


def test_catch_up_for_node_facts_waits_for_a_node_change_only(kube: ScriptedKube) -> None:
    """A refusal for a node's own facts waits for a node change received but not built, never for a pod
    deletion; for a node known to be behind (kube-scheduler passed its GPU count) it waits briefly for
    the change to arrive."""
    with synced(kube, min_interval_s=1.0) as live:  # rebuilds at least 1 s apart
        _until(lambda: live.catch_up(0.0) is False)
        kube.push("pods", ("DELETED", _bound("w", "a100-0", gpus=3, rv=102)))
        _until(lambda: live.stats()["events"] == 1)
        assert live.catch_up(1.0, node_facts=True) is False  # a deletion moves no node's facts
        other = copy.deepcopy(kube.items["nodes"][0])
        other["metadata"]["labels"]["e2e"] = "changed"
        kube.push("nodes", ("MODIFIED", other))
        _until(lambda: live.stats()["events"] == 2)
        assert live.catch_up(1.0, ["t4-1"], node_facts=True) is False  # another node's change: no wait for it
        started = time.monotonic()
        assert live.catch_up(1.0, ["t4-1"], node_facts=True) is False  # behind, but its change does not come
        assert 0.04 <= time.monotonic() - started < 0.9
        more = copy.deepcopy(kube.items["nodes"][1])
        more["status"]["allocatable"]["nvidia.com/gpu"] = "8"
        more["metadata"]["resourceVersion"] = "103"
        threading.Timer(0.01, kube.push, ("nodes", ("MODIFIED", more))).start()
        assert live.catch_up(3.0, ["t4-1"], node_facts=True) is True
        assert live().table.alloc_gpus.tolist() == [8, 8]


def test_a_deletion_drops_the_ledgers_earlier_readings_of_its_node_but_not_the_pods_own(kube: ScriptedKube) -> None:
    readings = LedgerReadings(margin_s=60)
    with synced(kube, readings=readings, min_interval_s=0.0) as live:
        readings.observe("a100-0", (0, 0, 0, 0, 0, 0, 0, 0))  # a bind refused for room: the ledger's count
        readings.observe("t4-1", (0, 0, 0, 0))
        readings.observe("a100-0", (0,) * 8, "uid-of-a-pod-not-shown-yet")  # the extender's own decision
        kube.push("pods", ("DELETED", _bound("w", "a100-0", gpus=3, rv=102)))
        _until(lambda: live().free_gpus.tolist()[0] == 8)
        left = [(r.node, r.uid) for r in readings.pending(None)]
        assert left == [("t4-1", ""), ("a100-0", "uid-of-a-pod-not-shown-yet")]


def test_a_410_lists_again_and_shares_gone_meanwhile_are_released(kube: ScriptedKube) -> None:
    released: list[tuple[str, str]] = []
    share = _bound("s", "t4-1", gpus=0, milli=500, assigned="0:500")
    kube.items["pods"].append(share)
    with synced(kube, on_gone=lambda node, uid: released.append((node, uid)), min_interval_s=0.0) as live:
        kube.items["pods"] = [p for p in kube.items["pods"] if p is not share]  # deleted while no watch saw it
        kube.push("pods", 410)
        _until(lambda: kube.lists["pods"] == 2)
        _until(lambda: released == [("t4-1", share["metadata"]["uid"])])
        assert live.stats()["relists_410"] == 1
        # A watch that just ends resumes from the last version seen, without a list.
        kube.push("pods", None)
        _until(lambda: kube.watched_from.count(("pods", "100")) >= 3)
        assert kube.lists["pods"] == 2


def test_a_broken_watch_is_retried_and_the_last_good_state_stays_in_service(kube: ScriptedKube) -> None:
    with synced(kube, min_interval_s=0.0) as live:
        before = live()
        kube.push("nodes", KubeApiError(0, "StreamBroken", "the watch of nodes broke off"))
        _until(lambda: live.stats()["watch_errors"] == 1)
        assert live() is before
        kube.push("nodes", ("ADDED", make_nodes("H100")[0] | {"metadata": {"name": "h100-9", "labels": {}}}))
        _until(lambda: "h100-9" in live().table.names)


def test_claims_watched_hold_their_gpus_and_one_let_go_frees_them_for_catch_up() -> None:
    api = "resource.k8s.io/v1"
    nodes = make_nodes("A100", "T4")
    dra = {
        "deviceclasses": device_classes(api),
        "resourceslices": [resource_slice(api, "a100-0", h200_devices("a100-0", 8))],
        "resourceclaims": [allocated(api, "t", "held", "a100-0", ["gpu-0", "gpu-1"], reserved_for="p")],
    }
    kube = ScriptedKube(nodes, [], dra)
    live = LiveState(lambda: kube, min_interval_s=0.5).start()
    try:
        assert live.wait_synced(5)
        state = live()
        assert state.free_gpus.tolist() == [6, 4] and state.claimed_gpus is not None
        assert state.dra_managed_at(np.array([0, 1])).tolist() == [True, False]
        assert live.stats()["dra_watched"] is True and kube.lists["resourceclaims"] == 1
        more = allocated(api, "t", "more", "a100-0", ["gpu-5"])
        kube.push("resourceclaims", ("ADDED", more))
        _until(lambda: live().free_gpus.tolist() == [5, 4])
        kube.push("resourceclaims", ("DELETED", more))  # a claim let go may free a GPU: a refusal waits for it
        _until(lambda: live.stats()["events"] == 2)
        assert live.catch_up(3.0) is True and live().free_gpus.tolist() == [6, 4]
    finally:
        live.close()
        kube.close()


def test_the_state_waits_for_dra_discovery_and_its_lists_before_it_serves() -> None:
    api = "resource.k8s.io/v1"
    claims = [allocated(api, "t", "held", "a100-0", ["gpu-0"], reserved_for="p")]
    kube = ScriptedKube(make_nodes("A100"), [], {"deviceclasses": [], "resourceslices": [], "resourceclaims": claims})
    kube.discovery_failures = 3
    live = LiveState(lambda: kube, min_interval_s=0.0)
    with kube.cond:  # discovery fails until released
        live.start()
        with pytest.raises(ClusterStateUnavailableError, match=r"resource\.k8s\.io discovery"):
            live()
    try:
        assert live.wait_synced(10)
        assert live().free_gpus.tolist() == [7] and kube.discovery_failures == 0
        assert live.stats()["watch_errors"] == 3
    finally:
        live.close()
        kube.close()


def test_without_dra_served_only_nodes_and_pods_are_watched(kube: ScriptedKube) -> None:
    with synced(kube, min_interval_s=0.0) as live:
        assert live().claimed_gpus is None and live.stats()["dra_watched"] is False
        assert {kind for kind, _ in kube.watched_from} <= {"nodes", "pods"}


def test_the_stats_read_as_prometheus_text() -> None:
    text = prometheus_text({"events": 3, "synced": True, "published_resource_versions": {"pods": "17"}})
    assert text.splitlines() == [
        "gpu_scheduler_live_state_events 3",
        "gpu_scheduler_live_state_synced 1",
        'gpu_scheduler_live_state_published_resource_version{kind="pods"} 17',
    ]


def test_an_unreachable_api_server_is_one_warning_a_minute_per_kind(caplog: pytest.LogCaptureFixture) -> None:
    """748 lines in 90 s before (urllib3's own retries, and a warning per retry of each watch): now the first
    failure of each list and watch, retried with backoff, and the rest at debug level until a minute passes."""
    import logging

    def unreachable() -> Any:
        raise KubeApiError(0, "", "the API server could not be reached: connection refused")

    live = LiveState(unreachable, min_interval_s=0.0, dra_api="")
    with caplog.at_level(logging.DEBUG, logger="adapters.live_state"):
        live.start()
        try:
            _until(lambda: live.counters["watch_errors"] >= 10, timeout_s=10)
        finally:
            live.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert sorted(w.split(" failed")[0] for w in warnings) == ["watching nodes", "watching pods"], warnings
    assert all("retrying with backoff: the API server could not be reached" in w for w in warnings)
