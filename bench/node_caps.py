"""``gpu-scheduler bench node-caps``: what one node that says ``nvidia.com/gpu: 2147483647`` costs both state
builders, side by side with the healthy nodes alone.

Two clusters are built from the same synthetic nodes and pods (``scheduler_core.simulator.synthetic``): the healthy
nodes alone, and the same plus one node whose status says 2,147,483,647 GPUs. For each, both builders run
in this process, a few times in alternation: the refresher's (``build_snapshot`` and ``write_snapshot``:
the snapshot's bytes) and ``serve --watch``'s (``NodeFacts.of`` and ``ClusterState.from_uses``: the live
rebuild). Each run's peak traced memory (``tracemalloc``, which numpy's allocations report to) and its
CPU time (``time.process_time``) are kept; the figures are the medians, and the ratios hostile / healthy
per builder. Before the caps the hostile cluster could not be built at all (``MemoryError``: its per-GPU
arrays took a column per GPU of the largest node); ``--liar-gpus 65536`` shows what a smaller lie cost then.
"""

from __future__ import annotations

import statistics
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np


def liar(gpus: int = 2**31 - 1) -> dict[str, Any]:
    """An A100 node named ``liar`` whose status says ``gpus`` GPUs."""
    from scheduler_core.simulator.synthetic import CATALOGUE, make_node

    node = make_node("liar", next(shape for shape in CATALOGUE if shape.model == "A100"), "us-east-1a")
    for part in ("capacity", "allocatable"):
        node["status"][part]["nvidia.com/gpu"] = str(gpus)
    return node


def _measure(build: Callable[[], object]) -> tuple[float, float]:
    """Peak traced MiB and CPU seconds of one ``build()``."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    started = time.process_time()
    try:
        build()
        cpu = time.process_time() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak / 2**20, cpu


def run(n_nodes: int, pods_per_node: float, repeat: int, seed: int, liar_gpus: int = 2**31 - 1) -> dict[str, Any]:
    from scheduler_core.simulator.synthetic import make_pod, synthetic_cluster
    from scheduler_core.state.allocation import pod_use
    from scheduler_core.state.cluster import ClusterState, NodeFacts
    from scheduler_core.state.snapshot import build_snapshot, write_snapshot

    rng = np.random.default_rng(seed)
    nodes, pods = synthetic_cluster(n_nodes, rng, used_fraction=1.0)
    extra = int(n_nodes * pods_per_node) - len(pods)
    names = [node["metadata"]["name"] for node in nodes]
    pods += [make_pod(f"cpu-{i}", 0, namespace="web", node_name=names[i % len(names)], phase="Running")
             for i in range(max(0, extra))]  # fmt: skip
    clusters = {"healthy": nodes, "with_liar": [*nodes, liar(liar_gpus)]}

    def snapshot(these: list[dict[str, Any]]) -> Callable[[], object]:
        return lambda: write_snapshot(build_snapshot(these, pods, cluster="bench", generated_at=time.time()))

    def live(these: list[dict[str, Any]]) -> Callable[[], object]:
        return lambda: ClusterState.from_uses(NodeFacts.of(these), [pod_use(pod) for pod in pods])

    figures: dict[str, dict[str, list[tuple[float, float]]]] = {
        builder: {name: [] for name in clusters} for builder in ("snapshot", "live_rebuild")
    }
    for turn in range(repeat):  # alternated, each cluster first in turn: drift and warm-up fall on both alike
        for name, these in list(clusters.items())[:: 1 if turn % 2 == 0 else -1]:
            figures["snapshot"][name].append(_measure(snapshot(these)))
            figures["live_rebuild"][name].append(_measure(live(these)))
    state = ClusterState.from_uses(NodeFacts.of(clusters["with_liar"]), [pod_use(pod) for pod in pods])
    result: dict[str, Any] = {
        "nodes_healthy": n_nodes,
        "liar_gpus": liar_gpus,
        "pods": len(pods),
        "repeat": repeat,
        "liar_refused": state.table.invalid.get(state.table.index["liar"], ""),
        "max_gpus": {"healthy": int(ClusterState.from_objects(nodes).max_gpus), "with_liar": state.max_gpus},
    }
    for builder, by_cluster in figures.items():
        peak = {name: statistics.median(p for p, _ in runs) for name, runs in by_cluster.items()}
        cpu = {name: 1000 * statistics.median(c for _, c in runs) for name, runs in by_cluster.items()}
        result[builder] = {
            **{name: {"peak_mib": round(peak[name], 2), "cpu_ms": round(cpu[name], 1)} for name in by_cluster},
            "peak_ratio": round(peak["with_liar"] / peak["healthy"], 3),
            "cpu_ratio": round(cpu["with_liar"] / max(cpu["healthy"], 1e-3), 3),
        }
    return result
