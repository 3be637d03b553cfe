"""Node-state refresher: GPU labels on nodes, and the cluster snapshot the extender serves from.

The orchestration of one run, returning a frozen :class:`RunReport`; the Lambda handler
(``lambdas/node_state/handler.py``) and ``gpu-scheduler refresh node-state`` both call :func:`refresh`.
One run:

1. lists every node (``limit=500`` pages with ``continue``);
2. looks up EC2 ``GpuInfo`` for the instance types of nodes without complete GFD labels (cached
   across invocations);
3. lists the non-terminal pods bound to nodes (field selector, paginated), keeping only what
   scheduling reads (decoded straight into :class:`adapters.kube_types.SchedulingPod`); where the API
   serves ``resource.k8s.io`` (DRA), its DeviceClasses, ResourceSlices and ResourceClaims too: GPUs that
   claims hold are in use, and nodes whose GPUs DRA manages take no share (:mod:`scheduler_core.k8s.dra`);
4. runs one PromQL query for DCGM utilisation; if it fails, the last known values are carried over
   from the previous snapshot, with their age;
5. builds the snapshot (whole-GPU and milli use per GPU) and writes it atomically to ``SNAPSHOT_URI``;
6. patches ``gpu.nvidia.com/model|memory|count`` where they should change: one merge patch per node,
   concurrently, until the deadline margin; what it skips is reported;
7. with ``LEDGER_TABLE`` (GPU sharing), reconciles the GPU ledger with the pods
   (:func:`scheduler_core.state.ledger.reconcile`): it frees what pods that are gone, finished or
   bound elsewhere still hold, records bound pods' annotations an item lacks, and rebuilds missing
   items. The ledger is read before the pods are listed, and unbound pods before bound ones, so that
   a bind in flight is never mistaken for a leftover; each write is conditional on the version read.

The snapshot is written before the labels, so that a slow API cannot leave the extender stale;
it already reflects the labels being written.

**Watch mode** (``WATCH_S`` > 0). After the run, the invocation keeps the snapshot fresh until
``WATCH_S`` seconds after it started: a list+watch of nodes and bound pods
(:class:`adapters.live_state.ClusterMirror`), seeded with the run's lists, and a new snapshot written
``PUBLISH_DEBOUNCE_S`` after the first change it lacks. Set above the schedule's period, the next
invocation starts while this one still watches: no gap. Every snapshot carries the ``resourceVersion``
of its lists (:class:`~scheduler_core.state.snapshot.Revision`) and the store writes it only over an
older one, atomically, so the overlap cannot put an older picture over a newer one. With the ledger,
a share pod seen deleted or finished frees its share at once. Labels, the ledger's reconcile and
utilisation keep the schedule: once per invocation.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, cast

from adapters.amp import PrometheusClient, PrometheusQueryError, utilization_by_node, utilization_query
from adapters.ec2_gpu import GpuInfoCatalog
from adapters.gpu_ledger import LedgerStore, LedgerStoreError
from adapters.kube import DRA_KINDS, DeadlineReachedError, KubeApiError, KubeClient
from adapters.kube_types import SchedulingPod
from adapters.live_state import ClusterMirror, lag_quantiles
from adapters.reservations import Reservations
from adapters.snapshot_store import SnapshotStore, SnapshotStoreError, open_store
from application.node_state.settings import NodeStateSettings
from manifests.placeholder import placeholder_pod
from manifests.reservation import reserving
from scheduler_core.errors import InvalidPodError
from scheduler_core.k8s.annotations import Pairs, gpu_uuid, trusted_assigned_gpus
from scheduler_core.k8s.dra import DraFacts, dra_facts_of
from scheduler_core.k8s.names import (
    ASSIGNED_GPUS_ANNOTATION,
    GFD_PRODUCT,
    GPU_RESOURCE,
    LABEL_INSTANCE_TYPE,
    MILLI_PER_GPU,
    MILLI_RESOURCE,
    PLACEHOLDER_APP,
    PLACEHOLDER_NAMESPACE,
    RESERVED_GPU_ANNOTATION,
    SCHEDULER_NAME,
    VISIBLE_DEVICES_ANNOTATION,
)
from scheduler_core.k8s.node_labels import LabelPolicy, desired_info, label_changes
from scheduler_core.k8s.nodes import NodeTable
from scheduler_core.k8s.pods import effective_requests
from scheduler_core.state.allocation import reservation_of
from scheduler_core.state.demand import PlaceholderCaps, cap_demand, plan_placeholders, share_demand
from scheduler_core.state.ledger import NodeLedger, reconcile
from scheduler_core.state.snapshot import (
    Revision,
    SnapshotFormatError,
    build_snapshot,
    read_snapshot,
    write_snapshot,
)

ASSIGNED_NON_TERMINAL = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
UNASSIGNED_NON_TERMINAL = "spec.nodeName=,status.phase!=Succeeded,status.phase!=Failed"
PENDING_SHARES = f"spec.nodeName=,spec.schedulerName={SCHEDULER_NAME},status.phase=Pending"
"""The pods that may be unschedulable shares of the profile (the rest of the test is on the pod)."""

log = logging.getLogger(__name__)

Plan = list[tuple[str, dict[str, str]]]
"""Label changes per node name."""


@dataclass(frozen=True)
class RunReport:
    status: str = "ok"  # "ok", or "failed" when no snapshot could be written
    error: str = ""
    nodes_seen: int = 0
    nodes_invalid: int = 0  # over a cap of scheduler_core.k8s.limits: refused to every pod
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
    reservations: dict[str, int] = field(default_factory=dict)  # reconciled reservation pods: created, deleted
    placeholders: dict[str, int] = field(default_factory=dict)  # whole-GPU demand of unschedulable shares
    snapshot_revision: str = ""
    snapshots_kept_newer: int = 0  # writes skipped: the store already held a newer snapshot
    watch: dict[str, float] = field(default_factory=dict)  # WATCH_S: events, publishes, lag
    dra: dict[str, Any] = field(default_factory=dict)  # the version read, nodes it manages, GPUs published and claimed
    mig: dict[str, Any] = field(default_factory=dict)  # MIG nodes by mode, slices by profile (ClusterState.mig_summary)


@dataclass
class Services:
    kube: KubeClient
    store: SnapshotStore
    catalog: GpuInfoCatalog | None  # None: no EC2 lookups (a cluster outside AWS)
    prometheus: PrometheusClient | None
    ledger: LedgerStore | None = None
    reservations: Reservations | None = None  # with the ledger: one reservation pod per GPU shares hold


def build_services(settings: NodeStateSettings, session: Any, *, ec2: bool = True) -> Services:
    """The clients one run needs, from ``settings`` and a boto3 session (kept while a Lambda stays warm,
    and the EC2 cache with them). ``ec2`` False looks up no instance type: nodes without GPU Feature
    Discovery labels then keep the GPU labels they have."""
    prometheus = (
        PrometheusClient(
            settings.amp_query_url, region=session.region_name or "", credentials=session.get_credentials()
        )
        if settings.amp_query_url
        else None
    )
    kube = settings.connect(session)
    reserve = bool(settings.ledger_table) and reserving(settings.reservation_image)
    return Services(
        kube=kube,
        store=open_store(settings.snapshot_uri, s3_client=session.client("s3")),
        catalog=GpuInfoCatalog(session.client("ec2")) if ec2 else None,
        prometheus=prometheus,
        ledger=LedgerStore(settings.ledger_table, session.client("dynamodb")) if settings.ledger_table else None,
        reservations=Reservations(lambda: kube, settings.reservation_image) if reserve else None,
    )


@dataclass
class _LedgerView:
    """What the reconcile needs, gathered in the order that makes it safe (see the module docstring)."""

    items: dict[str, NodeLedger] | None
    live: set[str] = field(default_factory=set)
    bound_to: dict[str, str] = field(default_factory=dict)
    annotated: dict[str, dict[str, Pairs]] = field(default_factory=dict)
    reservations: dict[str, dict[int, str]] = field(default_factory=dict)  # node -> GPU slot -> pod name
    reported: dict[tuple[str, int], str] = field(default_factory=dict)  # (node, slot) -> the UUID reported
    # Each bound share's (node, slot), the UUID its containers read (its Binding's), and its name.
    visible: list[tuple[tuple[str, int], str, str]] = field(default_factory=list)
    error: str = ""
    invalid_annotations: int = 0


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
    phases: dict[str, float] = {}
    report = RunReport(dry_run=settings.label_dry_run, phases_ms=phases)
    kube = services.kube
    kube.deadline = lambda: time_left() - settings.deadline_margin_s
    retries_before = kube.retries
    run_started = time.monotonic()
    try:
        with _phase(phases, "list_nodes"):
            nodes, nodes_version = kube.list_with_version("nodes")
            nodes = [node for node in nodes if _node_name(node)]
        policy = cast(LabelPolicy, settings.label_policy)  # validated by NodeStateSettings
        with _phase(phases, "plan_labels"):
            plan, unlabelled = _plan_labels(nodes, services.catalog, policy, logger)
        report = replace(report, nodes_seen=len(nodes), unlabelled=unlabelled, label_patches_planned=len(plan))
        ledger_view = _read_ledger(services, phases, logger) if services.ledger is not None else None
        with _phase(phases, "list_pods"):
            pods, pods_version = kube.list_with_version(
                "pods", field_selector=ASSIGNED_NON_TERMINAL, item_type=SchedulingPod
            )
        report = replace(report, pods_seen=len(pods))
        if ledger_view is not None:
            _note_bound(ledger_view, pods)
        with _phase(phases, "list_dra"):
            dra_lists = _list_dra(kube)
    except (KubeApiError, DeadlineReachedError) as exc:
        logger.error("run failed before a snapshot could be built", extra={"error": str(exc)})
        return replace(
            report,
            status="failed",
            error=f"listing the cluster failed: {exc}",
            run_ms=1000 * (time.perf_counter() - started),
        )

    utilization = _utilization(settings, services, now(), logger)
    report = replace(report, **utilization.report)
    revision = Revision.of([nodes_version, pods_version, *dra_lists.versions])
    dra = dra_lists.facts()
    with _phase(phases, "build_snapshot"):
        snapshot = _snapshot(settings, nodes, pods, utilization, now(), dra)
        data = write_snapshot(snapshot, revision=revision)
    for problem in snapshot.problems[:20]:
        logger.warning("snapshot input problem", extra={"problem": problem})
    invalid = snapshot.table.invalid
    for row, reason in list(invalid.items())[:20]:
        logger.warning("node refused: over a cap", extra={"node": snapshot.table.names[row], "reason": reason})
    report = replace(report, problems=len(snapshot.problems), snapshot_bytes=len(data), nodes_invalid=len(invalid),
                     snapshot_revision=str(revision or ""), mig=snapshot.mig_summary(),
                     dra=dra_lists.summary(dra))  # fmt: skip
    write_started = time.perf_counter()
    try:
        if services.store.put(data) is None:
            report = replace(report, snapshots_kept_newer=1)
            logger.info("the store holds a newer snapshot; kept it", extra={"revision": str(revision)})
    except SnapshotStoreError as exc:
        report = replace(report, status="failed", error=f"writing the snapshot to {services.store.uri} failed: {exc}")
        logger.error("snapshot write failed", extra={"error": str(exc), "uri": services.store.uri})
    report = replace(report, snapshot_write_ms=1000 * (time.perf_counter() - write_started))

    with _phase(phases, "patch_labels"):
        report = replace(report, **_apply_labels(plan, settings, kube, logger))
    if ledger_view is not None:
        drift = {"invalid_annotation": ledger_view.invalid_annotations} if ledger_view.invalid_annotations else {}
        report = replace(report, ledger_drift=drift, ledger_error=ledger_view.error)
        if ledger_view.items is not None and services.ledger is not None:
            with _phase(phases, "reconcile_ledger"):
                table = snapshot.table  # a node over a cap has no GPU count to rebuild an item with
                gpu_counts = {name: count for row, (name, count) in enumerate(zip(table.names,
                              table.alloc_gpus.tolist(), strict=True)) if row not in table.invalid}  # fmt: skip
                report = replace(
                    report,
                    **_reconcile(services.ledger, ledger_view, gpu_counts, drift, logger, services.reservations),
                )
        if services.reservations is not None:
            with _phase(phases, "placeholders"):
                placeholders = _placeholders(kube, services.reservations.image, settings.placeholder_caps, logger)
                report = replace(report, placeholders=placeholders)
    if settings.watch_s > 0 and report.status == "ok":
        with _phase(phases, "watch"):
            seed = _Seed(nodes, nodes_version, pods, pods_version, dict(plan), dra_lists)
            watch_until = run_started + settings.watch_s
            watched = _watch(settings, services, seed, utilization,
                             lambda: min(watch_until - time.monotonic(), time_left() - settings.deadline_margin_s),
                             now, logger)  # fmt: skip
        report = replace(
            report, watch=watched, snapshots_kept_newer=report.snapshots_kept_newer + int(watched["kept_newer"])
        )
    return replace(report, api_retries=kube.retries - retries_before, run_ms=1000 * (time.perf_counter() - started))


def _snapshot(
    settings: NodeStateSettings, nodes: list[dict[str, Any]], pods: list[dict[str, Any]], utilization: _Utilization,
    at: float, dra: DraFacts | None,
) -> Any:  # fmt: skip
    return build_snapshot(
        nodes, pods, cluster=settings.cluster_name or "local", generated_at=at,
        gpu_utilization=utilization.by_node, utilization_at=utilization.measured_at, dra=dra,
    )  # fmt: skip


@dataclass(frozen=True)
class _DraLists:
    """DRA's objects as listed (``api`` "" where the API serves no version the product reads)."""

    api: str = ""
    lists: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    versions: tuple[str, ...] = ()

    def facts(self) -> DraFacts | None:
        if not self.api:
            return None
        return dra_facts_of(self.lists)

    def summary(self, facts: DraFacts | None) -> dict[str, Any]:
        if facts is None:
            return {}
        return {"api": self.api, "nodes": len(facts.managed), "gpus_published": sum(facts.published.values()),
                "gpus_claimed": sum(facts.claimed.values()), "extended_resource": facts.extended}  # fmt: skip


def _list_dra(kube: KubeClient) -> _DraLists:
    """DeviceClasses, ResourceSlices and ResourceClaims, where the API serves DRA."""
    api = kube.dra_api()
    if not api:
        return _DraLists()
    lists, versions = {}, []
    for kind in DRA_KINDS:
        lists[kind], version = kube.list_with_version(kind)
        versions.append(version)
    return _DraLists(api, lists, tuple(versions))


@dataclass(frozen=True)
class _Seed:
    """The run's lists, where the watch starts from, and the label changes it planned."""

    nodes: list[dict[str, Any]]
    nodes_version: str
    pods: list[dict[str, Any]]
    pods_version: str
    labels: dict[str, dict[str, str]]
    dra: _DraLists


def _watch(
    settings: NodeStateSettings,
    services: Services,
    seed: _Seed,
    utilization: _Utilization,
    left: Callable[[], float],
    now: Callable[[], float],
    logger: Any,
) -> dict[str, float]:
    """Watch mode (see the module docstring) while ``left()`` is positive; the report's ``watch`` fields."""
    started = time.monotonic()
    mirror = ClusterMirror(lambda: services.kube, watch_timeout_s=max(1, math.ceil(left())), dra_api=seed.dra.api)
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
    mirror.seed("nodes", seed.nodes, seed.nodes_version)
    mirror.seed("pods", seed.pods, seed.pods_version)
    for kind, version in zip(DRA_KINDS, seed.dra.versions, strict=False):  # none where DRA is not served
        mirror.seed(kind, seed.dra.lists[kind], version)
    mirror.take()  # the run wrote these already
    lags: list[float] = []
    counts = {"publishes": 0, "kept_newer": 0, "publish_failures": 0}
    mirror.start()
    try:
        while (remaining := left()) > 0:
            first = mirror.next_change(min(remaining, 1.0))  # a second at most: a stop shows in left()
            if first is None:
                continue
            time.sleep(max(0.0, min(first + settings.publish_debounce_s - time.monotonic(), left())))
            nodes, pods, versions, dra_objects = mirror.take()
            for node in nodes:  # labels this run planned: what the API will show once the patches land
                changes = seed.labels.get(_node_name(node))
                if changes:
                    node["metadata"].setdefault("labels", {}).update(changes)
            revision = Revision.of(list(versions.values()))
            dra = None if dra_objects is None else dra_facts_of(dra_objects)
            try:
                data = write_snapshot(_snapshot(settings, nodes, pods, utilization, now(), dra), revision=revision)
                written = services.store.put(data)
            except (SnapshotStoreError, ValueError) as exc:
                counts["publish_failures"] += 1
                logger.error("watch: snapshot write failed; the next change tries again", extra={"error": str(exc)})
                continue
            counts["publishes" if written is not None else "kept_newer"] += 1
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


def _read_ledger(services: Services, phases: dict[str, float], logger: Any) -> _LedgerView:
    """The ledger items, then the UIDs of unbound non-terminal pods (a failed read skips the reconcile)."""
    assert services.ledger is not None
    with _phase(phases, "read_ledger"):
        try:
            items = {item.node: item for item in services.ledger.scan()}
        except LedgerStoreError as exc:
            logger.error("ledger read failed; no reconcile this run", extra={"error": str(exc)})
            return _LedgerView(None, error=f"reading the GPU ledger failed: {exc}")
    with _phase(phases, "list_unbound_pods"):
        unbound = services.kube.list_all("pods", field_selector=UNASSIGNED_NON_TERMINAL, item_type=SchedulingPod)
    view = _LedgerView(items)
    view.live.update(uid for pod in unbound if (uid := (pod.get("metadata") or {}).get("uid")))
    return view


def _note_bound(view: _LedgerView, pods: list[dict[str, Any]]) -> None:
    """Record the bound pods' UIDs, nodes and ``assigned-gpus`` annotations (an invalid one is left
    to the snapshot's problems, which already name it)."""
    for pod in pods:
        metadata, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        uid, node = metadata.get("uid"), spec.get("nodeName")
        if not uid or not node:
            continue
        annotations = metadata.get("annotations") or {}
        held_for = reservation_of(pod)
        if held_for is not None:
            view.reservations.setdefault(held_for[0], {})[held_for[1]] = str(metadata.get("name") or "")
            if (uuid := gpu_uuid(annotations.get(RESERVED_GPU_ANNOTATION))) is not None:
                view.reported[held_for] = uuid
        view.live.add(uid)
        view.bound_to[uid] = node
        text = annotations.get(ASSIGNED_GPUS_ANNOTATION)
        if text is None:
            continue
        try:
            gpus, milli = effective_requests(spec, (GPU_RESOURCE, MILLI_RESOURCE))
            pairs = trusted_assigned_gpus(text, spec.get("schedulerName"), gpus, milli)
        except InvalidPodError:
            view.invalid_annotations += 1  # malformed, or not to be believed: never copied into the ledger
            continue
        view.annotated.setdefault(node, {})[uid] = pairs
        visible = annotations.get(VISIBLE_DEVICES_ANNOTATION)
        if visible is not None and len(pairs) == 1 and pairs[0][1] < MILLI_PER_GPU:
            view.visible.append(
                ((node, pairs[0][0]), str(visible), f"{metadata.get('namespace')}/{metadata.get('name')}")
            )


def _reconcile(
    ledger: LedgerStore,
    view: _LedgerView,
    gpu_counts: dict[str, int],
    drift: dict[str, int],
    logger: Any,
    reservations: Reservations | None = None,
) -> dict[str, Any]:
    """Write what the reconcile found, then make the reservation pods agree with the items as written;
    the report's ledger fields."""
    assert view.items is not None
    outcome = reconcile(view.items, view.live, view.bound_to, view.annotated, gpu_counts)
    counts = dict(drift)
    for kind, count in outcome.counts().items():
        counts[kind] = counts.get(kind, 0) + count
    for found in outcome.drift[:20]:
        logger.warning("ledger drift", extra={"kind": found.kind, "node": found.node, "pod_uid": found.uid,
                                              "detail": found.detail})  # fmt: skip
    writes = conflicts = 0
    error = ""
    items = dict(view.items)
    for item, read_version in outcome.writes:
        try:
            written = ledger.write(item, read_version)
        except LedgerStoreError as exc:
            error = f"writing the GPU ledger failed: {exc}"
            logger.error("ledger write failed; the rest waits for the next run", extra={"error": str(exc)})
            break
        if written:
            writes += 1
            items[item.node] = item
        else:
            conflicts += 1
    report: dict[str, Any] = {
        "ledger_drift": counts, "ledger_writes": writes, "ledger_write_conflicts": conflicts, "ledger_error": error
    }  # fmt: skip
    if reservations is not None and not error:
        try:
            done = reservations.reconcile(
                items, view.reservations, lambda node: ledger.read(node, gpu_counts.get(node, 0))
            )
        except (LedgerStoreError, DeadlineReachedError) as exc:
            logger.error("reservation pods not reconciled; the next run tries again", extra={"error": str(exc)})
            done = {"reservation_errors": 1}
        report["reservations"] = {**done, "uuid_mismatches": _uuid_mismatches(view, logger)}
    return report


def _uuid_mismatches(view: _LedgerView, logger: Any) -> int:
    """Bound shares whose containers read a UUID (their Binding's) other than the one their GPU's
    reservation pod reports now: a reservation pod re-created onto another GPU by the device plugin, or
    a node replaced under the same name. The GPU such shares use is then held by no reservation pod, so
    the device plugin may give it to a whole-GPU pod. Counted (the report's ``uuid_mismatches``) and
    logged, not repaired: a container's environment does not change, and deleting a tenant's pods is
    its owner's call (their controllers re-create them, bound with the UUID of now)."""
    found = [(where, seen, name) for where, seen, name in view.visible if view.reported.get(where, seen) != seen]
    for (node, slot), seen, name in found[:20]:
        logger.warning("a share's containers read another UUID than its GPU's reservation pod reports",
                       extra={"pod": name, "node": node, "slot": slot, "reads": seen,
                              "reported": view.reported[(node, slot)]})  # fmt: skip
    return len(found)


def _placeholders(kube: KubeClient, image: str, caps: PlaceholderCaps, logger: Any) -> dict[str, int]:
    """Keep one placeholder pod per whole GPU that the unschedulable shares need, by group, within ``caps``
    (:mod:`scheduler_core.state.demand`, ``manifests/placeholder.py``); the report's counts. An API
    error ends the step, logged: the next run tries again."""
    done = {"demand_gpus": 0, "unschedulable_shares": 0, "held_back": 0, "created": 0, "deleted": 0, "errors": 0}
    try:
        pending = kube.list_all("pods", field_selector=PENDING_SHARES)
        existing = kube.list_all(
            "pods",
            label_selector=f"app.kubernetes.io/name={PLACEHOLDER_APP}",
            field_selector=f"metadata.namespace={PLACEHOLDER_NAMESPACE}",
        )
        demand = cap_demand(share_demand(pending), caps)
        done["demand_gpus"] = sum(d.gpus for d in demand)
        done["unschedulable_shares"] = sum(d.shares for d in demand)
        done["held_back"] = sum(d.held_back for d in demand)
        if done["held_back"]:
            logger.warning("placeholders held back by their caps", extra={
                "gpus": done["held_back"], "per_namespace": caps.per_namespace, "total": caps.total,
                "namespaces": sorted({d.namespace for d in demand if d.held_back})[:20]})  # fmt: skip
        plan = plan_placeholders(demand, existing)
        for name in plan.delete:
            try:
                kube.delete_pod(PLACEHOLDER_NAMESPACE, name, grace_period_s=0)
                done["deleted"] += 1
            except KubeApiError as exc:
                if exc.status != 404:
                    raise
        groups = {d.key: d for d in demand}
        for key, index in plan.create:
            cpu, memory = groups[key].per_gpu[index]
            body = placeholder_pod(key, index, groups[key].requirements, image=image, cpu_milli=cpu, memory=memory)
            try:
                kube.create_pod(PLACEHOLDER_NAMESPACE, body)
                done["created"] += 1
            except KubeApiError as exc:
                if exc.status != 409:
                    raise
    except (KubeApiError, DeadlineReachedError) as exc:
        done["errors"] += 1
        logger.warning("placeholders not kept up to date; the next run tries again", extra={"error": str(exc)})
    return done


@contextmanager
def _phase(phases: dict[str, float], name: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = round(1000 * (time.perf_counter() - started), 1)


def _node_name(node: Any) -> str:
    metadata = node.get("metadata") if isinstance(node, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) else ""


def _plan_labels(
    nodes: list[dict[str, Any]], catalog: GpuInfoCatalog | None, policy: LabelPolicy, logger: Any
) -> tuple[Plan, dict[str, int]]:
    """Label changes per node, and the nodes left unlabelled by reason; applies the changes to the
    listed objects so the snapshot matches."""
    needs_ec2 = {
        labels.get(LABEL_INSTANCE_TYPE)
        for node in nodes
        if GFD_PRODUCT not in (labels := node["metadata"].get("labels") or {})
    }
    ec2 = catalog.lookup(t for t in needs_ec2 if isinstance(t, str)) if catalog is not None else {}
    plan: Plan = []
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
    return plan, {reason: len(names) for reason, names in unlabelled.items()}


@dataclass(frozen=True)
class _Utilization:
    by_node: dict[str, list[float]] | None
    measured_at: float | None
    report: dict[str, Any]


def _utilization(settings: NodeStateSettings, services: Services, now: float, logger: Any) -> _Utilization:
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
            return _Utilization(by_node, now, {"utilization_source": "amp", "utilization_age_s": 0.0,
                                               "amp_query_ms": elapsed})  # fmt: skip
        except PrometheusQueryError as exc:
            logger.warning("utilisation query failed; keeping the last known values", extra={"error": str(exc)})
            report = {"amp_query_failed": True, "amp_query_ms": 1000 * (time.perf_counter() - started)}
    previous = _previous_utilization(services.store, now, logger)
    return replace(previous, report={**report, **previous.report})


def _previous_utilization(store: SnapshotStore, now: float, logger: Any) -> _Utilization:
    try:
        fetched = store.fetch(None)
        previous = read_snapshot(fetched.data) if fetched is not None else None
    except (SnapshotStoreError, SnapshotFormatError) as exc:
        logger.warning("no previous snapshot to keep utilisation from", extra={"error": str(exc)})
        return _Utilization(None, None, {})
    if previous is None or previous.utilization_at is None:
        return _Utilization(None, None, {})
    age = round(now - previous.utilization_at, 1)
    return _Utilization(
        previous.utilization_by_node(),
        previous.utilization_at,
        {"utilization_source": "previous", "utilization_age_s": age},
    )


def _apply_labels(plan: Plan, settings: NodeStateSettings, kube: KubeClient, logger: Any) -> dict[str, Any]:
    """Send the label patches, concurrently, until the deadline; the report's label counts."""
    if settings.label_dry_run:
        for name, changes in plan:
            logger.info("dry run: would label node", extra={"node": name, "labels": changes})
        return {}

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
    skipped = outcomes.count("skipped")
    if skipped:
        logger.warning("deadline reached: label patches skipped until the next run", extra={"skipped": skipped})
    return {
        "nodes_labeled": outcomes.count("labeled"),
        "label_patch_failures": outcomes.count("failed"),
        "label_patches_skipped": skipped,
    }
