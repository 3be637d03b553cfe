"""Consolidator on Lambda: EventBridge invokes it on its rate (``consolidationScheduleMinutes``);
:func:`~application.consolidation.service.consolidate` does the run, this module only emits its metrics
(:func:`lambdas.refresher.run_refresher` runs it and writes its log line).

Settings, Powertools and the clients are built once, at import: a bad deployment fails at start-up with
every problem named (``application/consolidation/settings.py``).

Metrics (EMF): ``PendingPods``, ``Plans``, ``NodesEmptied``, ``MovesPlanned``, ``Evictions``, ``EvictionsRefused``,
``HoldsKept``, ``HoldsLapsed``, ``RunMs``, ``RunFailures``.
"""

from __future__ import annotations

from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from application.consolidation.service import RunReport, build_services, consolidate
from application.consolidation.settings import ConsolidationSettings
from lambdas.refresher import run_refresher

SETTINGS = ConsolidationSettings.from_env()
logger = Logger(service=SETTINGS.service)
# Every metric carries the service dimension (adapters/metric_catalogue.py), set or not in the environment.
metrics = Metrics(namespace=SETTINGS.metrics_namespace, service=SETTINGS.service)
SERVICES = build_services(SETTINGS, boto3.session.Session(region_name=SETTINGS.region or None))


def emit(report: RunReport) -> None:
    """The invocation's metrics."""
    counts = (
        ("PendingPods", report.pending),
        ("Plans", len(report.plans)),
        ("NodesEmptied", len(report.emptied)),
        ("MovesPlanned", report.moves_planned),
        ("Evictions", report.evictions),
        ("EvictionsRefused", report.evictions_refused),
        ("HoldsKept", report.holds_kept),
        ("HoldsLapsed", report.holds_lapsed),
        ("RunFailures", int(report.status != "ok")),
    )
    for name, value in counts:
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)
    metrics.add_metric(name="RunMs", unit=MetricUnit.Milliseconds, value=round(report.run_ms, 1))


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return run_refresher(consolidate, SETTINGS, SERVICES, context, emit=emit, logger=logger, what="consolidation run")
