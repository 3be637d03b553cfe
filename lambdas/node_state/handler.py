"""Node-state refresher: GPU labels on nodes, and the cluster snapshot the extender serves from.

EventBridge invokes it every minute. One run:

1. lists every node (``limit=500`` pages with ``continue``);
2. looks up EC2 ``GpuInfo`` for the instance types of nodes without complete GFD labels (cached
   across invocations);
3. lists the non-terminal pods bound to nodes (field selector, paginated), keeping only what
   scheduling reads (decoded straight into :class:`adapters.kube_types.SchedulingPod`);
4. runs one PromQL query for DCGM utilisation; if it fails, the last known values are carried over
   from the previous snapshot, with their age;
5. builds the snapshot (whole-GPU and milli use per GPU) and writes it atomically to ``SNAPSHOT_URI``;
6. patches ``gpu.nvidia.com/model|memory|count`` where they should change: one merge patch per node,
   concurrently, until the deadline margin; what it skips is reported;
7. with ``LEDGER_TABLE`` (GPU sharing), reconciles the GPU ledger with the pods
   (:func:`scheduler_core.state.ledger.reconcile`): it frees what pods that are gone, finished or bound
   elsewhere still hold, records bound pods' annotations an item lacks, and rebuilds missing items.
   The ledger is read before the pods are listed, and unbound pods before bound ones, so that a
   bind in flight is never mistaken for a leftover; each write is conditional on the version read.

The snapshot is written before the labels, so that a slow API cannot leave the extender stale;
it already reflects the labels being written.

Metrics (EMF): ``NodesSeen``, ``NodesLabeled``, ``LabelPatchFailures``, ``LabelPatchesSkipped``,
``NodesWithoutGpuInfo``, ``SnapshotBytes``, ``SnapshotWriteMs``, ``AmpQueryMs``, ``AmpQueryFailures``,
``RunMs``, ``RunFailures``; with the ledger, ``LedgerDrift`` (by ``kind``) and ``LedgerReconcileFailures``.
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, cast

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from adapters.amp import PrometheusClient, PrometheusQueryError, utilization_by_node, utilization_query
from adapters.ec2_gpu import GpuInfoCatalog
from adapters.gpu_ledger import LedgerStore, LedgerStoreError
from adapters.kube import DeadlineReachedError, KubeApiError, KubeClient
from adapters.kube_types import SchedulingPod
from adapters.metric_catalogue import NAMESPACE, NODE_STATE, emit_count
from adapters.snapshot_store import SnapshotStore, SnapshotStoreError, open_store
from lambdas.node_state.config import NodeStateSettings
from scheduler_core.errors import InvalidPodError
from scheduler_core.k8s.annotations import parse_assigned_gpus
from scheduler_core.k8s.names import ASSIGNED_GPUS_ANNOTATION, GFD_PRODUCT, LABEL_INSTANCE_TYPE
from scheduler_core.k8s.node_labels import LabelPolicy, desired_info, label_changes
from scheduler_core.state.ledger import NodeLedger, Pairs, reconcile
from scheduler_core.state.snapshot import SnapshotFormatError, build_snapshot, read_snapshot, write_snapshot

ASSIGNED_NON_TERMINAL = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
UNASSIGNED_NON_TERMINAL = "spec.nodeName=,status.phase!=Succeeded,status.phase!=Failed"
_REASON_SAMPLES = 5  # node names logged per "left unlabelled" reason

log = logging.getLogger(__name__)


@dataclass
class RunReport:
    status: str = "ok"  # "ok", or "failed" when no snapshot could be written
    error: str = ""
    nodes_seen: int = 0
    pods_seen: int = 0
    nodes_labeled: int = 0
    label_patch_failures: int = 0
    label_patches_skipped: int = 0
    label_patches_planned: int = 0
    dry_run: bool = False
    unlabelled: dict[str, int] = field(default_factory=dict)
    utilization_source: str = "none"  # "amp", "previous" or "none"
    amp_query_failed: bool = False
    utilization_age_s: float | None = None
    snapshot_bytes: int = 0
    snapshot_write_ms: float = 0.0
    amp_query_ms: float = 0.0
    run_ms: float = 0.0
    problems: int = 0
    api_retries: int = 0
    phases_ms: dict[str, float] = field(default_factory=dict)
    ledger_drift: dict[str, int] = field(default_factory=dict)
    ledger_writes: int = 0
    ledger_write_conflicts: int = 0  # items a bind changed meanwhile: left for the next run
    ledger_error: str = ""


@dataclass
class Services:
    kube: KubeClient
    store: SnapshotStore
    catalog: GpuInfoCatalog
    prometheus: PrometheusClient | None
    ledger: LedgerStore | None = None


@dataclass
class _LedgerView:
    """What the reconcile needs, gathered in the order that makes it safe (see the module docstring)."""

    items: dict[str, NodeLedger] | None
    live: set[str] = field(default_factory=set)
    bound_to: dict[str, str] = field(default_factory=dict)
    annotated: dict[str, dict[str, Pairs]] = field(default_factory=dict)


def refresh(
    settings: NodeStateSettings,
    services: Services,
    *,
    time_left: Callable[[], float],
    now: Callable[[], float] = time.time,
    logger: Any = log,
) -> RunReport:
    """One refresher run (see the module docstring); ``time_left`` gives seconds to the deadline."""
    started = time.perf_counter()
    report = RunReport(dry_run=settings.label_dry_run)
    kube = services.kube
    kube.deadline = lambda: time_left() - settings.deadline_margin_s
    retries_before = kube.retries
    try:
        with _phase(report, "list_nodes"):
            nodes = [node for node in kube.list_all("nodes") if _node_name(node)]
        report.nodes_seen = len(nodes)
        policy = cast(LabelPolicy, settings.label_policy)  # validated by NodeStateSettings
        with _phase(report, "plan_labels"):
            plan = _plan_labels(nodes, services.catalog, policy, report, logger)
        ledger_view = _read_ledger(services, report, logger) if services.ledger is not None else None
        with _phase(report, "list_pods"):
            pods = kube.list_all("pods", field_selector=ASSIGNED_NON_TERMINAL, item_type=SchedulingPod)
        report.pods_seen = len(pods)
        if ledger_view is not None:
            _note_bound(ledger_view, pods, report)
    except (KubeApiError, DeadlineReachedError) as exc:
        report.status, report.error = "failed", f"listing the cluster failed: {exc}"
        logger.error("run failed before a snapshot could be built", extra={"error": str(exc)})
        report.run_ms = 1000 * (time.perf_counter() - started)
        return report

    utilization, measured_at = _utilization(settings, services, report, now(), logger)
    with _phase(report, "build_snapshot"):
        snapshot = build_snapshot(
            nodes, pods, cluster=settings.cluster_name or "local", generated_at=now(),
            gpu_utilization=utilization, utilization_at=measured_at,
        )  # fmt: skip
        data = write_snapshot(snapshot)
    del pods
    report.problems = len(snapshot.problems)
    for problem in snapshot.problems[:20]:
        logger.warning("snapshot input problem", extra={"problem": problem})
    report.snapshot_bytes = len(data)
    write_started = time.perf_counter()
    try:
        services.store.put(data)
    except SnapshotStoreError as exc:
        report.status, report.error = "failed", f"writing the snapshot to {services.store.uri} failed: {exc}"
        logger.error("snapshot write failed", extra={"error": str(exc), "uri": services.store.uri})
    report.snapshot_write_ms = 1000 * (time.perf_counter() - write_started)

    with _phase(report, "patch_labels"):
        _apply_labels(plan, settings, kube, report, logger)
    if ledger_view is not None and ledger_view.items is not None and services.ledger is not None:
        with _phase(report, "reconcile_ledger"):
            gpu_counts = dict(zip(snapshot.table.names, snapshot.table.alloc_gpus.tolist(), strict=True))
            _reconcile(services.ledger, ledger_view, gpu_counts, report, logger)
    report.api_retries = kube.retries - retries_before
    report.run_ms = 1000 * (time.perf_counter() - started)
    return report


def _read_ledger(services: Services, report: RunReport, logger: Any) -> _LedgerView:
    """The ledger items, then the UIDs of unbound non-terminal pods (a failed read skips the reconcile)."""
    assert services.ledger is not None
    with _phase(report, "read_ledger"):
        try:
            items = {item.node: item for item in services.ledger.scan()}
        except LedgerStoreError as exc:
            report.ledger_error = f"reading the GPU ledger failed: {exc}"
            logger.error("ledger read failed; no reconcile this run", extra={"error": str(exc)})
            return _LedgerView(None)
    with _phase(report, "list_unbound_pods"):
        unbound = services.kube.list_all("pods", field_selector=UNASSIGNED_NON_TERMINAL, item_type=SchedulingPod)
    view = _LedgerView(items)
    view.live.update(uid for pod in unbound if (uid := (pod.get("metadata") or {}).get("uid")))
    return view


def _note_bound(view: _LedgerView, pods: list[dict[str, Any]], report: RunReport) -> None:
    """Record the bound pods' UIDs, nodes and ``assigned-gpus`` annotations (an invalid one is left
    to the snapshot's problems, which already name it)."""
    for pod in pods:
        metadata, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        uid, node = metadata.get("uid"), spec.get("nodeName")
        if not uid or not node:
            continue
        view.live.add(uid)
        view.bound_to[uid] = node
        text = (metadata.get("annotations") or {}).get(ASSIGNED_GPUS_ANNOTATION)
        if text is None:
            continue
        try:
            view.annotated.setdefault(node, {})[uid] = parse_assigned_gpus(text)
        except InvalidPodError:
            report.ledger_drift["invalid_annotation"] = report.ledger_drift.get("invalid_annotation", 0) + 1


def _reconcile(
    ledger: LedgerStore, view: _LedgerView, gpu_counts: dict[str, int], report: RunReport, logger: Any
) -> None:
    assert view.items is not None
    outcome = reconcile(view.items, view.live, view.bound_to, view.annotated, gpu_counts)
    for kind, count in outcome.counts().items():
        report.ledger_drift[kind] = report.ledger_drift.get(kind, 0) + count
    for drift in outcome.drift[:20]:
        logger.warning("ledger drift", extra={"kind": drift.kind, "node": drift.node, "pod_uid": drift.uid,
                                              "detail": drift.detail})  # fmt: skip
    for item, read_version in outcome.writes:
        try:
            written = ledger.write(item, read_version)
        except LedgerStoreError as exc:
            report.ledger_error = f"writing the GPU ledger failed: {exc}"
            logger.error("ledger write failed; the rest waits for the next run", extra={"error": str(exc)})
            return
        if written:
            report.ledger_writes += 1
        else:
            report.ledger_write_conflicts += 1


@contextmanager
def _phase(report: RunReport, name: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        report.phases_ms[name] = round(1000 * (time.perf_counter() - started), 1)


def _node_name(node: Any) -> str:
    metadata = node.get("metadata") if isinstance(node, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) else ""


def _plan_labels(
    nodes: list[dict[str, Any]], catalog: GpuInfoCatalog, policy: LabelPolicy, report: RunReport, logger: Any
) -> list[tuple[str, dict[str, str]]]:
    """Label changes per node; applies them to the listed objects so the snapshot matches."""
    needs_ec2 = {
        labels.get(LABEL_INSTANCE_TYPE)
        for node in nodes
        if GFD_PRODUCT not in (labels := node["metadata"].get("labels") or {})
    }
    ec2 = catalog.lookup(t for t in needs_ec2 if isinstance(t, str))
    plan: list[tuple[str, dict[str, str]]] = []
    unlabelled: dict[str, list[str]] = defaultdict(list)
    for node in nodes:
        metadata = node["metadata"]
        labels = metadata.get("labels")
        if not isinstance(labels, dict):
            labels = metadata["labels"] = {}
        desired = desired_info(labels, ec2)
        if desired.info is None:
            unlabelled[desired.reason].append(metadata["name"])
            continue
        changes = label_changes(labels, desired.info, policy)
        if changes:
            plan.append((metadata["name"], changes))
            labels.update(changes)
    for reason, names in unlabelled.items():
        logger.info("nodes left unlabelled", extra={"reason": reason, "nodes": len(names), "sample": names[:5]})
    report.unlabelled = {reason: len(names) for reason, names in unlabelled.items()}
    report.label_patches_planned = len(plan)
    return plan


def _utilization(
    settings: NodeStateSettings, services: Services, report: RunReport, now: float, logger: Any
) -> tuple[dict[str, list[float]] | None, float | None]:
    if services.prometheus is not None:
        started = time.perf_counter()
        promql = utilization_query(
            settings.utilization_query,
            node_label=settings.utilization_node_label,
            gpu_label=settings.utilization_gpu_label,
            window=settings.utilization_window,
        )
        try:
            samples = services.prometheus.query(promql)
            by_node, problems = utilization_by_node(
                samples, node_label=settings.utilization_node_label, gpu_label=settings.utilization_gpu_label
            )
            for problem in problems[:5]:
                logger.warning("utilisation sample skipped", extra={"problem": problem})
            report.utilization_source, report.utilization_age_s = "amp", 0.0
            return by_node, now
        except PrometheusQueryError as exc:
            report.amp_query_failed = True
            logger.warning("utilisation query failed; keeping the last known values", extra={"error": str(exc)})
        finally:
            report.amp_query_ms = 1000 * (time.perf_counter() - started)
    return _previous_utilization(services.store, report, now, logger)


def _previous_utilization(
    store: SnapshotStore, report: RunReport, now: float, logger: Any
) -> tuple[dict[str, list[float]] | None, float | None]:
    try:
        fetched = store.fetch(None)
        previous = read_snapshot(fetched.data) if fetched is not None else None
    except (SnapshotStoreError, SnapshotFormatError) as exc:
        logger.warning("no previous snapshot to keep utilisation from", extra={"error": str(exc)})
        return None, None
    if previous is None or previous.utilization_at is None:
        return None, None
    report.utilization_source = "previous"
    report.utilization_age_s = round(now - previous.utilization_at, 1)
    return previous.utilization_by_node(), previous.utilization_at


def _apply_labels(
    plan: list[tuple[str, dict[str, str]]],
    settings: NodeStateSettings,
    kube: KubeClient,
    report: RunReport,
    logger: Any,
) -> None:
    if settings.label_dry_run:
        for name, changes in plan:
            logger.info("dry run: would label node", extra={"node": name, "labels": changes})
        return

    def patch(item: tuple[str, dict[str, str]]) -> str:
        name, changes = item
        try:
            kube.patch_node_labels(name, changes)
        except DeadlineReachedError:
            return "skipped"
        except KubeApiError as exc:
            logger.warning("label patch failed", extra={"node": name, "labels": changes, "error": str(exc)})
            return "failed"
        logger.info("labelled node", extra={"node": name, "labels": changes})
        return "labeled"

    with ThreadPoolExecutor(max_workers=settings.patch_concurrency, thread_name_prefix="label") as pool:
        outcomes = list(pool.map(patch, plan))
    report.nodes_labeled = outcomes.count("labeled")
    report.label_patch_failures = outcomes.count("failed")
    report.label_patches_skipped = outcomes.count("skipped")
    if report.label_patches_skipped:
        logger.warning(
            "deadline reached: label patches skipped until the next run",
            extra={"skipped": report.label_patches_skipped},
        )


# ---- Lambda entry point --------------------------------------------------------------------------
_SETTINGS: NodeStateSettings | None = None
_SERVICES: Services | None = None


def _services(settings: NodeStateSettings) -> Services:
    """Clients built once per container and reused while it stays warm (the EC2 cache with them)."""
    global _SERVICES
    if _SERVICES is None:
        import boto3

        session = boto3.session.Session(region_name=settings.region or None)
        kube = settings.connect(session)
        prometheus = (
            PrometheusClient(
                settings.amp_query_url, region=session.region_name or "", credentials=session.get_credentials()
            )
            if settings.amp_query_url
            else None
        )
        _SERVICES = Services(
            kube=kube,
            store=open_store(settings.snapshot_uri, s3_client=session.client("s3")),
            catalog=GpuInfoCatalog(session.client("ec2")),
            prometheus=prometheus,
            ledger=LedgerStore(settings.ledger_table, session.client("dynamodb")) if settings.ledger_table else None,
        )
    return _SERVICES


def _settings() -> NodeStateSettings:
    global _SETTINGS
    if _SETTINGS is None:
        _SETTINGS = NodeStateSettings.from_env()
    return _SETTINGS


# The settings are read on the first invocation: a bad deployment fails that run with every problem named.
logger = Logger(service=os.environ.get("POWERTOOLS_SERVICE_NAME", NODE_STATE))
# Every metric carries the service dimension (adapters/metric_catalogue.py), set or not in the environment.
metrics = Metrics(namespace=os.environ.get("POWERTOOLS_METRICS_NAMESPACE", NAMESPACE), service=logger.service)

_METRICS = (
    ("NodesSeen", "nodes_seen", MetricUnit.Count),
    ("NodesLabeled", "nodes_labeled", MetricUnit.Count),
    ("LabelPatchFailures", "label_patch_failures", MetricUnit.Count),
    ("LabelPatchesSkipped", "label_patches_skipped", MetricUnit.Count),
    ("SnapshotBytes", "snapshot_bytes", MetricUnit.Bytes),
    ("SnapshotWriteMs", "snapshot_write_ms", MetricUnit.Milliseconds),
    ("AmpQueryMs", "amp_query_ms", MetricUnit.Milliseconds),
    ("RunMs", "run_ms", MetricUnit.Milliseconds),
)


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    settings = _settings()
    report = refresh(
        settings, _services(settings), time_left=lambda: context.get_remaining_time_in_millis() / 1000, logger=logger
    )
    for name, attribute, unit in _METRICS:
        metrics.add_metric(name=name, unit=unit, value=round(float(getattr(report, attribute)), 3))
    metrics.add_metric(name="NodesWithoutGpuInfo", unit=MetricUnit.Count, value=sum(report.unlabelled.values()))
    metrics.add_metric(name="AmpQueryFailures", unit=MetricUnit.Count, value=int(report.amp_query_failed))
    metrics.add_metric(name="RunFailures", unit=MetricUnit.Count, value=int(report.status != "ok"))
    if settings.ledger_table:
        metrics.add_metric(name="LedgerReconcileFailures", unit=MetricUnit.Count, value=int(bool(report.ledger_error)))
        for kind, count in report.ledger_drift.items():
            emit_count("LedgerDrift", count, namespace=metrics.namespace, service=logger.service, kind=kind)
    summary = asdict(report)
    (logger.info if report.status == "ok" else logger.error)("node-state run", extra={"report": summary})
    return summary
