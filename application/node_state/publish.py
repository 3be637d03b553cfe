"""The snapshot the extender serves from: the utilisation job (one PromQL query for DCGM utilisation; if it
fails, the last known values from the previous snapshot, with their age) and the snapshot job (whole-GPU
and milli use per GPU, written atomically to ``SNAPSHOT_URI``, and only over an older revision). Watch mode
publishes through :func:`build` as well."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from adapters.amp import PrometheusQueryError, utilization_by_node, utilization_query
from adapters.snapshot_store import SnapshotStore, SnapshotStoreError
from application.node_state.run import Run
from application.node_state.settings import NodeStateSettings
from scheduler_core.k8s.dra import DraFacts
from scheduler_core.state.cluster import ClusterState
from scheduler_core.state.snapshot import Revision, SnapshotFormatError, build_snapshot, read_snapshot, write_snapshot


@dataclass(frozen=True)
class Utilization:
    by_node: dict[str, list[float]] | None
    measured_at: float | None
    report: dict[str, Any]


def build(
    settings: NodeStateSettings, nodes: list[dict[str, Any]], pods: list[dict[str, Any]], utilization: Utilization,
    at: float, dra: DraFacts | None,
) -> ClusterState:  # fmt: skip
    """The snapshot of ``nodes`` and ``pods`` as of ``at``."""
    return build_snapshot(
        nodes, pods, cluster=settings.cluster_name or "local", generated_at=at,
        gpu_utilization=utilization.by_node, utilization_at=utilization.measured_at, dra=dra,
    )  # fmt: skip


def read_utilization(run: Run) -> None:
    """The job: the utilisation the snapshot carries."""
    run.utilization = _utilization(run, run.now())
    run.note(**run.utilization.report)


def _utilization(run: Run, now: float) -> Utilization:
    settings, services, logger = run.settings, run.services, run.logger
    report: dict[str, Any] = {}
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
            elapsed = 1000 * (time.perf_counter() - started)
            return Utilization(by_node, now, {"utilization_source": "amp", "utilization_age_s": 0.0,
                                              "amp_query_ms": elapsed})  # fmt: skip
        except PrometheusQueryError as exc:
            logger.warning("utilisation query failed; keeping the last known values", extra={"error": str(exc)})
            report = {"amp_query_failed": True, "amp_query_ms": 1000 * (time.perf_counter() - started)}
    previous = _previous_utilization(services.store, now, logger)
    return replace(previous, report={**report, **previous.report})


def _previous_utilization(store: SnapshotStore, now: float, logger: Any) -> Utilization:
    try:
        fetched = store.fetch(None)
        previous = read_snapshot(fetched.data) if fetched is not None else None
    except (SnapshotStoreError, SnapshotFormatError) as exc:
        logger.warning("no previous snapshot to keep utilisation from", extra={"error": str(exc)})
        return Utilization(None, None, {})
    if previous is None or previous.utilization_at is None:
        return Utilization(None, None, {})
    age = round(now - previous.utilization_at, 1)
    return Utilization(
        previous.utilization_by_node(),
        previous.utilization_at,
        {"utilization_source": "previous", "utilization_age_s": age},
    )


def publish_snapshot(run: Run) -> None:
    """The job: build the snapshot and write it; a failed write fails the run (the labels, the reconcile
    and the placeholders still run: they do not depend on it)."""
    assert run.utilization is not None
    assert run.dra is not None
    logger, store = run.logger, run.services.store
    revision = Revision.of([run.nodes_version, run.pods_version, *run.dra.versions])
    dra = run.dra.facts()
    with run.phase("build_snapshot"):
        snapshot = run.snapshot = build(run.settings, run.nodes, run.pods, run.utilization, run.now(), dra)
        data = write_snapshot(snapshot, revision=revision)
    for problem in snapshot.problems[:20]:
        logger.warning("snapshot input problem", extra={"problem": problem})
    invalid = snapshot.table.invalid
    for row, reason in list(invalid.items())[:20]:
        logger.warning("node refused: over a cap", extra={"node": snapshot.table.names[row], "reason": reason})
    run.note(problems=len(snapshot.problems), snapshot_bytes=len(data), nodes_invalid=len(invalid),
             snapshot_revision=str(revision or ""), mig=snapshot.mig_summary(), dra=run.dra.summary(dra))  # fmt: skip
    write_started = time.perf_counter()
    try:
        if store.put(data) is None:
            run.note(snapshots_kept_newer=1)
            logger.info("the store holds a newer snapshot; kept it", extra={"revision": str(revision)})
    except SnapshotStoreError as exc:
        run.note(status="failed", error=f"writing the snapshot to {store.uri} failed: {exc}")
        logger.error("snapshot write failed", extra={"error": str(exc), "uri": store.uri})
    run.note(snapshot_write_ms=1000 * (time.perf_counter() - write_started))
