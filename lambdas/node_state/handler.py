"""Node-state refresher on Lambda: EventBridge invokes it every minute (with
``WATCH_S``, each invocation then watches until the next one has taken over);
:func:`~application.node_state.service.refresh` does the run, this module only emits its metrics
(:func:`lambdas.refresher.run_refresher` runs it and writes its log line).

Settings, Powertools and the clients are built once, at import: a bad deployment fails at start-up
with every problem named (``application/node_state/settings.py``).

Metrics (EMF): ``NodesSeen``, ``NodesInvalid`` (over a cap: refused to every pod), ``NodesLabeled``,
``LabelPatchFailures``, ``LabelPatchesSkipped``, ``NodesWithoutGpuInfo``, ``SnapshotBytes``,
``SnapshotWriteMs``, ``AmpQueryMs``, ``AmpQueryFailures``, ``RunMs``, ``RunFailures``,
``SnapshotsKeptNewer``; with ``WATCH_S``, ``SnapshotPublishes`` and ``WatchLagP99Ms``; with the ledger,
``LedgerDrift`` (by ``kind``), ``LedgerReconcileFailures``, ``PlaceholdersHeldBack`` (whole GPUs of
unschedulable shares' demand that the placeholder caps leave without a placeholder) and, with ``WATCH_S``,
``SharesReleased``; where a node has MIG, ``MigNodesUnsettled``, and ``MigSlicesFree`` and
``MigSlicesStranded`` by ``profile``; where the API serves DRA, ``DraNodes``, ``DraGpusPublished`` and
``DraGpusClaimed``.
"""

from __future__ import annotations

from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from adapters.metric_catalogue import emit_count
from application.node_state.service import RunReport, build_services, refresh
from application.node_state.settings import NodeStateSettings
from lambdas.refresher import run_refresher

SETTINGS = NodeStateSettings.from_env()
logger = Logger(service=SETTINGS.service)
# Every metric carries the service dimension (adapters/metric_catalogue.py), set or not in the environment.
metrics = Metrics(namespace=SETTINGS.metrics_namespace, service=SETTINGS.service)
SERVICES = build_services(SETTINGS, boto3.session.Session(region_name=SETTINGS.region or None))

_METRICS = (
    ("NodesSeen", "nodes_seen", MetricUnit.Count),
    ("NodesInvalid", "nodes_invalid", MetricUnit.Count),
    ("NodesLabeled", "nodes_labeled", MetricUnit.Count),
    ("LabelPatchFailures", "label_patch_failures", MetricUnit.Count),
    ("LabelPatchesSkipped", "label_patches_skipped", MetricUnit.Count),
    ("SnapshotBytes", "snapshot_bytes", MetricUnit.Bytes),
    ("SnapshotWriteMs", "snapshot_write_ms", MetricUnit.Milliseconds),
    ("AmpQueryMs", "amp_query_ms", MetricUnit.Milliseconds),
    ("RunMs", "run_ms", MetricUnit.Milliseconds),
)


def emit(report: RunReport) -> None:
    """The run's metrics."""
    for name, attribute, unit in _METRICS:
        metrics.add_metric(name=name, unit=unit, value=round(float(getattr(report, attribute)), 3))
    metrics.add_metric(name="NodesWithoutGpuInfo", unit=MetricUnit.Count, value=sum(report.unlabelled.values()))
    metrics.add_metric(name="AmpQueryFailures", unit=MetricUnit.Count, value=int(report.amp_query_failed))
    metrics.add_metric(name="RunFailures", unit=MetricUnit.Count, value=int(report.status != "ok"))
    metrics.add_metric(name="SnapshotsKeptNewer", unit=MetricUnit.Count, value=report.snapshots_kept_newer)
    if report.mig:
        nodes = report.mig["nodes"]
        unsettled = nodes.get("pending", 0) + nodes.get("invalid", 0)
        metrics.add_metric(name="MigNodesUnsettled", unit=MetricUnit.Count, value=unsettled)
        for profile, counts in report.mig["slices"].items():
            for name, key in (("MigSlicesFree", "free"), ("MigSlicesStranded", "stranded")):
                emit_count(name, counts[key], namespace=metrics.namespace, service=logger.service, profile=profile)
    if report.dra:
        for name, key in (
            ("DraNodes", "nodes"),
            ("DraGpusPublished", "gpus_published"),
            ("DraGpusClaimed", "gpus_claimed"),
        ):
            metrics.add_metric(name=name, unit=MetricUnit.Count, value=report.dra[key])
    if report.watch:
        metrics.add_metric(name="SnapshotPublishes", unit=MetricUnit.Count, value=report.watch["publishes"])
        metrics.add_metric(name="WatchLagP99Ms", unit=MetricUnit.Milliseconds, value=1000 * report.watch["lag_p99_s"])
        if SETTINGS.ledger_table:
            metrics.add_metric(name="SharesReleased", unit=MetricUnit.Count, value=report.watch["shares_released"])
    if SETTINGS.ledger_table:
        metrics.add_metric(name="LedgerReconcileFailures", unit=MetricUnit.Count, value=int(bool(report.ledger_error)))
        if report.placeholders:
            held = report.placeholders.get("held_back", 0)
            metrics.add_metric(name="PlaceholdersHeldBack", unit=MetricUnit.Count, value=held)
        for kind, count in report.ledger_drift.items():
            emit_count("LedgerDrift", count, namespace=metrics.namespace, service=logger.service, kind=kind)


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return run_refresher(refresh, SETTINGS, SERVICES, context, emit=emit, logger=logger, what="node-state run")
