"""The preempt verb: replaying kube-scheduler's real preemption requests, and the rules one by one."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from scheduler_core.extender.facade import BindOutcome, Extender
from scheduler_core.extender.preemption import Candidate, Frees, Holdings, PreemptOutcome, decide, victim_frees
from scheduler_core.extender.wire import ExtenderBindingArgs
from scheduler_core.k8s.pods import PodDemand, pod_demand
from scheduler_core.state.cluster import ClusterState
from scheduler_core.state.ledger import Demand, NodeLedger, choose_gpus
from tests.conftest import SCHEDULER_FIXTURES, SHARED, captured_nodes, load_fixture, make_pod, requires_fixtures

PODS_AFTER = SHARED / "fixtures" / "kube-apiserver" / "a5-preempt-nodecache-{}-pods-after-preemption.json"
SMALL = ("gpu-node-0", "gpu-node-1", "gpu-node-2")


class LedgerOf:
    """The Accounting a bind-enabled extender has, over ledger items built as its binds would."""

    def __init__(self, items: dict[str, NodeLedger]) -> None:
        self.items = items
        self.asked: list[Sequence[str]] = []

    def bind(self, args: ExtenderBindingArgs) -> BindOutcome:
        raise AssertionError("preempt never binds")

    def holdings(self, nodes: Sequence[str]) -> Holdings:
        self.asked.append(list(nodes))
        return {node: dict(self.items[node].assignments) for node in nodes if node in self.items}


def small_cluster(mode: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The small cluster's nodes and the pods on them when kube-scheduler asked to preempt."""
    nodes = [node for node in captured_nodes() if node["metadata"]["name"] in SMALL]
    pods = [pod for pod in load_fixture(PODS_AFTER.with_name(PODS_AFTER.name.format(mode)))["items"]]
    return nodes, [pod for pod in pods if pod["spec"].get("nodeName")]


def ledger_from(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> dict[str, NodeLedger]:
    """What the ledger holds after binding ``pods`` one by one, as the bind verb does."""
    state = ClusterState.from_objects(nodes)
    items = {name: NodeLedger(name, int(state.table.alloc_gpus[row])) for name, row in state.table.index.items()}
    for pod in pods:
        node, demand = pod["spec"]["nodeName"], pod_demand(pod)
        pairs = choose_gpus(items[node].free(), Demand(demand.gpus, 1000))
        assert pairs is not None
        items[node] = items[node].with_assignment(pod["metadata"]["uid"], pairs)
    return items


@requires_fixtures()
@pytest.mark.parametrize("mode", ["true", "false"])
def test_replayed_preemption_keeps_only_the_node_the_pod_can_run_on(mode: str) -> None:
    """kube-scheduler proposed three nodes for an A100 pod; with the echo extender it evicted two pods
    on the T4 node, where the pod can never run. Only gpu-node-0 (A100) frees 4 GPUs for it."""
    folder = SCHEDULER_FIXTURES / f"05-preempt-nodecache-{mode}"
    (request_path,) = folder.glob("*.request.json")
    request = load_fixture(request_path)
    nodes, pods = small_cluster(mode)
    ledger = LedgerOf(ledger_from(nodes, pods))
    extender = Extender(cluster=lambda: ClusterState.from_objects(nodes, pods), accounting=ledger)

    status, body = extender.handle("preempt", json.dumps(request).encode())

    assert status == 200
    kept = json.loads(body)["NodeNameToMetaVictims"]
    proposed = request["NodeNameToMetaVictims"] or {
        node: {"Pods": [{"UID": pod["metadata"]["uid"]} for pod in entry["Pods"]]}
        for node, entry in request["NodeNameToVictims"].items()
    }
    assert list(kept) == ["gpu-node-0"]
    assert kept["gpu-node-0"]["Pods"] == proposed["gpu-node-0"]["Pods"]  # both 2-GPU pods are needed
    assert ledger.asked == [list(proposed)]
    decision = extender.respond("preempt", json.dumps(request).encode()).outcome
    assert isinstance(decision, PreemptOutcome) and set(decision.dropped) == {"gpu-node-1", "gpu-node-2"}
    assert "GPU model" in decision.dropped["gpu-node-2"]


@requires_fixtures()
def test_replayed_full_victims_need_no_ledger() -> None:
    """With nodeCacheCapable: false the victims come as full Pods: their requests say what they hold."""
    request = load_fixture(next((SCHEDULER_FIXTURES / "05-preempt-nodecache-false").glob("*.request.json")))
    nodes, pods = small_cluster("false")
    extender = Extender(cluster=lambda: ClusterState.from_objects(nodes, pods), accounting=LedgerOf({}))
    _, body = extender.handle("preempt", json.dumps(request).encode())
    assert list(json.loads(body)["NodeNameToMetaVictims"]) == ["gpu-node-0"]


FREE = {"n": np.array([1000, 200, 0, 0], dtype=np.int32)}


def test_a_share_needs_a_gpu_with_room_after_the_evictions() -> None:
    share = PodDemand(gpus=1, share=500, milli_managed=True)
    enough = Candidate("n", ("a", "b"), (Frees(pairs=((1, 300),)), Frees(pairs=((2, 100),))))
    outcome = decide(share, [enough], {"n": np.array([0, 200, 0, 0], dtype=np.int32)}, {})
    assert outcome.kept["n"].uids == ("a", "b")  # b frees too little, but it does hold a GPU


def test_victims_holding_no_gpu_are_dropped_and_a_node_with_none_left_is_never_returned() -> None:
    whole = PodDemand(gpus=2)
    mixed = Candidate("n", ("cpu-only", "gpu"), (Frees(), Frees(pairs=((2, 1000),))), num_pdb_violations=1)
    only_cpu = Candidate("m", ("cpu-only",), (Frees(),))
    outcome = decide(whole, [mixed, only_cpu], {"n": FREE["n"], "m": FREE["n"]}, {})
    assert outcome.kept["n"].uids == ("gpu",) and outcome.kept["n"].num_pdb_violations == 1
    assert outcome.dropped == {"m": "no victim holds a GPU here"}


def test_a_cpu_only_pods_proposal_stands_on_the_nodes_the_state_knows() -> None:
    """What a pod without GPUs needs is CPU and memory, kube-scheduler's count: every victim stays,
    GPU holders or not, and only a node the state lacks (or one with no victims) is dropped."""
    proposals = [
        Candidate("n", ("cpu-only", "gpu"), (Frees(), Frees(pairs=((2, 1000),))), num_pdb_violations=1),
        Candidate("m", ("cpu-only",), (Frees(),)),
        Candidate("elsewhere", ("x",), (Frees(),)),
        Candidate("empty", (), ()),
    ]
    outcome = decide(PodDemand(), proposals, {"n": FREE["n"], "m": FREE["n"], "empty": FREE["n"]}, {})
    assert {node: victims.uids for node, victims in outcome.kept.items()} == {"n": ("cpu-only", "gpu"),
                                                                               "m": ("cpu-only",)}  # fmt: skip
    assert outcome.kept["n"].num_pdb_violations == 1
    assert outcome.dropped == {"elsewhere": "node is not in the cluster state", "empty": "no victim holds a GPU here"}


def test_too_little_freed_drops_the_node() -> None:
    outcome = decide(PodDemand(gpus=3), [Candidate("n", ("a",), (Frees(pairs=((2, 1000),)),))], FREE, {})
    assert outcome.kept == {} and "does not free enough" in outcome.dropped["n"]


def test_unknown_victims_are_trusted_for_whole_gpus_only() -> None:
    """kube-scheduler accounts nvidia.com/gpu itself; it cannot see shares, so a share needs known holdings."""
    unknown = [Candidate("n", ("a",), (Frees(known=False),))]
    full = {"n": np.zeros(4, dtype=np.int32)}
    assert list(decide(PodDemand(gpus=2), unknown, full, {}).kept) == ["n"]
    assert decide(PodDemand(gpus=1, share=300, milli_managed=True), unknown, full, {}).kept == {}
    assert decide(PodDemand(gpus=2, milli_managed=True), unknown, full, {}).kept == {}


def test_what_a_full_victim_frees_comes_from_the_ledger_then_its_annotation_then_its_request() -> None:
    pod = make_pod("v", 2)
    assert victim_frees("uid-default-v", "n", {"n": {"uid-default-v": ((5, 1000),)}}, pod).pairs == ((5, 1000),)
    assert victim_frees("uid-default-v", "n", {}, pod).whole == 2
    pod["metadata"]["annotations"]["gpu-scheduler.io/assigned-gpus"] = "3:1000,6:1000"
    assert victim_frees("uid-default-v", "n", {}, pod).pairs == ((3, 1000), (6, 1000))
    pod["metadata"]["annotations"]["gpu-scheduler.io/assigned-gpus"] = "3:250"  # not what it requests
    assert not victim_frees("uid-default-v", "n", {}, pod).known
    assert victim_frees("x", "n", {}, None) == Frees(known=False)
    assert victim_frees("x", "n", {}, make_pod("cpu", 0)).nothing


def test_preempt_without_cluster_state_is_a_503_and_a_bad_pod_a_400() -> None:
    body = {"Pod": make_pod("p", 1), "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": "a"}]}}}
    assert Extender().handle("preempt", json.dumps(body).encode())[0] == 404  # served only with a ledger
    status, _ = Extender(accounting=LedgerOf({})).handle("preempt", json.dumps(body).encode())
    assert status == 503
    body["Pod"]["metadata"]["annotations"]["gpu.nvidia.com/memory"] = "lots"
    extender = Extender(cluster=lambda: ClusterState.from_objects([]), accounting=LedgerOf({}))
    status, reply = extender.handle("preempt", json.dumps(body).encode())
    assert status == 400 and "gpu.nvidia.com/memory" in json.loads(reply)["Error"]


@pytest.mark.parametrize(
    ("verb", "body", "message"),
    [
        ("bind", b'{"PodName": 3, "PodNamespace": "default", "PodUID": "u", "Node": "n"}', "PodName: expected"),
        ("bind", b'{"PodName": "p", "PodNamespace": "default", "PodUID": "u"}', "Node: expected a non-empty string"),
        ("bind", b"[1]", "request body: expected a JSON object"),
        ("preempt", b'{"NodeNameToMetaVictims": {}}', "Pod: required"),
        ("preempt", b'{"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": 7}]}}}', "Pods[0].UID"),
    ],
)
def test_malformed_bind_and_preempt_bodies_are_400s_naming_the_field(verb: str, body: bytes, message: str) -> None:
    class NeverBinds(LedgerOf):
        def bind(self, args: ExtenderBindingArgs) -> BindOutcome:
            raise AssertionError("a malformed body never reaches the ledger")

    status, reply = Extender(cluster=lambda: ClusterState.from_objects([]), accounting=NeverBinds({})).handle(
        verb, body
    )
    assert status == 400 and message in json.loads(reply)["Error"]
