"""Whole and fractional GPU use per GPU, and the assigned-gpus annotation."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from manifests.reservation import reservation_pod
from scheduler_core.errors import InvalidPodError
from scheduler_core.k8s.annotations import format_assigned_gpus, parse_assigned_gpus
from scheduler_core.k8s.names import ASSIGNED_GPUS_ANNOTATION, MILLI_RESOURCE
from scheduler_core.k8s.nodes import NodeTable
from scheduler_core.simulator.synthetic import CATALOGUE, make_node, make_pod
from scheduler_core.state.allocation import gpu_usage
from scheduler_core.state.snapshot import build_snapshot
from tests.conftest import make_nodes

T4 = CATALOGUE[3]  # 4 GPUs


def share(name: str, milli: int, assigned: str | None, node: str = "n") -> dict[str, Any]:
    pod = make_pod(name, 0, node_name=node, phase="Running")
    pod["spec"]["containers"][0]["resources"]["limits"][MILLI_RESOURCE] = str(milli)
    if assigned is not None:
        pod["metadata"]["annotations"][ASSIGNED_GPUS_ANNOTATION] = assigned
    return pod


def usage(pods: list[dict[str, Any]]) -> Any:
    table = NodeTable.from_nodes([make_node("n", T4, "z")])
    return gpu_usage(table, pods, 4)


def test_shares_land_where_the_annotation_says_and_whole_gpus_avoid_them() -> None:
    result = usage(
        [share("a", 500, "1:500"), share("b", 250, "1:250"), make_pod("w", 2, node_name="n", phase="Running")]
    )
    assert result.used_milli.tolist() == [[1000, 750, 1000, 0]]
    assert result.problems == ()
    assert result.busy_gpus(np.array([4], dtype=np.int32)).tolist() == [3]


def test_a_share_without_annotation_is_counted_on_the_emptiest_gpu_and_reported() -> None:
    result = usage([share("a", 500, "0:500"), share("b", 300, None)])
    assert result.used_milli.tolist() == [[500, 300, 0, 0]]
    assert len(result.problems) == 1 and "default/b" in result.problems[0] and "GPU 1" in result.problems[0]


def test_bad_annotations_are_reported_not_raised() -> None:
    result = usage([share("a", 500, "x:500"), share("b", 500, "9:500")])
    assert any("'x:500' is not index:milli" in p for p in result.problems)
    assert any("assigned GPU 9, but the node has 4" in p for p in result.problems)
    assert result.used_milli.sum() == 500  # the unparsable one is still counted, by a best guess


def test_a_reservation_pods_gpu_is_the_shares_and_counts_once() -> None:
    """The reservation pod of GPU 1 holds the GPU the shares there hold: GPU 1 counts once, by the shares;
    the same pod anywhere else (or without the reservation's label) is a whole-GPU pod like any other."""
    reservation = reservation_pod("n", 1)
    reservation["status"] = {"phase": "Running"}
    shares = [share("a", 500, "1:500"), share("b", 250, "1:250")]
    result = usage([*shares, reservation])
    assert result.used_milli.tolist() == [[0, 750, 0, 0]]
    assert result.busy_gpus(np.array([4], dtype=np.int32)).tolist() == [1] and result.whole_gpus.tolist() == [0]
    assert result.used_cpu.tolist() == [10 + 2 * 1000]  # its CPU does count (make_pod asks for 1 core)
    for impostor in (
        {**reservation, "metadata": {**reservation["metadata"], "namespace": "default"}},
        {**reservation, "metadata": {**reservation["metadata"], "labels": {}}},
        {**reservation, "spec": {**reservation["spec"], "serviceAccountName": "default"}},
    ):
        assert usage([*shares, impostor]).busy_gpus(np.array([4], dtype=np.int32)).tolist() == [2]
    # One GPU is discounted, never more: a "reservation" asking for three holds two more.
    greedy = copy.deepcopy(reservation)
    greedy["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "3"
    greedy["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "3"
    assert usage([*shares, greedy]).busy_gpus(np.array([4], dtype=np.int32)).tolist() == [3]


def test_terminal_and_unbound_pods_use_nothing() -> None:
    result = usage([make_pod("done", 4, node_name="n", phase="Succeeded"), make_pod("pending", 4)])
    assert result.used_milli.sum() == 0


@pytest.mark.parametrize("text", ["", "0", "0:0", "0:1001", "0:5,0:5", "-1:5", "a:b"])
def test_parse_rejects_with_a_reason(text: str) -> None:
    with pytest.raises(InvalidPodError, match=ASSIGNED_GPUS_ANNOTATION):
        parse_assigned_gpus(text)


@given(st.dictionaries(st.integers(0, 15), st.integers(1, 1000), min_size=1))
def test_format_and_parse_round_trip(pairs: dict[int, int]) -> None:
    assert dict(parse_assigned_gpus(format_assigned_gpus(pairs.items()))) == pairs


def test_snapshot_free_milli_and_busy_gpus_follow_the_shares() -> None:
    snap = build_snapshot([make_node("n", T4, "z")], [share("a", 500, "2:500")], cluster="c", generated_at=0.0)
    assert snap.free_milli.tolist() == [[1000, 1000, 500, 1000]]
    assert snap.free_gpus.tolist() == [3]  # a shared GPU is not free for a whole-GPU pod


def test_cpu_in_use_and_the_gpu_pod_shapes_come_from_the_bound_pods():
    """CPU counts every bound, non-terminal pod; shapes the pods on GPU nodes, but not DaemonSets'."""
    from scheduler_core.simulator.synthetic import make_node
    from scheduler_core.state.cluster import ClusterState, NodeFacts
    from tests.conftest import SHAPES

    cpu_node = make_node("cpu-0", replace(SHAPES["T4"], gpus=0), "z")
    nodes = [*make_nodes("A100", "T4"), cpu_node]
    shares = [make_pod(f"s{i}", 0, milli=500, node_name="t4-1", phase="Running") for i in range(3)]
    pinned = make_pod("pinned", 2, node_name="a100-0", phase="Running", models="a100")
    pods = [
        *shares,
        pinned,
        make_pod("cpu-only", 0, node_name="a100-0", phase="Running"),
        make_pod("done", 1, node_name="a100-0", phase="Succeeded"),
        make_pod("on-cpu-node", 0, node_name="cpu-0", phase="Running"),
        make_pod("unbound", 1),
        make_pod("daemon", 0, node_name="t4-1", phase="Running"),
    ]
    # As the DaemonSet controller makes them: an owner reference and the template generation label.
    pods[-1]["metadata"]["ownerReferences"] = [{"kind": "DaemonSet", "name": "dcgm-exporter"}]
    pods[-1]["metadata"]["labels"] = {"app": "dcgm-exporter", "pod-template-generation": "3"}
    table = NodeTable.from_nodes(nodes)
    usage = gpu_usage(table, pods, 8)
    assert usage.used_cpu.tolist() == [2000, 4000, 1000]  # make_pod asks for 1 CPU
    state = ClusterState.from_objects(nodes, pods)
    assert state.free_cpu.tolist() == [95690 - 2000, 47810 - 4000, 47810 - 1000]
    assert state.shapes == (((1000, 500, 1, ""), 3), ((1000, 1000, 2, "A100"), 1), ((1000, 0, 0, ""), 1))
    assert NodeFacts.of(nodes).problems == ()  # every node's CPU was read


def test_a_bad_cpu_quantity_still_counts_the_pods_gpus_and_a_node_without_cpu_is_unlimited():
    from scheduler_core.state.allocation import UNKNOWN_CPU
    from scheduler_core.state.cluster import NodeFacts

    nodes = make_nodes("A100", "T4")
    del nodes[1]["status"]["allocatable"]["cpu"]
    bad = make_pod("bad", 2, node_name="a100-0", phase="Running")
    bad["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    usage = gpu_usage(NodeTable.from_nodes(nodes), [bad], 8)
    assert usage.whole_gpus.tolist() == [2, 0]
    assert usage.used_cpu.tolist() == [0, 0]
    assert usage.problems == (
        "pod default/bad on a100-0: containers[0].resources.requests.cpu: expected a Kubernetes quantity such as"
        " '2' or '40Gi', got 'lots'; its CPU is not counted",
    )
    nodes[0]["status"]["allocatable"]["cpu"] = "many"
    facts = NodeFacts.of(nodes)
    assert facts.cpu_milli.tolist() == [UNKNOWN_CPU, UNKNOWN_CPU]
    assert list(facts.problems) == [
        "Nodes.items[0].status.allocatable.cpu: expected a Kubernetes quantity such as '2' or '40Gi', got 'many'"
    ]
