"""``gpu-scheduler bench SUITE ...``: the benchmarks in ``bench/``, from a source checkout.

``bench/`` is not installed with the product: it needs the test doubles (``testing/``) and moto. The
command hands its arguments to ``bench.cli`` when a checkout puts it on the path (``make`` does), and
says how to get one otherwise.
"""

from __future__ import annotations

import argparse

from gpu_scheduler.commands.common import UsageError

HELP = "benchmarks, JSON on stdout (from a source checkout: make bench)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "suite_args", nargs=argparse.REMAINDER, help="the suite and its flags (bench --help lists them)"
    )


def run(args: argparse.Namespace) -> int:
    try:
        from bench.cli import main
    except ModuleNotFoundError as exc:
        if exc.name not in ("bench", "bench.cli"):
            raise
        raise UsageError(
            "the benchmarks run from a source checkout, not an installed package: clone the repository and run "
            "`make bench` (or .venv/bin/gpu-scheduler bench SUITE) there"
        ) from exc
    return main(args.suite_args)
