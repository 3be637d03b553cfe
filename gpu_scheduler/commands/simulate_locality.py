"""``gpu-scheduler simulate-locality``: cross-zone traffic on a synthetic microservice graph."""

from __future__ import annotations

import argparse
import json

from gpu_scheduler.commands.common import UsageError

HELP = "cross-zone traffic on a synthetic microservice graph"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--services", type=int, default=30)
    parser.add_argument("--zones", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--runs", type=int, default=10, help="graphs to average over (seeds seed, seed+1, ...)")
    parser.add_argument("--extender-weight", type=float, default=2.0, help="the extender's weight in kube-scheduler")
    parser.add_argument("--json", action="store_true", help="print the full report as JSON")


def run(args: argparse.Namespace) -> int:
    from scheduler_core.simulator.locality_sim import simulate_locality

    if args.services < 2 or args.zones < 1 or args.runs < 1:
        raise UsageError("--services must be at least 2, --zones and --runs at least 1")
    report = simulate_locality(args.services, args.zones, args.seed, args.runs, args.extender_weight)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"{report['services']} services on {report['nodes']} nodes in {report['zones']} zones, {report['runs']} graphs"
    )
    print(f"{'policy':<8} {'cross-zone traffic':>19} {'zone imbalance':>15} {'single-zone services':>21}")
    for policy, figures in report["mean"].items():
        print(
            f"{policy:<8} {figures['cross_zone_fraction']:>18.1%} {figures['zone_imbalance']:>15.2f} "
            f"{figures['single_zone_services']:>21.1f}"
        )
    print(f"cross-zone traffic saved against default spreading: {report['cross_zone_reduction_vs_spread']:.1%}")
    return 0
