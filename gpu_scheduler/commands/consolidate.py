"""``gpu-scheduler consolidate``: the consolidator, against any cluster (``docs/consolidation.md``).

The same :func:`application.consolidation.service.consolidate` the Lambda runs on EventBridge's schedule,
once (the default) or on a loop (``--every``), through a kubeconfig. With ``--dry-run`` it prints the plan,
each move with its reason and cost, and changes nothing: no hold is written and no pod is evicted. Each run
prints its report as one JSON line on stdout, last. Flags win over the Lambda's environment variables.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from gpu_scheduler.commands.common import UsageError
from gpu_scheduler.commands.refresh import _countdown, _loop, duration_s

HELP = "move opted-in pods so that Pending GPU pods fit (--dry-run: print the plan, change nothing)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", default="", help="the cluster (default: $KUBECONFIG, then the Lambda's)")
    parser.add_argument("--holds", default=None, help="where the holds go: the extender's --holds (HOLDS_URI)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan; evict nothing, write no hold")
    parser.add_argument("--every", type=duration_s, default=0.0, help="run this often (default: once)")
    for flag, key, kind in (
        ("--max-moves-per-run", "max_moves_per_run", int), ("--max-moves-per-hour", "max_moves_per_hour", int),
        ("--max-moves-per-plan", "max_moves_per_plan", int), ("--hold-s", "hold_s", float),
        ("--settle-s", "settle_s", float), ("--empty-nodes", "empty_nodes", int),
    ):  # fmt: skip
        parser.add_argument(flag, dest=key, type=kind, default=None, help=f"{key.upper()} (docs/configuration.md)")


def run(args: argparse.Namespace) -> int:
    import boto3

    from application.consolidation.service import build_services, consolidate
    from application.consolidation.settings import ConsolidationSettings
    from scheduler_core.errors import ConfigError

    overrides: dict[str, Any] = {"dry_run": args.dry_run}
    if args.kubeconfig:
        overrides |= {"kubeconfig": args.kubeconfig, "kube_api_url": "", "cluster_name": ""}
    if args.holds is not None:
        overrides["holds_uri"] = args.holds
    for key in ("max_moves_per_run", "max_moves_per_hour", "max_moves_per_plan", "hold_s", "settle_s", "empty_nodes"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    try:
        settings = ConsolidationSettings.from_env(**overrides)
        services = build_services(settings, boto3.session.Session())
    except ConfigError as exc:
        raise UsageError(str(exc)) from exc

    def step(budget_s: float, stop: Any) -> Any:
        report = consolidate(settings, services, time_left=_countdown(budget_s + settings.deadline_margin_s, stop))
        if settings.dry_run:
            print(describe(report), flush=True)
        return report

    return _loop(step, args.every)


def describe(report: Any) -> str:
    """The dry run's plan in words: one line per plan, one per move with its reason and cost."""
    lines = [f"{report.pending} Pending pods no node fits; {len(report.plans)} plans, {report.moves_planned} moves"]
    if report.in_flight:
        lines.append(f"{report.in_flight} holds of an earlier plan are in flight: nothing new is planned")
    heads = [f"plan for {p['pod']}: {p['gpus']} GPUs on {p['node']}, cost {p['cost']:g}" for p in report.plans]
    heads += [f"empty {p['node']} for scale-down, cost {p['cost']:g}" for p in report.emptied]
    for head, plan in zip(heads, [*report.plans, *report.emptied], strict=True):
        lines.append(head)
        for move in plan["moves"]:
            lines.append(
                f"  move {move['pod']} ({move['owner']}) {move['source']} -> {move['destination']}, "
                f"cost {move['cost']:g}: {move['reason']}"
            )
    lines += [f"no plan for {pod}: {why}" for pod, why in _items(report.waiting)]
    lines += [f"{count} pods not movable: {why}" for why, count in _items(report.unmovable)]
    return "\n".join(lines)


def _items(mapping: Mapping[str, Any]) -> list[tuple[str, Any]]:
    return sorted(mapping.items())
