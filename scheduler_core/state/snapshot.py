"""The cluster snapshot: a versioned, columnar picture of the cluster that the extender reads.

kube-scheduler's ``nodeCacheCapable: true`` requests carry node names only, so the extender needs
its own copy of node facts and GPU usage. The node-state refresher writes it; the extender reads it.

Format (schema version 1): an uncompressed ``.npz`` archive (numpy only, no pickle) whose members
are the arrays below plus ``header``, a UTF-8 JSON document stored as a uint8 array::

    header            {"schema_version", "generated_at" (Unix seconds), "cluster", "n_nodes",
                       "max_gpus", "zones", "instance_types", "models", "apps",
                       "gpu_info_errors" {row: reason}, "problems" [..],
                       "invalid_nodes" {row: reason} (optional: nodes over a cap of
                       scheduler_core.k8s.limits, refused to every pod),
                       "utilization_at" (Unix seconds or null; optional),
                       "shapes" [[cpu milli, GPU milli, GPUs, models "A|B" or "", pods], ..]
                       (optional: the typical GPU pod shapes, for FGD),
                       "revision" "LOW-HIGH" (optional: the resourceVersions of the node and pod
                       lists or watches it was built from, lowest and highest; see Revision)}
    names_utf8        uint8 (bytes,)         node names joined by "\\n"
    zone_id, instance_type_id, model_id, gpu_count, memory_mib, alloc_gpus, used_gpus
                      int32 (n_nodes,)
    free_milli        int32 (n_nodes, max_gpus)   free thousandths of each GPU; 0 past alloc_gpus
    gpu_utilization   float32 (n_nodes, max_gpus) per-GPU utilisation in [0, 1]; NaN unknown
    app_node          int32 (3, n_entries)   rows (app_id, node row, pod count): pods per app per node
    app_zone_counts   int32 (n_apps, n_zones) pods per app per zone
    free_cpu          int32 (n_nodes,)       allocatable milli-cores less bound pods' requests
                                             (optional, with "shapes": a snapshot without them
                                             leaves FGD share placement to its fallback)
    whole_gpus        int32 (n_nodes,)       the part of used_gpus held as nvidia.com/gpu (optional:
                                             without it, the filter leaves whole-GPU counts to
                                             kube-scheduler on every node)
    dra_gpus, claimed_gpus  int32 (n_nodes,) GPUs DRA publishes on each node, and GPUs its claims hold
                                             there (in used_gpus); optional, together: where DRA was
                                             not read, no node counts as DRA-managed

Readers refuse a newer schema version, and report a truncated or corrupt file as
:class:`SnapshotFormatError` naming what is wrong.
"""

from __future__ import annotations

import io
import json
import math
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler_core.errors import SchedulerCoreError
from scheduler_core.k8s.dra import DraFacts
from scheduler_core.k8s.limits import MAX_GPUS_PER_NODE
from scheduler_core.k8s.mig import MIG_MODES, parse_profile
from scheduler_core.k8s.nodes import NodeTable
from scheduler_core.placement.model import Shape
from scheduler_core.scoring.locality import DEFAULT_LABEL_KEYS, AppIndex
from scheduler_core.state.cluster import ClusterState

SCHEMA_VERSION = 1

_NODE_COLUMNS = ("zone_id", "instance_type_id", "model_id", "gpu_count", "memory_mib", "alloc_gpus", "used_gpus")
_HEADER_KEYS = (
    "schema_version",
    "generated_at",
    "cluster",
    "n_nodes",
    "max_gpus",
    "zones",
    "instance_types",
    "models",
    "apps",
)


class SnapshotFormatError(SchedulerCoreError, ValueError):
    """The bytes are not a snapshot this reader can use (truncated, corrupt or too new)."""


@dataclass(frozen=True, order=True)
class Revision:
    """How far into the cluster's history a snapshot has read: its node list (or watch) and its pod list
    are complete up to etcd revisions ``low`` and ``high`` (``resourceVersion`` in the API).

    Two writers of one snapshot (a refresher and the next one taking over) compare revisions so that an
    older picture never replaces a newer one: a snapshot is newer when its ``low`` is higher, then its
    ``high``. ``resourceVersion`` is opaque in the API's contract; on an etcd-backed API server it is the
    etcd revision, a number that only grows, and :meth:`of` gives None for anything else.

    >>> Revision.of(["120", "95"]), str(Revision(95, 120)), Revision.parse("95-120") < Revision(96, 96)
    (Revision(low=95, high=120), '95-120', True)
    >>> Revision.of(["", "12"]) is None, Revision.parse("x") is None
    (True, True)
    """

    low: int
    high: int

    @classmethod
    def of(cls, versions: Iterable[str]) -> Revision | None:
        given = list(versions)
        numbers = [int(v) for v in given if isinstance(v, str) and v.isdigit()]
        if not numbers or len(numbers) != len(given):
            return None
        return cls(min(numbers), max(numbers))

    @classmethod
    def parse(cls, text: object) -> Revision | None:
        low, _, high = text.partition("-") if isinstance(text, str) else ("", "", "")
        return cls(int(low), int(high)) if low.isdigit() and high.isdigit() and int(low) <= int(high) else None

    def __str__(self) -> str:
        return f"{self.low}-{self.high}"


def build_snapshot(
    nodes: Sequence[Any],
    pods: Sequence[Any],
    *,
    cluster: str,
    generated_at: float,
    gpu_utilization: Mapping[str, Sequence[float]] | None = None,
    utilization_at: float | None = None,
    app_label_keys: Sequence[str] = DEFAULT_LABEL_KEYS,
    dra: DraFacts | None = None,
) -> ClusterState:
    """Build a snapshot (a :class:`ClusterState` with its name, stamp and per-GPU utilisation) from v1
    Node and Pod objects.

    Parameters
    ----------
    gpu_utilization : mapping of node name to per-GPU utilisation in [0, 1], optional
        For example from DCGM ``DCGM_FI_DEV_GPU_UTIL / 100``. Missing GPUs, and NaN values, are unknown.
    utilization_at : when ``gpu_utilization`` was measured (Unix seconds), recorded in the header.
    app_label_keys : label keys indexed for locality, first present key wins per pod.
    dra : the GPUs DRA publishes and its claims hold (:func:`~scheduler_core.k8s.dra.dra_facts`), where read.

    GPU use per GPU follows :func:`scheduler_core.state.allocation.gpu_usage`: fractional shares where
    ``gpu-scheduler.io/assigned-gpus`` puts them, whole GPUs on the lowest-index untouched GPUs.
    ``used_gpus`` counts the GPUs that are not entirely free.

    >>> node = {"metadata": {"name": "n"}, "status": {"allocatable": {"nvidia.com/gpu": "4"}}}
    >>> pod = {"spec": {"nodeName": "n", "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    >>> snap = build_snapshot([node], [pod], cluster="demo", generated_at=0.0)
    >>> snap.free_milli.tolist()
    [[0, 1000, 1000, 1000]]
    """
    state = ClusterState.from_objects(nodes, pods, label_keys=app_label_keys, dra=dra)
    table, max_gpus = state.table, state.max_gpus
    problems = list(state.problems)
    util = np.full((table.n_nodes, max_gpus), np.nan, dtype=np.float32)
    for name, values in (gpu_utilization or {}).items():
        row = table.index.get(name)
        if row is None:
            continue
        clean = [float(v) for v in values[:max_gpus] if isinstance(v, int | float) and not isinstance(v, bool)]
        if len(clean) != len(values[:max_gpus]) or any(not 0.0 <= v <= 1.0 for v in clean if not math.isnan(v)):
            problems.append(f"gpu_utilization[{name!r}]: expected numbers in [0, 1], got {list(values)[:8]!r}")
            continue
        util[row, : len(clean)] = clean
    return replace(
        state,
        utilization=node_utilization(util, table.alloc_gpus),
        problems=tuple(problems),
        generated_at=float(generated_at),
        cluster=cluster,
        gpu_utilization=util,
        utilization_at=utilization_at,
    )


def node_utilization(util: npt.NDArray[np.float32], alloc: npt.NDArray[np.int32]) -> npt.NDArray[np.float64]:
    """Mean utilisation over each node's existing GPUs with a known value; 0 where none is known."""
    exists = np.arange(util.shape[1])[None, :] < alloc[:, None]
    known = exists & ~np.isnan(util)
    total = np.where(known, util, 0.0).sum(axis=1, dtype=np.float64)
    count = known.sum(axis=1)
    mean: npt.NDArray[np.float64] = np.divide(total, count, out=np.zeros(util.shape[0]), where=count > 0)
    return mean


def write_snapshot(snapshot: ClusterState, *, revision: Revision | None = None) -> bytes:
    """Serialise ``snapshot`` (see the module docstring for the format), with the ``revision`` of the
    lists it was built from when known.

    Raises
    ------
    ValueError
        The state has no ``generated_at`` stamp or no per-GPU free milli: it is not a snapshot.
    """
    if snapshot.generated_at is None or snapshot.free_milli is None:
        raise ValueError("write_snapshot: the state needs generated_at and free_milli (build it with build_snapshot)")
    arrays = _members_of(snapshot, _header_of(snapshot, revision), snapshot.free_milli)
    buffer = io.BytesIO()
    np.savez(buffer, allow_pickle=False, **arrays)
    return buffer.getvalue()


def _header_of(snapshot: ClusterState, revision: Revision | None) -> dict[str, Any]:
    """The ``header`` member's document (keys in the order they are written)."""
    table = snapshot.table
    header: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "generated_at": snapshot.generated_at,
        "cluster": snapshot.cluster,
        "n_nodes": table.n_nodes,
        "max_gpus": snapshot.max_gpus,
        "zones": list(table.zones),
        "instance_types": list(table.instance_types),
        "models": list(table.models),
        "apps": list(snapshot.apps.apps),
        "gpu_info_errors": {str(row): reason for row, reason in table.gpu_info_errors.items()},
        "problems": list(snapshot.problems),
        "invalid_nodes": {str(row): reason for row, reason in table.invalid.items()},
        "utilization_at": snapshot.utilization_at,
    }
    if snapshot.dra_extended:
        header["dra_extended"] = True
    if revision is not None:
        header["revision"] = str(revision)
    if snapshot.free_cpu is not None:
        header["shapes"] = [[*shape, count] for shape, count in snapshot.shapes]
    return header


def _members_of(
    snapshot: ClusterState, header: Mapping[str, Any], free_milli: npt.NDArray[np.int32]
) -> dict[str, npt.NDArray[Any]]:
    """The archive's members, ``header`` first, the optional ones where the state has them."""
    table = snapshot.table
    util = snapshot.gpu_utilization
    if util is None:
        util = np.full(free_milli.shape, np.nan, dtype=np.float32)
    arrays: dict[str, npt.NDArray[Any]] = {
        "header": np.frombuffer(json.dumps(header).encode(), dtype=np.uint8),
        "names_utf8": np.frombuffer("\n".join(table.names).encode(), dtype=np.uint8),
        "free_milli": free_milli,
        "gpu_utilization": util,
        "app_node": snapshot.apps.node_entries,
        "app_zone_counts": snapshot.apps.zone_counts,
        "used_gpus": snapshot.used_gpus,
    }
    if snapshot.free_cpu is not None:
        limits = np.iinfo(np.int32)
        arrays["free_cpu"] = np.clip(snapshot.free_cpu, limits.min, limits.max).astype(np.int32)
    if snapshot.whole_gpus is not None:
        arrays["whole_gpus"] = snapshot.whole_gpus
    if table.mig_profiles or table.mig_modes.any():  # MIG: optional members, absent from older snapshots
        header_mig = json.dumps(list(table.mig_profiles)).encode()
        arrays["mig_profiles_json"] = np.frombuffer(header_mig, dtype=np.uint8)
        arrays["mig_mode"] = table.mig_modes
        arrays["mig_slices"] = table.mig_counts
        if snapshot.mig_used is not None:
            arrays["mig_used"] = snapshot.mig_used
    if snapshot.dra_gpus is not None and snapshot.claimed_gpus is not None:
        arrays["dra_gpus"], arrays["claimed_gpus"] = snapshot.dra_gpus, snapshot.claimed_gpus
    for column in _NODE_COLUMNS[:-1]:
        arrays[column] = getattr(table, column)
    return arrays


def read_snapshot(data: bytes) -> ClusterState:
    """Parse and validate a snapshot written by :func:`write_snapshot`.

    Raises
    ------
    SnapshotFormatError
        Truncated or corrupt bytes, a missing member, inconsistent shapes, or a schema version
        newer than :data:`SCHEMA_VERSION`.
    """
    if not data.startswith(b"PK\x03\x04"):
        raise SnapshotFormatError(f"not a snapshot: {len(data)} bytes without the .npz (zip) signature")
    try:
        archive = np.load(io.BytesIO(data), allow_pickle=False)
        members = {name: archive[name] for name in archive.files}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError) as exc:
        raise SnapshotFormatError(f"snapshot is truncated or corrupt ({len(data)} bytes): {exc}") from exc
    header = _header(members)
    try:
        return _snapshot_from(members, header)
    except (TypeError, ValueError, KeyError, UnicodeDecodeError) as exc:
        if isinstance(exc, SnapshotFormatError):
            raise
        raise SnapshotFormatError(f"snapshot is inconsistent: {type(exc).__name__}: {exc}") from exc


def snapshot_revision(data: bytes) -> Revision | None:
    """The revision in a snapshot's header, reading only the header; None when it has none or the
    bytes are not a snapshot (a writer may then replace it)."""
    try:
        archive = np.load(io.BytesIO(data), allow_pickle=False)
        return Revision.parse(_header({"header": archive["header"]}).get("revision"))
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError):
        return None


def _snapshot_from(members: Mapping[str, npt.NDArray[Any]], header: dict[str, Any]) -> ClusterState:
    n_nodes = header["n_nodes"]
    table, used_gpus = _table_from(members, header)
    util = np.ascontiguousarray(members["gpu_utilization"], dtype=np.float32)
    problems = tuple(str(p) for p in header.get("problems", []))
    apps = AppIndex(
        apps=tuple(header["apps"]),
        node_entries=np.ascontiguousarray(members.get("app_node", np.zeros((3, 0))), dtype=np.int32),
        zone_counts=np.ascontiguousarray(members.get("app_zone_counts", np.zeros((0, 0))), dtype=np.int32),
    )
    free_milli = np.ascontiguousarray(members["free_milli"], dtype=np.int32)
    generated_at = float(header["generated_at"])
    free_cpu, shapes = _cpu_and_shapes(members, header, n_nodes)
    measured = header.get("utilization_at")
    whole = members.get("whole_gpus")
    if whole is not None and whole.shape != (n_nodes,):
        raise SnapshotFormatError(f"snapshot member 'whole_gpus': expected shape {(n_nodes,)}, got {whole.shape}")
    mig_used = members.get("mig_used")
    if mig_used is not None:
        _check_counts("mig_used", mig_used, table.mig_counts.shape)
    dra_gpus, claimed = _dra_columns(members, n_nodes)
    return ClusterState(
        table, used_gpus, node_utilization(util, table.alloc_gpus), problems, apps, free_milli, generated_at,
        free_cpu, shapes, str(header["cluster"]), util, float(measured) if isinstance(measured, int | float) else None,
        None if whole is None else np.ascontiguousarray(whole, dtype=np.int32),
        None if mig_used is None else np.ascontiguousarray(mig_used, dtype=np.int32), dra_gpus, claimed,
        header.get("dra_extended") is True and dra_gpus is not None,
    )  # fmt: skip


def _table_from(
    members: Mapping[str, npt.NDArray[Any]], header: Mapping[str, Any]
) -> tuple[NodeTable, npt.NDArray[np.int32]]:
    """The node table, checked against the header, and the ``used_gpus`` column read with its columns."""
    n_nodes, max_gpus = header["n_nodes"], header["max_gpus"]
    expected: dict[str, tuple[int, ...]] = {name: (n_nodes,) for name in _NODE_COLUMNS}
    expected |= {"free_milli": (n_nodes, max_gpus), "gpu_utilization": (n_nodes, max_gpus)}
    for name, shape in expected.items():
        array = members.get(name)
        if array is None:
            raise SnapshotFormatError(f"snapshot member {name!r} is missing")
        if array.shape != shape:
            raise SnapshotFormatError(f"snapshot member {name!r}: expected shape {shape}, got {array.shape}")
    names = members["names_utf8"].tobytes().decode("utf-8", errors="strict").split("\n") if n_nodes else []
    if len(names) != n_nodes:
        raise SnapshotFormatError(f"snapshot has {len(names)} node names for n_nodes={n_nodes}")
    errors = {int(row): str(reason) for row, reason in header.get("gpu_info_errors", {}).items()}
    raw_invalid = header.get("invalid_nodes", {})
    if not isinstance(raw_invalid, dict):
        raise SnapshotFormatError("snapshot header invalid_nodes must map rows to reasons")
    invalid = {int(row): str(reason) for row, reason in raw_invalid.items()}
    if any(not 0 <= row < n_nodes for row in invalid):
        raise SnapshotFormatError(f"snapshot header invalid_nodes names rows outside 0..{n_nodes - 1}")
    column = {name: np.ascontiguousarray(members[name], dtype=np.int32) for name in _NODE_COLUMNS}
    alloc = column["alloc_gpus"]
    if alloc.size and (alloc.min() < 0 or alloc.max() > max_gpus):
        raise SnapshotFormatError(f"snapshot member 'alloc_gpus': expected GPU counts in 0..{max_gpus} (max_gpus)")
    table = NodeTable(
        names=tuple(names),
        zone_id=column["zone_id"],
        zones=tuple(header["zones"]),
        instance_type_id=column["instance_type_id"],
        instance_types=tuple(header["instance_types"]),
        model_id=column["model_id"],
        models=tuple(header["models"]),
        gpu_count=column["gpu_count"],
        memory_mib=column["memory_mib"],
        alloc_gpus=column["alloc_gpus"],
        gpu_info_errors=errors,
        **_mig_columns(members, n_nodes),
        invalid=invalid,
    )
    _check_ids(table)
    return table, column["used_gpus"]


def _dra_columns(
    members: Mapping[str, npt.NDArray[Any]], n_nodes: int
) -> tuple[npt.NDArray[np.int32] | None, npt.NDArray[np.int32] | None]:
    """The optional ``dra_gpus`` and ``claimed_gpus`` members: both or neither."""
    dra = [members.get("dra_gpus"), members.get("claimed_gpus")]
    if (dra[0] is None) != (dra[1] is None):
        raise SnapshotFormatError("snapshot members 'dra_gpus' and 'claimed_gpus' come together; one is missing")
    for name, array in zip(("dra_gpus", "claimed_gpus"), dra, strict=True):
        if array is not None:
            _check_counts(name, array, (n_nodes,))
    dra_gpus, claimed = (None if a is None else np.ascontiguousarray(a, dtype=np.int32) for a in dra)
    return dra_gpus, claimed


def _mig_columns(members: Mapping[str, npt.NDArray[Any]], n_nodes: int) -> dict[str, Any]:
    """The table's MIG columns from their optional members (none: every node ``none``, no profiles)."""
    raw = members.get("mig_profiles_json")
    if raw is None:
        return {}
    profiles = json.loads(raw.tobytes().decode("utf-8"))
    names_ok = isinstance(profiles, list) and all(
        isinstance(p, str) and getattr(parse_profile(p), "name", None) == p for p in profiles
    )
    if not names_ok or len(set(profiles)) != len(profiles):
        raise SnapshotFormatError("snapshot member 'mig_profiles_json' is not a list of distinct MIG profile names")
    mode, slices = members.get("mig_mode"), members.get("mig_slices")
    if (
        mode is None
        or mode.shape != (n_nodes,)
        or mode.dtype.kind != "i"
        or mode.min(initial=0) < 0
        or mode.max(initial=0) >= len(MIG_MODES)
    ):
        raise SnapshotFormatError(f"snapshot member 'mig_mode': expected ({n_nodes},) MIG modes")
    if slices is None:
        raise SnapshotFormatError("snapshot member 'mig_slices' is missing")
    _check_counts("mig_slices", slices, (n_nodes, len(profiles)))
    return {
        "mig_mode": np.ascontiguousarray(mode, dtype=np.int32),
        "mig_profiles": tuple(profiles),
        "mig_slices": np.ascontiguousarray(slices, dtype=np.int32),
    }


def _check_counts(name: str, array: npt.NDArray[Any], shape: tuple[int, ...]) -> None:
    """A member of non-negative integers that fit in int32, of ``shape``."""
    if array.shape != shape or array.dtype.kind != "i" or array.min(initial=0) < 0 or array.max(initial=0) >= 2**31:
        raise SnapshotFormatError(f"snapshot member {name!r}: expected non-negative integers of shape {shape}")


def _cpu_and_shapes(
    members: Mapping[str, npt.NDArray[Any]], header: Mapping[str, Any], n_nodes: int
) -> tuple[npt.NDArray[np.int64] | None, tuple[tuple[Shape, int], ...]]:
    """The optional ``free_cpu`` member and ``shapes`` header key: both or neither."""
    free_cpu = members.get("free_cpu")
    if free_cpu is None:
        return None, ()
    if free_cpu.shape != (n_nodes,) or free_cpu.dtype.kind != "i":
        raise SnapshotFormatError(f"snapshot member 'free_cpu': expected ({n_nodes},) integers, got {free_cpu.shape}")
    raw = header.get("shapes")
    if not isinstance(raw, list):
        raise SnapshotFormatError("snapshot has free_cpu but its header has no 'shapes' list")
    shapes = []
    for i, item in enumerate(raw):
        valid = isinstance(item, list) and len(item) == 5 and isinstance(item[3], str)
        numbers = item[:3] + item[4:] if valid else []
        if not valid or not all(type(v) is int and v >= 0 for v in numbers):
            raise SnapshotFormatError(
                f"snapshot header shapes[{i}]: expected [cpu, gpu_milli, num_gpu, models, pods], got {item!r}"[:300]
            )
        shapes.append(((item[0], item[1], item[2], item[3]), item[4]))
    return np.ascontiguousarray(free_cpu, dtype=np.int64), tuple(shapes)


def _header(members: Mapping[str, npt.NDArray[Any]]) -> dict[str, Any]:
    raw = members.get("header")
    if raw is None:
        raise SnapshotFormatError("snapshot has no header member")
    try:
        header = json.loads(raw.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SnapshotFormatError(f"snapshot header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise SnapshotFormatError("snapshot header is not a JSON object")
    missing = [key for key in _HEADER_KEYS if key not in header]
    if missing:
        raise SnapshotFormatError(f"snapshot header lacks {', '.join(missing)}")
    version = header["schema_version"]
    if not isinstance(version, int) or version < 1:
        raise SnapshotFormatError(f"snapshot schema_version must be a positive integer, got {version!r}")
    if version > SCHEMA_VERSION:
        raise SnapshotFormatError(
            f"snapshot schema version {version} is newer than this reader's ({SCHEMA_VERSION}); upgrade the extender"
        )
    for key in ("n_nodes", "max_gpus"):
        if not isinstance(header[key], int) or header[key] < 0:
            raise SnapshotFormatError(f"snapshot header {key} must be a non-negative integer, got {header[key]!r}")
    if header["max_gpus"] > MAX_GPUS_PER_NODE:
        raise SnapshotFormatError(
            f"snapshot header max_gpus is {header['max_gpus']}, over the cap of {MAX_GPUS_PER_NODE} GPUs per node"
        )
    if not isinstance(header["generated_at"], int | float):
        raise SnapshotFormatError(f"snapshot header generated_at must be Unix seconds, got {header['generated_at']!r}")
    return header


def _check_ids(table: NodeTable) -> None:
    for column, vocabulary in (
        ("zone_id", table.zones),
        ("instance_type_id", table.instance_types),
        ("model_id", table.models),
    ):
        ids = getattr(table, column)
        if ids.size and (ids.min() < -1 or ids.max() >= len(vocabulary)):
            raise SnapshotFormatError(f"snapshot member {column!r} refers past its vocabulary of {len(vocabulary)}")
