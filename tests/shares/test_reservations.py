"""Reservation pods: the bind opens one before the Binding of a GPU's first share and waits for the UUID it
reports, the last share's release closes it; and :class:`shares.reservations.Reservations`' own reads,
closes and reconcile. The ledger in moto's DynamoDB, the pods in the in-repo API double over HTTP."""

from __future__ import annotations

import threading
import time

import pytest

from adapters.gpu_ledger import LedgerStore
from adapters.kube import connect_url
from manifests.share_env import share_annotations
from scheduler_core.k8s.names import (
    MPS_MEMORY_ANNOTATION,
    RESERVED_GPU_ANNOTATION,
    VISIBLE_DEVICES_ANNOTATION,
)
from scheduler_core.k8s.nodes import NodeTable
from scheduler_core.state.ledger import Demand
from shares.reservations import Reservations
from testing.kube_double import KubeApiDouble
from testing.reservation_kubelet import gpu_uuid
from tests.shares.conftest import RESERVED, TOKEN, pending, pod_on, reservation_names, reserving_binder

pytestmark = pytest.mark.server  # moto's DynamoDB and the API server double


def test_the_first_share_on_a_gpu_creates_its_reservation_pod_before_its_binding(
    api: KubeApiDouble, ledger: LedgerStore
) -> None:
    """Only the first share on a GPU creates one (the second on the same GPU does not ask again), whole
    GPUs never do (their pods request nvidia.com/gpu themselves), and the POST precedes the Binding."""
    binder = reserving_binder(api, ledger)
    assert binder.bind(pending(api, "a", milli=300)).error == ""
    assert binder.bind(pending(api, "b", milli=500)).error == ""  # the same GPU, 0
    assert binder.bind(pending(api, "w", gpus=1)).error == ""  # a whole GPU, 1
    assert binder.bind(pending(api, "c", milli=600)).error == ""  # no room on GPU 0: GPU 2
    assert reservation_names(api) == {"gpu-reservation-t4-0-0", "gpu-reservation-t4-0-2"}
    writes = [(r.method, r.path) for r in api.requests if r.method == "POST"]
    assert writes.index(("POST", f"/api/v1/namespaces/{RESERVED}/pods")) < writes.index(
        ("POST", "/api/v1/namespaces/default/pods/a/binding")
    )
    assert sum(1 for w in writes if w == ("POST", f"/api/v1/namespaces/{RESERVED}/pods")) == 2
    pod = api.get("pods", "gpu-reservation-t4-0-2", RESERVED)
    assert pod["spec"]["nodeName"] == "t4-0" and pod["spec"]["containers"][0]["image"] == "registry.example/python:3.12"


def test_a_shares_binding_gives_its_containers_the_uuid_its_reservation_pod_reported(
    api: KubeApiDouble, ledger: LedgerStore
) -> None:
    """The Binding carries the UUID (the double's node reports a made-up one per GPU) and the share's size,
    which the share's containers read from the pod's annotations (manifests/share_env.py)."""
    binder = reserving_binder(api, ledger)
    assert binder.bind(pending(api, "a", milli=300)).error == ""
    assert binder.bind(pending(api, "c", milli=800)).error == ""  # no room on GPU 0: GPU 1
    memory_mib = int(NodeTable.from_nodes([api.get("nodes", "t4-0")]).memory_mib[0])
    assert memory_mib > 0
    a, c = (api.get("pods", name, "default") for name in ("a", "c"))
    assert (
        a["metadata"]["annotations"] | share_annotations(gpu_uuid("t4-0", 0), 300, memory_mib)
        == a["metadata"]["annotations"]
    )
    assert a["metadata"]["annotations"][MPS_MEMORY_ANNOTATION] == f"0={memory_mib * 3 // 10}MB"
    assert c["metadata"]["annotations"][VISIBLE_DEVICES_ANNOTATION] == gpu_uuid("t4-0", 1)
    # Whole GPUs get theirs from the device plugin: no share annotations.
    assert binder.bind(pending(api, "w", gpus=1)).error == ""
    assert VISIBLE_DEVICES_ANNOTATION not in api.get("pods", "w", "default")["metadata"]["annotations"]


def test_a_share_waits_for_its_gpus_uuid_outside_its_own_budget(api: KubeApiDouble, ledger: LedgerStore) -> None:
    """A GPU's first share is bound once its new reservation pod reports (the kubelet starts it first);
    the wait is not taken from the bind's budget for its other calls."""
    api.reservations_report = False
    binder = reserving_binder(api, ledger)
    binder.kube.deadline, binder.kube.min_call_s = binder.deadline, 0.1
    binder.bind_budget_s = 0.8
    name = "gpu-reservation-t4-0-0"

    def node_reports() -> None:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and name not in reservation_names(api):
            time.sleep(0.02)
        time.sleep(1.2)  # past the bind's own 0.8 s
        pod = api.get("pods", name, RESERVED)
        pod["metadata"]["annotations"][RESERVED_GPU_ANNOTATION] = "GPU-11111111-2222-3333-4444-555555555555"
        api.load("pods", [{**pod, "status": {"phase": "Running"}}])

    thread = threading.Thread(target=node_reports)
    thread.start()
    outcome = binder.bind(pending(api, "a", milli=250))
    thread.join()
    assert outcome.error == ""
    annotations = api.get("pods", "a", "default")["metadata"]["annotations"]
    assert annotations[VISIBLE_DEVICES_ANNOTATION] == "GPU-11111111-2222-3333-4444-555555555555"


def test_a_share_whose_gpu_never_reports_is_not_bound_and_its_reservation_pod_stays(
    api: KubeApiDouble, ledger: LedgerStore
) -> None:
    """No UUID, no Binding: a container must never start without its GPU. The reservation pod is kept for
    kube-scheduler's retry (a new one would start over); the reconcile removes it if no share comes."""
    api.reservations_report = False
    binder = reserving_binder(api, ledger)
    binder.uuid_wait_s = 0.3
    outcome = binder.bind(pending(api, "a", milli=250))
    assert outcome.error == (
        "bind default/a to t4-0: the reservation pod of GPU 0 has not reported the GPU's UUID yet; "
        "kube-scheduler will retry the pod"
    )
    assert outcome.error_kind == "reservation_pending" and outcome.rolled_back
    assert pod_on(api, "a") == (None, None) and ledger.read("t4-0", 4).assignments == {}
    assert reservation_names(api) == {"gpu-reservation-t4-0-0"}
    # Reported now: the retry binds with it.
    pod = api.get("pods", "gpu-reservation-t4-0-0", RESERVED)
    pod["metadata"]["annotations"][RESERVED_GPU_ANNOTATION] = gpu_uuid("t4-0", 5)
    api.load("pods", [pod])
    assert binder.bind(pending(api, "a", milli=250)).error == ""
    assert api.get("pods", "a", "default")["metadata"]["annotations"][VISIBLE_DEVICES_ANNOTATION] == gpu_uuid("t4-0", 5)


def test_binds_waiting_for_one_gpus_uuid_share_their_reads(api: KubeApiDouble) -> None:
    """The shares of a new GPU, bound together, wait for one reservation pod: one GET at a time for all of
    them (not one each), and each is answered by a read that began after it asked."""
    api.reservations_report = False
    client = connect_url(api.url, TOKEN)
    reservations = Reservations(lambda: client)
    reservations.open("t4-0", [0])
    name = "gpu-reservation-t4-0-0"
    found: list[str] = []

    def wait() -> None:
        found.append(reservations.reported("t4-0", 0, time.monotonic() + 5))

    threads = [threading.Thread(target=wait) for _ in range(6)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    pod = api.get("pods", name, RESERVED)
    pod["metadata"]["annotations"][RESERVED_GPU_ANNOTATION] = gpu_uuid("t4-0", 3)
    api.load("pods", [pod])
    for thread in threads:
        thread.join()
    assert found == [gpu_uuid("t4-0", 3)] * 6
    reads = sum(1 for r in api.requests if r.method == "GET" and r.path.endswith(f"/pods/{name}"))
    # About one read per 0.1 s for the second the six waited, not six.
    assert 5 <= reads <= 20, reads
    time.sleep(1.1)
    assert reservations._read("gpu-reservation-t4-0-1") is None  # no such pod
    assert list(reservations._reads) == ["gpu-reservation-t4-0-1"]  # what nobody waited for since 1 s went


def test_a_refused_reservation_pod_fails_the_bind_and_gives_its_gpu_back(
    api: KubeApiDouble, ledger: LedgerStore
) -> None:
    api.fail_next("POST", rf"/namespaces/{RESERVED}/pods$", 403, times=2)
    binder = reserving_binder(api, ledger)
    outcome = binder.bind(pending(api, "a", milli=300))
    assert outcome.error == "bind default/a to t4-0: creating the GPU's reservation pod failed: HTTP 403 Forbidden"
    assert outcome.error_kind == "reservation_error" and outcome.rolled_back
    assert ledger.read("t4-0", 4).assignments == {} and pod_on(api, "a") == (None, None)
    assert binder.readings.pending(None) == []


def test_the_last_share_of_a_gpu_takes_its_reservation_pod_with_it(api: KubeApiDouble, ledger: LedgerStore) -> None:
    binder = reserving_binder(api, ledger)
    a, b = pending(api, "a", milli=300), pending(api, "b", milli=300)
    assert binder.bind(a).error == binder.bind(b).error == ""
    assert binder.release_pod("t4-0", a.pod_uid) and reservation_names(api) == {"gpu-reservation-t4-0-0"}
    assert binder.release_pod("t4-0", b.pod_uid) and reservation_names(api) == set()
    assert not binder.release_pod("t4-0", b.pod_uid)


def test_a_bind_that_drops_the_last_share_of_a_gpu_removes_its_reservation_pod(
    api: KubeApiDouble, ledger: LedgerStore
) -> None:
    """The live state saw a share go; the next bind to the node drops it in its own write (before the
    watch's release), and that bind removes the reservation pod the drop left without shares."""
    binder = reserving_binder(api, ledger)
    gone = pending(api, "gone", milli=700)
    assert binder.bind(gone).error == ""
    binder.gone = lambda node: {gone.pod_uid} if node == "t4-0" else set()
    assert binder.bind(pending(api, "new", milli=600)).error == ""  # GPU 0 is free again: 0:600
    assert ledger.read("t4-0", 4).assignments.keys() == {api.get("pods", "new", "default")["metadata"]["uid"]}
    assert reservation_names(api) == {"gpu-reservation-t4-0-0"}  # kept: the new share is on GPU 0


def test_closing_re_creates_a_reservation_pod_a_bind_needed_meanwhile(api: KubeApiDouble) -> None:
    """The race the second read settles: a release deleted the pod after a bind on the same GPU had found
    it still there (a 409, answered as present). The fresh read shows that bind's share: re-created."""
    client = connect_url(api.url, TOKEN)
    reservations = Reservations(lambda: client)
    reservations.open("t4-0", [1])
    again = reservations.close("t4-0", [1], lambda: frozenset({1}))
    assert again == (1,) and reservation_names(api) == {"gpu-reservation-t4-0-1"}
    assert reservations.close("t4-0", [1], lambda: frozenset()) == () and reservation_names(api) == set()


def test_opening_replaces_a_reservation_pod_that_failed(api: KubeApiDouble) -> None:
    """A kubelet that refused a reservation pod (another allocator took the GPU) leaves it Failed under its
    name: a 409 for the next POST. It is replaced, not taken for a live one."""
    client = connect_url(api.url, TOKEN)
    reservations = Reservations(lambda: client)
    reservations.open("t4-0", [0])
    failed = api.get("pods", "gpu-reservation-t4-0-0", RESERVED)
    api.load("pods", [{**failed, "status": {"phase": "Failed", "reason": "UnexpectedAdmissionError"}}])
    reservations.open("t4-0", [0])
    replaced = api.get("pods", "gpu-reservation-t4-0-0", RESERVED)
    assert replaced["metadata"]["uid"] != failed["metadata"]["uid"] and replaced["status"]["phase"] != "Failed"
    assert reservations.counters == {"created": 1, "deleted": 1, "replaced": 1}
    reservations.open("t4-0", [0])  # alive: kept
    assert reservations.counters["replaced"] == 1


def test_the_reconcile_acts_only_on_what_a_fresh_read_still_shows(api: KubeApiDouble, ledger: LedgerStore) -> None:
    """Listed: GPU 0 holds a share without a reservation pod, GPU 3 has one without shares, and GPU 1's
    listing is stale (a bind opened it after the list): the fresh read decides each."""
    client = connect_url(api.url, TOKEN)
    reservations = Reservations(lambda: client)
    ledger.assign("t4-0", 4, "s0", Demand(1, 500))  # GPU 0
    listed_items = {"t4-0": ledger.read("t4-0", 4)}
    reservations.open("t4-0", [3])
    ledger.assign("t4-0", 4, "s1", Demand(1, 600))  # GPU 1, after the "list": its pod is the bind's to make
    reservations.open("t4-0", [1])
    done = reservations.reconcile(
        listed_items, {"t4-0": {3: "gpu-reservation-t4-0-3"}}, lambda node: ledger.read(node, 4)
    )
    assert done == {"reservations_created": 1, "reservations_deleted": 1, "reservation_errors": 0}
    assert reservation_names(api) == {"gpu-reservation-t4-0-0", "gpu-reservation-t4-0-1"}
