"""The bind verb's guard: what :func:`bind_refusal` and :func:`room_refusal` refuse, and which sources
:meth:`Extender.admit` lets refuse a node for what is in use there."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import pytest

from scheduler_core.errors import ClusterStateUnavailableError
from scheduler_core.extender.admission import bind_refusal, room_refusal
from scheduler_core.extender.facade import CatchingUp, Extender
from scheduler_core.k8s.names import LABEL_ZONE
from scheduler_core.k8s.pods import pod_demand
from scheduler_core.state.cluster import ClusterState
from tests.conftest import make_nodes, make_pod

NODES = make_nodes("A100")  # a100-0: us-east-1a, 95690m CPU, 1149Gi, 110 pods
NODE = NODES[0]


def pod_asking(name: str, cpu: str, *, memory: str = "2Gi", node_name: str | None = None) -> dict[str, Any]:
    pod = make_pod(name, 0, milli=250, node_name=node_name, phase="Running" if node_name else "Pending")
    pod["spec"]["containers"][0]["resources"]["requests"].update(cpu=cpu, memory=memory)
    return pod


def refusal(pod: dict[str, Any], node: dict[str, Any] = NODE, state: ClusterState | None = None) -> str:
    return bind_refusal(pod, node, pod_demand(pod), state or ClusterState.from_objects(NODES))


def affinity(*expressions: dict[str, Any]) -> dict[str, Any]:
    terms = [{"matchExpressions": list(expressions)}]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


def in_zone_a(operator: str) -> Callable[[dict[str, Any]], None]:
    """A change to a pod: a required node affinity of ``zone OPERATOR [us-east-1a]`` (a100-0's zone)."""
    return lambda pod: pod["spec"].update(
        affinity=affinity({"key": LABEL_ZONE, "operator": operator, "values": ["us-east-1a"]})
    )


def requesting(**requests: str) -> Callable[[dict[str, Any]], None]:
    """A change to a pod: its first container's ``requests`` updated with ``requests``."""
    return lambda pod: pod["spec"]["containers"][0]["resources"]["requests"].update(**requests)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        pytest.param(lambda pod: None, "", id="a pod that fits is admitted"),
        pytest.param(
            in_zone_a("NotIn"),
            "node a100-0 does not match the pod's required node affinity (topology.kubernetes.io/zone NotIn "
            "[us-east-1a])",
            id="a required affinity that excludes the node refuses it",
        ),
        pytest.param(in_zone_a("In"), "", id="a required affinity that admits the node does not"),
        pytest.param(
            requesting(cpu="96"),
            "node a100-0 is too small for the pod: it requests cpu 96, more than the node's allocatable",
            id="more CPU than the node's allocatable",
        ),
        pytest.param(
            requesting(memory="2Ti", cpu="100"),
            "node a100-0 is too small for the pod: it requests cpu 100, memory 2Ti, more than the node's allocatable",
            id="every resource short is named",
        ),
        pytest.param(
            requesting(cpu="half"),
            "the pod's requests cannot be read: containers[0].resources.requests.cpu: expected a Kubernetes quantity",
            id="an unreadable request refuses",
        ),
    ],
)
def test_bind_refusal_rechecks_affinity_and_resource_fit(change: Any, expected: str) -> None:
    pod = pod_asking("p", "1")
    change(pod)
    got = refusal(pod)
    assert got.startswith(expected) if expected else got == ""


def test_a_node_without_allocatable_figures_is_not_limited_by_them() -> None:
    bare = {**NODE, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}
    assert refusal(pod_asking("p", "10000"), bare, ClusterState.from_objects([bare])) == ""


def test_the_nodeselector_is_named_before_the_affinity() -> None:
    pod = pod_asking("p", "1")
    pod["spec"]["nodeSelector"] = {LABEL_ZONE: "us-east-1c"}
    pod["spec"]["affinity"] = affinity({"key": LABEL_ZONE, "operator": "In", "values": ["us-east-1c"]})
    assert "nodeSelector" in refusal(pod)


def busy_state(used_cpu: str) -> ClusterState:
    """a100-0 with one bound pod asking ``used_cpu``."""
    return ClusterState.from_objects(NODES, [pod_asking("bound", used_cpu, node_name="a100-0")])


def test_room_refusal_counts_the_pods_bound_there() -> None:
    state = busy_state("90")  # 5.69 cores left
    assert room_refusal(pod_asking("p", "5"), NODE, state) == ""
    assert room_refusal(pod_asking("p", "6"), NODE, state) == (
        "node a100-0 has too little left for the pod: it requests cpu 6, more than the pods bound there leave free"
    )
    assert room_refusal(pod_asking("p", "0"), NODE, busy_state("100")) == "", "a zero request always fits"
    assert room_refusal(pod_asking("p", "6"), NODE, ClusterState.from_objects(NODES)) == ""


class Watch:
    """A source that follows the cluster (:class:`CatchingUp`): ``catch_up`` moves to its next state."""

    def __init__(self, *states: ClusterState) -> None:
        self.states = list(states)
        self.catch_ups = 0

    def __call__(self) -> ClusterState:
        return self.states[0]

    def catch_up(self, timeout_s: float, nodes: Collection[str] = (), *, node_facts: bool = False) -> bool:
        self.catch_ups += 1
        if len(self.states) > 1:
            self.states.pop(0)
            return True
        return False


def test_a_watched_state_refuses_a_node_whose_bound_pods_leave_too_little_cpu() -> None:
    watch = Watch(busy_state("90"))
    assert isinstance(watch, CatchingUp)
    assert Extender(cluster=watch).admit(pod_asking("p", "6"), NODE).startswith("node a100-0 has too little left")
    assert watch.catch_ups == 1  # it waited for a change that may free room before refusing
    assert Extender(cluster=watch).admit(pod_asking("p", "5"), NODE) == ""


def test_a_watched_state_that_catches_up_on_a_deletion_admits_the_pod() -> None:
    watch = Watch(busy_state("90"), ClusterState.from_objects(NODES))  # the bound pod is gone meanwhile
    assert Extender(cluster=watch).admit(pod_asking("p", "6"), NODE) == ""
    assert watch.catch_ups == 1


def test_a_snapshot_never_refuses_a_bind_for_what_is_in_use() -> None:
    """DESIGN section 5: a state that may be minutes old only scores what is in use; the static fit still
    refuses."""
    snapshot = busy_state("90")
    extender = Extender(cluster=lambda: snapshot)
    assert extender.admit(pod_asking("p", "6"), NODE) == ""
    assert "too small for the pod" in extender.admit(pod_asking("p", "96"), NODE)


def test_an_unavailable_state_refuses_naming_only_its_kind() -> None:
    def stale() -> ClusterState:
        raise ClusterStateUnavailableError("no cluster snapshot: s3://secret-bucket/key: NoSuchKey", kind="missing")

    assert Extender(cluster=stale).admit(pod_asking("p", "1"), NODE) == (
        "no cluster state to check the node against (missing); kube-scheduler will retry the pod"
    )
