import io
import json
import zipfile

import numpy as np
import pytest

from scheduler_core.state.snapshot import (
    SCHEMA_VERSION,
    SnapshotFormatError,
    build_snapshot,
    read_snapshot,
    write_snapshot,
)
from tests.conftest import captured_nodes, make_nodes, make_pod, requires_fixtures


def labelled(pod, app):
    pod["metadata"]["labels"] = {"app": app}
    return pod


def small_snapshot(**kwargs):
    nodes = make_nodes("A100", "T4", "H100")
    pods = [
        labelled(make_pod("a", 3, node_name="a100-0", phase="Running"), "redis"),
        labelled(make_pod("b", 1, node_name="t4-1", phase="Running"), "redis"),
        labelled(make_pod("c", 1, node_name="t4-1", phase="Succeeded"), "redis"),
        labelled(make_pod("d", 2, node_name="a100-0", phase="Pending"), "feature-store"),
    ]
    return build_snapshot(nodes, pods, cluster="prod", generated_at=1_700_000_000.5, **kwargs)


def test_snapshot_round_trips_every_column():
    snap = small_snapshot(gpu_utilization={"a100-0": [0.5, 1.0], "t4-1": [0.2] * 4})
    back = read_snapshot(write_snapshot(snap))
    assert (back.cluster, back.generated_at) == ("prod", 1_700_000_000.5)
    for column in ("zone_id", "instance_type_id", "model_id", "gpu_count", "memory_mib", "alloc_gpus"):
        assert np.array_equal(getattr(back.table, column), getattr(snap.table, column)), column
    assert back.table.names == snap.table.names
    assert (back.table.models, back.table.zones) == (snap.table.models, snap.table.zones)
    assert back.used_gpus.tolist() == [5, 1, 0]
    assert np.array_equal(back.free_milli, snap.free_milli)
    assert np.array_equal(back.gpu_utilization, snap.gpu_utilization, equal_nan=True)
    assert back.utilization.tolist() == pytest.approx([0.75, 0.2, 0.0])
    assert back.apps.apps == ("app=feature-store", "app=redis")
    assert back.apps.node_counts("app=redis", 3).tolist() == [1, 1, 0]
    assert back.apps.zone_counts.tolist() == [[1, 0, 0], [1, 1, 0]]


def test_whole_gpus_in_use_take_the_lowest_indices():
    snap = small_snapshot()
    assert snap.free_milli[0].tolist() == [0, 0, 0, 0, 0, 1000, 1000, 1000]
    assert snap.free_milli[1].tolist() == [0, 1000, 1000, 1000, 0, 0, 0, 0], "past 4 GPUs there is no GPU"


def test_invalid_utilisation_is_reported_and_left_unknown():
    snap = small_snapshot(gpu_utilization={"a100-0": [1.5], "t4-1": ["x"]})
    assert len(snap.problems) == 2
    assert np.isnan(snap.gpu_utilization[:2]).all()


@requires_fixtures()
def test_captured_cluster_round_trips():
    nodes = captured_nodes()
    snap = build_snapshot(nodes, [], cluster="captured", generated_at=0.0)
    back = read_snapshot(write_snapshot(snap))
    assert back.table.n_nodes == 83
    assert back.table.alloc_gpus.sum() == snap.table.alloc_gpus.sum() > 0


def test_free_cpu_and_the_gpu_pod_shapes_round_trip():
    snap = small_snapshot()
    back = read_snapshot(write_snapshot(snap))
    # a100-0 runs a (3 GPUs) and d (2 GPUs), t4-1 runs b; c has finished. make_pod asks for 1 CPU.
    assert back.free_cpu.tolist() == [95690 - 2000, 47810 - 1000, 191450]
    assert (
        back.shapes
        == snap.shapes
        == (
            ((1000, 1000, 3, ""), 1),
            ((1000, 1000, 2, ""), 1),
            ((1000, 1000, 1, ""), 1),
        )
    )
    assert back.workload.allowed.shape == (len(back.table.models) + 1, 3)


def test_the_gpus_shares_hold_round_trip_and_an_older_snapshot_does_not_know_them():
    share = make_pod("s", 0, milli=500, node_name="t4-1", phase="Running")
    share["metadata"]["annotations"]["gpu-scheduler.io/assigned-gpus"] = "2:500"
    nodes = make_nodes("A100", "T4")
    snap = build_snapshot(
        nodes, [make_pod("w", 3, node_name="a100-0", phase="Running"), share], cluster="c", generated_at=1.0
    )
    back = read_snapshot(write_snapshot(snap))
    assert back.whole_gpus.tolist() == [3, 0]
    assert back.held_by_shares(np.array([0, 1])).tolist() == [0, 1]
    older = read_snapshot(_rewrite(write_snapshot(snap), whole_gpus=None))
    assert older.whole_gpus is None and older.held_by_shares(np.array([0, 1])) is None
    with pytest.raises(SnapshotFormatError, match=r"'whole_gpus': expected shape \(2,\)"):
        read_snapshot(_rewrite(write_snapshot(snap), whole_gpus=np.zeros(3, dtype=np.int32)))


def test_a_snapshot_without_cpu_reads_as_unknown_cpu():
    """Snapshots written before free_cpu existed still read; FGD share placement then falls back."""
    data = _rewrite(write_snapshot(small_snapshot()), free_cpu=None)
    back = read_snapshot(data)
    assert back.free_cpu is None and back.shapes == ()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"header": {"shapes": None}}, "has free_cpu but its header has no 'shapes' list"),
        ({"header": {"shapes": [[1000, 500, 1, "", -2]]}}, r"shapes\[0\]: expected \[cpu, gpu_milli, num_gpu, models"),
        ({"header": {"shapes": [[1000, 500, 1]]}}, r"shapes\[0\]"),
        ({"free_cpu": np.zeros(2, dtype=np.int64)}, r"'free_cpu': expected \(3,\) integers"),
        ({"free_cpu": np.zeros(3, dtype=np.float64)}, r"'free_cpu': expected \(3,\) integers"),
    ],
)
def test_bad_cpu_or_shapes_are_a_format_error(changes, message):
    with pytest.raises(SnapshotFormatError, match=message):
        read_snapshot(_rewrite(write_snapshot(small_snapshot()), **changes))


def _rewrite(data, **changes):
    members = dict(np.load(io.BytesIO(data), allow_pickle=False))
    header = json.loads(members["header"].tobytes())
    header_changes = changes.pop("header", {})
    if header_changes is None:
        del members["header"]
    else:
        header.update(header_changes)
        members["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    for name, value in changes.items():
        if value is None:
            del members[name]
        else:
            members[name] = value
    out = io.BytesIO()
    np.savez(out, **members)
    return out.getvalue()


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        pytest.param(lambda d: d[: len(d) // 2], "truncated or corrupt", id="truncated file"),
        pytest.param(lambda d: d[:200] + b"\0" * 64 + d[264:], "truncated or corrupt", id="corrupt bytes"),
        pytest.param(lambda d: b"", "without the .npz", id="empty file"),
        pytest.param(lambda d: b'{"nodes": []}', "without the .npz", id="a JSON file"),
        pytest.param(
            lambda d: _rewrite(d, header={"schema_version": SCHEMA_VERSION + 1}),
            f"schema version {SCHEMA_VERSION + 1} is newer than this reader's",
            id="future schema version",
        ),
        pytest.param(lambda d: _rewrite(d, free_milli=None), "'free_milli' is missing", id="missing member"),
        pytest.param(
            lambda d: _rewrite(d, alloc_gpus=np.zeros(2, dtype=np.int32)),
            r"'alloc_gpus': expected shape \(3,\), got \(2,\)",
            id="inconsistent shapes",
        ),
        pytest.param(lambda d: _rewrite(d, header={"n_nodes": -1}), "n_nodes must be", id="negative node count"),
        pytest.param(
            lambda d: _rewrite(d, model_id=np.full(3, 99, dtype=np.int32)), "refers past its vocabulary", id="bad ids"
        ),
        pytest.param(lambda d: _rewrite(d, header=None), "no header member", id="no header"),
    ],
)
def test_unusable_snapshots_give_a_clear_error(mangle, message):
    with pytest.raises(SnapshotFormatError, match=message):
        read_snapshot(mangle(write_snapshot(small_snapshot())))


def test_snapshot_is_a_plain_npz_without_pickles():
    data = write_snapshot(small_snapshot())
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert "header.npy" in archive.namelist()
    members = np.load(io.BytesIO(data), allow_pickle=False)
    assert all(members[name].dtype != object for name in members.files)


def test_names_that_are_not_utf8_are_a_format_error():
    data = write_snapshot(small_snapshot())
    with pytest.raises(SnapshotFormatError, match="inconsistent: UnicodeDecodeError"):
        read_snapshot(_rewrite(data, names_utf8=np.frombuffer(b"\xff\xfe\n\xff", dtype=np.uint8)))


def test_a_header_vocabulary_of_the_wrong_type_is_a_format_error():
    data = write_snapshot(small_snapshot())
    with pytest.raises(SnapshotFormatError, match="inconsistent: TypeError"):
        read_snapshot(_rewrite(data, header={"zones": 7}))
