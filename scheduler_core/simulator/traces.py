"""Reading openb-style node and pod CSVs (Alibaba cluster-trace-gpu-v2023), and a synthetic look-alike.

Node list columns: ``sn,cpu_milli,memory_mib,gpu,model``. Pod list columns: ``name,cpu_milli,
memory_mib,num_gpu,gpu_milli[,gpu_spec,...]`` where ``gpu_spec`` is a ``|``-separated list of allowed
models (empty: any). CPU-only nodes (``gpu`` 0) are dropped from the cluster, as in the paper.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from scheduler_core.errors import InvalidArgsError
from scheduler_core.placement.model import Cluster, Task


def openb_dir() -> Path:
    """Where the openb trace lies: ``$OPENB_DIR``, else ``../shared/data/openb`` beside the checkout. Read at
    each call, never at import. The trace is research-use only and is never copied into the repository;
    whatever reads it skips, or falls back to :func:`synthetic_trace`, when it is absent."""
    return Path(os.environ.get("OPENB_DIR") or Path(__file__).resolve().parents[3] / "shared" / "data" / "openb")


def openb_traces(openb: Path) -> list[str]:
    """The traces in an openb directory, by name (``openb_pod_list_<name>.csv``), sorted."""
    return sorted(path.stem.removeprefix("openb_pod_list_") for path in openb.glob("openb_pod_list_*.csv"))


def read_nodes(path: str | Path) -> Cluster:
    """The GPU nodes, ordered by name (``sn``) when the file names them, as the authors' simulator sorts
    them before it draws its per-run node order for ties: a seed's shuffled order then picks the same
    nodes whatever order the file lists them in (and ``tie="first"`` means the name that sorts first)."""
    gpu_rows = read_gpu_node_rows(path)
    return Cluster.build(
        [int(r["cpu_milli"]) for r in gpu_rows],
        [int(r["memory_mib"]) for r in gpu_rows],
        [int(r["gpu"]) for r in gpu_rows],
        [r["model"] for r in gpu_rows],
    )


def read_gpu_node_rows(path: str | Path) -> list[dict[str, str]]:
    """The rows of the GPU nodes, in :func:`read_nodes`'s order (its cluster's row ``i`` is row ``i`` here);
    every number checked first, so that a bad cell is named by its line and column."""
    rows = _rows(path, ("cpu_milli", "memory_mib", "gpu", "model"))
    for line, row in enumerate(rows, start=2):
        for column in ("cpu_milli", "memory_mib", "gpu"):
            _count(row, column, path, line)
    return sorted((r for r in rows if int(r["gpu"]) > 0), key=lambda r: r.get("sn") or "")


def _count(row: dict[str, str], column: str, path: str | Path, line: int) -> int:
    """A non-negative integer cell; :class:`InvalidArgsError` naming the file, line, column and value."""
    text = (row.get(column) or "").strip()
    if not text.isascii() or not text.isdigit():
        raise InvalidArgsError(f"{path}:{line}: column {column}: expected a non-negative integer, got {text[:32]!r}")
    return int(text)


def read_tasks(path: str | Path) -> list[Task]:
    rows = _rows(path, ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli"))
    tasks = []
    for line, r in enumerate(rows, start=2):
        spec = (r.get("gpu_spec") or "").strip()
        columns = ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
        cpu, memory, num, milli = (_count(r, column, path, line) for column in columns)
        if milli > 1000 or (num == 0) != (milli == 0):
            raise InvalidArgsError(
                f"{path}:{line}: num_gpu={num}, gpu_milli={milli}: gpu_milli is 1..1000 of each GPU, 0 with no GPU"
            )
        tasks.append(Task(cpu, memory, num, milli, frozenset(spec.split("|")) if spec else None))
    return tasks


def read_times(path: str | Path) -> list[tuple[int, int]]:
    """Per task, in :func:`read_tasks`'s order: ``(creation_time, deletion_time)`` in seconds, for
    :func:`~scheduler_core.simulator.churn.churn`. The ``multigpu*`` traces have no times: refused, by name."""
    rows = _rows(path, ("creation_time", "deletion_time"))
    times = []
    for line, row in enumerate(rows, start=2):
        created, deleted = (_count(row, column, path, line) for column in ("creation_time", "deletion_time"))
        if deleted < created:
            raise InvalidArgsError(f"{path}:{line}: deletion_time {deleted} is before creation_time {created}")
        times.append((created, deleted))
    return times


def _rows(path: str | Path, needed: tuple[str, ...]) -> list[dict[str, str]]:
    try:
        with open(path, newline="") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in needed if c not in (reader.fieldnames or [])]
            if missing:
                raise InvalidArgsError(f"{path}: missing columns {', '.join(missing)}")
            return list(reader)
    except OSError as exc:
        raise InvalidArgsError(f"cannot read {path}: {exc.strerror}") from exc


def synthetic_trace(n_nodes: int, n_tasks: int, rng: np.random.Generator) -> tuple[Cluster, list[Task]]:
    """A small cluster and task list shaped like openb (for tests and the demo without ../shared):
    8-GPU and 2-GPU nodes; 13 % CPU-only tasks, 38 % sharing tasks, the rest mostly one whole GPU."""
    eight = rng.random(n_nodes) < 0.5
    cluster = Cluster.build(
        np.where(eight, 96_000, 64_000).tolist(),
        np.where(eight, 786_432, 262_144).tolist(),
        np.where(eight, 8, 2).tolist(),
        ["G2" if e else "T4" for e in eight.tolist()],
    )
    tasks = []
    kinds = rng.choice(4, size=n_tasks, p=[0.13, 0.38, 0.46, 0.03])
    for kind in kinds.tolist():
        cpu = int(rng.choice([2000, 4000, 8000, 12000]))
        if kind == 0:
            tasks.append(Task(cpu, 8192, 0, 0))
        elif kind == 1:
            tasks.append(Task(cpu, 8192, 1, int(rng.choice([100, 250, 300, 500, 700]))))
        elif kind == 2:
            tasks.append(Task(cpu, 16384, 1, 1000))
        else:
            tasks.append(Task(cpu * 4, 65536, int(rng.choice([2, 4, 8])), 1000))
    return cluster, tasks


def write_trace(cluster: Cluster, tasks: Sequence[Task], nodes_csv: Path, pods_csv: Path) -> None:
    """Write ``cluster`` and ``tasks`` as openb-style CSVs that :func:`read_nodes` and :func:`read_tasks`
    read back unchanged (node names zero-padded, so that they sort in row order)."""
    nodes = ["sn,cpu_milli,memory_mib,gpu,model"] + [
        f"node-{i:05d},{cluster.cpu_left[i]},{cluster.mem_left[i]},{cluster.gpu_count[i]},{cluster.models[cluster.model_id[i]]}"
        for i in range(cluster.n_nodes)
    ]
    pods = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec"] + [
        f"p{i},{t.cpu},{t.mem},{t.num_gpu},{t.gpu_milli},{'|'.join(sorted(t.models or ()))}"
        for i, t in enumerate(tasks)
    ]
    nodes_csv.write_text("\n".join(nodes) + "\n")
    pods_csv.write_text("\n".join(pods) + "\n")
