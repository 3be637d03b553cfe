"""What every sharing policy shares: the context it reads, its result type, and the normalisers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler_core.placement.model import Cluster, Task, Workload


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


CPU_NORM, GPU_NORM = 128_000.0, 8_000.0
"""The simulator's normalisers: the largest node's CPU (milli) and GPU (milli) capacity."""


def no_gpu(nodes: npt.NDArray[np.intp]) -> npt.NDArray[np.int64]:
    return np.full(nodes.shape[0], -1, dtype=np.int64)
