"""One node cannot size, fail or freeze the cluster state (issue "Safe to deploy, third pass"): a node whose
status, labels or DRA slices say more GPUs, slices or devices than a cap of ``scheduler_core.k8s.limits`` is
invalid on its own. Both state builders (the refresher's snapshot, ``serve --watch``'s live state) build and
serve the rest of the cluster as if it were absent; the node is refused to every pod with a reason that
names the figure; and a hypothesis fuzz of node status, labels and DRA objects with hostile sizes finds no
exception and no state larger than the caps allow."""

from __future__ import annotations

import copy
import io
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.amp import Sample, utilization_by_node
from adapters.live_state import LiveState
from scheduler_core.extender.facade import Extender
from scheduler_core.k8s.dra import dra_facts
from scheduler_core.k8s.limits import (
    MAX_DRA_DEVICES_PER_NODE,
    MAX_GPUS_PER_NODE,
    MAX_MIG_PROFILES_PER_NODE,
    MAX_MIG_SLICES_PER_NODE,
)
from scheduler_core.state.cluster import ClusterState
from scheduler_core.state.snapshot import SnapshotFormatError, build_snapshot, read_snapshot, write_snapshot
from testing.dra import allocated, h200_devices, resource_slice
from tests.adapters.test_live_state import ScriptedKube, _until
from tests.conftest import make_nodes, make_pod

API = "resource.k8s.io/v1"
HOSTILE_COUNT = "2147483647"
REASON = "node refused: allocatable nvidia.com/gpu is 2147483647 or more, over the cap of 128 per node"


def hostile_node(name: str = "liar", **allocatable: str) -> dict[str, Any]:
    """An A100 node whose status says ``allocatable`` (default: 2,147,483,647 GPUs)."""
    (node,) = make_nodes("A100")
    node["metadata"]["name"] = name
    node["status"]["allocatable"].update(allocatable or {"nvidia.com/gpu": HOSTILE_COUNT})
    return node


def filter_reply(state: ClusterState, pod: dict[str, Any]) -> dict[str, Any]:
    extender = Extender(cluster=lambda: state)
    body = json.dumps({"Pod": pod, "NodeNames": list(state.table.names)}).encode()
    status, reply = extender.handle("filter", body)
    assert status == 200
    decoded: dict[str, Any] = json.loads(reply)
    return decoded


def test_a_node_claiming_two_billion_gpus_is_refused_and_the_rest_is_served() -> None:
    nodes = [*make_nodes("A100", "T4", "H100"), hostile_node()]
    pods = [make_pod("w", 2, node_name="a100-0", phase="Running")]
    snapshot = read_snapshot(write_snapshot(build_snapshot(nodes, pods, cluster="c", generated_at=1.0)))
    assert snapshot.max_gpus == 8  # the largest real node's, not the liar's
    assert snapshot.free_milli is not None and snapshot.free_milli.shape == (4, 8)
    row = snapshot.table.index["liar"]
    assert snapshot.table.invalid == {row: REASON.removeprefix("node refused: ")}
    assert int(snapshot.table.alloc_gpus[row]) == 0
    for pod in (make_pod("one-gpu", 1), make_pod("cpu-only", 0)):
        reply = filter_reply(snapshot, pod)
        assert reply["FailedAndUnresolvableNodes"] == {"liar": REASON}
        assert "liar" not in reply["NodeNames"] and "a100-0" in reply["NodeNames"]


@pytest.mark.parametrize(
    ("allocatable", "figure"),
    [
        ({"nvidia.com/gpu": "129"}, "allocatable nvidia.com/gpu is 129, over the cap of 128"),
        ({"nvidia.com/gpu": "1e30"}, "allocatable nvidia.com/gpu is 2147483647 or more"),
        (
            {f"nvidia.com/mig-{k}g.{k}0gb": "7" for k in range(1, MAX_MIG_PROFILES_PER_NODE + 2)},
            f"its MIG profiles offered is {MAX_MIG_PROFILES_PER_NODE + 1}, over the cap of 32",
        ),
        ({"nvidia.com/mig-1g.10gb": "100", "nvidia.com/mig-3g.40gb": "100"}, "its allocatable MIG slices is 200"),
        ({"nvidia.com/mig-1g.10gb": HOSTILE_COUNT}, "its allocatable MIG slices is 2147483647 or more"),
    ],
    ids=["129 GPUs", "a quantity of 1e30 GPUs", "33 MIG profiles", "200 MIG slices", "two billion MIG slices"],
)
def test_every_figure_over_its_cap_makes_the_node_invalid_by_name(allocatable: dict[str, str], figure: str) -> None:
    node = hostile_node(**allocatable)
    if any(key.startswith("nvidia.com/mig-") for key in allocatable):
        node["metadata"]["labels"]["nvidia.com/mig.strategy"] = "mixed"
    state = ClusterState.from_objects([*make_nodes("T4"), node])
    (reason,) = state.table.invalid.values()
    assert figure in reason
    assert state.table.mig_profiles == () and state.max_gpus == 4


def test_a_gpu_count_label_over_the_cap_makes_the_node_invalid() -> None:
    node = hostile_node(**{"nvidia.com/gpu": "8"})
    node["metadata"]["labels"]["nvidia.com/gpu.count"] = "100000"
    (reason,) = ClusterState.from_objects([node]).table.invalid.values()
    assert reason == "its GPU count label is 100000, over the cap of 128 per node"


def test_nodes_at_the_caps_are_valid() -> None:
    mixed = hostile_node("mixed", **{"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": str(MAX_MIG_SLICES_PER_NODE)})
    mixed["metadata"]["labels"]["nvidia.com/mig.strategy"] = "mixed"
    state = ClusterState.from_objects([hostile_node("big", **{"nvidia.com/gpu": str(MAX_GPUS_PER_NODE)}), mixed])
    assert state.table.invalid == {} and state.max_gpus == MAX_GPUS_PER_NODE
    assert int(state.table.profile_slices("1g.10gb")[1]) == MAX_MIG_SLICES_PER_NODE


def test_the_live_state_keeps_following_the_cluster_past_a_lying_node() -> None:
    kube = ScriptedKube([*make_nodes("A100", "T4"), hostile_node()], [])
    live = LiveState(lambda: kube, min_interval_s=0.0, dra_api="")
    live.start()
    try:
        assert live.wait_synced(5), "no state was built: the lying node froze the live state"
        assert live().table.invalid and live().max_gpus == 8
        late = make_nodes("H100", "H100", "H100")[2]  # h100-2: a node added afterwards
        kube.push("nodes", ("ADDED", late))
        _until(lambda: "h100-2" in live().table.index)
        reply = filter_reply(live(), make_pod("needs-h100", 8, models="H100"))
        assert reply["NodeNames"] == ["h100-2"] and reply["FailedAndUnresolvableNodes"]["liar"] == REASON
        assert live.stats()["invalid_nodes"] == 1
    finally:
        live.close()
        kube.close()


def _h200_slices(node: str, gpus: int, pool: str | None = None) -> dict[str, Any]:
    piece = resource_slice(API, node, h200_devices(node, min(gpus, 8)))
    devices = piece["spec"]["devices"]
    piece["spec"]["devices"] = [
        {**copy.deepcopy(devices[k % len(devices)]), "name": f"gpu-{k}",
         "attributes": {**devices[k % len(devices)]["attributes"], "uuid": {"string": f"GPU-{node}-{k}"}}}
        for k in range(gpus)
    ]  # fmt: skip
    if pool is not None:
        piece["spec"]["pool"]["name"] = pool
    return piece


def test_dra_devices_over_the_cap_make_their_node_invalid_and_count_nowhere() -> None:
    facts = dra_facts([_h200_slices("n1", 8), _h200_slices("liar", MAX_DRA_DEVICES_PER_NODE + 1)], [])
    assert dict(facts.published) == {"n1": 8}
    assert "the GPUs DRA publishes on it is 129, over the cap of 128" in facts.over_cap["liar"]
    nodes = [hostile_node("n1", **{"nvidia.com/gpu": "0"}), hostile_node("liar", **{"nvidia.com/gpu": "0"})]
    state = ClusterState.from_objects(nodes, dra=facts)
    assert list(state.table.invalid) == [1]
    reply = filter_reply(state, make_pod("cpu", 0))
    assert "over the cap of 128" in reply["FailedAndUnresolvableNodes"]["liar"]
    assert reply["NodeNames"] == ["n1"]


def test_claims_holding_more_gpus_than_the_cap_make_their_node_invalid() -> None:
    held = [f"gpu-{k}" for k in range(MAX_GPUS_PER_NODE + 1)]
    claims = [allocated(API, "t", "c", "liar", held)]  # devices no slice lists: one GPU each, on the selected node
    facts = dra_facts([], claims)
    assert "the GPUs DRA claims hold on it is 129" in facts.over_cap["liar"] and not facts.claimed


def test_a_slice_cannot_take_over_another_nodes_pool_by_its_name() -> None:
    own = _h200_slices("n1", 4)
    impostor = _h200_slices("n2", 1, pool="n1")  # n2's kubelet writes a slice of pool "n1", a newer generation
    impostor["spec"]["pool"]["generation"] = 7
    claims = [allocated(API, "t", "c", "n1", ["gpu-2"])]
    facts = dra_facts([own, impostor], claims)
    assert dict(facts.published) == {"n1": 4, "n2": 1}  # n1's devices still count on n1
    assert dict(facts.claimed) == {"n1": 1}  # the claim n1's node selector names stays on n1


def test_a_utilisation_sample_of_gpu_9999_sizes_no_list() -> None:
    by_node, problems = utilization_by_node([Sample({"Hostname": "n", "gpu": "9999"}, 50.0)])
    assert by_node == {} and "past the cap of 128 GPUs per node" in problems[0]


def test_a_snapshot_wider_than_the_cap_is_refused_on_read() -> None:
    data = write_snapshot(build_snapshot(make_nodes("A100"), [], cluster="c", generated_at=1.0))
    members = dict(np.load(io.BytesIO(data), allow_pickle=False))
    header = json.loads(members["header"].tobytes())
    header["max_gpus"] = MAX_GPUS_PER_NODE + 1
    members["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    for name in ("free_milli", "gpu_utilization"):
        members[name] = np.zeros((1, MAX_GPUS_PER_NODE + 1), dtype=members[name].dtype)
    forged = io.BytesIO()
    np.savez(forged, allow_pickle=False, **members)
    with pytest.raises(SnapshotFormatError, match="max_gpus is 129, over the cap of 128"):
        read_snapshot(forged.getvalue())


# ---- the fuzz ---------------------------------------------------------------------------------
HUGE = st.sampled_from(["0", "1", "8", "128", "129", "4096", HOSTILE_COUNT, "9" * 40, "1e30", "1Ki", "-3", "x", ""])
COUNT = st.one_of(HUGE, st.integers(min_value=-(2**70), max_value=2**70), st.none(), st.floats(), st.booleans())
RESOURCE = st.sampled_from([
    "nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb", "nvidia.com/mig-7g.80gb",
    "nvidia.com/mig-2c.3g.40gb", "cpu", "memory", "gpu-scheduler.io/gpu-milli",
])  # fmt: skip
LABEL = st.sampled_from([
    "nvidia.com/gpu.count", "nvidia.com/gpu.memory", "gpu.nvidia.com/count", "gpu.nvidia.com/memory",
    "nvidia.com/gpu.product", "nvidia.com/mig.strategy", "nvidia.com/mig.config.state",
    "karpenter.k8s.aws/instance-gpu-count",
])  # fmt: skip


@st.composite
def hostile_cluster(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Two honest nodes and up to three whose allocatable, labels and ResourceSlices are drawn, hostile sizes
    among them; the slices list up to twice the device cap on one node."""
    nodes = make_nodes("A100", "T4")
    slices: list[dict[str, Any]] = [_h200_slices("a100-0", 2)]
    for k in range(draw(st.integers(1, 3))):
        name = f"fuzz-{k}"
        node = hostile_node(name, **{"nvidia.com/gpu": "1"})
        node["status"]["allocatable"].update(draw(st.dictionaries(RESOURCE, COUNT, max_size=4)))
        many = draw(st.integers(0, 40))  # up to 40 made-up MIG profiles
        node["status"]["allocatable"].update({f"nvidia.com/mig-{p % 7 + 1}g.{p + 1}gb": "9" for p in range(many)})
        node["metadata"]["labels"].update(draw(st.dictionaries(LABEL, HUGE | st.sampled_from(["mixed", "pending"]),
                                                                max_size=3)))  # fmt: skip
        nodes.append(node)
        devices = draw(st.sampled_from([0, 8, MAX_GPUS_PER_NODE + 1, 2 * MAX_DRA_DEVICES_PER_NODE]))
        if devices:
            slices.append(_h200_slices(name, devices, pool=draw(st.sampled_from([name, "a100-0"]))))
    return nodes, slices


def _within_caps(state: ClusterState) -> None:
    table = state.table
    assert state.max_gpus <= MAX_GPUS_PER_NODE
    assert state.free_milli is not None and state.free_milli.shape == (table.n_nodes, state.max_gpus)
    assert int(table.alloc_gpus.max(initial=0)) <= MAX_GPUS_PER_NODE
    assert int(table.gpu_count.max(initial=0)) <= MAX_GPUS_PER_NODE
    per_node = (table.mig_counts > 0).sum(axis=1)
    assert int(per_node.max(initial=0)) <= MAX_MIG_PROFILES_PER_NODE
    assert int(table.mig_counts.sum(axis=1, dtype=np.int64).max(initial=0)) <= MAX_MIG_SLICES_PER_NODE
    assert len(table.mig_profiles) <= MAX_MIG_PROFILES_PER_NODE * table.n_nodes
    for column in (state.dra_gpus, state.claimed_gpus):
        assert column is None or int(column.max(initial=0)) <= MAX_GPUS_PER_NODE
    assert {"a100-0", "t4-1"} <= set(table.names) and not table.invalid_mask[:2].any()


@pytest.mark.slow  # a hypothesis fuzz, about 10 s
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cluster=hostile_cluster())
def test_hostile_sizes_through_both_state_builders_never_raise_or_outgrow_the_caps(
    cluster: tuple[list[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    nodes, slices = cluster
    facts = dra_facts(slices, [])
    # The refresher's builder, through the snapshot's bytes.
    snapshot = build_snapshot(nodes, [make_pod("w", 1, node_name="a100-0", phase="Running")], cluster="c",
                              generated_at=1.0, dra=facts)  # fmt: skip
    _within_caps(read_snapshot(write_snapshot(snapshot)))
    # serve --watch's builder: the live state from the same objects.
    kube = ScriptedKube(copy.deepcopy(nodes), [], dra={"resourceslices": slices, "resourceclaims": [],
                                                        "deviceclasses": []})  # fmt: skip
    live = LiveState(lambda: kube, min_interval_s=0.0, dra_api=API)
    live.start()
    try:
        assert live.wait_synced(5), "the live state built nothing"
        _within_caps(live())
    finally:
        live.close()
        kube.close()
