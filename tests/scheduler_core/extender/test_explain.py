"""``explain`` is the extender's own answer: the same verdicts, reasons and scores as filter and prioritize."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_core.errors import ClusterStateUnavailableError, InvalidPodError
from scheduler_core.extender.explain import explain
from scheduler_core.extender.facade import Extender, ExtenderConfig
from scheduler_core.extender.wire import ExtenderArgs
from scheduler_core.k8s.names import ASSIGNED_GPUS_ANNOTATION, PEERS_ANNOTATION
from scheduler_core.k8s.pods import pod_demand
from scheduler_core.state.cluster import ClusterState
from tests.conftest import make_nodes, make_pod

# a100-0, h100-1, t4-2, a100-3, t4-4, l40s-5: whole GPUs in use on two, shares on three GPUs of two more.
NODES = make_nodes("A100", "H100", "T4", "A100", "T4", "L40S")


def _share(name: str, node: str, milli: int, gpu: int) -> dict[str, Any]:
    pod = make_pod(name, 0, node_name=node, phase="Running", milli=milli)
    pod["metadata"]["annotations"][ASSIGNED_GPUS_ANNOTATION] = f"{gpu}:{milli}"
    return pod


def _app(name: str, node: str, app: str) -> dict[str, Any]:
    pod = make_pod(name, 1, node_name=node, phase="Running")
    pod["metadata"]["labels"] = {"app": app}
    return pod


BOUND = [
    make_pod("w1", 6, node_name="a100-0", phase="Running"),
    make_pod("w2", 3, node_name="t4-4", phase="Running"),
    _share("s1", "t4-2", 600, 0),
    _share("s2", "t4-2", 300, 1),
    _share("s3", "l40s-5", 750, 2),
    _app("f1", "a100-3", "feature-store"),
]


def _peer_pod() -> dict[str, Any]:
    pod = make_pod("near", 2)
    pod["metadata"]["annotations"][PEERS_ANNOTATION] = "app=feature-store:3"
    return pod


KUBE_SCHEDULERS_COUNT = " (kube-scheduler's count of nvidia.com/gpu)"
PODS = {
    "whole GPUs with a model list": make_pod("whole", 4, models="A100,T4"),
    "more GPUs than most nodes have": make_pod("big", 8),
    "a share of one GPU": make_pod("share", 0, milli=400),
    "a share with a model list": make_pod("share-t4", 0, milli=250, models="T4"),
    "a pod that names peers": _peer_pod(),
}


@pytest.mark.parametrize("policy", ["fgd_cpu", "gpu_packing"])
@pytest.mark.parametrize("pod", list(PODS.values()), ids=list(PODS))
def test_explain_gives_the_filters_reasons_and_the_prioritize_scores(pod: dict[str, Any], policy: str) -> None:
    state = ClusterState.from_objects(NODES, BOUND)
    extender = Extender(ExtenderConfig(share_policy=policy), cluster=lambda: state)
    rows = explain(extender, pod).nodes
    args = ExtenderArgs(pod=pod, node_names=list(state.table.names))
    reply = extender.filter(args).reply
    prioritized = extender.prioritize(args)
    scored = dict(zip(prioritized.hosts, prioritized.values, strict=True))

    assert sorted(r.node for r in rows) == sorted(state.table.names)
    # For whole GPUs the extender leaves the count to kube-scheduler; explain adds that count, and says so.
    demand = pod_demand(pod)
    theirs = {r.node for r in rows if r.reason.endswith(KUBE_SCHEDULERS_COUNT)}
    assert theirs == {r.node for r in rows if r.node in (reply.node_names or []) and r.gpus_free < demand.gpus}
    assert not theirs or demand.counted_by_scheduler
    assert {r.node for r in rows if r.passed} == set(reply.node_names or []) - theirs
    assert {r.node: r.reason for r in rows if not r.passed and r.node not in theirs} == {
        **reply.failed,
        **reply.failed_unresolvable,
    }
    assert {r.node for r in rows if r.unresolvable} == set(reply.failed_unresolvable)
    assert {r.node: r.score for r in rows} == scored
    # Best first: every node that passes before every one that does not, in the scores' order.
    passed = [r for r in rows if r.passed]
    assert rows[: len(passed)] == passed
    assert [r.score for r in passed] == sorted((r.score for r in passed), reverse=True)


def test_a_share_is_explained_on_the_gpus_it_would_share() -> None:
    """The per-GPU view: t4-2 has 400 and 700 milli left on two GPUs, so a 400-milli share fits it, and
    fgd_cpu (the default) prefers it to any idle GPU."""
    state = ClusterState.from_objects(NODES, BOUND)
    rows = {r.node: r for r in explain(Extender(cluster=lambda: state), PODS["a share of one GPU"]).nodes}
    assert rows["t4-2"].passed and rows["t4-2"].gpus_free == 4  # all four GPUs have 400 milli
    assert rows["t4-2"].score == 10
    share_t4 = {r.node: r for r in explain(Extender(cluster=lambda: state), PODS["a share with a model list"]).nodes}
    assert share_t4["a100-0"].unresolvable and share_t4["a100-0"].reason == "GPU model A100 not in T4"


def test_explain_refuses_a_pod_the_filter_refuses_with_the_filters_message() -> None:
    state = ClusterState.from_objects(NODES, BOUND)
    pod = make_pod("bad", 1, models="A100,!!")
    with pytest.raises(InvalidPodError, match="'!!' is not a GPU model name"):
        explain(Extender(cluster=lambda: state), pod)


def test_explain_needs_cluster_state() -> None:
    with pytest.raises(ClusterStateUnavailableError, match="explain needs cluster state"):
        explain(Extender(), make_pod("p", 1))
