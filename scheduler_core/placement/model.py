"""Fractional GPU sharing: per-GPU free milli, task shapes, feasibility and fragmentation.

The model follows the FGD paper's simulator (``../shared/data/openb/FGD_NOTES.md``, sections 1 and 4):

- a node has ``cpu_left`` (milli-cores), ``mem_left`` (MiB), a GPU model and ``gpu_left[i]`` in
  0..1000 per GPU (1000 = one whole GPU free; GPUs past the node's count are 0 and never fit);
- a task asks for ``cpu`` milli, ``mem`` MiB, ``num_gpu`` GPUs of ``gpu_milli`` each (a sharing task
  has ``num_gpu == 1`` and ``gpu_milli < 1000``), and optionally a set of allowed models;
- fragmentation ``F_n(M)``: the GPU capacity of node ``n`` that the typical task shapes ``M`` cannot
  use, weighted by their popularity.

The extender's ``gpu-scheduler.io/gpu-milli`` maps onto ``gpu_milli`` with ``num_gpu = 1`` below 1000,
and whole GPUs (``nvidia.com/gpu``) onto ``gpu_milli = 1000``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt

from scheduler_core.k8s.names import MILLI_PER_GPU

MAX_GPUS = 8
COVERAGE = 0.95

Shape = tuple[int, int, int, str]
"""A task shape: CPU milli, GPU milli per GPU, GPUs, and the allowed models joined by "|" ("" for any)."""


@dataclass(frozen=True)
class Task:
    """One task (pod) shape. ``models`` is None when any GPU model is allowed."""

    cpu: int
    mem: int
    num_gpu: int
    gpu_milli: int
    models: frozenset[str] | None = None

    @property
    def sharing(self) -> bool:
        return self.num_gpu == 1 and 0 < self.gpu_milli < MILLI_PER_GPU

    @property
    def gpu_demand(self) -> int:
        """Milli-GPUs the task takes: ``num_gpu x gpu_milli``."""
        return self.num_gpu * self.gpu_milli


@dataclass
class Cluster:
    """Mutable node state, one row per node (the simulator's and the extender's view)."""

    cpu_left: npt.NDArray[np.int64]
    mem_left: npt.NDArray[np.int64]
    gpu_left: npt.NDArray[np.int64]  # (n_nodes, MAX_GPUS)
    gpu_count: npt.NDArray[np.int64]
    model_id: npt.NDArray[np.int64]
    models: tuple[str, ...]

    @property
    def n_nodes(self) -> int:
        return int(self.cpu_left.shape[0])

    @property
    def total_gpus(self) -> int:
        return int(self.gpu_count.sum())

    @classmethod
    def build(cls, cpu: Sequence[int], mem: Sequence[int], gpus: Sequence[int], models: Sequence[str]) -> Cluster:
        """Empty nodes: all CPU, memory and GPUs free.

        >>> Cluster.build([64000], [262144], [2], ["P100"]).gpu_left[0, :3].tolist()
        [1000, 1000, 0]
        """
        vocabulary = tuple(sorted(set(models)))
        count = np.asarray(gpus, dtype=np.int64)
        if count.size and (count.min() < 0 or count.max() > MAX_GPUS):
            raise ValueError(f"GPUs per node must be in 0..{MAX_GPUS}, got {count.min()}..{count.max()}")
        left = np.where(np.arange(MAX_GPUS)[None, :] < count[:, None], MILLI_PER_GPU, 0).astype(np.int64)
        return cls(
            cpu_left=np.asarray(cpu, dtype=np.int64).copy(),
            mem_left=np.asarray(mem, dtype=np.int64).copy(),
            gpu_left=left,
            gpu_count=count,
            model_id=np.asarray([vocabulary.index(m) for m in models], dtype=np.int64),
            models=vocabulary,
        )

    def copy(self) -> Cluster:
        return Cluster(
            self.cpu_left.copy(), self.mem_left.copy(), self.gpu_left.copy(), self.gpu_count,
            self.model_id, self.models,
        )  # fmt: skip

    def model_mask(self, allowed: frozenset[str] | None) -> npt.NDArray[np.bool_]:
        """Shape (n_models,): which of the cluster's models ``allowed`` admits."""
        if allowed is None:
            return np.ones(len(self.models), dtype=bool)
        return np.asarray([m in allowed for m in self.models], dtype=bool)

    def feasible(self, task: Task, rows: npt.NDArray[np.intp] | None = None) -> npt.NDArray[np.bool_]:
        """Shape (n_nodes,), or that of ``rows`` when given (those nodes only): CPU and memory fit, and (for
        a GPU task) an allowed model with at least ``num_gpu`` GPUs that each have ``gpu_milli`` free."""
        at = slice(None) if rows is None else rows
        ok = (self.cpu_left[at] >= task.cpu) & (self.mem_left[at] >= task.mem)
        if task.num_gpu == 0:
            return ok
        fitting = (self.gpu_left[at] >= task.gpu_milli).sum(axis=1)
        allowed = self.model_mask(task.models)[self.model_id[at]]
        result: npt.NDArray[np.bool_] = ok & (fitting >= task.num_gpu) & allowed
        return result

    def place(self, node: int, task: Task, gpus: Sequence[int]) -> None:
        """Take ``task``'s resources on ``node``: ``gpu_milli`` from each GPU in ``gpus``."""
        self.cpu_left[node] -= task.cpu
        self.mem_left[node] -= task.mem
        for gpu in gpus:
            if self.gpu_left[node, gpu] < task.gpu_milli:
                raise ValueError(f"GPU {gpu} of node {node} has {self.gpu_left[node, gpu]} milli, not {task.gpu_milli}")
            self.gpu_left[node, gpu] -= task.gpu_milli

    def release(self, node: int, task: Task, gpus: Sequence[int]) -> None:
        """Give back what :meth:`place` took for ``task`` on ``node`` (GPUs ``gpus``): the task moved or left.

        >>> cluster = Cluster.build([4000], [1024], [1], ["T4"])
        >>> cluster.place(0, Task(1000, 256, 1, 500), [0]); cluster.release(0, Task(1000, 256, 1, 500), [0])
        >>> int(cluster.cpu_left[0]), int(cluster.mem_left[0]), int(cluster.gpu_left[0, 0])
        (4000, 1024, 1000)
        """
        self.cpu_left[node] += task.cpu
        self.mem_left[node] += task.mem
        for gpu in gpus:
            if self.gpu_left[node, gpu] + task.gpu_milli > MILLI_PER_GPU:
                raise ValueError(f"GPU {gpu} of node {node} has {self.gpu_left[node, gpu]} milli free already")
            self.gpu_left[node, gpu] += task.gpu_milli


def whole_gpus(left_row: npt.NDArray[np.int64], task: Task) -> list[int]:
    """GPUs a multi-GPU or whole-GPU task takes: among those with room, smallest free first, then the
    lowest index (in practice the lowest-index fully free GPUs)."""
    fits = np.nonzero(left_row >= task.gpu_milli)[0]
    order = np.lexsort((fits, left_row[fits]))
    return [int(g) for g in fits[order][: task.num_gpu]]


@dataclass(frozen=True)
class Workload:
    """The typical task shapes ``M`` and their popularity ``p_m`` (FGD_NOTES section 4)."""

    cpu: npt.NDArray[np.int64]
    gpu_milli: npt.NDArray[np.int64]
    num_gpu: npt.NDArray[np.int64]
    popularity: npt.NDArray[np.float64]
    allowed: npt.NDArray[np.bool_]  # (n_models, n_shapes)

    @classmethod
    def typical(cls, tasks: Sequence[Task], models: Sequence[str], coverage: float = COVERAGE) -> Workload:
        """The typical shapes of ``tasks`` (:func:`typical_shapes`) over the cluster's ``models``."""
        return cls.from_shapes(typical_shapes(tasks, coverage), models)

    @classmethod
    def from_shapes(cls, kept: Sequence[tuple[Shape, int]], models: Sequence[str]) -> Workload:
        """Shapes and their counts; popularity is each count over the total kept. ``allowed`` has a row
        per name in ``models``: a shape that names models allows only those.

        >>> w = Workload.from_shapes([((8000, 500, 1, ""), 3), ((4000, 1000, 2, "V100"), 1)], ["T4", "V100"])
        >>> w.popularity.tolist(), w.allowed.tolist()
        ([0.75, 0.25], [[True, False], [True, True]])
        """
        total = sum(count for _, count in kept)
        allowed = np.asarray(
            [[not key or model in key.split("|") for (_, _, _, key), _ in kept] for model in models], dtype=bool
        ).reshape(len(models), len(kept))
        return cls(
            cpu=np.asarray([s[0] for s, _ in kept], dtype=np.int64),
            gpu_milli=np.asarray([s[1] for s, _ in kept], dtype=np.int64),
            num_gpu=np.asarray([s[2] for s, _ in kept], dtype=np.int64),
            popularity=np.asarray([c / total for _, c in kept], dtype=np.float64),
            allowed=allowed,
        )

    @cached_property
    def thresholds(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.intp]]:
        """The distinct ``gpu_milli`` values (ascending), and each shape's position among them."""
        values, of_shape = np.unique(self.gpu_milli, return_inverse=True)
        return values, of_shape.reshape(-1)

    @property
    def n_shapes(self) -> int:
        return int(self.cpu.shape[0])

    def fragmentation(
        self, gpu_left: npt.NDArray[np.int64], cpu_left: npt.NDArray[np.int64], model_id: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float64]:
        """``F_n(M)`` in milli-GPUs for each row (node, or hypothetical node state).

        For shape m: CPU-only, or a model m does not allow, or m does not fit (GPUs or CPU): all free
        GPU counts; otherwise the free milli of the GPUs too small for m.

        >>> w = Workload(np.array([0]), np.array([500]), np.array([1]), np.array([1.0]), np.array([[True]]))
        >>> w.fragmentation(np.array([[300, 1000]]), np.array([8000]), np.array([0])).tolist()
        [300.0]
        """
        count, small = self.by_threshold(gpu_left)
        return self.fragmentation_from(count, small, gpu_left.sum(axis=1), cpu_left, model_id)

    def by_threshold(self, gpu_left: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Per row and per distinct GPU milli t (:attr:`thresholds`): how many GPUs have t free, and
        the free milli of those that have less. Fewer columns than shapes, and all FGD needs of the GPUs."""
        thresholds, _ = self.thresholds
        fits = gpu_left[:, None, :] >= thresholds[None, :, None]  # (rows, thresholds, gpus)
        small = np.where(fits, 0, gpu_left[:, None, :]).sum(axis=2)
        return fits.sum(axis=2), small

    def fragmentation_from(
        self,
        count: npt.NDArray[np.int64],
        small: npt.NDArray[np.int64],
        free: npt.NDArray[np.int64],
        cpu_left: npt.NDArray[np.int64],
        model_id: npt.NDArray[np.int64],
    ) -> npt.NDArray[np.float64]:
        """:meth:`fragmentation` from :meth:`by_threshold`'s counts and each row's total free milli."""
        _, of_shape = self.thresholds
        usable = (
            (self.num_gpu[None, :] > 0)
            & (count[:, of_shape] >= self.num_gpu[None, :])
            & (cpu_left[:, None] >= self.cpu[None, :])
            & self.allowed[model_id]
        )
        per_shape = np.where(usable, small[:, of_shape], free[:, None]).astype(np.float64)
        # Not ``per_shape @ popularity``: BLAS may sum a row in another order when the batch has another
        # number of rows, and FGD's score of a task that changes nothing is the sign of F before minus F
        # after, computed in different batches. Row by row, the same row always gives the same bits.
        result: npt.NDArray[np.float64] = np.einsum("ij,j->i", per_shape, self.popularity)
        return result


MAX_SHAPES = 64
"""The most shapes a snapshot carries: FGD's cost per decision grows with them (openb needs 35)."""


def typical_shapes(tasks: Sequence[Task], coverage: float = COVERAGE) -> list[tuple[Shape, int]]:
    """:func:`keep_typical` over the shapes of ``tasks``.

    >>> typical_shapes([Task(8000, 0, 1, 500)] * 3 + [Task(4000, 0, 2, 1000)], coverage=0.7)
    [((8000, 500, 1, ''), 3)]
    """
    return keep_typical(Counter(shape_of(t) for t in tasks), coverage)


def keep_typical(
    counts: Mapping[Shape, int], coverage: float = COVERAGE, limit: int | None = None
) -> list[tuple[Shape, int]]:
    """The most common shapes (ties: descending lexicographic order) until they cover ``coverage`` of
    the counted tasks, or ``limit`` shapes are kept."""
    ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    needed = coverage * sum(counts.values())
    kept: list[tuple[Shape, int]] = []
    covered = 0
    for shape, count in ranked[:limit]:
        kept.append((shape, count))
        covered += count
        if covered >= needed:
            break
    return kept


def shape_of(task: Task) -> Shape:
    return (task.cpu, task.gpu_milli, task.num_gpu, _model_key(task.models))


def _model_key(models: frozenset[str] | None) -> str:
    return "|".join(sorted(models)) if models else ""


def tightest(left: npt.NDArray[np.int64], milli: int) -> npt.NDArray[np.int64]:
    """Per row, the GPU with the least room that still fits ``milli`` (lowest index on ties); -1 if none."""
    room = np.where(left >= milli, left, np.iinfo(np.int64).max)
    choice = np.argmin(room, axis=1).astype(np.int64)
    return np.where(room[np.arange(left.shape[0]), choice] == np.iinfo(np.int64).max, -1, choice)
