"""``gpu-scheduler deletion-costs``: a dry run of pod deletion costs from a metrics file."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path

from gpu_scheduler.commands.common import UsageError, read_document

HELP = "dry run: pod deletion costs from a metrics file"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pods", type=Path, required=True, help="v1 PodList or a JSON list of v1 Pods")
    parser.add_argument("--metrics", type=Path, required=True, help='{"namespace/pod": {"active_requests": 3, ...}}')
    parser.add_argument("--config", type=Path, help="workload config JSON (default: the metrics policy for every pod)")
    parser.add_argument("--scale-down", type=int, default=0, help="also list the first N pods a scale-down removes")
    parser.add_argument("--now", help="ISO 8601 time to judge pod age by (default: now)")
    parser.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    from scheduler_core.deletion_cost.plan import costs_for, current_cost, pod_key, pod_list, victims
    from scheduler_core.deletion_cost.policy import CostConfig

    if args.scale_down < 0:
        raise UsageError(f"--scale-down must not be negative, got {args.scale_down}")
    try:
        now = (
            datetime.fromisoformat(args.now.replace("Z", "+00:00")).timestamp()
            if args.now
            else datetime.now(UTC).timestamp()
        )
    except ValueError as exc:
        raise UsageError(f"--now: expected an ISO 8601 time, got {args.now!r}") from exc
    pods = pod_list(read_document(args.pods, "pods file"))
    config = CostConfig.from_json(read_document(args.config, "config file")) if args.config else CostConfig()
    costs = costs_for(pods, read_document(args.metrics, "metrics file"), config, now)
    order = victims(pods, costs, args.scale_down, now) if args.scale_down else []
    if args.json:
        print(json.dumps({"costs": costs, "victims": order}, indent=2))
        return 0
    width = max((len(k) for k in costs), default=3)
    print(f"{'POD':<{width}}  {'CURRENT':>8}  {'NEW':>6}")
    for pod in pods:
        key, new = pod_key(pod), costs[pod_key(pod)]
        old = current_cost(pod)
        print(f"{key:<{width}}  {'-' if old is None else old:>8}  {'keep' if new is None else new:>6}")
    if order:
        print(f"a scale-down by {args.scale_down} removes: {', '.join(order)}")
    return 0
