"""``gpu-scheduler simulate``: GPU-sharing placement on a trace, by the FGD paper's protocol."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpu_scheduler.commands.common import UsageError

HELP = "GPU-sharing placement on a trace, by the FGD paper's protocol"
TIES = ("shuffled", "first", "random")
"""``scheduler_core.simulator.simulate.TIES``, repeated so that the parser loads no numpy (a test keeps them equal)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=Path, required=True, help="node list CSV (openb format)")
    parser.add_argument("--pods", type=Path, required=True, help="pod list CSV (openb format)")
    parser.add_argument(
        "--policy",
        default="fgd_cpu",
        help="fgd_cpu (ours, the default), fgd, bestfit, gpu_packing, gpu_clustering, dotprod or random",
    )
    parser.add_argument("--seeds", default="42-51", help="a range (42-51) or a list (42,43)")
    parser.add_argument("--tune", type=float, default=1.3, help="inflate the trace to this multiple of GPU capacity")
    parser.add_argument(
        "--tie", choices=TIES, default="shuffled",
        help="how equal top scores are broken: the first node in an order shuffled once per seed (as the authors' "
        "simulator does), the first node in the file, or at random per decision",
    )  # fmt: skip
    parser.add_argument("--jobs", type=int, default=1, help="seeds run in parallel")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--plot", type=Path, help="draw unallocated GPU %% against arrived %% to this PNG")


def run(args: argparse.Namespace) -> int:
    from gpu_scheduler.simulation import parse_seeds, plot, run_many, write_json
    from scheduler_core.placement.policies import registry

    if args.policy not in registry():
        raise UsageError(f"--policy: expected one of {', '.join(sorted(registry()))}, got {args.policy!r}")
    (result,) = run_many(args.nodes, args.pods, [args.policy], parse_seeds(args.seeds), args.tune, args.tie, args.jobs)
    if args.json:
        write_json(result, args.json)
    if args.plot:
        plot(result, args.plot)
    unalloc = result["unallocated_gpu_pct"]
    print(f"{args.policy} on {args.pods.name}, seeds {args.seeds}, tune {args.tune}, ties {args.tie}")
    print(f"{'seed':>6} {'unalloc@100':>12} {'unalloc@130':>12} {'frag@80':>8} {'frag@90':>8} {'failed':>7}")
    frag = result["frag_ratio_pct"]
    for i, seed in enumerate(result["seeds"]):
        print(
            f"{seed:>6} {_pct(unalloc['100']['per_seed'][i], 12)} {_pct(unalloc['130']['per_seed'][i], 12)} "
            f"{_pct(frag['80']['per_seed'][i], 8)} {_pct(frag['90']['per_seed'][i], 8)} "
            f"{result['pods_failed']['per_seed'][i]:>7.0f}"
        )
    print(f"{'mean':>6} {_pct(unalloc['100']['mean'], 12)} {_pct(unalloc['130']['mean'], 12)}")
    print(f"{'median':>6} {_pct(unalloc['100']['median'], 12)} {_pct(unalloc['130']['median'], 12)}")
    short = [f"{a} %: {n - unalloc[a]['seeds_reaching']} of {n}" for a in ("100", "130")
             if unalloc[a]["seeds_reaching"] < (n := len(result["seeds"]))]  # fmt: skip
    if short:
        print(f"n/a: the run ended before that much of the capacity had arrived ({'; '.join(short)} seeds); a"
              " larger trace or --tune reaches it")  # fmt: skip
    return 0


def _pct(value: float | None, width: int) -> str:
    """A percentage, or ``n/a`` for a point the run never reached."""
    return f"{'n/a':>{width}}" if value is None else f"{value:>{width}.2f}"
