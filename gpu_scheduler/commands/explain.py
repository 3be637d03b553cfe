"""``gpu-scheduler explain``: per node, the verdict and the score the extender gives a pod, and why."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gpu_scheduler.commands.common import UsageError, add_scoring, locality, read_json, weights
from scheduler_core.extender.explain import Explanation, NodeExplanation, explain
from scheduler_core.extender.facade import Extender, ExtenderConfig

HELP = "show per node why a pod passes or fails, and how it scores"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pod", type=Path, required=True, help="v1 Pod JSON")
    parser.add_argument("--cluster", type=Path, required=True, help='JSON {"nodes": [...], "pods": [...]}')
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_scoring(parser)


def run(args: argparse.Namespace) -> int:
    from gpu_scheduler.server import load_cluster_file

    pod = read_json(args.pod, "pod file")
    if not isinstance(pod, dict):
        raise UsageError(f"pod file {args.pod}: expected a v1 Pod object")
    state = load_cluster_file(args.cluster)
    config = ExtenderConfig(weights=weights(args), locality=locality(args)).validated()
    explanation = explain(Extender(config, cluster=lambda: state), pod)
    if args.json:
        print(json.dumps(explanation.to_json(), indent=2))
    else:
        print(table(explanation))
    return 0


def table(explanation: Explanation) -> str:
    """The explanation as aligned columns, one node per line, best first."""
    demand, rows = explanation.demand, explanation.nodes
    header = ("NODE", "ZONE", "MODEL", "MEM MiB", "FREE/ALLOC", "UTIL", "FIT", "UTIL.S", "LOCAL", "SCORE", "VERDICT")
    lines = [header, *(_cells(row) for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    asks = f"{demand.share} milli of one GPU" if demand.share else f"{demand.gpus} GPU(s)"
    text = [f"pod {demand.key} requests {asks}; {sum(r.passed for r in rows)} of {len(rows)} nodes pass"]
    text += [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=False)) + "  " + line[-1] for line in lines
    ]
    return "\n".join(text)


def _cells(r: NodeExplanation) -> tuple[str, ...]:
    verdict = "ok" if r.passed else ("never: " if r.unresolvable else "not now: ") + r.reason
    return (
        r.node,
        r.zone or "-",
        r.model or "-",
        str(r.memory_mib or "-"),
        f"{r.gpus_free}/{r.gpus_allocatable}",
        f"{r.utilization:.2f}",
        f"{r.fit:.2f}",
        f"{r.utilization_score:.2f}",
        f"{r.locality:.2f}",
        str(r.score),
        verdict,
    )
