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
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

MILLI = 1000
MAX_GPUS = 8
COVERAGE = 0.95


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
        return self.num_gpu == 1 and 0 < self.gpu_milli < MILLI

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
        left = np.where(np.arange(MAX_GPUS)[None, :] < count[:, None], MILLI, 0).astype(np.int64)
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

    def feasible(self, task: Task) -> npt.NDArray[np.bool_]:
        """Shape (n_nodes,): CPU and memory fit, and (for a GPU task) an allowed model with at least
        ``num_gpu`` GPUs that each have ``gpu_milli`` free."""
        ok = (self.cpu_left >= task.cpu) & (self.mem_left >= task.mem)
        if task.num_gpu == 0:
            return ok
        fitting = (self.gpu_left >= task.gpu_milli).sum(axis=1)
        result: npt.NDArray[np.bool_] = ok & (fitting >= task.num_gpu) & self.model_mask(task.models)[self.model_id]
        return result

    def place(self, node: int, task: Task, gpus: Sequence[int]) -> None:
        """Take ``task``'s resources on ``node``: ``gpu_milli`` from each GPU in ``gpus``."""
        self.cpu_left[node] -= task.cpu
        self.mem_left[node] -= task.mem
        for gpu in gpus:
            if self.gpu_left[node, gpu] < task.gpu_milli:
                raise ValueError(f"GPU {gpu} of node {node} has {self.gpu_left[node, gpu]} milli, not {task.gpu_milli}")
            self.gpu_left[node, gpu] -= task.gpu_milli


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
        """Count shapes (cpu, gpu_milli, num_gpu, models) over the original tasks; keep the most common
        (ties: descending lexicographic order) until they cover ``coverage`` of the tasks."""
        counts = Counter((t.cpu, t.gpu_milli, t.num_gpu, _model_key(t.models)) for t in tasks)
        ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
        kept, covered = [], 0
        for shape, count in ranked:
            kept.append((shape, count))
            covered += count
            if covered >= coverage * len(tasks):
                break
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
        free = gpu_left.sum(axis=1)
        fits = gpu_left[:, None, :] >= self.gpu_milli[None, :, None]  # (rows, shapes, gpus)
        count = fits.sum(axis=2)
        small = np.where(fits, 0, gpu_left[:, None, :]).sum(axis=2)
        usable = (
            (self.num_gpu[None, :] > 0)
            & (count >= self.num_gpu[None, :])
            & (cpu_left[:, None] >= self.cpu[None, :])
            & self.allowed[model_id]
        )
        per_shape = np.where(usable, small, free[:, None]).astype(np.float64)
        result: npt.NDArray[np.float64] = per_shape @ self.popularity
        return result


def _model_key(models: frozenset[str] | None) -> str:
    return "|".join(sorted(models)) if models else ""
