"""``gpu-scheduler replay``: a trace through the real kube-scheduler on the production configuration, by
the FGD paper's protocol (``bench/replay.py``), beside ``simulate --policy fgd_cpu`` on the same seed."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpu_scheduler.commands.common import from_checkout

HELP = "replay a trace through a real kube-scheduler and the product (from a source checkout)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=Path, required=True, help="node list CSV (openb format)")
    parser.add_argument("--pods", type=Path, required=True, help="pod list CSV (openb format)")
    parser.add_argument("--seed", type=int, default=42, help="the protocol's seed (task order and copies)")
    parser.add_argument("--tune", type=float, default=1.3, help="inflate the trace to this multiple of GPU capacity")
    parser.add_argument("--until", type=float, default=100.0, help="stop once this %% of the GPU capacity arrived")
    parser.add_argument("--sample", type=float, default=1.0, help="a seeded fraction of the nodes and pods")
    parser.add_argument(
        "--serve-arg", dest="serve_args", action="append", default=[],
        help="an extra flag for gpu-scheduler serve (repeatable), e.g. --serve-arg=--share-policy=gpu_packing",
    )  # fmt: skip
    parser.add_argument(
        "--config-arg", dest="config_args", action="append", default=[],
        help="an extra flag for gpu-scheduler scheduler-config (repeatable), e.g. --config-arg=--weight=20",
    )  # fmt: skip
    parser.add_argument(
        "--settle", action="store_true",
        help="submit each pod once serve's live state includes the previous bind (measures the state's lag)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the results, curves included, here")
    parser.add_argument("--plot", type=Path, help="draw the replay and simulate's curve to this PNG")


def run(args: argparse.Namespace) -> int:
    main = from_checkout(
        "bench.replay",
        "main",
        "run .venv/bin/gpu-scheduler replay there, beside ../shared (make test sets it up)",
    )
    return int(main(args))
