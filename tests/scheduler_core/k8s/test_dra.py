"""DRA: the GPUs NVIDIA's driver publishes and claims hold, per node, and what the state and filter make of them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from scheduler_core.extender.view import node_view
from scheduler_core.extender.wire import ExtenderArgs
from scheduler_core.k8s.dra import dra_facts, served_by_claim
from scheduler_core.k8s.pods import PodDemand, pod_demand
from scheduler_core.scoring.gpu_fit import Reason
from scheduler_core.state.cluster import ClusterState
from scheduler_core.state.readings import NoReadings
from scheduler_core.state.snapshot import build_snapshot, read_snapshot, write_snapshot
from testing.dra import allocated, device_classes, gpu_uuid, h200_devices, resource_slice

API = "resource.k8s.io/v1"


def test_a_node_publishes_its_gpus_once_each_its_mig_devices_counting_their_parent() -> None:
    devices = h200_devices("n1", 8, {7: ["1g.18gb"] * 7})
    facts = dra_facts([resource_slice(API, "n1", devices)], [])
    assert dict(facts.published) == {"n1": 8} and not facts.claimed and facts.managed == {"n1"}


def test_only_the_newest_generation_of_a_pool_is_published_and_one_being_rewritten_keeps_its_node_managed() -> None:
    old = resource_slice(API, "n1", h200_devices("n1", 8), generation=1)
    half = resource_slice(API, "n1", h200_devices("n1", 4), generation=2, count=2)
    facts = dra_facts([old, half], [])
    assert dict(facts.published) == {"n1": 4} and facts.managed == {"n1"}  # generation 2 lacks a slice so far
    other = resource_slice(API, "n1", h200_devices("n1", 8)[4:], generation=2, count=2, part=1)
    assert dict(dra_facts([old, half, other], []).published) == {"n1": 8}
    assert dict(dra_facts([half, other, old], []).published) == {"n1": 8}  # order does not matter
    shrunk = resource_slice(API, "n1", h200_devices("n1", 2), generation=3)
    assert dict(dra_facts([old, half, other, shrunk], []).published) == {"n1": 2}  # older generations never count


def test_claims_hold_gpus_reserved_or_not_and_mig_devices_hold_their_parent() -> None:
    devices = h200_devices("n1", 8, {7: ["1g.18gb"] * 7})
    slices = [resource_slice(API, "n1", devices)]
    claims = [
        allocated(API, "t", "reserved", "n1", ["gpu-0"], reserved_for="p"),
        allocated(API, "t", "not-yet", "n1", ["gpu-1", "gpu-2"]),
        allocated(API, "t", "slice-a", "n1", ["gpu-7-mig-1g18gb-0"]),
        allocated(API, "t", "slice-b", "n1", ["gpu-7-mig-1g18gb-3"]),  # the same parent: counted once
        allocated(API, "t", "watching", "n1", ["gpu-3"], admin=True),  # adminAccess holds nothing
    ]
    facts = dra_facts(slices, claims)
    assert dict(facts.claimed) == {"n1": 4}


def test_a_claimed_device_no_slice_lists_still_holds_a_gpu_on_the_node_its_allocation_names() -> None:
    gone = allocated(API, "t", "c", "n2", ["gpu-5"])
    facts = dra_facts([], [gone])
    assert dict(facts.claimed) == {"n2": 1} and not facts.problems
    del gone["status"]["allocation"]["nodeSelector"]
    facts = dra_facts([], [gone])
    assert not facts.claimed and "t/c" in facts.problems[0] and "gpu.nvidia.com/n2/gpu-5" in facts.problems[0]


def test_v1beta1_devices_and_per_device_node_selection_are_read() -> None:
    beta1 = resource_slice("resource.k8s.io/v1beta1", "n1", h200_devices("n1", 2, {1: ["3g.71gb"]}, v1beta1=True))
    assert dict(dra_facts([beta1], []).published) == {"n1": 2}
    spread = resource_slice(API, "ignored", h200_devices("a", 2))
    spread["spec"].update(perDeviceNodeSelection=True, nodeName=None)
    spread["spec"]["devices"][0]["nodeName"], spread["spec"]["devices"][1]["nodeName"] = "a", "b"
    assert dict(dra_facts([spread], []).published) == {"a": 1, "b": 1}
    beta1_spread = resource_slice("resource.k8s.io/v1beta1", "ignored", h200_devices("a", 2, v1beta1=True))
    beta1_spread["spec"].update(perDeviceNodeSelection=True, nodeName=None)
    beta1_spread["spec"]["devices"][0]["basic"]["nodeName"] = "a"
    beta1_spread["spec"]["devices"][1]["basic"]["nodeName"] = "b"
    assert dict(dra_facts([beta1_spread], []).published) == {"a": 1, "b": 1}


def test_other_drivers_device_types_and_unplaced_slices_are_not_gpus() -> None:
    nic = resource_slice(API, "n1", h200_devices("n1", 2))
    nic["spec"]["driver"] = "rdma.example.com"
    channel = resource_slice(API, "n2", [{"name": "channel-0", "attributes": {"type": {"string": "channel"}}}])
    network = resource_slice(API, "n3", h200_devices("n3", 2))
    network["spec"].pop("nodeName")
    network["spec"]["allNodes"] = True
    assert dict(dra_facts([nic, channel, network], []).published) == {}


@pytest.mark.parametrize(
    "pool",
    [None, {"name": "n1"}, {"name": "n1", "generation": -1, "resourceSliceCount": 1},
     {"name": "n1", "generation": 1, "resourceSliceCount": 0}, {"name": 3, "generation": 1, "resourceSliceCount": 1},
     {"name": "n1", "generation": True, "resourceSliceCount": 1}],
)  # fmt: skip
def test_a_slice_without_a_valid_pool_is_reported_not_counted(pool: Any) -> None:
    bad = resource_slice(API, "n1", h200_devices("n1", 2))
    bad["spec"]["pool"] = pool
    facts = dra_facts([bad, "not a slice", {"spec": []}], [None, {"status": {"allocation": "x"}}])
    assert not facts.published and len(facts.problems) == 1 and "spec.pool" in facts.problems[0]


def test_a_device_class_that_maps_nvidia_gpu_turns_on_kep_5004_and_its_pods_count_once() -> None:
    classes = device_classes(API)
    assert not dra_facts([], [], classes).extended
    classes[0]["spec"]["extendedResourceName"] = "nvidia.com/gpu"
    assert dra_facts([], [], classes).extended
    request = {"containerName": "main", "resourceName": "nvidia.com/gpu", "requestName": "container-0-request-0"}
    mapping = {
        "extendedResourceClaimStatus": {"resourceClaimName": "p-extended-resources-a", "requestMappings": [request]}
    }
    assert served_by_claim(mapping) and not served_by_claim({}) and not served_by_claim({"phase": "Running"})


def h200_node(name: str, gpus: int = 8) -> dict[str, Any]:
    labels = {
        "nvidia.com/gpu.product": "NVIDIA-H200",
        "nvidia.com/gpu.memory": "143771",
        "nvidia.com/gpu.count": str(gpus),
    }
    return {"metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "190"}}}  # fmt: skip


def gpu_pod(name: str, node: str, resources: dict[str, str], status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "t", "uid": name},
            "spec": {"nodeName": node, "schedulerName": "gpu-scheduler",
                     "containers": [{"name": "main", "resources": {"limits": resources}}]},
            "status": status or {"phase": "Running"}}  # fmt: skip


def dra_state(claims: list[dict[str, Any]], pods: list[dict[str, Any]] = (), classes: list[Any] = ()) -> ClusterState:  # type: ignore[assignment]
    nodes = [h200_node("dra"), h200_node("plain")]
    facts = dra_facts([resource_slice(API, "dra", h200_devices("dra", 8, {7: ["1g.18gb"] * 7}))], claims, classes)
    return build_snapshot(nodes, list(pods), cluster="t", generated_at=1.0, dra=facts)


def test_claims_are_used_gpus_that_kube_scheduler_cannot_see_and_survive_the_snapshot() -> None:
    claims = [allocated(API, "t", "a", "dra", ["gpu-0", "gpu-1"], reserved_for="p"),
              allocated(API, "t", "m", "dra", ["gpu-7-mig-1g18gb-2"])]  # fmt: skip
    state = dra_state(claims, [gpu_pod("w", "dra", {"nvidia.com/gpu": "2"})])
    assert state.used_gpus.tolist() == [5, 0] and state.free_gpus.tolist() == [3, 8]
    assert state.whole_gpus.tolist() == [2, 0] and state.held_by_shares(np.array([0, 1])).tolist() == [3, 0]
    assert state.claimed_gpus.tolist() == [3, 0] and state.dra_gpus.tolist() == [8, 0]
    assert (state.free_milli[0] == 0).sum() == 5
    back = read_snapshot(write_snapshot(state))
    assert back.claimed_gpus.tolist() == [3, 0] and back.dra_gpus.tolist() == [8, 0]
    assert back.free_gpus.tolist() == [3, 8] and back.dra_managed_at(np.array([1, 0, -1])).tolist() == [
        False,
        True,
        False,
    ]
    plain = build_snapshot([h200_node("dra")], [], cluster="t", generated_at=1.0)
    assert plain.dra_managed_at(np.array([0])) is None and read_snapshot(write_snapshot(plain)).dra_gpus is None


def test_whole_gpu_pods_are_refused_the_claimed_gpus_and_shares_every_dra_node() -> None:
    claims = [allocated(API, "t", f"c{k}", "dra", [f"gpu-{k}"]) for k in range(6)]
    state = dra_state(claims)
    nodes = [h200_node("dra"), h200_node("plain")]
    three = {"containers": [{"name": "m", "resources": {"limits": {"nvidia.com/gpu": "3"}}}]}
    demand = pod_demand({"spec": three})
    view = node_view(state, ExtenderArgs(pod={"spec": three}, nodes=nodes), demand, NoReadings())
    held = view.held_by_shares()
    assert held is not None
    result = view.filter(demand, held > 0)  # what the filter verdict does for nvidia.com/gpu
    assert result.reason.tolist() == [Reason.TOO_FEW_FREE, Reason.FITS]
    assert result.failed == {"dra": "2 of 8 GPUs free, pod needs 3"}
    share = PodDemand(share=250, milli_managed=True)
    result = node_view(state, ExtenderArgs(pod={}, nodes=nodes), share, NoReadings(), per_gpu=True).filter(share)
    assert result.reason.tolist() == [Reason.DRA_MANAGED, Reason.FITS]
    assert "DRA manages this node's GPUs" in result.failed_unresolvable["dra"] and not result.failed


def test_a_pod_whose_gpus_a_claim_serves_is_counted_once_by_the_claim() -> None:
    classes = device_classes(API)
    classes[0]["spec"]["extendedResourceName"] = "nvidia.com/gpu"
    status = {"phase": "Running", "extendedResourceClaimStatus": {"resourceClaimName": "x", "requestMappings": [
        {"containerName": "main", "resourceName": "nvidia.com/gpu", "requestName": "r"}]}}  # fmt: skip
    pod = gpu_pod("ext", "dra", {"nvidia.com/gpu": "2"}, status)
    state = dra_state([allocated(API, "t", "x", "dra", ["gpu-0", "gpu-1"], reserved_for="ext")], [pod], classes)
    assert state.used_gpus.tolist() == [2, 0] and state.whole_gpus is not None and state.whole_gpus.tolist() == [0, 0]
    counted_twice = dra_state(
        [allocated(API, "t", "x", "dra", ["gpu-0", "gpu-1"])], [gpu_pod("p", "dra", {"nvidia.com/gpu": "2"})]
    )
    assert counted_twice.used_gpus.tolist() == [4, 0]  # without the status, a device-plugin pod and a claim both count


def test_uuids_are_distinct_per_gpu_and_keep_the_real_pattern() -> None:
    uuids = {gpu_uuid(node, k) for node in ("a", "b") for k in range(8)}
    assert len(uuids) == 16 and all(u.startswith("GPU-f4ece6de-") and len(u) == 40 for u in uuids)


def test_where_a_class_maps_nvidia_gpu_a_dra_only_node_is_left_to_kube_schedulers_count() -> None:
    """KEP-5004: the node advertises no nvidia.com/gpu; kube-scheduler serves the request from DRA there."""
    dra_only = h200_node("dra-only")
    del dra_only["status"]["allocatable"]["nvidia.com/gpu"]
    nodes = [dra_only, h200_node("plain")]
    classes = device_classes(API)
    slices = [resource_slice(API, "dra-only", h200_devices("dra-only", 8))]
    two = {"spec": {"containers": [{"name": "m", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}
    demand = pod_demand(two)
    verdicts = {}
    for mapped in (False, True):
        classes[0]["spec"]["extendedResourceName"] = "nvidia.com/gpu" if mapped else None
        state = build_snapshot(nodes, [], cluster="t", generated_at=1.0, dra=dra_facts(slices, [], classes))
        state = read_snapshot(write_snapshot(state))  # the mapping survives the snapshot
        assert state.dra_extended is mapped
        view = node_view(state, ExtenderArgs(pod=two, nodes=nodes), demand, NoReadings())
        verdicts[mapped] = view.filter(demand).reason.tolist()
    assert verdicts == {False: [Reason.TOO_FEW_GPUS, Reason.FITS], True: [Reason.FITS, Reason.FITS]}
    share = PodDemand(share=250, milli_managed=True)
    view = node_view(state, ExtenderArgs(pod={}, nodes=nodes), share, NoReadings(), per_gpu=True)
    assert view.filter(share).reason.tolist()[0] == Reason.DRA_MANAGED


def test_a_cluster_document_may_carry_dra_objects() -> None:
    slices = [resource_slice(API, "dra", h200_devices("dra", 8))]
    claims = [allocated(API, "t", "a", "dra", ["gpu-0", "gpu-1"])]
    document = {"nodes": [h200_node("dra"), h200_node("plain")], "resourceslices": slices, "resourceclaims": claims}
    state = ClusterState.from_document(document)
    assert state.free_gpus.tolist() == [6, 8] and state.dra_gpus is not None and state.dra_gpus.tolist() == [8, 0]
    assert ClusterState.from_document({"nodes": [h200_node("dra")]}).dra_gpus is None  # none given: not read
