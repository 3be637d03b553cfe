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

from scheduler_core.allocation import MILLI_PER_GPU, format_assigned_gpus
from scheduler_core.errors import SchedulerCoreError
from scheduler_core.policies import tightest

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
