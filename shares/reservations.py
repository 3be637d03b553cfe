"""Reservation pods through the API: one per GPU that holds shares, made and removed as the ledger changes.

The ledger decides (:meth:`scheduler_core.state.ledger.NodeLedger.shared_slots`); this module makes the
API agree, for whichever process saw the change:

- **open**, by the bind, before the Binding of the first share on a GPU (:attr:`Assigned.opened
  <adapters.gpu_ledger.Assigned>`): POST :func:`manifests.reservation.reservation_pod`. A 409 means one of
  that name exists: kept if it is alive, replaced if it failed or is being deleted (a kubelet that
  refused it, say);
- **close**, by whoever released the last share of a GPU (the bind's rollback or its drop of pods that
  are gone, ``serve --watch``'s release, the node-state refresher's watch): DELETE it at once
  (``gracePeriodSeconds: 0``: its container only sleeps, and the name is free again on return), then
  read the ledger again and re-create it if a bind put a share there meanwhile. A bind that found the
  old pod still there (a 409) has been answered, and the DELETE came after it: the second read sees
  that bind's write, because the write came before its POST;
- **reconcile**, by the node-state refresher's run: the reservation pods it listed against the ledger
  items, node by node, each difference checked against a fresh read of the node's item first, the
  deletions before the creations.

Each write names the pod by node and GPU (:func:`manifests.reservation.reservation_name`): two processes
that open the same GPU make one pod.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from adapters.gpu_ledger import LedgerStoreError
from adapters.kube import KubeClient
from adapters.kube_transport import DeadlineReachedError, KubeApiError
from manifests.reservation import DEFAULT_IMAGE, NAMESPACE, reservation_name, reservation_pod
from scheduler_core.k8s.annotations import gpu_uuid
from scheduler_core.k8s.names import RESERVED_GPU_ANNOTATION, TERMINAL_PHASES
from scheduler_core.k8s.quantity import shown
from scheduler_core.state.ledger import NodeLedger, plan_reservations

log = logging.getLogger(__name__)


class ReservationPendingError(Exception):
    """A share's GPU has no UUID to give its containers yet (or its reservation pod failed): the bind
    fails with this message, and kube-scheduler retries the pod."""


UUID_POLL_S = 0.25
"""How often a bind waiting for a GPU's UUID reads its reservation pod: a GET, for the first shares of a
GPU only, while their binds wait (and kube-scheduler with them)."""

SharedNow = Callable[[], frozenset[int]]
"""The GPUs of a node that hold shares, from a fresh, strongly consistent read of its ledger item."""


@dataclass
class _SharedRead:
    """The reads of one reservation pod that waiting binds share (:meth:`Reservations._read`)."""

    condition: threading.Condition
    started: int = 0  # reads begun
    answered: int = 0  # the number of the read whose answer is ``answer``
    answer: dict[str, Any] | Exception | None = None
    busy: bool = False
    waiting: int = 0
    last: float = -1e9  # when the last read began (time.monotonic)


@dataclass
class Reservations:
    """Opens and closes reservation pods through ``kube`` (called for the client on each use, so that a
    binder connects on its first bind). ``image`` runs the reservation program."""

    kube: Callable[[], KubeClient]
    image: str = DEFAULT_IMAGE
    counters: dict[str, int] = field(default_factory=lambda: {"created": 0, "deleted": 0, "replaced": 0})
    _reads: dict[str, _SharedRead] = field(default_factory=dict, init=False, repr=False)
    _reads_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def open(self, node: str, slots: Iterable[int]) -> int:
        """Make sure the reservation pod of each GPU ``slot`` on ``node`` exists and is alive; how many it
        created (a live one found under the name is kept, and not counted).

        Raises
        ------
        KubeApiError, DeadlineReachedError
            The pod could not be created (the caller rolls its share back).
        """
        client = self.kube()
        made = 0
        for slot in slots:
            body = reservation_pod(node, slot, image=self.image)
            try:
                client.create_pod(NAMESPACE, body)
                self.counters["created"] += 1
                made += 1
                continue
            except KubeApiError as exc:
                if exc.status != 409:
                    raise
            name = body["metadata"]["name"]
            try:
                current = client.get_pod(NAMESPACE, name)
            except KubeApiError as exc:
                if exc.status != 404:
                    raise
                current = None  # gone between the two calls
            if current is not None and _alive(current):
                continue
            log.info("reservation pod %s/%s is failed or going; replacing it", NAMESPACE, name)
            self._delete(client, name)
            try:
                client.create_pod(NAMESPACE, body)
            except KubeApiError as exc:
                if exc.status != 409:  # another process made it again meanwhile: a new pod, alive
                    raise
                continue
            self.counters["replaced"] += 1
            made += 1
        return made

    def reported(self, node: str, slot: int, until: float) -> str:
        """The UUID the reservation pod of GPU ``slot`` on ``node`` reported, waiting for it (polling the pod)
        until ``time.monotonic()`` reaches ``until``. A pod that does not exist is created (once): the
        caller's share holds the GPU in the ledger already.

        Raises
        ------
        ReservationPendingError
            Not reported in time, or the pod failed (its program refused the GPU it was given) or sits on
            another node.
        KubeApiError, DeadlineReachedError
            The pod could not be read.
        """
        name = reservation_name(node, slot)
        made = False
        while True:
            pod = self._read(name)
            if pod is None and not made:
                # Another instance's bind opened this GPU and has not made its pod (or failed to), or a
                # close took it: the share is in the ledger, so the GPU needs one (a 409 if it came meanwhile).
                self.open(node, [slot])
                made = True
                continue
            if pod is not None:
                where = (pod.get("spec") or {}).get("nodeName")
                if where != node:
                    raise ReservationPendingError(f"the reservation pod of GPU {slot} is bound to another node")
                uuid = ((pod.get("metadata") or {}).get("annotations") or {}).get(RESERVED_GPU_ANNOTATION)
                if uuid and gpu_uuid(uuid) is None:  # only a GPU UUID names one GPU ("all" names every one)
                    raise ReservationPendingError(
                        f"the reservation pod of GPU {slot} reported {shown(uuid)}, which is not a GPU UUID; "
                        "no share is bound to it"
                    )
                if uuid and _alive(pod):
                    return str(uuid)
                if (pod.get("status") or {}).get("phase") == "Failed":
                    raise ReservationPendingError(f"the reservation pod of GPU {slot} failed; its log says why")
            if time.monotonic() + UUID_POLL_S > until:
                raise ReservationPendingError(
                    f"the reservation pod of GPU {slot} has not reported the GPU's UUID yet; "
                    "kube-scheduler will retry the pod"
                )

    def _read(self, name: str) -> dict[str, Any] | None:
        """The reservation pod ``name`` (None: there is none), from a GET that started after this call did.
        The binds that wait for one pod (the shares of a new GPU, bound together) share its reads: one
        GET at a time for each pod, at most one each :data:`UUID_POLL_S`, its answer handed to every
        caller that was waiting before it began.

        Raises KubeApiError (but 404) and DeadlineReachedError, the reading caller's or the shared read's.
        """
        with self._reads_lock:
            now = time.monotonic()
            for stale in [k for k, r in self._reads.items() if not r.waiting and r.last < now - 1.0]:
                del self._reads[stale]
            read = self._reads.setdefault(name, _SharedRead(threading.Condition(self._reads_lock)))
            read.waiting += 1
            needed = read.started + 1  # a read already under way may have begun before the caller's question
            try:
                while read.answered < needed:
                    if read.busy:
                        read.condition.wait()
                        continue
                    read.busy, read.started = True, read.started + 1
                    number = read.started
                    pause = read.last + UUID_POLL_S - time.monotonic()
                    self._reads_lock.release()
                    try:
                        if pause > 0:  # the waiters that join meanwhile are answered by this read too
                            time.sleep(pause)
                        read.last = time.monotonic()
                        answer: dict[str, Any] | Exception | None = self.kube().get_pod(NAMESPACE, name)
                    except KubeApiError as exc:
                        answer = None if exc.status == 404 else exc
                    except DeadlineReachedError as exc:
                        answer = exc
                    finally:
                        self._reads_lock.acquire()
                    read.busy, read.answered, read.answer = False, number, answer
                    read.condition.notify_all()
                answer = read.answer
            finally:
                read.waiting -= 1
        if isinstance(answer, Exception):
            raise answer
        return answer

    def close(self, node: str, slots: Iterable[int], shared_now: SharedNow) -> tuple[int, ...]:
        """Delete the reservation pods of ``slots`` on ``node``, then re-create those ``shared_now`` says
        hold shares again (see the module docstring); the slots re-created."""
        wanted = sorted(set(slots))
        if not wanted:
            return ()
        client = self.kube()
        for slot in wanted:
            self._delete(client, reservation_name(node, slot))
        again = tuple(sorted(set(wanted) & shared_now()))
        if again:
            self.open(node, again)
        return again

    def released(self, node: str, slots: Sequence[int], shared_now: SharedNow) -> None:
        """:meth:`close` after a ledger release left ``slots`` without shares, for callers that must not
        fail for it (a bind, a watch's release): an error is logged, and what is left over is the
        reconcile's to remove or re-create."""
        if not slots:
            return
        try:
            self.close(node, slots, shared_now)
        except (KubeApiError, DeadlineReachedError, LedgerStoreError) as exc:
            log.warning("removing the reservation pods of GPUs %s on %s failed: %s", list(slots), node, exc)

    def reconcile(
        self,
        items: Mapping[str, NodeLedger],
        existing: Mapping[str, Mapping[int, str]],
        read: Callable[[str], NodeLedger],
    ) -> dict[str, int]:
        """Make the reservation pods ``existing`` (node to slot to pod name, as listed after ``items`` were
        read) agree with the ledger ``items``: each node that differs is read again (``read``), and only
        what still differs is created or deleted. Counts of what was done; an API error stops the node it
        happened on, and is counted, not raised."""
        done = {"reservations_created": 0, "reservations_deleted": 0, "reservation_errors": 0}
        for node in sorted(set(items) | set(existing)):
            pods = existing.get(node, {})
            listed = plan_reservations(items.get(node) or NodeLedger(node, 0), pods)
            if not listed.create and not listed.delete:
                continue
            try:
                fresh = read(node)
                plan = plan_reservations(fresh, pods)
                # Deletions first: the GPUs the device plugin gave those pods are free again before the new
                # pods ask for theirs (on a node whose GPUs are all held, a new pod would find none).
                closed = [slot for slot, name in pods.items() if name in plan.delete]
                again = self.close(node, closed, lambda node=node: read(node).shared_slots())  # type: ignore[misc]
                done["reservations_deleted"] += len(closed) - len(again)
                done["reservations_created"] += self.open(node, plan.create)
            except (KubeApiError, DeadlineReachedError, LedgerStoreError) as exc:
                done["reservation_errors"] += 1
                log.warning("reconciling the reservation pods of %s failed: %s", node, exc)
        return done

    def _delete(self, client: KubeClient, name: str) -> None:
        try:
            client.delete_pod(NAMESPACE, name, grace_period_s=0)
            self.counters["deleted"] += 1
        except KubeApiError as exc:
            if exc.status != 404:
                raise


def _alive(pod: Mapping[str, Any]) -> bool:
    metadata, status = pod.get("metadata") or {}, pod.get("status") or {}
    return not metadata.get("deletionTimestamp") and status.get("phase") not in TERMINAL_PHASES
