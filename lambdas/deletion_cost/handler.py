"""Deletion-cost refresher on Lambda: EventBridge invokes it every minute;
:func:`~application.deletion_cost.service.refresh` does the passes, this module only emits their metrics
(:func:`lambdas.refresher.run_refresher` runs it and writes its log line).

Settings, Powertools and the clients are built once, at import: a bad deployment fails at start-up
with every problem named (``application/deletion_cost/settings.py``).

Metrics (EMF): ``PodsSeen``, ``CostPatches``, ``CostUnchanged``, ``MetricsMissing``, ``PatchFailures``,
``PodsGone``, ``MetricQueryFailures``, ``RunMs``, and ``PodsByCostRange`` with a ``range`` dimension
(``warming`` -100..-1, ``default`` 0, ``medium`` 1..99, ``high`` 100..1000).
"""

from __future__ import annotations

from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from adapters.metric_catalogue import emit_count
from application.deletion_cost.service import RunReport, build_services, refresh
from application.deletion_cost.settings import DeletionCostSettings
from lambdas.refresher import run_refresher

SETTINGS = DeletionCostSettings.from_env()
logger = Logger(service=SETTINGS.service)
# Every metric carries the service dimension (adapters/metric_catalogue.py), set or not in the environment.
metrics = Metrics(namespace=SETTINGS.metrics_namespace, service=SETTINGS.service)
SERVICES = build_services(SETTINGS, boto3.session.Session(region_name=SETTINGS.region or None), logger)

_METRICS = (
    ("PodsSeen", "pods_seen"),
    ("CostPatches", "cost_patches"),
    ("CostUnchanged", "cost_unchanged"),
    ("MetricsMissing", "metrics_missing"),
    ("PatchFailures", "patch_failures"),
    ("PodsGone", "pods_gone"),
    ("MetricQueryFailures", "query_failures"),
)


def emit(report: RunReport) -> None:
    """The invocation's metrics."""
    for name, attribute in _METRICS:
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=report.total(attribute))
    metrics.add_metric(name="RunMs", unit=MetricUnit.Milliseconds, value=round(report.run_ms, 1))
    metrics.add_metric(name="RunFailures", unit=MetricUnit.Count, value=int(report.status != "ok"))
    if report.passes:
        for name, count in report.passes[-1].cost_ranges.items():
            emit_count("PodsByCostRange", count, namespace=metrics.namespace, service=logger.service, range=name)


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return run_refresher(refresh, SETTINGS, SERVICES, context, emit=emit, logger=logger, what="deletion-cost run")
