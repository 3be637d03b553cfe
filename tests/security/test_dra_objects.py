"""DRA objects the product reads but does not control: whatever a ResourceSlice, a ResourceClaim or a
DeviceClass holds, reading them never raises, never counts a negative or a foreign GPU, and says what it
skipped; a cluster document or a snapshot with bad DRA parts is refused with a message that names them."""

from __future__ import annotations

import io
import zipfile
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_core.errors import InvalidArgsError
from scheduler_core.k8s.dra import dra_facts, served_by_claim
from scheduler_core.state.cluster import ClusterState
from scheduler_core.state.snapshot import SnapshotFormatError, build_snapshot, read_snapshot, write_snapshot
from testing.dra import allocated, h200_devices, resource_slice

API = "resource.k8s.io/v1"

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


def garbled(obj: Any, data: st.DataObject) -> Any:
    """``obj`` with one value somewhere inside it replaced by arbitrary JSON."""
    if isinstance(obj, dict) and obj and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(obj)))
        return {**obj, key: garbled(obj[key], data)}
    if isinstance(obj, list) and obj and data.draw(st.booleans()):
        at = data.draw(st.integers(0, len(obj) - 1))
        return [*obj[:at], garbled(obj[at], data), *obj[at + 1 :]]
    return data.draw(JSON)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_garbled_slices_and_claims_never_raise_and_never_count_what_no_node_has(data: st.DataObject) -> None:
    slices = [resource_slice(API, "n1", h200_devices("n1", 4, {3: ["1g.18gb"] * 2}))]
    claims = [allocated(API, "t", "a", "n1", ["gpu-0", "gpu-3-mig-1g18gb-1"], reserved_for="p")]
    slices = [garbled(s, data) for s in slices] + [data.draw(JSON)]
    claims = [garbled(c, data) for c in claims] + [data.draw(JSON)]
    facts = dra_facts(slices, claims, [data.draw(JSON)])
    # 4 GPUs in 5 devices (GPU 3 as two MIG devices): a device whose GPU is garbled away counts as a GPU of its
    # own (the module docstring: it errs towards refusing), so at most one per device.
    assert all(isinstance(n, str) and 0 < count <= 5 for n, count in facts.published.items()), facts
    assert all(isinstance(n, str) and count > 0 for n, count in facts.claimed.items())
    assert all(isinstance(p, str) for p in facts.problems)
    assert isinstance(served_by_claim(data.draw(JSON)), bool)


@pytest.mark.parametrize("value", [["gpu"], {"a": 1}, 7, None, True, ""])
@pytest.mark.parametrize("attribute", ["type", "uuid", "parentUUID"])
def test_an_attribute_of_any_shape_never_raises_nor_loses_a_gpu(attribute: str, value: Any) -> None:
    devices = h200_devices("n1", 2, {1: ["1g.18gb"] * 2})
    for device in devices:
        device["attributes"][attribute] = {"string": value}
    published = dict(dra_facts([resource_slice(API, "n1", devices)], []).published)
    if attribute == "type" and isinstance(value, str):  # a type the driver names that is no GPU's
        assert published == {}
    else:  # a GPU each, told apart by name where its UUIDs cannot tell them: never fewer than there are
        assert published in ({"n1": 2}, {"n1": 3})


def test_a_claim_on_a_node_the_table_lacks_counts_nowhere() -> None:
    node = {"metadata": {"name": "n1"}, "status": {"allocatable": {"nvidia.com/gpu": "4"}}}
    facts = dra_facts([], [allocated(API, "t", "a", "elsewhere", ["gpu-0"] * 3)])
    state = ClusterState.from_objects([node], [], dra=facts)
    assert state.free_gpus.tolist() == [4] and state.claimed_gpus is not None and state.claimed_gpus.tolist() == [0]


def test_more_claimed_gpus_than_a_node_has_leave_it_full_not_negative() -> None:
    node = {"metadata": {"name": "n1"}, "status": {"allocatable": {"nvidia.com/gpu": "2"}}}
    devices = [f"gpu-{k}" for k in range(6)]
    state = ClusterState.from_objects([node], [], dra=dra_facts([], [allocated(API, "t", "a", "n1", devices)]))
    assert state.free_gpus.tolist() == [0] and state.used_gpus.tolist() == [2]


@pytest.mark.parametrize("kind", ["resourceslices", "resourceclaims", "deviceclasses"])
def test_a_cluster_document_whose_dra_part_is_not_a_list_is_refused_by_name(kind: str) -> None:
    with pytest.raises(InvalidArgsError, match=kind):
        ClusterState.from_document({"nodes": [], kind: {"items": []}})


@pytest.mark.parametrize(
    ("member", "value"),
    [("dra_gpus", np.array([-1], dtype=np.int32)), ("claimed_gpus", np.array([1.5])),
     ("claimed_gpus", np.array([1, 2], dtype=np.int32)), ("claimed_gpus", None),
     ("claimed_gpus", np.array([2**32 + 1], dtype=np.int64))],
)  # fmt: skip
def test_a_snapshot_with_garbled_dra_members_is_refused(member: str, value: Any) -> None:
    node = {"metadata": {"name": "n1"}, "status": {"allocatable": {"nvidia.com/gpu": "4"}}}
    state = build_snapshot([node], [], cluster="c", generated_at=1.0,
                           dra=dra_facts([], [allocated(API, "t", "a", "n1", ["gpu-0"])]))  # fmt: skip
    source, out = io.BytesIO(write_snapshot(state)), io.BytesIO()
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(out, "w") as new:
        for item in old.infolist():
            if item.filename != f"{member}.npy":
                new.writestr(item, old.read(item))
            elif value is not None:
                buffer = io.BytesIO()
                np.save(buffer, value)
                new.writestr(item, buffer.getvalue())
    with pytest.raises(SnapshotFormatError, match=r"dra_gpus|claimed_gpus"):
        read_snapshot(out.getvalue())
