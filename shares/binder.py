"""The ``bind`` verb's I/O: the GPU ledger in DynamoDB, then the Binding, which carries the annotation.

One bind (DESIGN section 5):

1. GET the pod. A pod that is gone, or re-created under the same name (another UID), fails the
   bind, with one answer for both (:data:`NO_SUCH_POD`): bind tells nobody which pods exist. A pod
   already bound to this node with its annotation in place is a retried bind: success, nothing
   written (kube-scheduler retries a bind whose answer it did not get in ``httpTimeout``).
   Then GET the node, and ask the extender whether the bind is its to make at all
   (:mod:`scheduler_core.extender.admission`: the profile, the node in the state, its static filter,
   the pod's nodeSelector and required node affinity, taints, and the pod's CPU, memory and pod slot
   against the node's allocatable); a refusal writes nothing.
2. Record its GPUs in the node's ledger item: a conditional write on the item's version, idempotent
   per pod UID; a lost race re-reads and chooses again, with jitter, while the bind's budget lasts
   (``LedgerStore.assign``). Binds to one node from this instance take turns (a lock per node), so
   they never race each other (``shares/ledger_writes.py``). Whole-GPU pods are recorded too, so the
   ledger holds every GPU on the node. Shares the live state has seen go (``gone``) are dropped from the
   item by the same write. What the ledger showed free there (after this bind, or when it had no room)
   goes to ``readings``, which filter and prioritize lay over the state.
3. With reservation pods, a share: its GPU's reservation pod is created if the write opened that GPU
   (``shares/reservations.py``), and the UUID it reports is waited for (``UUID_WAIT_S``, outside the
   bind's budget; no UUID, no Binding: the entry is rolled back and the bind fails).
4. POST the Binding with ``gpu-scheduler.io/assigned-gpus`` in its metadata, and a share's UUID and size
   for its containers (``manifests/share_env.py``): the API server merges a Binding's annotations onto
   the pod in the same write, so the pod is never bound without its GPUs written down, nor annotated
   without being bound. A 409 whose pod turns out bound to this very node is a success.

If step 4 fails, the pod is read back: bound to this node (the Binding landed, its answer lost) is a
success; bound elsewhere, or unbound after a refusal (a 4xx, or nothing sent), releases the ledger
entry again, so that a failed bind holds no GPUs, and kube-scheduler retries the pod. Unbound after a
timeout or a 5xx, or unreadable, keeps the entry for the reconcile: that Binding may still commit,
and releasing the GPUs it uses would let another pod take them.

A failed bind's ``Error`` reaches kube-scheduler and the pod's events, which its tenant reads: it names
the step that failed and the cause in a few fixed words (``shares/bind_answers.py``); the rest goes to the log.

Idempotency comes from the ledger keyed by pod UID and the pod's own state, not from a separate
idempotency table: a repeat finds the same assignment and writes nothing new.

Every bind has :data:`BIND_BUDGET_S` for its Kubernetes calls, retries and waits included (a
``Retry-After`` is cut to what is left), inside kube-scheduler's ``httpTimeout`` (``shares/bind_deadline.py``).

The Kubernetes client is made on the first bind (``connect`` imports ``kubernetes`` lazily), so
filter and prioritize never load it.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from adapters.gpu_ledger import Assigned, LedgerConflictError, LedgerStore, LedgerStoreError, NoRoomError
from adapters.kube import POOL_SIZE, KubeClient
from adapters.kube_transport import DeadlineReachedError, KubeApiError, RetryPolicy
from adapters.ledger_readings import LedgerReadings
from adapters.settings import ClusterAccess
from manifests.placeholder import is_placeholder
from manifests.reservation import UUID_WAIT_S, reserving
from manifests.share_env import share_annotations
from scheduler_core.errors import ClusterStateUnavailableError, InvalidPodError
from scheduler_core.extender.facade import Admit, BindOutcome
from scheduler_core.extender.preemption import Holdings
from scheduler_core.extender.wire import ExtenderBindingArgs
from scheduler_core.k8s.names import ASSIGNED_GPUS_ANNOTATION, MILLI_PER_GPU
from scheduler_core.k8s.nodes import NodeTable
from scheduler_core.k8s.pod_requests import assumed_cpu_milli
from scheduler_core.k8s.pods import pod_demand
from scheduler_core.state.cluster import ClusterState
from scheduler_core.state.ledger import Demand
from shares.bind_answers import NO_SUCH_POD, failed_bind, ledger_cause, pod_key_of, refused, short
from shares.bind_deadline import BindDeadline
from shares.ledger_writes import BusyError, LedgerWrites
from shares.reservations import ReservationPendingError, Reservations

log = logging.getLogger(__name__)

KubeFactory = Callable[[], KubeClient]
BIND_RETRY = RetryPolicy(attempts=2, base_s=0.05, max_s=0.2, request_timeout_s=1.0)
"""Bind has kube-scheduler's ``httpTimeout`` (3 s) for all of its calls: short ones, one quick retry."""
CONFIRM_S = 1.0
"""After a failed Binding, the time given to read back whether it landed."""
BINDING_RESERVE_S = 0.5
"""Of the bind's budget, what is kept for posting the Binding once the ledger is written."""
BIND_BUDGET_S = 2.5
"""What one bind may spend on Kubernetes calls (the ledger has its own ``ledger_budget_s`` inside it):
under kube-scheduler's default ``httpTimeout`` of 3 s, so a bind that cannot finish says why in time."""
BIND_DYNAMODB = {"connect_timeout": 0.5, "read_timeout": 1.0, "retries": {"mode": "standard", "max_attempts": 2},
                 "max_pool_connections": POOL_SIZE}  # fmt: skip
"""The same for the ledger's calls: botocore's defaults (60 s timeouts, several retries) would outlast
kube-scheduler's wait, and a ledger that does not answer must fail the bind with its name, in time. As
many connections as binds at once (botocore keeps 10)."""


@dataclass(frozen=True)
class BindPlan:
    """What one bind will write, decided from the pod and the node as read, before any write: the ledger
    entry (``ledger``: the GPUs; None for a pod that asks for none), a share's milli (its reservation pod
    and its annotations follow from the GPU the ledger gives it), the CPU the readings record, or the
    placeholder to remove instead of binding it."""

    args: ExtenderBindingArgs
    node: Mapping[str, Any] = field(default_factory=dict)
    gpu_count: int = 0
    cpu: int = 0
    ledger: Demand | None = None
    share: int = 0
    retire_placeholder: bool = False


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
        *,
        ledger_budget_s: float = 2.0,
        gone: Callable[[str], Collection[str]] | None = None,
        bind_budget_s: float = BIND_BUDGET_S,
        node_of: Callable[[str], Mapping[str, Any] | None] | None = None,
        reservations: Reservations | None = None,
        uuid_wait_s: float = UUID_WAIT_S,
        share_device: str = "cdi",
    ) -> None:
        self.ledger = ledger
        self._kube_factory = kube
        self._kube: KubeClient | None = None
        self.store_client: Callable[[], Any] | None = None
        """Makes the ledger's client anew (:meth:`reconnect`)."""
        self._kube_lock = threading.Lock()
        self._cluster = cluster or (lambda: None)
        self.readings = readings or LedgerReadings()
        self.ledger_budget_s = ledger_budget_s
        self.gone: Callable[[str], Collection[str]] = gone or (lambda _node: ())
        # The node object as a watch holds it (serve --watch): admission reads it there instead of a GET,
        # as kube-scheduler decided from its own cache. A node it does not hold is read from the API.
        self.node_of: Callable[[str], Mapping[str, Any] | None] = node_of or (lambda _node: None)
        self._writes = LedgerWrites(self._write_batch, self._close)
        self.bind_budget_s = bind_budget_s
        # Reservation pods, one per GPU that holds shares (None: Kubernetes does not count those GPUs).
        self.reservations = reservations
        self.uuid_wait_s = uuid_wait_s
        self.share_device = share_device  # how a share's GPU reaches its containers (SHARE_DEVICE)
        self._deadline = BindDeadline()

    def deadline(self) -> float:
        """Seconds left to the bind running on this thread (the Kubernetes client's ``deadline``)."""
        return self._deadline.left()

    @property
    def kube(self) -> KubeClient:
        with self._kube_lock:
            if self._kube is None:
                self._kube = self._kube_factory()
            return self._kube

    def reconnect(self) -> None:
        """New clients after a SnapStart restore: the ledger's from :attr:`store_client` (where set), and
        the Kubernetes client made again on the next bind. Connections and credentials made before the
        snapshot are not carried over."""
        with self._kube_lock:
            self._kube = None
        if self.store_client is not None:
            self.ledger.client = self.store_client()

    # -- bind --------------------------------------------------------------------------------------
    def bind(self, args: ExtenderBindingArgs, admit: Admit | None = None) -> BindOutcome:
        with self._deadline.running(self.bind_budget_s):
            outcome = self._bind(args, admit or (lambda _pod, _node: ""))
        if outcome.error:
            # The pod is not where filter or prioritize predicted: drop the prediction at once.
            self.readings.forget([args.pod_uid])
        return outcome

    def _bind(self, args: ExtenderBindingArgs, admit: Admit) -> BindOutcome:
        """Plan from reads alone, then carry the plan out."""
        plan = self._plan(args, admit)
        return plan if isinstance(plan, BindOutcome) else self._execute(plan)

    def _plan(self, args: ExtenderBindingArgs, admit: Admit) -> BindPlan | BindOutcome:
        """What the bind will write, from the pod and the node as read (steps 1 of the module docstring),
        or the answer when there is nothing to write: a pod gone, already bound, refused or invalid."""
        failed = partial(failed_bind, args)
        pod_key = pod_key_of(args)
        try:
            pod = self.kube.get_pod(args.pod_namespace, args.pod_name)
        except KubeApiError as exc:
            if exc.status == 404:
                log.info("bind %s to %s: no such pod (%s)", pod_key, args.node, exc)
                return failed("pod_gone", NO_SUCH_POD)
            return failed("kube_error", self._logged(pod_key, args.node, "reading the pod failed", exc))
        except DeadlineReachedError as exc:
            return failed("kube_error", self._logged(pod_key, args.node, "reading the pod failed", exc))
        metadata = pod.get("metadata") or {}
        if metadata.get("uid") != args.pod_uid:
            # The same answer as for a pod that does not exist, so that bind tells nobody which pods do;
            # and never the pod's real UID, which is what a forged bind would need next.
            log.info("bind %s to %s: the pod's UID is not %s", pod_key, args.node, args.pod_uid)
            return failed("pod_gone", NO_SUCH_POD)
        spec = pod.get("spec") or {}
        if is_placeholder(pod):
            return BindPlan(args, retire_placeholder=True)
        assigned = (metadata.get("annotations") or {}).get(ASSIGNED_GPUS_ANNOTATION, "")
        if spec.get("nodeName"):
            if spec["nodeName"] != args.node:
                return failed("already_bound", "the pod is already bound to another node")
            return BindOutcome(pod_key, args.node, assigned=assigned, already=True)
        try:
            node = self.node_of(args.node) or self.kube.get_node(args.node)
        except KubeApiError as exc:
            kind = "node_unknown" if exc.status == 404 else "kube_error"
            return failed(kind, self._logged(pod_key, args.node, "reading the node failed", exc))
        except DeadlineReachedError as exc:
            return failed("kube_error", self._logged(pod_key, args.node, "reading the node failed", exc))
        refusal = admit(pod, node)
        if refusal:
            return failed("refused", refusal)
        try:
            demand = pod_demand(pod)
            gpu_count = self._gpu_count(args.node, node)
        except InvalidPodError as exc:
            return failed("invalid_pod", str(exc))
        ledger = None
        if demand.gpus:  # no GPU: nothing to record in the ledger, only the CPU it takes here
            ledger = Demand(1, demand.share) if demand.share else Demand(demand.gpus, MILLI_PER_GPU)
        return BindPlan(args, node, gpu_count, assumed_cpu_milli(pod), ledger, demand.share)

    def _execute(self, plan: BindPlan) -> BindOutcome:
        """Carry ``plan`` out (steps 2 to 4 of the module docstring): the ledger, a new GPU's reservation
        pod, a share's UUID, the Binding. Each failure after the ledger write undoes it (its compensation:
        :meth:`_roll_back`); the Binding's own failures are :meth:`_post_binding`'s."""
        args, pod_key, failed = plan.args, pod_key_of(plan.args), partial(failed_bind, plan.args)
        if plan.retire_placeholder:
            return self._retire_placeholder(args, failed)
        if plan.ledger is None:
            if plan.cpu:
                self.readings.observe(args.node, None, args.pod_uid, plan.cpu)
            return self._post_binding(args, pod_key, None)
        try:
            held = self._writes.record(
                args.node, plan.gpu_count, args.pod_uid, plan.ledger,
                deadline=self.deadline, reserve_s=BINDING_RESERVE_S, bind_budget_s=self.bind_budget_s,
            )  # fmt: skip
        except NoRoomError as exc:
            self.readings.observe(args.node, exc.free, holds=exc.holds)  # the view was stale here: the next one knows
            return failed("no_room", self._logged(pod_key, args.node, "no room in the GPU ledger", exc))
        except LedgerConflictError as exc:
            cause = self._logged(pod_key, args.node, "the GPU ledger write failed", exc)
            return failed("conflict", cause, conflicts=exc.conflicts)
        except BusyError as exc:
            return failed("busy", self._logged(pod_key, args.node, "the GPU ledger write failed", exc))
        except LedgerStoreError as exc:
            return failed("ledger_error", self._logged(pod_key, args.node, "the GPU ledger write failed", exc))
        undo = partial(self._roll_back, args, plan.gpu_count)
        if held.opened and self.reservations is not None:
            # The first share on a GPU: its reservation pod exists before the share is bound.
            try:
                self.reservations.open(args.node, held.opened)
            except (KubeApiError, DeadlineReachedError) as exc:
                cause = self._logged(pod_key, args.node, "creating the GPU's reservation pod failed", exc)
                return failed("reservation_error", cause, rolled_back=undo())
        # Other instances' binds there, and this one (its CPU as well, which fgd_cpu reads), before the
        # wait for a GPU's UUID: filter and prioritize count this share meanwhile (a failed bind forgets it).
        self.readings.observe(args.node, held.free, args.pod_uid, plan.cpu, holds=held.holds)
        shared: dict[str, str] = {}
        if plan.share and self.reservations is not None:
            try:
                shared = self._share_annotations(args.node, plan.node, held, plan.share)
            except (ReservationPendingError, ValueError) as exc:  # ValueError: a value not of the bind's shape
                # The reservation pod stays (the reconcile removes it if no share comes): the retry finds
                # it started, where a new one would start over.
                return failed("reservation_pending", str(exc), rolled_back=undo(close=False))
            except (KubeApiError, DeadlineReachedError) as exc:
                cause = self._logged(pod_key, args.node, "reading the GPU's reservation pod failed", exc)
                return failed("reservation_error", cause, rolled_back=undo())
        return self._post_binding(args, pod_key, held, plan.gpu_count, shared)

    def _share_annotations(self, node: str, obj: Mapping[str, Any], held: Assigned, milli: int) -> dict[str, str]:
        """What a share's Binding carries for its containers (:func:`manifests.share_env.share_annotations`):
        the UUID its GPU's reservation pod reported, waited for up to :attr:`uuid_wait_s` (the bind's
        deadline moves by the time waited: the generated bind ``httpTimeout`` allows for it), and its size."""
        assert self.reservations is not None
        ((slot, _milli),) = held.pairs
        until = time.monotonic() + self.uuid_wait_s
        with self._deadline.set_apart(until):  # not counted against the bind's own budget, nor added to it
            uuid = self.reservations.reported(node, slot, until)
        memory_mib = int(NodeTable.from_nodes([obj]).memory_mib[0])
        return share_annotations(uuid, milli, memory_mib, device=self.share_device)

    def _retire_placeholder(self, args: ExtenderBindingArgs, failed: Callable[..., BindOutcome]) -> BindOutcome:
        """A placeholder that kube-scheduler would bind has done its job: a node with room for its shares
        exists (an autoscaler added it, or a GPU came free). It is deleted instead, so that it never holds
        that GPU, and the shares (whose retry its deletion triggers) take it (``manifests/placeholder.py``)."""
        try:
            self.kube.delete_pod(args.pod_namespace, args.pod_name, grace_period_s=0)
        except (KubeApiError, DeadlineReachedError) as exc:
            if not isinstance(exc, KubeApiError) or exc.status != 404:
                pod_key = f"{args.pod_namespace}/{args.pod_name}"
                return failed("placeholder", self._logged(pod_key, args.node, "removing the placeholder failed", exc))
        return failed("placeholder", "a node has room for this placeholder's shares: it is removed, not bound")

    @staticmethod
    def _logged(pod_key: str, node: str, step: str, exc: Exception) -> str:
        """``step: cause`` for the bind's answer, the cause in a few fixed words a tenant may read
        (:func:`shares.bind_answers.short`). The whole of ``exc`` goes to the log (a lost race or a full
        node, routine under load, at INFO)."""
        routine = isinstance(exc, NoRoomError | LedgerConflictError | BusyError)
        log.log(logging.INFO if routine else logging.WARNING, "bind %s to %s: %s: %s", pod_key, node, step, exc)
        return f"{step}: {short(exc)}"

    def _write_batch(
        self, node: str, gpu_count: int, batch: list[tuple[str, Demand]]
    ) -> dict[str, Assigned | NoRoomError]:
        """The ledger write of the binds waiting on ``node`` (:class:`shares.ledger_writes.LedgerWrites`), in
        what is left of the bind's budget once the Binding's share is kept; shares seen gone are dropped by it."""
        budget_s = min(self.ledger_budget_s, self.deadline() - BINDING_RESERVE_S)
        if budget_s <= 0:
            raise BusyError(f"no time left in the bind's {self.bind_budget_s:g} s to write the ledger")
        return self.ledger.assign_many(node, gpu_count, batch, budget_s=budget_s, drop=self.gone(node))

    def _post_binding(
        self,
        args: ExtenderBindingArgs,
        pod_key: str,
        held: Assigned | None,
        gpu_count: int = 0,
        shared: Mapping[str, str] | None = None,
    ) -> BindOutcome:
        """POST the Binding for a pod whose GPUs the ledger now records as ``held`` (None: no GPU), with
        their annotation (and a share's ``shared`` annotations for its containers). A failed POST may still
        have landed (a timeout, a lost reply, a 5xx): the pod
        itself says, and only a pod known not to be bound here gives its GPUs back. Releasing them for a
        Binding that did land would let the next pod take the same milli.

        The bind's reading about the pod is taken back if the Binding fails. It is made before the Binding
        is posted: a live state forgets it when its watch shows the pod bound, and a reading made after
        that event would cap the node for ``margin_s`` with a share that may be gone by then."""
        annotation = held.annotation if held is not None else ""
        conflicts = held.conflicts if held is not None else 0
        already = held is not None and held.already
        annotations = {ASSIGNED_GPUS_ANNOTATION: annotation, **(shared or {})} if annotation else None
        try:
            self.kube.bind_pod(args.pod_namespace, args.pod_name, args.pod_uid, args.node, annotations)
        except (KubeApiError, DeadlineReachedError) as exc:
            where = self._bound_to(args)
            if where != args.node:
                conflict = bool(where) or (isinstance(exc, KubeApiError) and exc.status == 409)
                log.warning("bind %s to %s: posting the Binding failed: %s", pod_key, args.node, exc)
                # A 409 names the node the pod went to: not the caller's to learn; nor is the API's own text.
                cause = "another bind placed the pod first" if conflict else short(exc)
                rolled = False
                # Unbound now is not unbound for good: a Binding whose request timed out or got a 5xx may
                # still commit after the read. Only a refusal, or nothing sent, gives the GPUs back.
                if where is None or (where == "" and not refused(exc)):
                    cause += "; whether the Binding landed is unknown, so its GPUs stay recorded until the reconcile"
                else:
                    rolled = held is not None and not held.already and self._roll_back(args, gpu_count)
                message = f"bind {pod_key} to {args.node}: posting the Binding failed: {cause}"
                kind = "already_bound" if conflict else "kube_error"
                self.readings.forget([args.pod_uid])
                return BindOutcome(
                    pod_key, args.node, message, kind, annotation, conflicts, already, rolled_back=rolled
                )
            already = True
        return BindOutcome(pod_key, args.node, assigned=annotation, conflicts=conflicts, already=already)

    def _bound_to(self, args: ExtenderBindingArgs) -> str | None:
        """The node the pod is bound to now (``""``: unbound, or gone), None when the pod cannot be read.
        The read gets :data:`CONFIRM_S` of its own, whatever is left of the bind's budget: a wrong guess
        either way costs more than kube-scheduler's wait (a double booking, or GPUs held until the
        reconcile)."""
        try:
            with self._deadline.replaced(CONFIRM_S):
                pod = self.kube.get_pod(args.pod_namespace, args.pod_name)
        except KubeApiError as exc:
            return "" if exc.status == 404 else None
        except DeadlineReachedError:
            return None
        if (pod.get("metadata") or {}).get("uid") != args.pod_uid:
            return ""
        return str((pod.get("spec") or {}).get("nodeName") or "")

    def _roll_back(self, args: ExtenderBindingArgs, gpu_count: int, *, close: bool = True) -> bool:
        """Release the pod's ledger entry, and (``close``) the reservation pod of a GPU left without shares;
        False when the release failed too, which the node-state refresher's reconcile then repairs.
        Nothing else to undo: the annotations only ever travel in the Binding."""
        try:
            with self._writes.lock(args.node):
                released = self.ledger.release(args.node, gpu_count, args.pod_uid)
        except LedgerStoreError:
            log.exception("rolling back the ledger entry of %s on %s failed", args.pod_uid, args.node)
            return False
        if close:
            self._close(args.node, gpu_count, released.emptied)
        return True

    def release_pod(self, node: str, uid: str) -> bool:
        """Free what a pod that is gone or finished holds on ``node`` (True if it held something), and the
        reservation pod of a GPU it leaves without shares; the live state calls this, so shares come back
        within seconds, not at the next reconcile."""
        gpu_count = self._gpu_count(node)
        with self._writes.lock(node):
            released = self.ledger.release(node, gpu_count, uid)
        self._close(node, gpu_count, released.emptied)
        return released.held

    def _close(self, node: str, gpu_count: int, slots: Sequence[int]) -> None:
        """Delete the reservation pods of ``slots``, GPUs the ledger just left without shares
        (:meth:`shares.reservations.Reservations.released`: never raises)."""
        if self.reservations is not None:
            self.reservations.released(node, slots, lambda: self.ledger.read(node, gpu_count).shared_slots())

    def _gpu_count(self, node: str, obj: Mapping[str, Any] | None = None) -> int:
        """The node's allocatable GPUs: from the state, else from ``obj`` (the node as just read), else
        read from the API."""
        try:
            state = self._cluster()
        except ClusterStateUnavailableError:
            state = None
        if state is not None:
            row = state.table.index.get(node)
            if row is not None:
                return int(state.table.alloc_gpus[row])
        return int(NodeTable.from_nodes([obj if obj is not None else self.kube.get_node(node)]).alloc_gpus[0])

    # -- preempt -----------------------------------------------------------------------------------
    def holdings(self, nodes: Sequence[str]) -> Holdings:
        """What the ledger says each pod holds on ``nodes`` (nodes without an item hold nothing known).

        Raises
        ------
        ClusterStateUnavailableError
            The ledger could not be read (``preempt`` answers 503 with the cause).
        """
        try:
            items = self.ledger.read_many(nodes)
        except LedgerStoreError as exc:
            log.warning("preempt: reading the GPU ledger failed: %s", exc)
            raise ClusterStateUnavailableError(
                f"preempt: reading the GPU ledger failed: {ledger_cause(exc)}", kind="ledger_error"
            ) from exc
        return {node: dict(item.assignments) for node, item in items.items()}


def ledger_binder(
    table: str,
    access: ClusterAccess,
    *,
    session: Any = None,
    cluster: Callable[[], ClusterState | None] | None = None,
    readings: LedgerReadings | None = None,
    reservation_image: str = "",
    share_device: str = "cdi",
) -> LedgerBinder:
    """The binder a deployment uses: the ledger ``table`` through ``session`` (boto3's default when None),
    and the API ``access`` names, connected on the first bind with :data:`BIND_RETRY`; with
    ``reservation_image``, a reservation pod running it holds each GPU that shares are bound to, and its
    GPU reaches the shares' containers as ``share_device`` says (``SHARE_DEVICE``)."""
    import boto3
    from botocore.config import Config

    session = session or boto3.session.Session(region_name=access.region or None)

    def kube() -> KubeClient:
        client: KubeClient = access.connect(session)
        client.retry = BIND_RETRY
        client.deadline, client.min_call_s = binder.deadline, 0.1
        return client

    def dynamodb() -> Any:
        # A copy: botocore rewrites the retries dict it is given (max_attempts into total_max_attempts).
        return session.client("dynamodb", config=Config(**copy.deepcopy(BIND_DYNAMODB)))

    binder = LedgerBinder(LedgerStore(table, dynamodb()), kube, cluster, readings, share_device=share_device)
    binder.store_client = dynamodb
    if reserving(reservation_image):
        binder.reservations = Reservations(lambda: binder.kube, reservation_image)
    return binder
