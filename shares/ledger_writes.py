"""This instance's writes to the nodes' ledger items: one writer per node at a time, and a group commit.

Binds to one node from this instance take turns (a lock per node), so that they never race each other
(other instances they may: the ledger's conditional write settles that). Binds that arrive while one
writes wait, and the next writer records all of them in one conditional write: packing sends pod after
pod to the same node, and one write each, in turn, would make the ledger's round trip the bind rate.
The bind's rollbacks and the live state's releases take the same lock (:meth:`LedgerWrites.lock`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from adapters.gpu_ledger import Assigned, LedgerStoreError, NoRoomError
from scheduler_core.state.ledger import Demand

BatchWrite = Callable[[str, int, list[tuple[str, Demand]]], Mapping[str, Assigned | NoRoomError]]
"""Writes ``(uid, demand)`` pairs to the item of a node (its name, its GPU count) in one conditional write:
each UID's GPUs, or the NoRoomError that says why not; a LedgerStoreError when the write fails for all."""


class BusyError(LedgerStoreError):
    """The bind's budget ran out waiting for this instance's other writes to the node."""


@dataclass(eq=False)
class _Request:
    """One bind waiting for its node's ledger write."""

    uid: str
    demand: Demand
    done: threading.Event = field(default_factory=threading.Event)
    result: Assigned | None = None
    error: LedgerStoreError | None = None


@dataclass
class _NodeQueue:
    lock: threading.Lock  # held by the one writer of the node's item in this instance
    mutex: threading.Lock = field(default_factory=threading.Lock)  # guards ``waiting``
    waiting: list[_Request] = field(default_factory=list)


class LedgerWrites:
    """The queues of this instance's binds to each node's ledger item (see the module docstring).

    Parameters
    ----------
    write : the ledger write of a batch (:data:`BatchWrite`), made with the node's lock held
    emptied : called with (node, GPU count, GPUs) once a write made here left those GPUs without shares,
        out of the lock
    """

    def __init__(self, write: BatchWrite, emptied: Callable[[str, int, tuple[int, ...]], None]) -> None:
        self._write = write
        self._emptied = emptied
        self._queues: dict[str, _NodeQueue] = {}
        self._queues_lock = threading.Lock()

    def lock(self, node: str) -> threading.Lock:
        """The one lock on ``node``'s ledger item in this instance (binds, rollbacks, releases)."""
        return self._queue(node).lock

    def record(
        self,
        node: str,
        gpu_count: int,
        uid: str,
        demand: Demand,
        *,
        deadline: Callable[[], float],
        reserve_s: float,
        bind_budget_s: float,
    ) -> Assigned:
        """Record the pod in the node's ledger item: the bind's GPUs, or the error that says why not.

        The wait for the node counts against the bind's budget (``deadline()``: the seconds left), and what
        is left must cover the Binding too (``reserve_s``): a bind that could not post its Binding in time
        would write the ledger only to roll it back. ``bind_budget_s`` is the budget's whole, for the
        :class:`BusyError` that says it ran out.
        """
        request = _Request(uid, demand)
        queue = self._queue(node)
        with queue.mutex:
            queue.waiting.append(request)
        emptied: tuple[int, ...] = ()
        if queue.lock.acquire(timeout=max(0.0, deadline() - reserve_s)):
            try:
                if not request.done.is_set():
                    emptied = self._commit(node, gpu_count, queue)
            finally:
                queue.lock.release()
            # The write dropped the last shares of these GPUs (pods the watch saw go): out of the lock.
            self._emptied(node, gpu_count, emptied)
        else:
            with queue.mutex:
                if request in queue.waiting:  # nobody took it: nothing was written for it
                    queue.waiting.remove(request)
                    raise BusyError(f"other binds to {node} held it for the bind's {bind_budget_s:g} s")
            request.done.wait(timeout=max(0.0, deadline()))  # taken: its write is on its way
        if not request.done.is_set():
            raise BusyError(
                f"the write of {node}'s ledger item did not end within the bind's {bind_budget_s:g} s; "
                "what it records is the reconcile's to check"
            )
        if request.error is not None:
            raise request.error
        assert request.result is not None
        return request.result

    def _commit(self, node: str, gpu_count: int, queue: _NodeQueue) -> tuple[int, ...]:
        """Write every bind waiting on ``node`` in one go, and hand each its result (with the lock held);
        the GPUs the write left without shares."""
        with queue.mutex:
            batch, queue.waiting = queue.waiting, []
        try:
            outcomes = self._write(node, gpu_count, [(r.uid, r.demand) for r in batch])
            for request in batch:
                outcome = outcomes[request.uid]
                if isinstance(outcome, NoRoomError):
                    request.error = outcome
                else:
                    request.result = outcome
        except LedgerStoreError as exc:
            for request in batch:
                request.error = exc
        finally:
            for request in batch:
                request.done.set()
        return next((r.result.emptied for r in batch if r.result is not None and r.result.emptied), ())

    def _queue(self, node: str) -> _NodeQueue:
        with self._queues_lock:
            queue = self._queues.get(node)
            if queue is None:
                queue = self._queues[node] = _NodeQueue(threading.Lock())
            return queue
