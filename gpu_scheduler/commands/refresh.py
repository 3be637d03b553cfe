"""``gpu-scheduler refresh node-state|deletion-cost``: the refreshers' own services, against any cluster.

The same :func:`application.node_state.service.refresh` and :func:`application.deletion_cost.service.refresh`
the Lambdas run on EventBridge's schedule, here on a loop (``--every``) or once (``--once``), through a
kubeconfig. Each run prints its report as one JSON line on stdout. Flags win over the Lambdas'
environment variables (``docs/configuration.md``), which are read too.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpu_scheduler.commands.common import UsageError

HELP = "run the node-state or deletion-cost refresher against a cluster, once or on a loop"
log = logging.getLogger("gpu_scheduler.refresh")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_subparsers(dest="refresher", required=True)
    node = which.add_parser("node-state", help="GPU labels, the cluster snapshot and the ledger's reconcile")
    _common(node, every="10s")
    node.add_argument("--snapshot", required=True, help="where the snapshot goes: a path, file:///path or s3://b/k")
    node.add_argument("--ledger-table", default="", help="reconcile this GPU ledger (DynamoDB) with the pods")
    node.add_argument(
        "--reservation-image", default="", help="the reservation pods' image, as the extender's (RESERVATION_IMAGE)"
    )
    node.add_argument("--label-dry-run", action="store_true", help="plan label patches without sending them")
    node.add_argument("--prometheus", default="", help="DCGM utilisation from this Prometheus or AMP URL")
    node.add_argument("--no-ec2", action="store_true", help="look up no instance type in EC2 (a cluster outside AWS)")
    node.add_argument(
        "--watch", type=duration_s, default=None,
        help="after each run, keep the snapshot fresh from a watch until this long after the run started (WATCH_S)",
    )  # fmt: skip
    cost = which.add_parser("deletion-cost", help="pod-deletion-cost on managed pods from live metrics")
    _common(cost, every="30s")
    cost.add_argument("--prometheus", default="", help="the Prometheus or AMP URL the cost queries go to")
    cost.add_argument("--config", type=Path, help="the workload config JSON (default: the metrics policy)")
    cost.add_argument("--dry-run", action="store_true", help="compute and log the changes, write nothing")
    cost.add_argument(
        "--karpenter-deployment", help="Karpenter's Deployment, NAMESPACE/NAME ('' : never look; KARPENTER_DEPLOYMENT)"
    )
    cost.add_argument(
        "--do-not-disrupt-from", type=int, help="pods of at least this cost get karpenter.sh/do-not-disrupt (0: none)"
    )


def _common(parser: argparse.ArgumentParser, *, every: str) -> None:
    parser.add_argument("--kubeconfig", default="", help="the cluster (default: $KUBECONFIG, then the Lambda's)")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--once", action="store_true", help="one run, then exit (1 if it failed)")
    when.add_argument("--every", type=duration_s, default=duration_s(every), help=f"run this often (default {every})")


def duration_s(text: str) -> float:
    """``10s``, ``500ms``, ``2m`` or plain seconds (an argparse ``type``).

    >>> duration_s("500ms"), duration_s("2m"), duration_s("1.5")
    (0.5, 120.0, 1.5)
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"expected a duration such as 10s, 500ms or 2m, got {text!r}")
    value = float(match.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}[match.group(2)]
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive duration, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    import boto3

    from scheduler_core.errors import ConfigError

    overrides: dict[str, Any] = {}
    if args.kubeconfig:
        overrides |= {"kubeconfig": args.kubeconfig, "kube_api_url": "", "cluster_name": ""}
    try:
        if args.refresher == "node-state":
            step = _node_state(args, overrides, boto3.session.Session())
        else:
            step = _deletion_cost(args, overrides, boto3.session.Session())
    except ConfigError as exc:
        raise UsageError(str(exc)) from exc
    return _loop(step, 0.0 if args.once else args.every)


def _node_state(
    args: argparse.Namespace, overrides: dict[str, Any], session: Any
) -> Callable[[float, threading.Event], Any]:
    from application.node_state.service import build_services, refresh
    from application.node_state.settings import NodeStateSettings

    settings = NodeStateSettings.from_env(
        **overrides,
        snapshot_uri=args.snapshot,
        label_dry_run=args.label_dry_run,
        **({"ledger_table": args.ledger_table} if args.ledger_table else {}),
        **({"reservation_image": args.reservation_image} if args.reservation_image else {}),
        **({"amp_query_url": args.prometheus} if args.prometheus else {}),
        **({"watch_s": args.watch} if args.watch is not None else {}),
    )
    services = build_services(settings, session, ec2=not args.no_ec2)
    return lambda budget_s, stop: refresh(
        settings, services, time_left=_countdown(max(budget_s, settings.watch_s) + settings.deadline_margin_s, stop)
    )


def _deletion_cost(
    args: argparse.Namespace, overrides: dict[str, Any], session: Any
) -> Callable[[float, threading.Event], Any]:
    from application.deletion_cost.service import build_services, refresh
    from application.deletion_cost.settings import DeletionCostSettings

    if args.config is not None:
        try:
            overrides["config_json"] = args.config.read_text()
        except OSError as exc:
            raise UsageError(f"cannot read config file {args.config}: {exc.strerror}") from exc
    if args.karpenter_deployment is not None:
        overrides["karpenter_deployment"] = args.karpenter_deployment
    if args.do_not_disrupt_from is not None:
        overrides["do_not_disrupt_from"] = args.do_not_disrupt_from
    settings = DeletionCostSettings.from_env(
        **overrides,
        passes=1,
        dry_run=args.dry_run,
        **({"amp_query_url": args.prometheus} if args.prometheus else {}),
    )
    services = build_services(settings, session)
    return lambda budget_s, stop: refresh(
        settings, services, time_left=_countdown(budget_s + settings.deadline_margin_s, stop)
    )


def _countdown(seconds: float, stop: threading.Event) -> Callable[[], float]:
    """Seconds left of ``seconds`` from now, and none once ``stop`` is set: a run's stand-in for the
    Lambda's remaining time (its margin is added by the caller, so the run itself gets all of its budget)."""
    deadline = time.monotonic() + seconds
    return lambda: 0.0 if stop.is_set() else deadline - time.monotonic()


def _loop(step: Callable[[float, threading.Event], Any], every_s: float) -> int:
    """Run ``step`` now and then every ``every_s`` (0: once) until SIGINT or SIGTERM; each run has the
    interval, and at least a minute, before it stops starting work. The exit code is the last run's: 0 ok,
    1 failed."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    status = "ok"
    try:
        while True:
            started = time.monotonic()
            report = step(max(every_s, 60.0), stop)
            status = report.status
            print(json.dumps(asdict(report), separators=(",", ":")), flush=True)
            if not every_s or stop.wait(max(0.0, every_s - (time.monotonic() - started))):
                break
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0 if status == "ok" else 1
