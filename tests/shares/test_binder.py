"""The bind verb's I/O: ledger in moto's DynamoDB, pod annotation and Binding through the in-repo
API double over HTTP, with faults injected at each step."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from adapters.gpu_ledger import LedgerStore
from bench.ledger import TABLE
from scheduler_core.extender.wire import ExtenderBindingArgs
from scheduler_core.k8s.names import ASSIGNED_GPUS_ANNOTATION
from scheduler_core.state.cluster import ClusterState
from scheduler_core.state.ledger import Demand
from testing.kube_double import KubeApiDouble
from tests.shares.conftest import NODES, make_binder, pending, pod_on, reservation_names, reserving_binder

pytestmark = pytest.mark.server  # moto's DynamoDB and the API server double


def test_a_share_is_recorded_annotated_and_bound(api: KubeApiDouble, ledger: LedgerStore) -> None:
    binder = make_binder(api, ledger)
    first = binder.bind(pending(api, "a", milli=300))
    second = binder.bind(pending(api, "b", milli=500))
    assert (first.error, second.error) == ("", "")
    assert pod_on(api, "a") == ("t4-0", "0:300") and pod_on(api, "b") == ("t4-0", "0:500")  # tightest GPU
    item = ledger.read("t4-0", 4)
    assert item.used == (800, 0, 0, 0) and item.problems() == []
    # Each bind tells this instance's filter what the ledger has free there now.
    assert [news.free for news in binder.readings.pending(None)] == [(700, 1000, 1000, 1000), (200, 1000, 1000, 1000)]


def test_a_whole_gpu_pod_is_recorded_too(api: KubeApiDouble, ledger: LedgerStore) -> None:
    outcome = make_binder(api, ledger).bind(pending(api, "w", gpus=2))
    assert outcome.error == "" and outcome.assigned == "0:1000,1:1000"
    assert ledger.read("t4-0", 4).used == (1000, 1000, 0, 0)


def test_a_retried_bind_is_answered_the_same_and_writes_nothing(api: KubeApiDouble, ledger: LedgerStore) -> None:
    binder = make_binder(api, ledger)
    args = pending(api, "a", milli=300)
    binder.bind(args)
    writes, version = len(api.writes()), ledger.read("t4-0", 4).version
    again = binder.bind(args)
    assert again.error == "" and again.already and again.assigned == "0:300"
    assert len(api.writes()) == writes and ledger.read("t4-0", 4).version == version


def test_a_refused_binding_rolls_the_ledger_back(
    api: KubeApiDouble, ledger: LedgerStore, caplog: pytest.LogCaptureFixture
) -> None:
    api.fail_next("POST", r"/pods/a/binding", 403)  # the API server refused it: nothing landed
    binder = make_binder(api, ledger)
    outcome = binder.bind(pending(api, "a", milli=300))
    # The step and the status, in fixed words; the API server's own text only in the log.
    assert outcome.error == "bind default/a to t4-0: posting the Binding failed: HTTP 403 Forbidden"
    assert outcome.error_kind == "kube_error" and outcome.rolled_back
    assert "injected fault 403" in caplog.text
    assert ledger.read("t4-0", 4).used == (0, 0, 0, 0)
    assert ledger.read("t4-0", 4).assignments == {}
    assert pod_on(api, "a") == (None, None)
    assert binder.readings.pending(None) == []  # nor does the filter think it bound


def test_the_binds_reading_is_made_before_the_binding_so_the_watch_of_it_can_forget_it(
    api: KubeApiDouble, ledger: LedgerStore
) -> None:
    binder = make_binder(api, ledger)
    args = pending(api, "a", milli=300)
    seen_at_binding: list[list[str]] = []
    post = binder.kube.bind_pod

    def bind_pod(*a: Any, **kw: Any) -> Any:
        seen_at_binding.append([r.uid for r in binder.readings.pending(None)])
        return post(*a, **kw)

    binder.kube.bind_pod = bind_pod  # type: ignore[method-assign]
    assert binder.bind(args).error == ""
    assert seen_at_binding == [[args.pod_uid]]  # a live state's forget() of it can only come later


def test_binds_that_land_out_of_order_leave_the_view_as_full_as_the_pods_on_their_way_make_it(
    api: KubeApiDouble, ledger: LedgerStore
) -> None:
    """Four quarter shares are predicted onto t4-0's GPU 0; kube-scheduler binds each on its own, so the
    fourth's bind can reach the ledger before the second's and third's. Its reading (750 + 250 taken)
    replaces its prediction, but the second and third are still on their way: the next share must see
    GPU 0 full, or it is sent where the ledger has no room."""
    import json

    from scheduler_core.extender.facade import Extender, ExtenderConfig

    binder = make_binder(api, ledger)
    state = ClusterState.from_objects(NODES)
    extender = Extender(ExtenderConfig(share_policy="gpu_packing"), cluster=lambda: state, readings=binder.readings)
    args = [pending(api, f"q{i}", milli=250) for i in range(1, 6)]

    def predict(name: str) -> tuple[tuple[int, int], ...]:
        pod = api.get("pods", name, "default")
        status, _ = extender.handle("prioritize", json.dumps({"Pod": pod, "NodeNames": ["t4-0"]}).encode())
        assert status == 200
        (prediction,) = [r for r in binder.readings.pending(None, assumed=True) if r.uid == pod["metadata"]["uid"]]
        return prediction.taken

    assert [predict(f"q{i}") for i in range(1, 5)] == [((0, 250),)] * 4
    assert binder.bind(args[0]).assigned == "0:250" and binder.bind(args[3]).assigned == "0:250"
    assert predict("q5") == ((1, 250),)  # GPU 0 is taken by q1..q4, two of them still on their way
    assert [binder.bind(a).assigned for a in (args[1], args[2], args[4])] == ["0:250", "0:250", "1:250"]


def test_a_binding_that_may_have_landed_keeps_its_gpus(api: KubeApiDouble, ledger: LedgerStore) -> None:
    """A 5xx (or a timeout) may come from a Binding that commits after the read-back: releasing its GPUs
    would let the next pod take the same milli. They stay for the reconcile."""
    api.fail_next("POST", r"/pods/a/binding", 500, times=2)  # past the one retry
    outcome = make_binder(api, ledger).bind(pending(api, "a", milli=300))
    assert "whether the Binding landed is unknown" in outcome.error and not outcome.rolled_back
    assert ledger.read("t4-0", 4).used == (300, 0, 0, 0)


def test_a_pod_bound_elsewhere_meanwhile_releases_the_gpus(api: KubeApiDouble, ledger: LedgerStore) -> None:
    args = pending(api, "a", milli=300)
    binder = make_binder(api, ledger)
    original = binder.kube.bind_pod

    def race_then_bind(*a: Any, **k: Any) -> Any:  # another scheduler binds it between our steps
        pod = api.get("pods", "a", "default")
        if not pod["spec"].get("nodeName"):
            pod["spec"]["nodeName"] = "a100-1"
            api.load("pods", [pod])
        return original(*a, **k)

    binder.kube.bind_pod = race_then_bind  # type: ignore[method-assign]
    outcome = binder.bind(args)
    assert "another bind placed the pod first" in outcome.error and outcome.rolled_back
    assert ledger.read("t4-0", 4).assignments == {}


class ThrottledClient:
    """A real DynamoDB client whose writes are throttled past botocore's own retries."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def put_item(self, **_: Any) -> Any:
        error = {"Code": "ProvisionedThroughputExceededException", "Message": "Rate of requests exceeds"}
        raise ClientError({"Error": error}, "PutItem")


def test_a_throttled_ledger_fails_the_bind_before_anything_is_written(
    api: KubeApiDouble, ledger: LedgerStore, caplog: pytest.LogCaptureFixture
) -> None:
    throttled = LedgerStore(TABLE, ThrottledClient(ledger.client))
    outcome = make_binder(api, throttled).bind(pending(api, "a", milli=300))
    assert outcome.error_kind == "ledger_error"
    assert outcome.error == "bind default/a to t4-0: the GPU ledger write failed: throttled, try again"
    assert pod_on(api, "a") == (None, None) and api.writes() == []
    # The table and DynamoDB's own words are the operator's: in the log, not in the answer.
    assert f"the GPU ledger {TABLE}: writing t4-0: ProvisionedThroughputExceededException" in caplog.text


class FailingClient(ThrottledClient):
    """A real DynamoDB client whose writes fail with ``error``."""

    def __init__(self, client: Any, error: Exception) -> None:
        super().__init__(client)
        self.error = error

    def put_item(self, **_: Any) -> Any:
        raise self.error


ARN = f"arn:aws:dynamodb:us-east-1:123456789012:table/{TABLE}"


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        pytest.param(
            ClientError({"Error": {"Code": "AccessDeniedException", "Message": f"not authorized on {ARN}"}}, "PutItem"),
            "DynamoDB refused the request; see the extender's log",
            id="a refusal names neither the table nor its ARN",
        ),
        pytest.param(
            EndpointConnectionError(endpoint_url=f"https://dynamodb.us-east-1.amazonaws.com/{TABLE}"),
            "DynamoDB did not answer in time, try again",
            id="an unreachable ledger names neither its endpoint nor the table",
        ),
    ],
)
def test_a_failed_ledger_write_names_the_step_and_the_log_the_rest(
    api: KubeApiDouble, ledger: LedgerStore, caplog: pytest.LogCaptureFixture, error: Exception, cause: str
) -> None:
    failing = LedgerStore(TABLE, FailingClient(ledger.client, error))
    outcome = make_binder(api, failing).bind(pending(api, "a", milli=300))
    assert (outcome.error_kind, outcome.error) == (
        "ledger_error",
        f"bind default/a to t4-0: the GPU ledger write failed: {cause}",
    )
    assert TABLE not in outcome.error and "arn:" not in outcome.error
    assert TABLE in caplog.text
    assert pod_on(api, "a") == (None, None) and api.writes() == []


def test_a_stale_snapshot_is_overruled_by_the_ledger(api: KubeApiDouble, ledger: LedgerStore) -> None:
    """The snapshot says t4-0 is empty; the ledger knows another instance filled it since."""
    state = ClusterState.from_objects(NODES)
    assert state.free_milli is not None and state.free_milli[0, :4].tolist() == [1000] * 4
    for i in range(4):
        ledger.assign("t4-0", 4, f"other-{i}", Demand(1, 900))
    binder = make_binder(api, ledger, state)
    outcome = binder.bind(pending(api, "a", milli=300))
    assert outcome.error_kind == "no_room" and "no room" in outcome.error
    assert pod_on(api, "a") == (None, None)
    # The refusal corrects this instance's view of t4-0 until the next snapshot.
    (news,) = binder.readings.pending(None)
    assert (news.node, news.free) == ("t4-0", (100, 100, 100, 100))


def test_a_missing_ledger_item_is_created_by_the_first_bind(api: KubeApiDouble, ledger: LedgerStore) -> None:
    assert ledger.read("t4-0", 4).version == 0
    outcome = make_binder(api, ledger).bind(pending(api, "a", milli=250))
    assert outcome.error == "" and ledger.read("t4-0", 4).version == 1


def test_a_gone_or_replaced_pod_is_refused_with_one_answer_for_both(api: KubeApiDouble, ledger: LedgerStore) -> None:
    """A bind is no oracle for which pods exist: a pod that does not exist and a pod whose UID is another
    get the same answer, and neither carries the real UID."""
    binder = make_binder(api, ledger)
    pending(api, "a", milli=250)
    replaced = binder.bind(ExtenderBindingArgs("a", "default", "an-older-uid", "t4-0"))
    gone = binder.bind(ExtenderBindingArgs("a", "elsewhere", "an-older-uid", "t4-0"))
    assert (gone.error_kind, replaced.error_kind) == ("pod_gone", "pod_gone")
    assert replaced.error == "bind default/a to t4-0: no pod with that namespace, name and UID"
    assert gone.error == replaced.error.replace("default/", "elsewhere/")
    assert "uid-default-a" not in replaced.error
    assert ledger.read("t4-0", 4).version == 0 and api.writes() == []


def test_a_pod_without_gpus_is_bound_without_the_ledger(api: KubeApiDouble, ledger: LedgerStore) -> None:
    binder = make_binder(api, ledger)
    outcome = binder.bind(pending(api, "cpu"))
    assert outcome.error == "" and pod_on(api, "cpu") == ("t4-0", None)
    assert ledger.read("t4-0", 4).version == 0
    # What it takes there is its CPU (make_pod asks 1 core), for fgd_cpu until the state shows it; no GPU figures.
    assert [(r.node, r.free, r.cpu) for r in binder.readings.pending(None)] == [("t4-0", None, 1000)]


def test_a_gpu_pods_bind_carries_its_cpu_with_the_gpus_left(api: KubeApiDouble, ledger: LedgerStore) -> None:
    binder = make_binder(api, ledger)
    assert binder.bind(pending(api, "w", gpus=1)).error == ""
    assert [(r.free, r.cpu) for r in binder.readings.pending(None)] == [((0, 1000, 1000, 1000), 1000)]


@pytest.mark.slow  # 2,000 binds on eight threads, about 30 s
def test_eight_threads_binding_2000_shares_never_overallocate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's acceptance run: 8 threads bind 2,000 shares at once through the whole bind verb, the
    ledger in moto's DynamoDB in server mode (its own process), the pods in the API double. A bind that
    fails (a lost race, no room) moves to the pod's next node, as kube-scheduler's retry would."""
    from collections import Counter

    from bench.bind import bind_all
    from scheduler_core.k8s.annotations import parse_assigned_gpus
    from testing.moto import moto_server

    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(name, value)
    with moto_server() as endpoint:
        run = bind_all(endpoint, threads=8, pods=2000)

    assert run.conflicts > 0, "8 binders on 10 hot nodes must collide"
    # 8 tries each on a crowded few. The extender breaks a tie the same way in every instance (so that
    # kube-scheduler consolidates); 8 binders that see each other only through the ledger, over one
    # unchanging snapshot, then crowd the same nodes: 14-25 of 2,000 find no room in 8 tries (2-5 when
    # each instance broke ties its own way).
    assert run.outcome["bound"] + run.unplaced == 2000 and run.unplaced < 40
    for item in run.items:
        assert item.problems() == [], item.node  # used == the sum of the assignments
        assert max(item.used) <= 1000, item.node
    held = Counter(uid for item in run.items for uid in item.assignments)
    assert len(held) == run.outcome["bound"] and max(held.values()) == 1, "a pod is assigned twice"
    # The ledger equals the sum of the pod annotations, GPU by GPU; an unplaced pod holds nothing.
    from_annotations: dict[str, list[int]] = {item.node: [0] * 8 for item in run.items}
    for pod in run.pods:
        if not pod["spec"].get("nodeName"):
            assert ASSIGNED_GPUS_ANNOTATION not in pod["metadata"]["annotations"]
            continue
        for gpu, milli in parse_assigned_gpus(pod["metadata"]["annotations"][ASSIGNED_GPUS_ANNOTATION]):
            from_annotations[pod["spec"]["nodeName"]][gpu] += milli
    assert {item.node: list(item.used) for item in run.items} == from_annotations


def test_a_bind_that_waits_past_its_budget_for_the_node_writes_nothing(api: KubeApiDouble, ledger: LedgerStore) -> None:
    """Binds queued behind a slow one on the same node used to wait without bound, write the ledger after
    the deadline, fail the Binding and then have to roll back (which conflicts under load)."""

    binder = make_binder(api, ledger)
    binder.bind_budget_s = 0.8
    args = pending(api, "queued", milli=250)
    outcomes = []
    with binder._writes.lock("t4-0"):  # another bind to t4-0 that does not finish while this one waits
        waiting = threading.Thread(target=lambda: outcomes.append(binder.bind(args)))
        waiting.start()
        waiting.join(timeout=10)
        assert not waiting.is_alive(), "the bind waited for the node past its budget"
    assert outcomes[0].error_kind == "busy" and "held it for the bind's whole budget" in outcomes[0].error
    assert ledger.read("t4-0", 4).version == 0 and pod_on(api, "queued") == (None, None)


def test_a_watched_node_is_admitted_from_the_watch_without_a_get(api: KubeApiDouble, ledger: LedgerStore) -> None:
    binder = make_binder(api, ledger)
    tainted = {**NODES[0], "spec": {"taints": [{"key": "gpu", "value": "x", "effect": "NoSchedule"}]}}
    binder.node_of = {"t4-0": tainted}.get
    refused = binder.bind(pending(api, "a", milli=300), admit=lambda pod, node: "tainted" if node["spec"] else "")
    assert refused.error.endswith("tainted"), "the watch's copy was used, not the API's untainted node"
    binder.node_of = {"t4-0": NODES[0]}.get
    assert binder.bind(pending(api, "b", milli=300)).error == ""
    assert not [r for r in api.requests if r.method == "GET" and "/nodes/" in r.path]
    binder.node_of = lambda _name: None  # not watched: read from the API
    assert binder.bind(pending(api, "c", milli=300)).error == ""
    assert [r for r in api.requests if r.method == "GET" and "/nodes/" in r.path]


def test_binds_that_queue_on_one_node_are_written_together(api: KubeApiDouble, ledger: LedgerStore) -> None:
    """While one bind writes the node's item (slowly here), 11 more arrive; they are recorded in one or two
    conditional writes, not 11 in turn, each on its own GPUs, and the one that does not fit is told so."""

    from adapters.gpu_ledger import LedgerStore as Store

    writes = []

    class Slow:
        def __init__(self, client: Any) -> None:
            self.client = client

        def put_item(self, **kwargs: Any) -> Any:
            writes.append(len(kwargs["Item"]["assignments"]["M"]))
            time.sleep(0.2)
            return self.client.put_item(**kwargs)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.client, name)

    binder = make_binder(api, Store(ledger.table, Slow(ledger.client)))
    requests = [pending(api, f"p{i}", milli=400) for i in range(12)]  # t4-0 has 4 GPUs: 2 x 400 on each
    outcomes: list[Any] = []
    first = threading.Thread(target=lambda: outcomes.append(binder.bind(requests[0])))
    first.start()
    time.sleep(0.05)  # the first is writing
    others = [threading.Thread(target=lambda a=a: outcomes.append(binder.bind(a))) for a in requests[1:]]
    for thread in others:
        thread.start()
    for thread in [first, *others]:
        thread.join(timeout=10)
    assert len(writes) <= 3 and sum(writes[:1]) == 1, writes
    bound = [o for o in outcomes if not o.error]
    assert len(bound) == 8 and {o.error_kind for o in outcomes if o.error} == {"no_room"}
    item = ledger.read("t4-0", 4)
    assert item.used == (800, 800, 800, 800) and item.problems() == [] and len(item.assignments) == 8
    assert {o.pod.split("/")[1]: o.assigned for o in bound} == {
        o.pod.split("/")[1]: pod_on(api, o.pod.split("/")[1])[1] for o in bound
    }, "each pod's annotation is what the ledger gave it"
    assert sorted(o.assigned for o in bound) == sorted(f"{g}:400" for g in range(4) for _ in range(2))


def test_a_placeholder_is_removed_instead_of_bound(api: KubeApiDouble, ledger: LedgerStore) -> None:
    """A node has room for the placeholder's shares: it goes, holding nothing, and the shares take the room."""
    from manifests.placeholder import NAMESPACE, placeholder_pod

    pod = placeholder_pod("0a1b2c3d4e", 0, {"annotations": {"gpu.nvidia.com/model": "T4"}}, image="r.example/p:1")
    pod["metadata"]["uid"] = "placeholder-uid"
    api.load("pods", [pod])
    binder = reserving_binder(api, ledger)
    outcome = binder.bind(ExtenderBindingArgs(pod["metadata"]["name"], NAMESPACE, "placeholder-uid", "t4-0"))
    assert outcome.error_kind == "placeholder" and "it is removed, not bound" in outcome.error
    assert NAMESPACE not in {p["metadata"].get("namespace") for p in api.objects("pods")}
    assert ledger.read("t4-0", 4).assignments == {} and reservation_names(api) == set()


def test_a_placeholder_that_cannot_be_removed_is_not_bound_either(api: KubeApiDouble, ledger: LedgerStore) -> None:
    from manifests.placeholder import NAMESPACE, placeholder_pod

    pod = placeholder_pod("0a1b2c3d4e", 1, {}, image="r.example/p:1")
    pod["metadata"]["uid"] = "placeholder-uid"
    api.load("pods", [pod])
    api.fail_next("DELETE", r"/pods/gpu-placeholder-0a1b2c3d4e-1", 403, times=2)
    outcome = reserving_binder(api, ledger).bind(
        ExtenderBindingArgs(pod["metadata"]["name"], NAMESPACE, "placeholder-uid", "t4-0")
    )
    assert outcome.error == (
        f"bind {NAMESPACE}/gpu-placeholder-0a1b2c3d4e-1 to t4-0: removing the placeholder failed: HTTP 403 Forbidden"
    )
    assert api.get("pods", "gpu-placeholder-0a1b2c3d4e-1", NAMESPACE)["spec"].get("nodeName") is None
    assert ledger.read("t4-0", 4).assignments == {}
