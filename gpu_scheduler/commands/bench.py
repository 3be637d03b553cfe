"""``gpu-scheduler bench SUITE ...``: the benchmarks in ``bench/``, from a source checkout.

``bench/`` is not installed with the product: it needs the test doubles (``testing/``) and moto. The
command hands its arguments to ``bench.cli`` when a checkout puts it on the path (``make`` does), and
says how to get one otherwise.
"""

from __future__ import annotations

import argparse

from gpu_scheduler.commands.common import from_checkout

HELP = "benchmarks, JSON on stdout (from a source checkout: make bench)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "suite_args", nargs=argparse.REMAINDER, help="the suite and its flags (bench --help lists them)"
    )


def run(args: argparse.Namespace) -> int:
    main = from_checkout("bench.cli", "main", "run `make bench` (or .venv/bin/gpu-scheduler bench SUITE) there")
    return int(main(args.suite_args))
