"""``gpu-scheduler demo``: a synthetic GPU cluster scheduled through a real local extender."""

from __future__ import annotations

import argparse

HELP = "drive a synthetic GPU cluster through a local extender"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--pods", type=int, default=350)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--mode", choices=("names", "nodes"), default="names", help="nodeCacheCapable true (names) or false (nodes)"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--no-live", action="store_true", help="skip the burst through a real kube-scheduler")
    parser.add_argument("--placement-seeds", default="42,43", help="seeds for the FGD vs ours comparison ('' skips it)")


def run(args: argparse.Namespace) -> int:
    from gpu_scheduler.demo import run_demo
    from gpu_scheduler.simulation import parse_seeds

    return run_demo(
        n_nodes=args.nodes,
        n_pods=args.pods,
        seed=args.seed,
        mode=args.mode,
        as_json=args.json,
        placement_seeds=tuple(parse_seeds(args.placement_seeds, "--placement-seeds")),
        live=not args.no_live,
    )
