"""``gpu-scheduler autoscaler-affinity``: a pod's GPU needs as required node affinity an autoscaler reads.

Reads a v1 Pod (JSON or YAML; ``-`` for stdin) and prints it with
``spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution`` written as
``docs/autoscalers.md`` says: its own terms, each ANDed with the GPU requirements on Karpenter's labels,
then each ANDed with them on the product's labels. Exit 0 with the pod (unchanged where there is
nothing to add); exit 2 with the reason where no instance type the product knows has GPUs the pod
would pass on.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from typing import Any

import yaml

from gpu_scheduler.commands.common import UsageError, read_document

HELP = "print a pod with its GPU model and memory as node affinity Karpenter and cluster-autoscaler read"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pod", help="a v1 Pod file, JSON or YAML ('-': stdin)")
    parser.add_argument("--json", action="store_true", help="print JSON (default: YAML)")


def run(args: argparse.Namespace) -> int:
    from scheduler_core.errors import InvalidPodError
    from scheduler_core.k8s.autoscaler import autoscaler_affinity
    from scheduler_core.k8s.pods import pod_demand

    pod = read_document(args.pod, "pod file")
    if not isinstance(pod, dict) or pod.get("kind", "Pod") != "Pod":
        raise UsageError(f"{args.pod}: expected a v1 Pod object")
    try:
        terms, why = autoscaler_affinity(pod, pod_demand(pod))
    except InvalidPodError as exc:
        raise UsageError(f"{args.pod}: {exc}") from exc
    if why:
        print(f"{args.pod}: {why}", file=sys.stderr)
        return 2
    out: dict[str, Any] = copy.deepcopy(pod)
    if terms is not None:
        affinity = out.setdefault("spec", {}).setdefault("affinity", {})
        affinity.setdefault("nodeAffinity", {})["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": terms
        }
    sys.stdout.write(json.dumps(out, indent=2) + "\n" if args.json else yaml.safe_dump(out, sort_keys=False))
    return 0
