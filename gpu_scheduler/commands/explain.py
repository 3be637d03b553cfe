"""``gpu-scheduler explain``: per node, the verdict and the score the extender gives a pod, and why.

Two forms: ``explain NAMESPACE/POD --kubeconfig F [--snapshot PATH]`` reads the live pod, and the
cluster from the snapshot (or, without one, from the API's nodes and pods as they are now);
``explain --pod FILE --cluster FILE`` reads both from files.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from adapters.settings import add_flags
from application.extender.settings import ExtenderSettings
from gpu_scheduler.commands.common import SCORING, UsageError, add_scoring, extender_settings, read_document
from scheduler_core.consolidation.plan import MAX_MOVES, consolidation_hint
from scheduler_core.extender.explain import Explanation, NodeExplanation, explain
from scheduler_core.extender.facade import Extender
from scheduler_core.k8s.mig import mig_resource
from scheduler_core.state.cluster import ClusterState

HELP = "show per node why a pod passes or fails, and how it scores"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pod_ref", nargs="?", metavar="NAMESPACE/POD", help="a live pod (with --kubeconfig)")
    parser.add_argument("--kubeconfig", default="", help="the cluster the pod lives in (default: $KUBECONFIG)")
    parser.add_argument("--snapshot", default="", help="decide from this snapshot (default: the live nodes and pods)")
    parser.add_argument("--pod", help="or: a v1 Pod file, JSON or YAML ('-': stdin)")
    parser.add_argument(
        "--cluster",
        type=Path,
        help="and the cluster: what `kubectl get nodes,pods -A -o json` (or -o yaml) prints, or "
        '{"nodes": [...], "pods": [...]}',
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--moves",
        type=int,
        default=2,
        help="where no node fits, the most moves of opted-in pods a consolidation plan may make (0: do not ask; "
        "not with --snapshot, which holds no pods)",
    )
    add_scoring(parser)
    add_flags(parser, ExtenderSettings, ["share_policy"])


def run(args: argparse.Namespace) -> int:
    if args.pod_ref:
        if args.pod or args.cluster:
            raise UsageError("give NAMESPACE/POD (a live pod) or --pod and --cluster (files), not both")
        pod, state, objects = _live(args)
    else:
        if not (args.pod and args.cluster):
            raise UsageError("give NAMESPACE/POD with --kubeconfig, or --pod FILE and --cluster FILE")
        pod, state, objects = _files(args)
    if not 0 <= args.moves <= MAX_MOVES:
        raise UsageError(f"--moves: expected 0..{MAX_MOVES}, got {args.moves}")
    config = extender_settings(args, [*SCORING, "share_policy"]).extender_config()
    explanation = explain(Extender(config, cluster=lambda: state), pod)
    hint = ""
    if not explanation.passing and objects is not None and args.moves:
        hint = consolidation_hint(pod, *objects, args.moves)
    if args.json:
        print(json.dumps({**explanation.to_json(), **({"consolidation": hint} if hint else {})}, indent=2))
    else:
        print(table(explanation) + (f"\n{hint}" if hint else ""))
    return 0


Objects = tuple[list[dict[str, Any]], list[dict[str, Any]]] | None
"""The nodes and pods a consolidation plan is made from; None where only a snapshot was read."""


def _files(args: argparse.Namespace) -> tuple[dict[str, Any], ClusterState, Objects]:
    from adapters.cluster_file import load_cluster_file
    from scheduler_core.state.cluster import document_of_list

    pod = read_document(args.pod, "pod file")
    if not isinstance(pod, dict) or pod.get("kind", "Pod") != "Pod":
        raise UsageError(f"pod file {args.pod}: expected a v1 Pod object")
    state = load_cluster_file(args.cluster)
    document = read_document(args.cluster, "cluster file")
    if isinstance(document, dict) and "items" in document:
        document = document_of_list(document)
    return pod, state, (list(document.get("nodes") or []), list(document.get("pods") or []))


def _live(args: argparse.Namespace) -> tuple[dict[str, Any], ClusterState, Objects]:
    from adapters.errors import AdapterError
    from adapters.kube import connect_kubeconfig

    namespace, _, name = args.pod_ref.partition("/")
    if not (namespace and name):
        raise UsageError(f"expected NAMESPACE/POD, got {args.pod_ref!r}")
    kubeconfig = args.kubeconfig or os.environ.get("KUBECONFIG", "")
    try:
        kube = connect_kubeconfig(kubeconfig or None)
        pod = kube.get_pod(namespace, name)
        if args.snapshot:
            return pod, _snapshot(args.snapshot), None
        nodes = kube.list_all("nodes")
        pods = kube.list_all("pods", field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed")
    except AdapterError as exc:
        raise UsageError(f"reading {args.pod_ref} and the cluster: {exc}") from exc
    return pod, ClusterState.from_objects(nodes, pods), (nodes, pods)


def _snapshot(uri: str) -> ClusterState:
    from adapters.errors import AdapterError
    from adapters.snapshot_store import open_store
    from scheduler_core.state.snapshot import SnapshotFormatError, read_snapshot

    try:
        fetched = open_store(uri).fetch(None)
        if fetched is None:
            raise UsageError(f"snapshot {uri}: there is none")
        return read_snapshot(fetched.data)
    except (AdapterError, SnapshotFormatError, ValueError) as exc:
        raise UsageError(f"snapshot {uri}: {exc}") from exc


def table(explanation: Explanation) -> str:
    """The explanation as aligned columns, one node per line, best first."""
    demand, rows = explanation.demand, explanation.nodes
    header = ("NODE", "ZONE", "MODEL", "MEM MiB", "FREE/ALLOC", "UTIL", "FIT", "UTIL.S", "LOCAL", "SCORE", "VERDICT")
    lines = [header, *(_cells(row) for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    asks = f"{demand.share} milli of one GPU" if demand.share else f"{demand.gpus} GPU(s)"
    if demand.mig:
        slices = ", ".join(f"{count} {mig_resource(profile)}" for profile, count in demand.mig)
        asks = slices if not demand.gpus else f"{asks} and {slices}"
    extender_only = sum(1 for r in rows if r.passed) - explanation.passing
    counted = f" ({extender_only} more pass the extender, but not kube-scheduler's count of free GPUs)"
    text = [f"pod {demand.key} requests {asks}; {explanation.passing} of {len(rows)} nodes pass"
            + (counted if extender_only else "")]  # fmt: skip
    text += [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=False)) + "  " + line[-1] for line in lines
    ]
    if explanation.autoscaler:
        text.append(f"autoscaler: {explanation.autoscaler}")
    unreadable = [f"{r.node}: {r.node_problem}" for r in rows if r.node_problem]
    if unreadable:
        text.append(
            f"warning: {len(unreadable)} node(s) with data the product cannot use: " + "; ".join(unreadable[:5])
        )
    return "\n".join(text)


def _cells(r: NodeExplanation) -> tuple[str, ...]:
    verdict = "ok" if r.passed else ("never: " if r.unresolvable else "not now: ") + r.reason
    if r.kube_scheduler:
        verdict += f"; kube-scheduler's count of nvidia.com/gpu: {r.kube_scheduler}"
    if r.node_problem and r.node_problem not in r.reason:
        verdict += f"; node data: {r.node_problem}"
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
