"""``gpu-scheduler bench consolidation``: what a consolidator run and the holds cost.

``plan``: :func:`~scheduler_core.consolidation.plan.plan_consolidation` on a synthetic cluster of ``nodes``
8-GPU nodes, each with 4 to 7 one-GPU pods of movable ReplicaSets and the rest free, so that no node has 8
free GPUs, and ``pending`` 8-GPU pods waiting: CPU seconds of the whole plan (the process's own counter,
the median of ``repeat``), the pods and the moves it planned. That is the consolidator's run, less its API
calls.

``filter``: the extender's filter for a one-GPU pod over every node, with no holds, one plan's (a hold and
two steers) and a full book (:data:`~scheduler_core.consolidation.holds.MAX_HOLDS` holds, ``MAX_STEERS``
steers), interleaved, on the same extender: the median CPU microseconds of each and their ratios. JSON on
stdout.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from scheduler_core.consolidation.holds import MAX_HOLDS, MAX_STEERS, Hold, HoldBook, Steer
from scheduler_core.consolidation.plan import plan_consolidation
from scheduler_core.extender.facade import Extender
from scheduler_core.k8s.names import MOVABLE_LABEL
from scheduler_core.simulator.synthetic import CATALOGUE, make_node
from scheduler_core.state.cluster import ClusterState

H100 = next(shape for shape in CATALOGUE if shape.model == "H100")
RECREATED_SETS = 50
"""ReplicaSets the movable pods belong to."""


def pod(name: str, node: str | None, gpus: int, owner: str) -> dict[str, Any]:
    labels = {"app": owner, MOVABLE_LABEL: "true"}
    refs = [{"kind": "ReplicaSet", "name": owner, "uid": f"uid-{owner}", "controller": True}] if owner else []
    made: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "labels": labels, "ownerReferences": refs,
                     "creationTimestamp": "2026-12-06T10:00:00Z"},
        "spec": {"schedulerName": "gpu-scheduler", "containers": [{"name": "c", "resources": {
            "requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"nvidia.com/gpu": str(gpus)}}}]},
        "status": {"phase": "Running"},
    }  # fmt: skip
    if node:
        made["spec"]["nodeName"] = node
    else:
        made["status"] = {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}  # fmt: skip
    return made


def cluster(n_nodes: int, pending: int, seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``n_nodes`` 8-GPU nodes with 4-7 one-GPU movable pods each; ``pending`` 8-GPU pods."""
    rng = np.random.default_rng(seed)
    nodes = [make_node(f"h100-{i:05d}", H100, "us-east-1a") for i in range(n_nodes)]
    pods = []
    for i, count in enumerate(rng.integers(4, 8, size=n_nodes).tolist()):
        owners = rng.integers(0, RECREATED_SETS, size=count).tolist()
        pods += [pod(f"p-{i:05d}-{k}", f"h100-{i:05d}", 1, f"rs-{o}") for k, o in enumerate(owners)]
    pods += [pod(f"big-{k}", None, 8, "") for k in range(pending)]
    return nodes, pods


def _cpu_s(action: Callable[[], Any]) -> tuple[float, Any]:
    started = time.process_time()
    result = action()
    return time.process_time() - started, result


def run_plan(sizes: list[int], pending: int, moves: int, repeat: int, seed: int) -> list[dict[str, Any]]:
    rows = []
    for n_nodes in sizes:
        nodes, pods = cluster(n_nodes, pending, seed)
        timings, result = [], None
        for _ in range(repeat):
            seconds, result = _cpu_s(
                lambda: plan_consolidation(nodes, pods, max_moves=moves, max_moves_per_plan=moves)  # noqa: B023
            )
            timings.append(seconds)
        assert result is not None
        rows.append({
            "nodes": n_nodes, "pods": len(pods), "pending": pending, "plans": len(result.plans),
            "moves": result.moves, "cpu_s_median": round(statistics.median(timings), 3),
        })  # fmt: skip
    return rows


def book_of(names: list[str], holds: int, steers: int, now: float) -> HoldBook:
    """``holds`` holds of 8 GPUs on the first nodes and ``steers`` steers to the last ones, live at ``now``."""
    return HoldBook(
        tuple(Hold("ml", f"h-{k}", f"uid-h-{k}", names[k % len(names)], 8, now + 600) for k in range(holds)),
        tuple(
            Steer("ml", "ReplicaSet", f"rs-{k}", f"uid-rs-{k}", f"ml/m-{k}", names[-1 - k % len(names)], now, now + 600)
            for k in range(steers)
        ),
    )


BOOKS = {"no_holds": (0, 0), "typical_book": (1, 2), "full_book": (MAX_HOLDS, MAX_STEERS)}
"""Books the filter is timed with: none (``HOLDS_URI`` unset costs nothing at all), one plan in flight
(a hold and two steers), and the largest book the extender reads."""


def run_filter(sizes: list[int], repeat: int, seed: int) -> list[dict[str, Any]]:
    """The filter for a one-GPU pod of a ReplicaSet no steer names, over every node, with each book of
    :data:`BOOKS`, interleaved; the median CPU microseconds of each, and each one's ratio to no book."""
    rows = []
    for n_nodes in sizes:
        nodes, pods = cluster(n_nodes, 0, seed)
        state = ClusterState.from_objects(nodes, pods)
        names = [n["metadata"]["name"] for n in nodes]
        now = 1e9
        books = {name: book_of(names, holds, steers, now) for name, (holds, steers) in BOOKS.items()}
        held: list[tuple[HoldBook, float]] = [(books["no_holds"], now)]
        extender = Extender(cluster=lambda: state, holds=lambda: held[0])  # noqa: B023
        body = json.dumps({"Pod": pod("one", None, 1, "rs-unsteered"), "NodeNames": names}).encode()
        timings: dict[str, list[float]] = {name: [] for name in books}
        for _ in range(repeat):
            for name, book in books.items():
                held[0] = (book, now + 1)
                seconds, (status, _) = _cpu_s(lambda: extender.handle("filter", body))  # noqa: B023
                assert status == 200
                timings[name].append(seconds)
        medians = {name: statistics.median(values) for name, values in timings.items()}
        row: dict[str, Any] = {"nodes": n_nodes, **{f"{name}_us": round(t * 1e6) for name, t in medians.items()}}
        row |= {f"{name}_ratio": round(t / medians["no_holds"], 3) for name, t in medians.items() if name != "no_holds"}
        rows.append(row)
    return rows


def run(sizes: list[int], filter_sizes: list[int], pending: int, moves: int, repeat: int, seed: int) -> dict[str, Any]:
    return {
        "suite": "consolidation",
        "plan": run_plan(sizes, pending, moves, repeat, seed),
        "filter": run_filter(filter_sizes, max(repeat, 20), seed),
    }
