"""``explain`` is the extender's own answer: the same verdicts, reasons and scores as filter and prioritize."""

from __future__ import annotations

import json
from typing import Any

import pytest

from scheduler_core.errors import ClusterStateUnavailableError, InvalidPodError
from scheduler_core.extender.explain import explain
from scheduler_core.extender.facade import Extender, ExtenderConfig
from scheduler_core.k8s.names import ASSIGNED_GPUS_ANNOTATION, PEERS_ANNOTATION
from scheduler_core.k8s.pods import pod_demand
from scheduler_core.scoring.gpu_fit import ScoreWeights
from scheduler_core.scoring.policy import SHARE_POLICIES
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


PODS = {
    "whole GPUs with a model list": make_pod("whole", 4, models="A100,T4"),
    "more GPUs than most nodes have": make_pod("big", 8),
    "a share of one GPU": make_pod("share", 0, milli=400),
    "a share with a model list": make_pod("share-t4", 0, milli=250, models="T4"),
    "a pod that names peers": _peer_pod(),
    "a pod without GPUs": make_pod("cpu-only", 0),
}


@pytest.mark.parametrize("policy", SHARE_POLICIES)
@pytest.mark.parametrize("pod", list(PODS.values()), ids=list(PODS))
def test_explain_is_filter_and_prioritize_on_the_wire_for_every_policy(pod: dict[str, Any], policy: str) -> None:
    """explain, under a configuration, against another extender of the same configuration answering
    kube-scheduler's filter and prioritize bodies: the same verdicts, reasons and scores."""
    state = ClusterState.from_objects(NODES, BOUND)
    config = ExtenderConfig(share_policy=policy, weights=ScoreWeights(fit=0.6, utilization=0.2, locality=0.9))
    rows = explain(Extender(config, cluster=lambda: state), pod).nodes
    body = json.dumps({"Pod": pod, "NodeNames": list(state.table.names)}).encode()
    extender = Extender(config, cluster=lambda: state)
    filtered = json.loads(extender.handle("filter", body)[1])
    scored = {entry["Host"]: entry["Score"] for entry in json.loads(extender.handle("prioritize", body)[1])}

    assert sorted(r.node for r in rows) == sorted(state.table.names)
    assert {r.node for r in rows if r.passed} == set(filtered["NodeNames"])
    assert {r.node: r.reason for r in rows if not r.passed} == {
        **filtered["FailedNodes"],
        **filtered["FailedAndUnresolvableNodes"],
    }
    assert {r.node for r in rows if r.unresolvable} == set(filtered["FailedAndUnresolvableNodes"])
    assert {r.node: r.score for r in rows} == scored
    # Where the extender leaves the count of nvidia.com/gpu to kube-scheduler, explain says what that
    # count refuses, beside the verdict.
    demand = pod_demand(pod)
    theirs = {r.node for r in rows if r.kube_scheduler}
    assert theirs == {r.node for r in rows if r.passed and r.gpus_free < demand.gpus}
    assert not theirs or demand.counted_by_scheduler
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
