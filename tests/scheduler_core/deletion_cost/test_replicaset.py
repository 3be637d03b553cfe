from scheduler_core.deletion_cost.replicaset import scale_down_order
from scheduler_core.k8s.names import DELETION_COST_ANNOTATION

NOW = 1_800_000_000.0


def pod(
    name,
    *,
    node="n1",
    phase="Running",
    ready_at="2026-11-29T10:00:00Z",
    cost=None,
    restarts=0,
    created="2026-11-29T09:00:00Z",
):
    conditions = [{"type": "Ready", "status": "True" if ready_at else "False", "lastTransitionTime": ready_at}]
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "creationTimestamp": created,
            "annotations": {DELETION_COST_ANNOTATION: cost} if cost is not None else {},
        },
        "spec": {"nodeName": node},
        "status": {"phase": phase, "conditions": conditions, "containerStatuses": [{"restartCount": restarts}]},
    }


def order(*pods):
    return [p["metadata"]["name"] for p in scale_down_order(list(pods), NOW)]


def test_each_rule_of_the_replicaset_controller():
    assert order(pod("assigned"), pod("unassigned", node="")) == ["unassigned", "assigned"]
    assert order(pod("run"), pod("unknown", phase="Unknown"), pod("pend", phase="Pending")) == [
        "pend",
        "unknown",
        "run",
    ]
    assert order(pod("ready"), pod("unready", ready_at=None)) == ["unready", "ready"]
    assert order(pod("high", cost="100"), pod("low", cost="-50"), pod("none")) == ["low", "none", "high"]
    assert order(pod("invalid", cost="+10"), pod("ten", cost="10")) == ["invalid", "ten"], "invalid counts as 0"
    assert order(pod("alone", node="n2"), pod("crowd-a"), pod("crowd-b"))[2] == "alone"
    assert order(
        pod("old-ready", ready_at="2026-11-29T08:00:00Z", node="a"),
        pod("new-ready", ready_at="2026-11-29T11:00:00Z", node="b"),
    ) == ["new-ready", "old-ready"]
    assert order(pod("calm", node="a"), pod("flaky", restarts=5, node="b")) == ["flaky", "calm"]
    assert order(
        pod("older", node="a", created="2026-11-29T01:00:00Z"), pod("newer", node="b", created="2026-11-29T02:00:00Z")
    ) == ["newer", "older"]
