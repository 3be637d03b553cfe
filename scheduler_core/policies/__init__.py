"""GPU-sharing placement policies, one module each, behind one interface.

A policy scores the feasible nodes for a task: ``score(ctx, task, nodes) -> (scores, gpus)``, where
``scores`` are integers (higher is better; the simulator takes the top score and gives ties to the
node that comes first in an order shuffled once per run, as the authors' simulator does: see
:mod:`scheduler_core.simulate`) and
``gpus`` gives, per node, the GPU a sharing task would take (-1 for other tasks, which take
:func:`scheduler_core.sharing.whole_gpus`). The six published policies follow ``FGD_NOTES.md``
sections 5-6 exactly, integer flooring included; ``fgd_cpu`` is ours.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler_core.sharing import Cluster, Task, Workload


@dataclass
class Context:
    """What a policy may read: the cluster, the typical workload, per-node fragmentation and the
    task classes each node hosts (for GpuClustering), and the run's random generator."""

    cluster: Cluster
    workload: Workload
    frag: npt.NDArray[np.float64]
    rng: np.random.Generator
    classes: list[set[Any]] = field(default_factory=list)


Scores = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]
"""Per candidate node: its integer score, and the GPU a sharing task would take there (-1 otherwise)."""
Scorer = Callable[[Context, Task, npt.NDArray[np.intp]], Scores]


def registry() -> dict[str, Scorer]:
    from scheduler_core.policies import bestfit, dotprod, fgd, fgd_cpu, gpu_clustering, gpu_packing, random

    return {
        "random": random.score,
        "dotprod": dotprod.score,
        "gpu_clustering": gpu_clustering.score,
        "gpu_packing": gpu_packing.score,
        "bestfit": bestfit.score,
        "fgd": fgd.score,
        "fgd_cpu": fgd_cpu.score,  # ours
    }


CPU_NORM, GPU_NORM = 128_000.0, 8_000.0
"""The simulator's normalisers: the largest node's CPU (milli) and GPU (milli) capacity."""


def tightest(left: npt.NDArray[np.int64], milli: int) -> npt.NDArray[np.int64]:
    """Per row, the GPU with the least room that still fits ``milli`` (lowest index on ties); -1 if none."""
    room = np.where(left >= milli, left, np.iinfo(np.int64).max)
    choice = np.argmin(room, axis=1).astype(np.int64)
    return np.where(room[np.arange(left.shape[0]), choice] == np.iinfo(np.int64).max, -1, choice)


def no_gpu(nodes: npt.NDArray[np.intp]) -> npt.NDArray[np.int64]:
    return np.full(nodes.shape[0], -1, dtype=np.int64)
