"""The node table: one row per node, one numpy column per fact the scheduler needs.

Each node's facts are read from its v1 Node object by :mod:`scheduler_core.k8s.node_facts` (label
precedence, garbled labels); a node whose facts are over a cap of :mod:`scheduler_core.k8s.limits` is
invalid (:attr:`NodeTable.invalid`). A garbled value never raises: the node is treated as having no GPU
information, and :attr:`NodeTable.gpu_info_errors` says why.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler_core.k8s.hash_index import HashIndex
from scheduler_core.k8s.limits import (
    MAX_GPUS_PER_NODE,
    MAX_INT32,
    MAX_MIG_PROFILES_PER_NODE,
    MAX_MIG_SLICES_PER_NODE,
    over_cap,
)
from scheduler_core.k8s.mig import MigMode, mig_mode
from scheduler_core.k8s.names import GPU_RESOURCE, LABEL_INSTANCE_TYPE, LABEL_ZONE
from scheduler_core.k8s.node_facts import NodeGpuFacts, gpu_facts, node_parts, offered_mig_slices

IntArray = npt.NDArray[np.int32]


@dataclass(frozen=True, eq=False)
class GpuShapes:
    """The distinct (model, memory per GPU, allocatable GPUs) combinations of a table.

    Real clusters have a handful of instance types, so checks that depend only on these three
    facts run once per shape (k of them) and are gathered to nodes with ``shape_id``.

    Attributes
    ----------
    shape_id : ndarray of shape (n_nodes,), intp
        Kept as ``intp`` so that gathering by it needs no index conversion.
    model_id, memory_mib, alloc_gpus, mig_mode : ndarray of shape (k,), int32
    """

    shape_id: npt.NDArray[np.intp]
    model_id: IntArray
    memory_mib: IntArray
    alloc_gpus: IntArray
    mig_mode: IntArray


@dataclass(frozen=True, eq=False)
class NodeTable:
    """Columnar node facts. Every array has shape ``(n_nodes,)`` and is aligned with ``names``.

    Attributes
    ----------
    names : tuple of str, length n_nodes
    zone_id, instance_type_id : ndarray of shape (n_nodes,), int32
        Index into ``zones`` / ``instance_types``; -1 when the label is missing.
    model_id : ndarray of shape (n_nodes,), int32
        Index into ``models``; -1 when the node has no (valid) GPU model information.
    gpu_count : ndarray of shape (n_nodes,), int32
        GPUs per node according to the labels (0 when unknown). Informational.
    memory_mib : ndarray of shape (n_nodes,), int32
        Memory per GPU in MiB (0 when unknown).
    alloc_gpus : ndarray of shape (n_nodes,), int32
        Allocatable ``nvidia.com/gpu``: the total the filter and the scores work with.
    gpu_info_errors : mapping of node index to reason
        Nodes whose GPU labels were garbled; their model, memory and count are unknown.
    mig_mode : ndarray of shape (n_nodes,), int32
        The node's :class:`~scheduler_core.k8s.mig.MigMode` (0, ``none``, when not given).
    mig_profiles : tuple of str
        The MIG profiles some node of the table offers as ``nvidia.com/mig-<profile>`` (``mixed``).
    mig_slices : ndarray of shape (n_nodes, len(mig_profiles)), int32
        Allocatable slices of each profile per node.
    invalid : mapping of node index to reason
        Nodes over a cap of :mod:`scheduler_core.k8s.limits`: their row has no GPU, slice or model, and
        every pod is refused there with the reason (``Reason.NODE_INVALID``).
    """

    names: tuple[str, ...]
    zone_id: IntArray
    zones: tuple[str, ...]
    instance_type_id: IntArray
    instance_types: tuple[str, ...]
    model_id: IntArray
    models: tuple[str, ...]
    gpu_count: IntArray
    memory_mib: IntArray
    alloc_gpus: IntArray
    gpu_info_errors: Mapping[int, str] = field(default_factory=dict)
    mig_mode: IntArray | None = None
    mig_profiles: tuple[str, ...] = ()
    mig_slices: IntArray | None = None
    invalid: Mapping[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n_nodes = len(self.names)
        if self.mig_mode is None:
            object.__setattr__(self, "mig_mode", np.zeros(n_nodes, dtype=np.int32))
        if self.mig_slices is None:
            object.__setattr__(self, "mig_slices", np.zeros((n_nodes, len(self.mig_profiles)), dtype=np.int32))
        for name in ("zone_id", "instance_type_id", "model_id", "gpu_count", "memory_mib", "alloc_gpus", "mig_mode"):
            column = getattr(self, name)
            if not isinstance(column, np.ndarray) or column.shape != (n_nodes,):
                shape = getattr(column, "shape", type(column).__name__)
                raise ValueError(f"NodeTable.{name}: expected shape ({n_nodes},), got {shape}")
        slices = self.mig_slices
        if not isinstance(slices, np.ndarray) or slices.shape != (n_nodes, len(self.mig_profiles)):
            shape = getattr(slices, "shape", type(slices).__name__)
            raise ValueError(f"NodeTable.mig_slices: expected shape ({n_nodes}, {len(self.mig_profiles)}), got {shape}")

    @property
    def n_nodes(self) -> int:
        return len(self.names)

    @cached_property
    def index(self) -> dict[str, int]:
        """Row of each node name (the last row wins for duplicated names)."""
        return {name: row for row, name in enumerate(self.names)}

    @cached_property
    def _hash_index(self) -> HashIndex:
        return HashIndex.build(np.fromiter(map(hash, self.names), dtype=np.int64, count=self.n_nodes))

    def rows_of(self, names: Sequence[str]) -> npt.NDArray[np.intp]:
        """Row of each of ``names`` (shape (k,)), -1 for names not in the table.

        Names are matched by Python's 64-bit string hash (keyed per process) in an open-addressing
        table of numpy arrays (:class:`HashIndex`): one vectorised probe finds almost every name, with
        a few random reads each, where a dict lookup or a binary search per name costs several cache
        misses (10,000 names in a 100,000-node table: 0.2 ms, against 1.1 ms for either). Hashing the
        names is the one step per name. A false match needs a 64-bit collision between a name the
        table lacks and one it has: odds of about n_nodes / 2**64 per such name.

        >>> NodeTable.from_columns(alloc_gpus=[1, 2], names=["a", "b"]).rows_of(["b", "x", "a"]).tolist()
        [1, -1, 0]
        """
        if self.n_nodes == 0:
            return np.full(len(names), -1, dtype=np.intp)
        return self._hash_index.find(np.fromiter(map(hash, names), dtype=np.int64, count=len(names)))

    @cached_property
    def gpu_info_error_mask(self) -> npt.NDArray[np.bool_]:
        """Shape (n_nodes,): True where the node's GPU labels were garbled."""
        mask = np.zeros(self.n_nodes, dtype=bool)
        mask[list(self.gpu_info_errors)] = True
        return mask

    @cached_property
    def invalid_mask(self) -> npt.NDArray[np.bool_]:
        """Shape (n_nodes,): True where the node is over a cap (:attr:`invalid`)."""
        mask = np.zeros(self.n_nodes, dtype=bool)
        mask[list(self.invalid)] = True
        return mask

    def with_invalid(self, reasons: Mapping[int, str]) -> NodeTable:
        """This table with the rows of ``reasons`` (row -> why) made invalid as well: no GPU, slice, model or
        memory there any more. Derived from names alone, the row lookup and the tie order are shared.

        >>> table = NodeTable.from_columns(alloc_gpus=[8, 4], names=["a", "b"]).with_invalid({1: "too many"})
        >>> table.alloc_gpus.tolist(), table.invalid, table.rows_of(["b"]).tolist()
        ([8, 0], {1: 'too many'}, [1])
        """
        if not reasons:
            return self
        rows = np.fromiter(reasons, dtype=np.intp, count=len(reasons))
        if rows.min() < 0 or rows.max() >= self.n_nodes:
            raise ValueError(f"invalid rows: expected rows in 0..{self.n_nodes - 1}, got {sorted(reasons)[:5]}")
        zeroed = {name: getattr(self, name).copy() for name in ("gpu_count", "memory_mib", "alloc_gpus")}
        model_id, mig_mode, mig_slices = self.model_id.copy(), self.mig_modes.copy(), self.mig_counts.copy()
        for column in zeroed.values():
            column[rows] = 0
        model_id[rows], mig_mode[rows], mig_slices[rows] = -1, 0, 0
        errors = {row: reason for row, reason in self.gpu_info_errors.items() if row not in reasons}
        table = replace(
            self, **zeroed, model_id=model_id, mig_mode=mig_mode, mig_slices=mig_slices, gpu_info_errors=errors,
            invalid={**self.invalid, **reasons},
        )  # fmt: skip
        for kept in ("index", "_hash_index", "tie_rank", "json_names", "_taken_from"):  # names alone: the same
            if kept in self.__dict__:
                table.__dict__[kept] = self.__dict__[kept]
        return table

    @cached_property
    def gpu_shapes(self) -> GpuShapes:
        """Computed once per table, and carried over by :meth:`take`."""
        stacked = np.stack([self.model_id, self.memory_mib, self.alloc_gpus, self.mig_modes], axis=1)
        unique, inverse = np.unique(stacked, axis=0, return_inverse=True)
        unique = unique.reshape(-1, 4).astype(np.int32)
        return GpuShapes(
            shape_id=inverse.reshape(-1).astype(np.intp),
            model_id=np.ascontiguousarray(unique[:, 0]),
            memory_mib=np.ascontiguousarray(unique[:, 1]),
            alloc_gpus=np.ascontiguousarray(unique[:, 2]),
            mig_mode=np.ascontiguousarray(unique[:, 3]),
        )

    @property
    def mig_modes(self) -> IntArray:
        """:attr:`mig_mode`, never None (``__post_init__`` fills it)."""
        assert self.mig_mode is not None
        return self.mig_mode

    def profile_slices(self, profile: str) -> IntArray:
        """Shape (n_nodes,): allocatable slices of one MIG profile per node (0 where none)."""
        if profile not in self.mig_profiles:
            return np.zeros(self.n_nodes, dtype=np.int32)
        column: IntArray = self.mig_counts[:, self.mig_profiles.index(profile)]
        return column

    @property
    def mig_counts(self) -> IntArray:
        """:attr:`mig_slices`, never None (``__post_init__`` fills it)."""
        assert self.mig_slices is not None
        return self.mig_slices

    @cached_property
    def tie_rank(self) -> npt.NDArray[np.int64]:
        """Shape (n_nodes,): a fixed pseudo-random order of the nodes, the CRC-32 of each name. Every
        extender instance computes the same one, so all of them break a tie toward the same node, as
        the FGD authors' simulator breaks ties by a node order drawn once per run. A table from
        :meth:`take` reads its parent's, computed once per parent."""
        source = self.__dict__.get("_taken_from")
        if source is not None:
            parent, rows = source
            rank: npt.NDArray[np.int64] = parent.tie_rank[rows]
            return rank
        return np.fromiter((zlib.crc32(name.encode()) for name in self.names), dtype=np.int64, count=self.n_nodes)

    @cached_property
    def json_names(self) -> npt.NDArray[np.object_]:
        """Shape (n_nodes,), objects: each name as a JSON string literal, for the replies written by
        hand (gathered by rows in C, not per name in Python); from the parent, as above."""
        source = self.__dict__.get("_taken_from")
        if source is not None:
            parent, rows = source
            taken: npt.NDArray[np.object_] = parent.json_names[rows]
            return taken
        return np.array(list(map(json.encoder.encode_basestring_ascii, self.names)), dtype=object)

    def json_names_at(self, rows: npt.NDArray[np.intp] | npt.NDArray[np.bool_]) -> npt.NDArray[np.object_]:
        """:attr:`json_names` at ``rows`` (indices or a mask); a table from :meth:`take` gathers them
        from its parent's at once, without building its own.

        >>> NodeTable.from_columns(alloc_gpus=[1, 2], names=["a", "b"]).take([1, 0]).json_names_at(np.array([1]))
        array(['"a"'], dtype=object)
        """
        source = self.__dict__.get("_taken_from")
        if "json_names" not in self.__dict__ and source is not None:
            parent, parent_rows = source
            picked: npt.NDArray[np.object_] = parent.json_names[parent_rows[rows]]
            return picked
        names: npt.NDArray[np.object_] = self.json_names[rows]
        return names

    def take(self, rows: npt.ArrayLike, names: Sequence[str] | None = None) -> NodeTable:
        """The sub-table of ``rows`` (shape (k,), int), in that order; vocabularies are shared.

        ``names``, when the caller has them already, must be the names of ``rows``; it saves a
        lookup per row. The parent's :attr:`gpu_shapes` are computed once and shared.
        """
        picked = np.asarray(rows, dtype=np.intp)
        if picked.ndim != 1:
            raise ValueError(f"rows: expected shape (k,), got {picked.shape}")
        errors = {}
        if self.gpu_info_errors:  # the few garbled rows among those picked, found by mask
            garbled = np.flatnonzero(self.gpu_info_error_mask[picked])
            old_rows = picked[garbled].tolist()
            errors = {new: self.gpu_info_errors[old] for new, old in zip(garbled.tolist(), old_rows, strict=True)}
        invalid = {}
        if self.invalid:
            flagged = np.flatnonzero(self.invalid_mask[picked])
            invalid = {new: self.invalid[int(picked[new])] for new in flagged.tolist()}
        if names is None:
            names = list(map(self.names.__getitem__, picked.tolist()))
        shapes = self.gpu_shapes
        table = NodeTable(
            names=tuple(names),
            zone_id=self.zone_id[picked],
            zones=self.zones,
            instance_type_id=self.instance_type_id[picked],
            instance_types=self.instance_types,
            model_id=self.model_id[picked],
            models=self.models,
            gpu_count=self.gpu_count[picked],
            memory_mib=self.memory_mib[picked],
            alloc_gpus=self.alloc_gpus[picked],
            gpu_info_errors=errors,
            mig_mode=self.mig_modes[picked],
            mig_profiles=self.mig_profiles,
            mig_slices=np.take(self.mig_counts, picked, axis=0),  # 2-D rows: np.take is ~10x a fancy index
            invalid=invalid,
        )
        # Share the parent's shapes (cached_property storage): no np.unique per sub-table.
        table.__dict__["gpu_shapes"] = GpuShapes(
            shapes.shape_id[picked], shapes.model_id, shapes.memory_mib, shapes.alloc_gpus, shapes.mig_mode
        )
        table.__dict__["_taken_from"] = (self, picked)  # for what is derived from names once per parent
        return table

    def model_name(self, row: int) -> str | None:
        model = int(self.model_id[row])
        return self.models[model] if model >= 0 else None

    def zone_name(self, row: int) -> str | None:
        zone = int(self.zone_id[row])
        return self.zones[zone] if zone >= 0 else None

    @classmethod
    def from_nodes(cls, nodes: Sequence[Any]) -> NodeTable:
        """Build the table from v1 Node objects (dicts with camelCase keys).

        Raises
        ------
        InvalidArgsError
            If an item is not an object or has no ``metadata.name``. Garbled GPU labels do not
            raise; they are recorded in ``gpu_info_errors``.

        Examples
        --------
        >>> node = {"metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": "Tesla-T4"}},
        ...         "status": {"allocatable": {"nvidia.com/gpu": "4"}}}
        >>> table = NodeTable.from_nodes([node])
        >>> table.model_name(0), int(table.alloc_gpus[0])
        ('T4', 4)
        """
        read = _read_nodes(nodes)
        n_rows = len(read.rows)
        # One conversion at the end: per-element writes into numpy arrays cost more than the parse.
        columns = np.array(read.rows, dtype=np.int32).reshape(n_rows, 7).T
        mig_profiles = read.profiles.items()
        mig_slices = np.zeros((n_rows, len(mig_profiles)), dtype=np.int32)
        for (row, column), count in read.slices.items():
            mig_slices[row, column] = count
        return cls(
            names=tuple(read.names),
            zone_id=np.ascontiguousarray(columns[0]),
            zones=read.zones.items(),
            instance_type_id=np.ascontiguousarray(columns[1]),
            instance_types=read.instance_types.items(),
            model_id=np.ascontiguousarray(columns[2]),
            models=read.models.items(),
            gpu_count=np.ascontiguousarray(columns[3]),
            memory_mib=np.ascontiguousarray(columns[4]),
            alloc_gpus=np.ascontiguousarray(columns[5]),
            gpu_info_errors=read.errors,
            mig_mode=np.ascontiguousarray(columns[6]),
            mig_profiles=mig_profiles,
            mig_slices=mig_slices,
            invalid=read.invalid,
        )

    @classmethod
    def from_columns(
        cls,
        *,
        alloc_gpus: Sequence[int],
        models: Sequence[str | None] | None = None,
        memory_mib: Sequence[int] | None = None,
        zones: Sequence[str] | None = None,
        names: Sequence[str] | None = None,
    ) -> NodeTable:
        """A small table from plain lists (names default to ``node-0``, ``node-1``, ...).

        >>> NodeTable.from_columns(alloc_gpus=[8, 4], models=["A100", None]).model_name(1) is None
        True
        """
        n_nodes = len(alloc_gpus)
        vocab: dict[str, int] = {}
        model_id = [-1 if m is None else vocab.setdefault(m, len(vocab)) for m in (models or [None] * n_nodes)]
        zone_vocab: dict[str, int] = {}
        zone_id = [zone_vocab.setdefault(z, len(zone_vocab)) for z in zones] if zones else [-1] * n_nodes
        return cls(
            names=tuple(names or (f"node-{i}" for i in range(n_nodes))),
            zone_id=np.asarray(zone_id, dtype=np.int32),
            zones=tuple(zone_vocab),
            instance_type_id=np.full(n_nodes, -1, dtype=np.int32),
            instance_types=(),
            model_id=np.asarray(model_id, dtype=np.int32),
            models=tuple(vocab),
            gpu_count=np.asarray(alloc_gpus, dtype=np.int32),
            memory_mib=np.asarray(memory_mib if memory_mib is not None else [0] * n_nodes, dtype=np.int32),
            alloc_gpus=np.asarray(alloc_gpus, dtype=np.int32),
        )


class _Vocabulary:
    """Interns strings to dense ids; ``None`` and ``""`` map to -1."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}

    def id_of(self, value: object) -> int:
        if not isinstance(value, str) or not value:
            return -1
        return self._ids.setdefault(value, len(self._ids))

    def items(self) -> tuple[str, ...]:
        return tuple(self._ids)


@dataclass(frozen=True, eq=False)
class _NodeRows:
    """What :meth:`NodeTable.from_nodes` reads node by node, before one conversion to columns."""

    names: list[str]
    rows: list[tuple[int, int, int, int, int, int, int]]
    """Per node: zone id, instance type id, model id, GPU count, MiB per GPU, allocatable GPUs, MIG mode."""
    zones: _Vocabulary
    instance_types: _Vocabulary
    models: _Vocabulary
    profiles: _Vocabulary
    slices: dict[tuple[int, int], int]
    """(row, profile id) -> allocatable MIG slices of that profile."""
    errors: dict[int, str]
    invalid: dict[int, str]


def _read_nodes(nodes: Sequence[Any]) -> _NodeRows:
    """Read each node's facts (:mod:`scheduler_core.k8s.node_facts`) into rows; a node over a cap is
    invalid and keeps no GPU, slice or model."""
    names: list[str] = []
    zones = _Vocabulary()
    instance_types = _Vocabulary()
    models = _Vocabulary()
    rows: list[tuple[int, int, int, int, int, int, int]] = []
    errors: dict[int, str] = {}
    profiles = _Vocabulary()
    slices: dict[tuple[int, int], int] = {}
    invalid: dict[int, str] = {}
    for row, node in enumerate(nodes):
        name, labels, allocatable = node_parts(node, row)
        names.append(name)
        mode = mig_mode(labels, allocatable)
        facts = gpu_facts(labels, allocatable, mode)
        offered = offered_mig_slices(allocatable) if mode == MigMode.MIXED else {}
        reason = _over_caps(facts, offered)
        if reason:  # invalid on its own: no GPU, slice or model, and its figures size nothing
            invalid[row] = reason
            facts, mode, offered = NodeGpuFacts(None, 0, 0, 0), MigMode.NONE, {}
        if facts.error:
            errors[row] = facts.error
        for profile, count in offered.items():
            slices[row, profiles.id_of(profile)] = count
        rows.append(
            (
                zones.id_of(labels.get(LABEL_ZONE)),
                instance_types.id_of(labels.get(LABEL_INSTANCE_TYPE)),
                models.id_of(facts.model),
                facts.count,
                facts.memory_mib,
                facts.allocatable,
                int(mode),
            )
        )
    return _NodeRows(names, rows, zones, instance_types, models, profiles, slices, errors, invalid)


def _over_caps(facts: NodeGpuFacts, slices: Mapping[str, int]) -> str:
    """Why a node's GPU facts are over a cap of :mod:`scheduler_core.k8s.limits` ("" when none is)."""
    total = min(sum(slices.values()), MAX_INT32) if slices else 0
    if (
        facts.allocatable <= MAX_GPUS_PER_NODE
        and facts.count <= MAX_GPUS_PER_NODE
        and len(slices) <= MAX_MIG_PROFILES_PER_NODE
        and total <= MAX_MIG_SLICES_PER_NODE
    ):
        return ""  # every node but a liar: decided here, once per node of every request
    found = [
        over_cap(f"allocatable {GPU_RESOURCE}", facts.allocatable, MAX_GPUS_PER_NODE),
        over_cap("its GPU count label", facts.count, MAX_GPUS_PER_NODE),
        over_cap("its MIG profiles offered", len(slices), MAX_MIG_PROFILES_PER_NODE),
        over_cap("its allocatable MIG slices", total, MAX_MIG_SLICES_PER_NODE),
    ]
    return "; ".join(filter(None, found))
