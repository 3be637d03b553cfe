"""With ``LEDGER_TABLE`` (GPU sharing), the GPU ledger's reconcile with the pods
(:func:`scheduler_core.state.ledger.reconcile`): it frees what pods that are gone, finished or bound elsewhere
still hold, records bound pods' annotations an item lacks, and rebuilds missing items; then the reservation
pods are made to agree with the items as written. The ledger is read before the pods are listed, and
unbound pods before bound ones, so that a bind in flight is never mistaken for a leftover; each write is
conditional on the version read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from adapters.gpu_ledger import LedgerStore, LedgerStoreError
from adapters.kube_transport import DeadlineReachedError
from adapters.kube_types import SchedulingPod
from application.node_state.run import Run
from scheduler_core.errors import InvalidPodError
from scheduler_core.k8s.annotations import Pairs, gpu_uuid, trusted_assigned_gpus
from scheduler_core.k8s.names import (
    ASSIGNED_GPUS_ANNOTATION,
    GPU_RESOURCE,
    MILLI_PER_GPU,
    MILLI_RESOURCE,
    RESERVED_GPU_ANNOTATION,
    VISIBLE_DEVICES_ANNOTATION,
)
from scheduler_core.k8s.pod_requests import effective_requests
from scheduler_core.state.allocation import reservation_of
from scheduler_core.state.ledger import NodeLedger, reconcile
from shares.reservations import Reservations

UNASSIGNED_NON_TERMINAL = "spec.nodeName=,status.phase!=Succeeded,status.phase!=Failed"


@dataclass
class LedgerView:
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


def read_ledger(run: Run) -> LedgerView:
    """The ledger items, then the UIDs of unbound non-terminal pods (a failed read skips the reconcile)."""
    services, logger = run.services, run.logger
    assert services.ledger is not None
    with run.phase("read_ledger"):
        try:
            items = {item.node: item for item in services.ledger.scan()}
        except LedgerStoreError as exc:
            logger.error("ledger read failed; no reconcile this run", extra={"error": str(exc)})
            return LedgerView(None, error=f"reading the GPU ledger failed: {exc}")
    with run.phase("list_unbound_pods"):
        unbound = services.kube.list_all("pods", field_selector=UNASSIGNED_NON_TERMINAL, item_type=SchedulingPod)
    view = LedgerView(items)
    view.live.update(uid for pod in unbound if (uid := (pod.get("metadata") or {}).get("uid")))
    return view


def note_bound(view: LedgerView, pods: list[dict[str, Any]]) -> None:
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


def reconcile_ledger(run: Run) -> None:
    """The job: the drift found while listing, then, when the ledger was read, the reconcile's writes
    and the reservation pods."""
    view, ledger = run.ledger, run.services.ledger
    assert view is not None
    assert run.snapshot is not None
    drift = {"invalid_annotation": view.invalid_annotations} if view.invalid_annotations else {}
    run.note(ledger_drift=drift, ledger_error=view.error)
    if view.items is None or ledger is None:
        return
    with run.phase("reconcile_ledger"):
        table = run.snapshot.table  # a node over a cap has no GPU count to rebuild an item with
        gpu_counts = {name: count for row, (name, count) in enumerate(zip(table.names,
                      table.alloc_gpus.tolist(), strict=True)) if row not in table.invalid}  # fmt: skip
        run.note(**_reconcile(ledger, view, gpu_counts, drift, run.logger, run.services.reservations))


def _reconcile(
    ledger: LedgerStore,
    view: LedgerView,
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


def _uuid_mismatches(view: LedgerView, logger: Any) -> int:
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
