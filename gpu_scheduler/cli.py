"""``gpu-scheduler``: one command per module in :mod:`gpu_scheduler.commands`, dispatched by name.

Exit codes: 0 success, 1 a runtime failure, 2 bad arguments or bad input files (one line that says
which file and field), 130 interrupted, 141 the reader of stdout went away (``| head``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from adapters.runtime import version
from gpu_scheduler.commands.common import UsageError
from scheduler_core.errors import ConfigError, InvalidArgsError, InvalidPodError

COMMANDS = {
    "serve": "serve",
    "explain": "explain",
    "demo": "demo",
    "simulate": "simulate",
    "simulate-locality": "simulate_locality",
    "replay": "replay",
    "deletion-costs": "deletion_costs",
    "scheduler-config": "scheduler_config",
    "autoscaler-affinity": "autoscaler_affinity",
    "refresh": "refresh",
    "consolidate": "consolidate",
    "ledger": "ledger",
    "bench": "bench",
}
"""Command name to its module under ``gpu_scheduler.commands``; each has ``HELP``, ``add_arguments(parser)``
and ``run(args) -> int``."""


def command(name: str) -> ModuleType:
    return importlib.import_module(f"gpu_scheduler.commands.{COMMANDS[name]}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-scheduler", description="GPU-aware kube-scheduler extender for EKS")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"gpu-scheduler {version()}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        module = command(name)
        module.add_arguments(subparsers.add_parser(name, help=module.HELP, description=module.__doc__))
    return parser


_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class FieldsFormatter(logging.Formatter):
    """The message, then the structured fields a call passed in ``extra`` (what the Lambda's JSON logs
    carry as keys, the shared extender service's decisions among them), as one JSON object.

    >>> record = logging.makeLogRecord({"msg": "bind failed", "levelname": "WARNING", "bind": {"pod": "a/b"}})
    >>> FieldsFormatter("%(levelname)s %(message)s").format(record)
    'WARNING bind failed {"bind": {"pod": "a/b"}}'
    """

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = {key: value for key, value in vars(record).items() if key not in _RECORD_FIELDS}
        return f"{text} {json.dumps(fields, default=str)}" if fields else text


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(FieldsFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, handlers=[handler])
    try:
        result: int = command(args.command).run(args)
        sys.stdout.flush()  # a reader that went away (| head) shows here, not at exit
        return result
    except (UsageError, ConfigError, InvalidArgsError, InvalidPodError) as exc:
        print(f"gpu-scheduler {args.command}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader of stdout went away: stop quietly, as a shell tool does on SIGPIPE, with nothing
        # left for the interpreter to flush at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
