"""MIG: the node's mode and slices, the pod's profiles, the filter's verdicts, and the state's count."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from scheduler_core.errors import InvalidPodError
from scheduler_core.extender.view import node_view
from scheduler_core.extender.wire import ExtenderArgs
from scheduler_core.k8s.mig import KNOWN_PROFILES, MigMode, known_mig_resources, mig_mode, parse_profile
from scheduler_core.k8s.nodes import NodeTable
from scheduler_core.k8s.pods import PodDemand, pod_demand
from scheduler_core.scoring.gpu_fit import Reason, filter_nodes
from scheduler_core.scoring.mig_fit import mig_preference
from scheduler_core.state.cluster import ClusterState
from scheduler_core.state.readings import NoReadings
from scheduler_core.state.snapshot import read_snapshot, write_snapshot
from tests.conftest import SHARED

BALANCED = {"nvidia.com/mig-1g.18gb": "16", "nvidia.com/mig-2g.35gb": "8", "nvidia.com/mig-3g.71gb": "8"}


SINGLE = {
    "nvidia.com/mig.strategy": "single",
    "nvidia.com/gpu.product": "NVIDIA-H200-MIG-1g.18gb",
    "nvidia.com/gpu.memory": "16384",
    "nvidia.com/gpu.count": "56",
}


def node(name: str, labels: dict[str, str], allocatable: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "status": {"allocatable": allocatable}}


def nodes() -> list[dict[str, Any]]:
    h200 = {"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.memory": "143771", "nvidia.com/gpu.count": "8"}
    return [
        node("plain", h200, {"nvidia.com/gpu": "8"}),
        node("mixed", h200 | {"nvidia.com/mig.strategy": "mixed"}, dict(BALANCED)),
        node("single", h200 | SINGLE, {"nvidia.com/gpu": "56"}),
        node("invalid", h200 | {"nvidia.com/gpu.product": "NVIDIA-H200-MIG-INVALID"}, {"nvidia.com/gpu": "56"}),
        node("pending", h200 | {"nvidia.com/mig.config.state": "rebooting"}, dict(BALANCED)),
    ]  # fmt: skip


def slices_pod(**limits: str) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "spec": {"containers": [{"resources": {"limits": limits}}]}}


def test_modes_and_slices_from_labels_and_allocatable() -> None:
    table = NodeTable.from_nodes(nodes())
    assert [MigMode(m).name for m in table.mig_modes] == ["NONE", "MIXED", "SINGLE", "INVALID", "PENDING"]
    assert table.profile_slices("3g.71gb").tolist() == [0, 8, 0, 0, 0]  # a pending node's slices are not offered
    assert table.memory_mib.tolist()[2] == 16384 and table.alloc_gpus.tolist()[2] == 56
    taken = table.take(np.array([1, 0]))
    assert taken.profile_slices("1g.18gb").tolist() == [16, 0] and taken.mig_modes.tolist() == [2, 0]
    assert mig_mode({}, {"nvidia.com/mig-1g.10gb": "7"}) == MigMode.MIXED  # without GFD's strategy label


def test_profiles_parse_in_every_spelling_and_refuse_what_is_not_one() -> None:
    assert parse_profile("1g.10gb+me") == parse_profile("1g.10gb.me") == parse_profile("1G.10GB-me")
    assert parse_profile("1c.3g.40gb").slices == 3  # type: ignore[union-attr]
    assert parse_profile("3g") is None and parse_profile("a100") is None
    assert "nvidia.com/mig-3g.71gb" in known_mig_resources()
    with pytest.raises(InvalidPodError, match=r"'nvidia\.com/mig-huge' is not a MIG profile"):
        pod_demand(slices_pod(**{"nvidia.com/mig-huge": "1"}))


def test_a_pod_asks_slices_per_profile_by_kube_schedulers_rule() -> None:
    pod = slices_pod(**{"nvidia.com/mig-1g.18gb": "2", "nvidia.com/mig-3g.71gb": "1"})
    pod["spec"]["initContainers"] = [{"resources": {"requests": {"nvidia.com/mig-1g.18gb": "3"}}}]
    demand = pod_demand(pod)
    assert demand.mig == (("1g.18gb", 3), ("3g.71gb", 1)) and demand.gpus == 0 and demand.wants_gpu


def test_the_filter_refuses_with_what_the_node_is() -> None:
    table = NodeTable.from_nodes(nodes())
    free = table.alloc_gpus

    def verdict(demand: PodDemand) -> list[str]:
        result = filter_nodes(table, free, demand)
        return [Reason(code).name for code in result.reason], result.messages

    reasons, messages = verdict(PodDemand(mig=(("3g.71gb", 2),)))
    assert reasons == ["NO_PROFILE", "FITS", "NO_PROFILE", "MIG_UNSETTLED", "MIG_UNSETTLED"]
    assert messages[0] == "0 nvidia.com/mig-3g.71gb allocatable (MIG none), pod needs 2"
    assert messages[4] == "MIG is being reconfigured on this node (nvidia.com/mig.config.state=rebooting)"
    # An unconstrained whole-GPU pod: the slices need the pod's word; unsettled nodes never.
    reasons, messages = verdict(PodDemand(gpus=1))
    assert reasons == ["FITS", "TOO_FEW_GPUS", "MIG_SLICES", "MIG_UNSETTLED", "MIG_UNSETTLED"]
    assert 'gpu-scheduler.io/accept-mig-slices: "true"' in messages[2] and "16384 MiB each" in messages[2]
    reasons, _ = verdict(PodDemand(gpus=1, accept_mig_slices=True, models=frozenset({"H200"})))
    assert reasons[:3] == ["FITS", "TOO_FEW_GPUS", "FITS"]
    reasons, _ = verdict(PodDemand(gpus=1, accept_mig_slices=True, min_memory_mib=20480))
    assert reasons[2] == "MEMORY"  # the slice's memory is the GPU's
    reasons, messages = verdict(PodDemand(gpus=1, share=250, milli_managed=True, accept_mig_slices=True))
    assert reasons[2] == "MIG_SLICES" and "takes no gpu-scheduler.io/gpu-milli share" in messages[2]
    assert all(Reason[name].unresolvable for name in ("MIG_SLICES", "MIG_UNSETTLED", "NO_PROFILE"))


def test_the_state_counts_slices_and_the_snapshot_keeps_them() -> None:
    bound = slices_pod(**{"nvidia.com/mig-1g.18gb": "5", "nvidia.com/mig-3g.71gb": "8"})
    bound["spec"]["nodeName"] = "mixed"
    state = ClusterState.from_objects(nodes(), [bound])
    rows = np.array([1, -1, 4])
    assert state.mig_free_at(rows, ("1g.18gb", "3g.71gb", "7g.141gb")).tolist() == [[11, 0, 0], [0, 0, 0], [0, 0, 0]]
    again = read_snapshot(write_snapshot(replace(state, generated_at=1.0)))
    assert again.table.mig_profiles == state.table.mig_profiles
    assert again.table.mig_modes.tolist() == state.table.mig_modes.tolist()
    assert np.array_equal(again.mig_used, state.mig_used) and np.array_equal(
        again.table.mig_counts, state.table.mig_counts
    )
    # A second node, less full, loses to the fuller one; the full profile's node is not feasible anyway.
    free = state.mig_free_at(np.array([1, 4]), state.table.mig_profiles)
    two = state.table.take(np.array([1, 1]))
    fit = mig_preference(
        two, np.array([free[0], two.mig_counts[0]]), PodDemand(mig=(("1g.18gb", 1),)), np.array([True, True])
    )
    assert fit[0] > fit[1]


def test_a_layout_newer_than_the_state_is_not_taken_for_full() -> None:
    """The state knew the node before its MIG manager gave it 3g slices: prioritize's view counts them free."""
    before = [node("mixed", {"nvidia.com/mig.strategy": "mixed"}, {"nvidia.com/mig-1g.18gb": "16"})]
    state = ClusterState.from_objects(before, [])
    now = [node("mixed", {"nvidia.com/mig.strategy": "mixed"}, dict(BALANCED))]
    demand = PodDemand(mig=(("3g.71gb", 1),))
    view = node_view(state, ExtenderArgs(pod={}, nodes=now), demand, NoReadings())
    free = dict(zip(view.table.mig_profiles, view.mig_free()[0].tolist(), strict=True))
    assert free == {"1g.18gb": 16, "2g.35gb": 8, "3g.71gb": 8}


def test_the_h200_profiles_are_what_a_real_h200_lists() -> None:
    """KNOWN_PROFILES' H200 row against `nvidia-smi mig -lgip` on a real H200 (../shared/fixtures/gpu/h200)."""
    listing = SHARED / "fixtures" / "gpu" / "h200" / "mig-profiles.txt"
    if not listing.exists():
        pytest.skip(f"{listing} is absent: the H200 fixture comes with ../shared")
    names = re.findall(r"MIG (\d+g\.\d+gb(?:\+me)?)\s", listing.read_text())
    listed = {parse_profile(name).name for name in names}  # type: ignore[union-attr]
    assert listed == set(KNOWN_PROFILES["H200-141GB"]) and len(listed) == 7
