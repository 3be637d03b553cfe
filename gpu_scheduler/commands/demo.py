"""``gpu-scheduler demo``: the stock kube-scheduler and gpu-scheduler on the same pods."""

from __future__ import annotations

import argparse

HELP = "the stock kube-scheduler and gpu-scheduler side by side on a synthetic GPU cluster"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=96, help="GPU nodes (default 96: under 100, see the module)")
    parser.add_argument("--pods", type=int, default=150, help="pending GPU pods (default 150)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--mode", choices=("names", "nodes"), default="names", help="nodeCacheCapable true (names) or false (nodes)"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--no-live", action="store_true", help="skip the burst through a real kube-scheduler")
    parser.add_argument(
        "--placement-seeds", default="42-44", help="seeds for FGD beside gpu-scheduler on shares ('' skips it)"
    )
    parser.add_argument("--synth", action="store_true", help="then synthesise the CDK app (make demo)")


def run(args: argparse.Namespace) -> int:
    from gpu_scheduler.commands.common import UsageError
    from gpu_scheduler.demo import run_demo
    from gpu_scheduler.simulation import parse_seeds

    if not 1 <= args.nodes <= 1000 or not 1 <= args.pods <= 10_000:
        raise UsageError(f"--nodes: expected 1..1000 and --pods 1..10000, got {args.nodes} and {args.pods}")
    return run_demo(
        n_nodes=args.nodes,
        n_pods=args.pods,
        seed=args.seed,
        mode=args.mode,
        as_json=args.json,
        placement_seeds=tuple(parse_seeds(args.placement_seeds, "--placement-seeds")),
        live=not args.no_live,
        synth=args.synth,
    )
