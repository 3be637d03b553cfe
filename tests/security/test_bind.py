"""``/bind`` refuses what is not its own, and changes nothing when it does (issue: "Safe to deploy").

Each test replays a finding of the security review through ``serve`` and the Lambda handler. After a
refusal the pod is unbound, the ledger holds nothing, and the API server saw no write.
"""

from __future__ import annotations

import threading
from typing import Any

from scheduler_core.k8s.names import ASSIGNED_GPUS_ANNOTATION
from tests.conftest import make_pod
from tests.security.conftest import TAINT, World

NOTHING_HELD = {"t4-0": 0, "a100-1": 0, "l40s-2": 0}


def refused(world: World, pod: dict[str, Any], node: str, uid: str | None = None) -> str:
    """Bind and return the Error, checking that nothing changed anywhere."""
    status, reply = world.bind(pod, node, uid)
    assert status == 200 and reply["Error"], reply
    meta = pod["metadata"]
    stored = world.api.get("pods", meta["name"], meta["namespace"])
    assert stored["spec"].get("nodeName") is None
    assert ASSIGNED_GPUS_ANNOTATION not in (stored["metadata"].get("annotations") or {})
    assert world.ledger_used() == NOTHING_HELD
    assert world.api_writes() == []
    return str(reply["Error"])


def test_a_pod_of_another_scheduler_is_not_bound_and_its_uid_is_not_leaked(world: World) -> None:
    coredns = make_pod("coredns-5d78c9869d-x2x7q", 1, namespace="kube-system")
    coredns["spec"]["schedulerName"] = "default-scheduler"
    world.api.load("pods", [coredns])
    uid = coredns["metadata"]["uid"]
    guessed = refused(world, coredns, "t4-0", uid="guess")
    assert uid not in guessed and "UID" in guessed
    assert "reading the node" in refused(world, coredns, "no-such-node")
    assert "not scheduled by 'gpu-scheduler'" in refused(world, coredns, "t4-0")


def test_a_node_that_does_not_exist_is_refused(world: World) -> None:
    pod = make_pod("p", 0, milli=250)
    world.api.load("pods", [pod])
    assert "reading the node" in refused(world, pod, "no-such-node")


def test_a_node_the_filter_rules_out_is_refused(world: World) -> None:
    h100_only = make_pod("wants-h100", 1, models="H100")
    world.api.load("pods", [h100_only])
    assert "does not pass the filter for this pod: GPU model A100 not in H100" in refused(world, h100_only, "a100-1")
    too_big = make_pod("nine", 9)
    world.api.load("pods", [too_big])
    assert "does not pass the filter" in refused(world, too_big, "a100-1")


def test_a_taint_the_pod_does_not_tolerate_is_refused_and_a_toleration_admits_it(world: World) -> None:
    pod = make_pod("untolerating", 0, milli=500)
    world.api.load("pods", [pod])
    assert "dedicated=inference:NoSchedule" in refused(world, pod, "l40s-2")
    tolerating = make_pod("tolerating", 0, milli=500)
    tolerating["spec"]["tolerations"] = [{"key": TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}]
    world.api.load("pods", [tolerating])
    assert world.bind(tolerating, "l40s-2") == (200, {"Error": ""})
    assert world.api.get("pods", "tolerating", "default")["spec"]["nodeName"] == "l40s-2"


def test_a_node_outside_the_pods_node_selector_is_refused(world: World) -> None:
    pod = make_pod("zoned", 0, milli=250)
    pod["spec"]["nodeSelector"] = {"topology.kubernetes.io/zone": "nowhere-1a"}
    world.api.load("pods", [pod])
    assert "does not match the pod's nodeSelector (topology.kubernetes.io/zone=nowhere-1a)" in refused(
        world, pod, "t4-0"
    )


def test_a_pod_that_requests_no_gpu_is_bound_with_nothing_recorded_and_only_where_it_may_go(world: World) -> None:
    """The generated profile sends the extender CPU-only pods too, so binding them is its own verb now
    (it refused them while the profile had managedResources). What it binds them with stays checked:
    a forged assigned-gpus annotation claims nothing, and a taint or a nodeSelector still refuses."""
    forged = make_pod("cpu-only", 0)
    forged["metadata"]["annotations"] = {ASSIGNED_GPUS_ANNOTATION: "0:1000,1:1000,2:1000,3:1000"}
    fenced = make_pod("cpu-only-zoned", 0)
    fenced["spec"]["nodeSelector"] = {"topology.kubernetes.io/zone": "nowhere-1a"}
    world.api.load("pods", [forged, fenced])
    plain = make_pod("cpu-only-plain", 0)
    world.api.load("pods", [plain])
    assert "taints the pod does not tolerate" in refused(world, plain, "l40s-2")
    assert "does not match the pod's nodeSelector" in refused(world, fenced, "t4-0")
    assert world.bind(forged, "t4-0") == (200, {"Error": ""})
    assert world.api.get("pods", "cpu-only", "default")["spec"]["nodeName"] == "t4-0"
    assert world.ledger_used() == NOTHING_HELD


def test_a_pod_that_names_a_gpu_at_zero_is_bound_and_records_nothing(world: World) -> None:
    """kube-scheduler asks the extender to bind any pod that names a managed resource, at 0 too."""
    zero = make_pod("zero", 0)
    zero["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "0"
    world.api.load("pods", [zero])
    assert world.bind(zero, "t4-0") == (200, {"Error": ""})
    assert world.api.get("pods", "zero", "default")["spec"]["nodeName"] == "t4-0"
    assert world.ledger_used() == NOTHING_HELD


def test_a_running_or_terminating_pod_is_refused(world: World) -> None:
    running = make_pod("running", 1) | {"status": {"phase": "Running"}}
    terminating = make_pod("terminating", 1)
    terminating["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    world.api.load("pods", [running, terminating])
    assert "the pod is Running, not Pending" in refused(world, running, "t4-0")
    assert "being deleted" in refused(world, terminating, "t4-0")


def test_a_pod_bound_elsewhere_does_not_say_where(world: World) -> None:
    pod = make_pod("placed", 0, milli=250)
    world.api.load("pods", [pod])
    assert world.bind(pod, "t4-0") == (200, {"Error": ""})
    status, reply = world.bind(pod, "a100-1")
    assert status == 200 and "already bound to another node" in reply["Error"] and "t4-0" not in reply["Error"]


def test_two_concurrent_binds_of_one_pod_leave_one_placement_and_its_annotation(serve_world: World) -> None:
    """One instance, two threads (a Lambda instance serves one request at a time; two instances race
    the same way through the API server and the ledger)."""
    world = serve_world
    for trial in range(10):
        pod = make_pod(f"raced-{trial}", 0, milli=300)
        world.api.load("pods", [pod])
        replies: dict[str, Any] = {}

        def bind(node: str, pod: dict[str, Any] = pod, replies: dict[str, Any] = replies) -> None:
            replies[node] = world.bind(pod, node)

        threads = [threading.Thread(target=bind, args=(node,)) for node in ("t4-0", "a100-1")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        stored = world.api.get("pods", pod["metadata"]["name"], "default")
        node = stored["spec"]["nodeName"]
        winners = [n for n, (_, reply) in replies.items() if reply["Error"] == ""]
        assert winners == [node], replies
        loser = next(reply["Error"] for _, reply in replies.values() if reply["Error"])
        assert node not in loser  # the placement is not the caller's to learn
        held = {n: dict(world.ledger.read(n, c).assignments) for n, c in (("t4-0", 4), ("a100-1", 8))}
        uid = pod["metadata"]["uid"]
        assert [n for n, assignments in held.items() if uid in assignments] == [node]  # the loser rolled back
        annotation = stored["metadata"]["annotations"][ASSIGNED_GPUS_ANNOTATION]
        assert annotation == ",".join(f"{gpu}:{milli}" for gpu, milli in held[node][uid])


def test_a_binding_answered_429_with_a_long_retry_after_ends_inside_the_schedulers_timeout(world: World) -> None:
    """A Binding answered 429 with Retry-After: 10 used to hold the bind 10 s, past kube-scheduler's
    3 s httpTimeout and the Lambda's 5 s; now the bind gives up in its budget and releases the GPUs."""
    import time

    pod = make_pod("throttled", 0, milli=250)
    world.api.load("pods", [pod])
    world.api.fail_next("POST", "/pods/throttled/binding", 429, times=5, retry_after="10")
    started = time.monotonic()
    status, reply = world.bind(pod, "t4-0")
    assert time.monotonic() - started < 3.0
    assert status == 200 and "posting the Binding" in reply["Error"]
    assert world.api.get("pods", "throttled", "default")["spec"].get("nodeName") is None
    assert world.ledger_used() == NOTHING_HELD  # rolled back
