"""``gpu-scheduler bench extender``: core filter+score latency, the handle() path, and the speed-up
of the vectorised core over the loop-based reference, measured side by side in one run."""

from __future__ import annotations

import argparse
import json
import os
import platform
from functools import partial
from typing import Any

import numpy as np

from bench.timing import time_us
from scheduler_core._reference import reference_reasons, reference_scores
from scheduler_core.cluster import ClusterState
from scheduler_core.extender import Extender
from scheduler_core.gpu_fit import ScoreWeights, filter_nodes, score_nodes
from scheduler_core.pods import PodDemand
from scheduler_core.synthetic import CATALOGUE, ZONES, make_node, make_pod, synthetic_table

DEMAND = PodDemand(name="bench", gpus=2, models=frozenset({"A100", "H100", "L40S"}), min_memory_mib=40960)


def _core(n_nodes: int, repeat: int, rng: np.random.Generator) -> dict[str, Any]:
    table = synthetic_table(n_nodes, rng)
    used = rng.integers(0, table.alloc_gpus + 1).astype(np.int32)
    free = table.alloc_gpus - used
    util = rng.random(n_nodes)
    weights = ScoreWeights()

    def core() -> None:
        verdict = filter_nodes(table, free, DEMAND)
        score_nodes(table, free, util, DEMAND, weights, feasible=verdict.feasible)

    def core_with_messages() -> None:
        verdict = filter_nodes(table, free, DEMAND)
        score_nodes(table, free, util, DEMAND, weights, feasible=verdict.feasible)
        _ = verdict.failed, verdict.failed_unresolvable

    free_list, util_list = free.tolist(), util.tolist()

    def reference() -> None:
        reasons = reference_reasons(table, free_list, DEMAND)
        reference_scores(free_list, util_list, [r == 0 for r in reasons], DEMAND.gpus, weights)

    # The reference is slow by design: fewer iterations, and at least 3.
    ref_repeat = max(3, min(repeat, 200_000 // n_nodes))
    vectorised = time_us(core, repeat)
    ref = time_us(reference, ref_repeat, warmup=1)
    verdict = filter_nodes(table, free, DEMAND)
    return {
        "nodes": n_nodes,
        "feasible": int(verdict.feasible.sum()),
        "filter_score": vectorised,
        "filter_score_with_reason_strings": time_us(core_with_messages, max(3, repeat // 4)),
        "reference": ref,
        "speedup_p50": round(ref["p50_us"] / vectorised["p50_us"], 1),
    }


def _handle(n_nodes: int, repeat: int, rng: np.random.Generator) -> dict[str, Any]:
    nodes = [
        make_node(f"node-{i:05d}", CATALOGUE[i % len(CATALOGUE)], ZONES[i % len(ZONES)], gfd=i % 2 == 0)
        for i in range(n_nodes)
    ]
    bound = [
        make_pod(f"run-{i}", int(rng.integers(1, 4)), node_name=f"node-{i:05d}", phase="Running")
        for i in range(0, n_nodes, 2)
    ]
    state = ClusterState.from_objects(nodes, bound)
    extender = Extender(cluster=lambda: state)
    pod = make_pod("bench", 2, models="A100,H100,L40S", memory="40Gi")
    body = json.dumps({"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}).encode()
    results = {}
    for verb in ("filter", "prioritize"):
        status, _ = extender.handle(verb, body)
        assert status == 200, status
        results[verb] = time_us(partial(extender.handle, verb, body), max(5, repeat // 4))
    return {"nodes": n_nodes, "request_bytes": len(body), **results}


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed)
    return {
        "benchmark": "extender",
        "machine": {"python": platform.python_version(), "numpy": np.__version__, "cpus": os.cpu_count()},
        "demand": {"gpus": DEMAND.gpus, "models": sorted(DEMAND.models or ()), "min_memory_mib": DEMAND.min_memory_mib},
        "core": [_core(n, args.repeat, rng) for n in args.nodes],
        "handle_full_nodes": [_handle(n, args.repeat, rng) for n in args.payload_nodes],
    }
