"""The GPU ledger's arithmetic: what one node's item holds, and how a bind changes it.

One item per node (DESIGN section 5): used milli per GPU, the assignments by pod UID, and a version for
conditional writes. The store (``adapters/gpu_ledger.py``) does the I/O; everything here is pure, so the
invariants are tested without DynamoDB:

- no GPU ever holds more than 1000 milli;
- ``used`` always equals the sum of the assignments;
- a pod UID is assigned at most once per node, and assigning it again with the same result is a no-op.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from scheduler_core.errors import SchedulerCoreError
from scheduler_core.k8s.annotations import format_assigned_gpus
from scheduler_core.k8s.names import MILLI_PER_GPU
from scheduler_core.placement.model import tightest

Pairs = tuple[tuple[int, int], ...]  # ((gpu index, milli), ...), sorted by index


class LedgerError(SchedulerCoreError):
    """A change that would break the ledger's invariants (over-allocation, a pod twice)."""


@dataclass(frozen=True)
class Demand:
    """What one pod takes on one node: ``num_gpu`` GPUs of ``milli`` each (1000 is a whole GPU).

    >>> Demand(1, 250).validated()
    Demand(num_gpu=1, milli=250)
    """

    num_gpu: int
    milli: int

    def validated(self) -> Demand:
        if self.num_gpu < 1 or not 1 <= self.milli <= MILLI_PER_GPU:
            raise LedgerError(f"demand: expected num_gpu >= 1 and milli in 1..1000, got {self.num_gpu} x {self.milli}")
        if self.num_gpu > 1 and self.milli != MILLI_PER_GPU:
            raise LedgerError(f"demand: a share of a GPU is for one GPU only, got {self.num_gpu} x {self.milli}")
        return self


@dataclass(frozen=True)
class NodeLedger:
    """One node's item. ``version`` 0 means the item does not exist yet.

    Attributes
    ----------
    used : tuple of int, one per GPU
        Milli in use per GPU, each in 0..1000.
    assignments : mapping of pod UID to pairs
        ``((gpu, milli), ...)`` per pod; ``used`` is their sum.
    """

    node: str
    gpu_count: int
    version: int = 0
    used: tuple[int, ...] = ()
    assignments: Mapping[str, Pairs] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if not self.used:
            object.__setattr__(self, "used", (0,) * self.gpu_count)
        object.__setattr__(self, "assignments", MappingProxyType(dict(self.assignments)))

    def free(self) -> npt.NDArray[np.int64]:
        """Free milli per GPU, shape (n_gpus,)."""
        return MILLI_PER_GPU - np.asarray(self.used, dtype=np.int64).reshape(self.gpu_count)

    def problems(self) -> list[str]:
        """Every broken invariant, by GPU or pod."""
        found = []
        if len(self.used) != self.gpu_count:
            found.append(f"{self.node}: {len(self.used)} used entries for {self.gpu_count} GPUs")
            return found
        summed = [0] * self.gpu_count
        for uid, pairs in self.assignments.items():
            for gpu, milli in pairs:
                if not 0 <= gpu < self.gpu_count:
                    found.append(f"{self.node}: pod {uid} holds GPU {gpu} of {self.gpu_count}")
                    continue
                summed[gpu] += milli
        for gpu, (used, total) in enumerate(zip(self.used, summed, strict=True)):
            if used > MILLI_PER_GPU:
                found.append(f"{self.node}: GPU {gpu} holds {used} milli, over {MILLI_PER_GPU}")
            if used != total:
                found.append(f"{self.node}: GPU {gpu} records {used} milli but its assignments sum to {total}")
        return found

    def with_assignment(self, uid: str, pairs: Pairs) -> NodeLedger:
        """The next version with ``uid`` holding ``pairs``.

        Raises :class:`LedgerError` when the pod already holds something else here, or a GPU would go
        over 1000 milli.
        """
        if uid in self.assignments:
            raise LedgerError(f"{self.node}: pod {uid} already holds {format_assigned_gpus(self.assignments[uid])}")
        used = list(self.used)
        for gpu, milli in pairs:
            if not 0 <= gpu < self.gpu_count or used[gpu] + milli > MILLI_PER_GPU:
                raise LedgerError(
                    f"{self.node}: GPU {gpu} has {MILLI_PER_GPU - used[gpu] if 0 <= gpu < self.gpu_count else 0}"
                    f" milli free, not {milli}"
                )
            used[gpu] += milli
        return NodeLedger(
            self.node, self.gpu_count, self.version + 1, tuple(used), {**self.assignments, uid: tuple(sorted(pairs))}
        )

    def shared_slots(self) -> frozenset[int]:
        """The GPUs that hold at least one share (under 1000 milli of one pod): each needs a reservation
        pod (``manifests/reservation.py``), whole GPUs do not (their pods request ``nvidia.com/gpu``).

        >>> item = NodeLedger("n", 4).with_assignment("a", ((0, 1000), (1, 1000)))
        >>> item.with_assignment("b", ((2, 250),)).shared_slots()
        frozenset({2})
        """
        return frozenset(gpu for pairs in self.assignments.values() for gpu, milli in pairs if milli < MILLI_PER_GPU)

    def without(self, uid: str) -> NodeLedger:
        """The next version with ``uid``'s assignment released (the same item when it holds none)."""
        if uid not in self.assignments:
            return self
        used = list(self.used)
        for gpu, milli in self.assignments[uid]:
            used[gpu] -= milli
        rest = {k: v for k, v in self.assignments.items() if k != uid}
        return NodeLedger(self.node, self.gpu_count, self.version + 1, tuple(used), rest)


def choose_gpus(free: npt.NDArray[np.int64], demand: Demand) -> Pairs | None:
    """The GPUs a pod takes on a node with ``free`` milli per GPU, or None when it does not fit.

    A share goes on the tightest GPU that still fits (the simulator's GPU choice, ``policies.tightest``),
    which keeps whole GPUs free; whole GPUs are the lowest-index fully free ones.

    >>> choose_gpus(np.array([1000, 300, 600]), Demand(1, 250))
    ((1, 250),)
    >>> choose_gpus(np.array([1000, 300, 1000]), Demand(2, 1000))
    ((0, 1000), (2, 1000))
    """
    demand.validated()
    if demand.milli == MILLI_PER_GPU:
        whole = np.nonzero(free >= MILLI_PER_GPU)[0][: demand.num_gpu]
        return tuple((int(g), MILLI_PER_GPU) for g in whole) if len(whole) == demand.num_gpu else None
    gpu = int(tightest(free.reshape(1, -1), demand.milli)[0])
    return None if gpu < 0 else ((gpu, demand.milli),)


def rebuild(node: str, gpu_count: int, held: Mapping[str, Pairs], version: int = 0) -> tuple[NodeLedger, list[str]]:
    """A node's item rebuilt from what its pods' annotations say they hold; pods that do not fit (a GPU
    over 1000, or out of range) are left out and named."""
    ledger = NodeLedger(node, gpu_count, version)
    problems = []
    for uid, pairs in sorted(held.items()):
        try:
            ledger = ledger.with_assignment(uid, pairs)
        except LedgerError as exc:
            problems.append(str(exc))
    return NodeLedger(node, gpu_count, version + 1, ledger.used, ledger.assignments), problems


@dataclass(frozen=True)
class Drift:
    """One thing the reconcile found the ledger wrong about.

    ``kind``: ``released`` (the pod is gone, terminal, or bound to another node), ``recorded`` (a bound
    pod's annotation was missing from an existing item), ``rebuilt`` (a whole item was missing),
    ``mismatch`` (the ledger and the pod's annotation disagree; reported, not changed) or ``conflict``
    (an annotation that does not fit beside the others; reported, not recorded).
    """

    kind: str
    node: str
    uid: str
    detail: str = ""


@dataclass(frozen=True)
class Reconciled:
    """Items to write (each with the version it was read at, 0 for a new item) and the drift found."""

    writes: list[tuple[NodeLedger, int]]
    drift: list[Drift]

    def counts(self) -> dict[str, int]:
        tally: dict[str, int] = {}
        for found in self.drift:
            tally[found.kind] = tally.get(found.kind, 0) + 1
        return tally


def reconcile(
    items: Mapping[str, NodeLedger],
    live: set[str] | frozenset[str],
    bound_to: Mapping[str, str],
    annotated: Mapping[str, Mapping[str, Pairs]],
    gpu_counts: Mapping[str, int],
) -> Reconciled:
    """Bring the ledger in line with the pods.

    Parameters
    ----------
    items : the ledger items by node, read *before* the pods were listed, so that every assignment in
        them belongs to a pod that existed when it was read.
    live : UIDs of every non-terminal pod, pending ones listed before bound ones: a pod bound in
        between is then seen in one list or the other, never in neither.
    bound_to : pod UID to the node it is bound to.
    annotated : node to pod UID to the ``gpu-scheduler.io/assigned-gpus`` pairs of its bound pods.
    gpu_counts : node to its GPU count, for items to be rebuilt.

    >>> item = NodeLedger("n", 2).with_assignment("gone", ((0, 500),)).with_assignment("kept", ((1, 300),))
    >>> out = reconcile({"n": item}, {"kept"}, {"kept": "n"}, {"n": {"kept": ((1, 300),)}}, {"n": 2})
    >>> out.writes[0][0].used, out.writes[0][1], out.counts()
    ((0, 300), 2, {'released': 1})
    """
    writes: list[tuple[NodeLedger, int]] = []
    drift: list[Drift] = []
    for node, item in sorted(items.items()):
        updated = item
        for uid in sorted(item.assignments):
            if uid not in live:
                drift.append(Drift("released", node, uid, "the pod is gone or finished"))
            elif bound_to.get(uid, node) != node:
                drift.append(Drift("released", node, uid, f"the pod is bound to {bound_to[uid]}"))
            else:
                continue
            updated = updated.without(uid)
        for uid, pairs in sorted(annotated.get(node, {}).items()):
            held = updated.assignments.get(uid)
            if held is not None:
                if tuple(sorted(held)) != tuple(sorted(pairs)):
                    drift.append(Drift("mismatch", node, uid, f"ledger {_text(held)}, annotation {_text(pairs)}"))
                continue
            try:
                updated = updated.with_assignment(uid, pairs)
                drift.append(Drift("recorded", node, uid, _text(pairs)))
            except LedgerError as exc:
                drift.append(Drift("conflict", node, uid, str(exc)))
        if updated is not item:
            writes.append(
                (NodeLedger(node, item.gpu_count, item.version + 1, updated.used, updated.assignments), item.version)
            )
    for node in sorted(set(annotated) - set(items)):
        if node not in gpu_counts:
            continue  # the node is gone: its pods will be
        rebuilt, problems = rebuild(node, gpu_counts[node], annotated[node])
        writes.append((rebuilt, 0))
        drift.append(Drift("rebuilt", node, "", f"{len(rebuilt.assignments)} pods"))
        drift.extend(Drift("conflict", node, "", problem) for problem in problems)
    return Reconciled(writes, drift)


@dataclass(frozen=True)
class ReservationPlan:
    """What makes a node's reservation pods match its ledger item: the GPU slots that hold shares and
    have no reservation pod (``create``), and the reservation pods of slots that hold none (``delete``,
    pod names)."""

    node: str
    create: tuple[int, ...] = ()
    delete: tuple[str, ...] = ()


def plan_reservations(item: NodeLedger, existing: Mapping[int, str]) -> ReservationPlan:
    """The reservation pods ``item`` calls for, against ``existing`` (slot to pod name on its node).

    >>> item = NodeLedger("n", 4).with_assignment("a", ((1, 250),))
    >>> plan_reservations(item, {2: "r-2"})
    ReservationPlan(node='n', create=(1,), delete=('r-2',))
    """
    shared = item.shared_slots()
    create = tuple(sorted(shared - set(existing)))
    delete = tuple(name for slot, name in sorted(existing.items()) if slot not in shared)
    return ReservationPlan(item.node, create, delete)


def _text(pairs: Pairs) -> str:
    return format_assigned_gpus(pairs)
