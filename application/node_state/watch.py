"""Watch mode (``WATCH_S`` > 0), the run's last job. After the run, the invocation keeps the snapshot fresh
until ``WATCH_S`` seconds after it started: a list+watch of nodes and bound pods
(:class:`adapters.cluster_mirror.ClusterMirror`), seeded with the run's lists, and a new snapshot written
``PUBLISH_DEBOUNCE_S`` after the first change it lacks. Set above the schedule's period, the next invocation
starts while this one still watches: no gap. Every snapshot carries the ``resourceVersion`` of its lists
(:class:`~scheduler_core.state.snapshot.Revision`) and the store writes it only over an older one,
atomically, so the overlap cannot put an older picture over a newer one. With the ledger, a share pod seen
deleted or finished frees its share at once. Labels, the ledger's reconcile and utilisation keep the
schedule: once per invocation."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from adapters.cluster_mirror import ClusterMirror, Taken
from adapters.kube import DRA_KINDS
from adapters.live_state import lag_quantiles
from adapters.snapshot_store import SnapshotStoreError
from application.node_state.publish import Utilization, build
from application.node_state.run import Run, node_name
from scheduler_core.k8s.dra import dra_facts_of
from scheduler_core.k8s.nodes import NodeTable
from scheduler_core.state.snapshot import Revision, write_snapshot


def watch(run: Run) -> None:
    """The job, timed as ``watch``, while the run is ok."""
    settings, time_left = run.settings, run.time_left
    watch_until = run.run_started + settings.watch_s
    with run.phase("watch"):
        watched = _watch(run, lambda: min(watch_until - time.monotonic(), time_left() - settings.deadline_margin_s))
    run.note(watch=watched, snapshots_kept_newer=run.report.snapshots_kept_newer + int(watched["kept_newer"]))


def _watch(run: Run, left: Callable[[], float]) -> dict[str, float]:
    """Watch while ``left()`` is positive; the report's ``watch`` fields."""
    settings = run.settings
    assert run.utilization is not None
    utilization, labels = run.utilization, dict(run.plan)
    started = time.monotonic()
    mirror = _seeded_mirror(run, watch_timeout_s=max(1, math.ceil(left())))
    lags: list[float] = []
    counts = {"publishes": 0, "kept_newer": 0, "publish_failures": 0}
    mirror.start()
    try:
        while (remaining := left()) > 0:
            first = mirror.next_change(min(remaining, 1.0))  # a second at most: a stop shows in left()
            if first is None:
                continue
            time.sleep(max(0.0, min(first + settings.publish_debounce_s - time.monotonic(), left())))
            outcome = _publish(run, utilization, labels, mirror.take())
            counts[outcome] += 1
            if outcome != "publish_failures":
                lags.append(time.monotonic() - first)
    finally:
        mirror.close()
    return {
        "seconds": round(time.monotonic() - started, 1),
        **counts,
        "events": mirror.counters["events"],
        "relists_410": mirror.counters["relists_410"],
        "watch_errors": mirror.counters["watch_errors"],
        "shares_released": mirror.counters["released"],
        **lag_quantiles(lags),
    }


def _seeded_mirror(run: Run, *, watch_timeout_s: int) -> ClusterMirror:
    """A mirror of the cluster seeded with the run's lists (its watches resume from their versions), all of
    it taken (the run wrote it already); with the ledger, the share of a pod seen gone is released."""
    services = run.services
    assert run.dra is not None
    seed_dra = run.dra
    mirror = ClusterMirror(lambda: services.kube, watch_timeout_s=watch_timeout_s, dra_api=seed_dra.api)
    if services.ledger is not None:
        ledger = services.ledger

        def release(node: str, uid: str) -> None:
            obj = mirror.node(node)
            if obj is None:
                return
            gpu_count = int(NodeTable.from_nodes([obj]).alloc_gpus[0])
            released = ledger.release(node, gpu_count, uid)
            if services.reservations is not None:
                services.reservations.released(
                    node, released.emptied, lambda: ledger.read(node, gpu_count).shared_slots()
                )

        mirror.on_gone = release
    mirror.seed("nodes", run.nodes, run.nodes_version)
    mirror.seed("pods", run.pods, run.pods_version)
    for kind, version in zip(DRA_KINDS, seed_dra.versions, strict=False):  # none where DRA is not served
        mirror.seed(kind, seed_dra.lists[kind], version)
    mirror.take()  # the run wrote these already
    return mirror


def _publish(run: Run, utilization: Utilization, labels: dict[str, dict[str, str]], taken: Taken) -> str:
    """Write a snapshot of what the mirror holds (``taken``), with the labels this run planned; which of
    the ``watch`` counts it adds to: ``publishes``, ``kept_newer`` (the store held a newer one) or
    ``publish_failures``."""
    nodes, pods, versions, dra_objects = taken
    for node in nodes:  # labels this run planned: what the API will show once the patches land
        changes = labels.get(node_name(node))
        if changes:
            node["metadata"].setdefault("labels", {}).update(changes)
    revision = Revision.of(list(versions.values()))
    dra = None if dra_objects is None else dra_facts_of(dra_objects)
    try:
        data = write_snapshot(build(run.settings, nodes, pods, utilization, run.now(), dra), revision=revision)
        written = run.services.store.put(data)
    except (SnapshotStoreError, ValueError) as exc:
        run.logger.error("watch: snapshot write failed; the next change tries again", extra={"error": str(exc)})
        return "publish_failures"
    return "publishes" if written is not None else "kept_newer"
