"""The ``bind`` verb's I/O: the GPU ledger in DynamoDB, then the pod annotation, then the Binding.

One bind (DESIGN section 5):

1. GET the pod. A pod that is gone, or re-created under the same name (another UID), fails the
   bind. A pod already bound to this node with its annotation in place is a retried bind: success,
   nothing written (kube-scheduler retries a bind whose answer it did not get in ``httpTimeout``).
2. Record its GPUs in the node's ledger item: a conditional write on the item's version, idempotent
   per pod UID, with one re-read and a fresh GPU choice on a conflict (``LedgerStore.assign``).
   Whole-GPU pods are recorded too, so the ledger holds every GPU on the node. What the ledger showed
   free there (after this bind, or when it had no room) goes to ``readings``, which filter and prioritize
   lay over the snapshot.
3. Merge-patch ``gpu-scheduler.io/assigned-gpus`` onto the pod: the device plugin side and the
   node-state refresher read it.
4. POST the Binding. A 409 whose pod turns out bound to this very node is a success.

If step 3 or 4 fails, the ledger entry is released again (and the annotation removed), so that a
failed bind never holds GPUs; kube-scheduler then retries the pod. Idempotency comes from the ledger
keyed by pod UID and the pod's own state, not from a separate idempotency table: a repeat finds the
same assignment and writes nothing new.

The Kubernetes client is made on the first bind (``connect`` imports ``kubernetes`` lazily), so
filter and prioritize never load it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from adapters.gpu_ledger import Assigned, LedgerConflictError, LedgerStore, LedgerStoreError, NoRoomError
from adapters.kube import DeadlineReachedError, KubeApiError, KubeClient, RetryPolicy
from adapters.ledger_readings import LedgerReadings
from adapters.settings import ClusterAccess
from scheduler_core.errors import ClusterStateUnavailableError, InvalidPodError
from scheduler_core.extender.facade import BindOutcome
from scheduler_core.extender.preemption import Holdings
from scheduler_core.extender.wire import ExtenderBindingArgs
from scheduler_core.k8s.names import ASSIGNED_GPUS_ANNOTATION, MILLI_PER_GPU
from scheduler_core.k8s.nodes import NodeTable
from scheduler_core.k8s.pods import pod_demand
from scheduler_core.state.cluster import ClusterState
from scheduler_core.state.ledger import Demand

log = logging.getLogger(__name__)

KubeFactory = Callable[[], KubeClient]
BIND_RETRY = RetryPolicy(attempts=2, base_s=0.05, max_s=0.2, request_timeout_s=1.0)
"""Bind has kube-scheduler's ``httpTimeout`` (3 s) for all of its calls: short ones, one quick retry."""


class LedgerBinder:
    """:class:`scheduler_core.extender.Accounting` on a DynamoDB ledger and the Kubernetes API.

    Parameters
    ----------
    ledger : LedgerStore
    kube : callable returning a KubeClient, called once, on the first bind
    cluster : the extender's cluster source, for each node's GPU count (the node is read from the
        API when the state lacks it)
    readings : what this instance learned from the ledger, which filter and prioritize lay over the snapshot
    """

    def __init__(
        self,
        ledger: LedgerStore,
        kube: KubeFactory,
        cluster: Callable[[], ClusterState | None] | None = None,
        readings: LedgerReadings | None = None,
    ) -> None:
        self.ledger = ledger
        self._kube_factory = kube
        self._kube: KubeClient | None = None
        self._kube_lock = threading.Lock()
        self._cluster = cluster or (lambda: None)
        self.readings = readings or LedgerReadings()

    @property
    def kube(self) -> KubeClient:
        with self._kube_lock:
            if self._kube is None:
                self._kube = self._kube_factory()
            return self._kube

    # -- bind --------------------------------------------------------------------------------------
    def bind(self, args: ExtenderBindingArgs) -> BindOutcome:
        pod_key = f"{args.pod_namespace}/{args.pod_name}"

        def failed(kind: str, message: str, **extra: Any) -> BindOutcome:
            return BindOutcome(pod_key, args.node, f"bind {pod_key} to {args.node}: {message}", kind, **extra)

        try:
            pod = self.kube.get_pod(args.pod_namespace, args.pod_name)
        except KubeApiError as exc:
            return failed("pod_gone" if exc.status == 404 else "kube_error", f"reading the pod: {exc}")
        except DeadlineReachedError as exc:
            return failed("kube_error", str(exc))
        metadata = pod.get("metadata") or {}
        if metadata.get("uid") != args.pod_uid:
            return failed("pod_gone", f"the pod now has UID {metadata.get('uid')!r}, not {args.pod_uid!r}")
        spec = pod.get("spec") or {}
        assigned = (metadata.get("annotations") or {}).get(ASSIGNED_GPUS_ANNOTATION, "")
        if spec.get("nodeName"):
            if spec["nodeName"] != args.node:
                return failed("already_bound", f"the pod is already bound to {spec['nodeName']}")
            return BindOutcome(pod_key, args.node, assigned=assigned, already=True)
        try:
            demand = pod_demand(pod)
        except InvalidPodError as exc:
            return failed("invalid_pod", str(exc))
        if demand.gpus == 0:
            return self._post_binding(args, pod_key, None)
        try:
            gpu_count = self._gpu_count(args.node)
        except (ClusterStateUnavailableError, KubeApiError, DeadlineReachedError) as exc:
            return failed("node_unknown", f"reading the node's GPU count: {exc}")
        ledger_demand = Demand(1, demand.share) if demand.share else Demand(demand.gpus, MILLI_PER_GPU)
        try:
            held = self.ledger.assign(args.node, gpu_count, args.pod_uid, ledger_demand)
        except NoRoomError as exc:
            self.readings.observe(args.node, exc.free)  # the snapshot was stale here: the next filter knows
            return failed("no_room", str(exc))
        except LedgerConflictError as exc:
            return failed("conflict", str(exc), conflicts=exc.conflicts)
        except LedgerStoreError as exc:
            return failed("ledger_error", str(exc))
        if held.annotation != assigned:
            try:
                self.kube.patch_pod_annotations(
                    args.pod_namespace, args.pod_name, {ASSIGNED_GPUS_ANNOTATION: held.annotation}
                )
            except (KubeApiError, DeadlineReachedError) as exc:
                rolled = self._roll_back(args, gpu_count, annotated=False)
                return failed("kube_error", f"annotating the pod: {exc}", conflicts=held.conflicts, rolled_back=rolled)
        bound = self._post_binding(args, pod_key, held, gpu_count)
        if not bound.error:
            self.readings.observe(args.node, held.free)  # the other instances' binds there, and this one
        return bound

    def _post_binding(
        self, args: ExtenderBindingArgs, pod_key: str, held: Assigned | None, gpu_count: int = 0
    ) -> BindOutcome:
        """POST the Binding for a pod whose GPUs the ledger now records as ``held`` (None: no GPU)."""
        annotation = held.annotation if held is not None else ""
        conflicts = held.conflicts if held is not None else 0
        already = held is not None and held.already
        try:
            self.kube.bind_pod(args.pod_namespace, args.pod_name, args.pod_uid, args.node)
        except (KubeApiError, DeadlineReachedError) as exc:
            if not (isinstance(exc, KubeApiError) and exc.status == 409 and self._bound_here(args)):
                rolled = held is not None and self._roll_back(args, gpu_count, annotated=True)
                message = f"bind {pod_key} to {args.node}: posting the Binding: {exc}"
                return BindOutcome(
                    pod_key, args.node, message, "kube_error", annotation, conflicts, already, rolled_back=rolled
                )
            already = True
        return BindOutcome(pod_key, args.node, assigned=annotation, conflicts=conflicts, already=already)

    def _bound_here(self, args: ExtenderBindingArgs) -> bool:
        try:
            pod = self.kube.get_pod(args.pod_namespace, args.pod_name)
        except (KubeApiError, DeadlineReachedError):
            return False
        uid = (pod.get("metadata") or {}).get("uid")
        return uid == args.pod_uid and (pod.get("spec") or {}).get("nodeName") == args.node

    def _roll_back(self, args: ExtenderBindingArgs, gpu_count: int, *, annotated: bool) -> bool:
        """Release the pod's ledger entry (and its annotation); False when that failed too, which the
        node-state refresher's reconcile then repairs."""
        released = True
        try:
            self.ledger.release(args.node, gpu_count, args.pod_uid)
        except LedgerStoreError:
            log.exception("rolling back the ledger entry of %s on %s failed", args.pod_uid, args.node)
            released = False
        if annotated:
            try:
                self.kube.patch_pod_annotations(args.pod_namespace, args.pod_name, {ASSIGNED_GPUS_ANNOTATION: None})
            except (KubeApiError, DeadlineReachedError):
                log.warning(
                    "could not remove %s from %s/%s", ASSIGNED_GPUS_ANNOTATION, args.pod_namespace, args.pod_name
                )
        return released

    def _gpu_count(self, node: str) -> int:
        state = self._cluster()
        if state is not None:
            row = state.table.index.get(node)
            if row is not None:
                return int(state.table.alloc_gpus[row])
        return int(NodeTable.from_nodes([self.kube.get_node(node)]).alloc_gpus[0])

    # -- preempt -----------------------------------------------------------------------------------
    def holdings(self, nodes: Sequence[str]) -> Holdings:
        """What the ledger says each pod holds on ``nodes`` (nodes without an item hold nothing known)."""
        items = self.ledger.read_many(nodes)
        return {node: dict(item.assignments) for node, item in items.items()}


def ledger_binder(
    table: str,
    access: ClusterAccess,
    *,
    session: Any = None,
    cluster: Callable[[], ClusterState | None] | None = None,
    readings: LedgerReadings | None = None,
) -> LedgerBinder:
    """The binder a deployment uses: the ledger ``table`` through ``session`` (boto3's default when None),
    and the API ``access`` names, connected on the first bind with :data:`BIND_RETRY`."""
    import boto3

    session = session or boto3.session.Session(region_name=access.region or None)

    def kube() -> KubeClient:
        client: KubeClient = access.connect(session)
        client.retry = BIND_RETRY
        return client

    return LedgerBinder(LedgerStore(table, session.client("dynamodb")), kube, cluster, readings)
