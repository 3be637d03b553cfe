"""Incremental scoring: a node's FGD score is kept, per task shape, until that node's inputs change.

FGD scores a node from that node's row alone: its free milli per GPU, its free CPU and its GPU model
(its fragmentation follows from those and the typical shapes). Between two decisions almost every
row is the same: the simulator changes the one node it placed a task on; the extender's state changes
the nodes a watch event or a new snapshot touched, and its ledger readings a few more. So
:class:`ScoreMemo` keeps, per slot (a node's stable position: the state's row, the simulator's node),
the inputs it last saw there, and per task shape the score and GPU computed for each slot, with the
inputs' version they were computed on. A call compares the candidates' inputs with those seen (one
vectorised pass), gathers the scores still valid, and computes only the rest with the policy's own
scorer, in one batch. The result is the scorer's, row for row: the memo never changes a score, only
when it is computed (``tests/scheduler_core/placement/test_memo.py`` checks it against the scorer on
every call of a simulation, and ``simulate`` places the same tasks with and without it).

Rows are compared, not trusted: a slot whose node changed, moved (a node added before it in a new
state) or was read with ledger readings laid over it is simply recomputed. Slots may repeat within a
call; a slot that two candidates read with different inputs is computed for both and kept for none.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from scheduler_core.placement.model import Task
from scheduler_core.placement.policies.base import Scores

MEMO_BYTES = 16 << 20
"""What the kept scores may take, all task shapes together: 18 bytes per slot per shape."""
MAX_TASKS = 64
"""The most task shapes kept; the least recently used goes first. The typical shapes of openb's
``default`` trace are 35, and the pods of a burst share a few."""

BY_CONTENT_ROWS = 256
"""The most rows a call looks up by their inputs (:meth:`ScoreMemo._by_content`); more are computed."""
BY_CONTENT_ENTRIES = 2_048
"""The most row inputs remembered per task shape (about 200 bytes each: 0.4 MB per shape, 26 MB for
:data:`MAX_TASKS`); past it, they are forgotten at once and relearned."""
Compute = Callable[[npt.NDArray[np.intp]], Scores]
"""Scores for the candidates at the given positions of the call, computed by the policy itself."""
Rows = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]
"""Some candidates' inputs: free milli per GPU (n, width), free CPU (n,) and model row (n,)."""
Inputs = Callable[[npt.NDArray[np.intp]], Rows]
"""The candidates' rows at the given positions."""


@dataclass
class _Kept:
    """One task shape's scores per slot, the input version each was computed on (0: never), and the
    token under which each was last found valid (0: none)."""

    version: npt.NDArray[np.int32]
    score: npt.NDArray[np.int64]
    gpu: npt.NDArray[np.int16]
    checked: npt.NDArray[np.int32]
    by_content: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    """Score and GPU by a row's inputs (its bytes), whatever its slot: many nodes pass through the same
    states (empty, one pod of a shape, two...), so a node that changed often takes a state some node had."""


@dataclass(frozen=True)
class _Call:
    """What one call of :meth:`ScoreMemo.scores` scores besides its slots: the task, how to read and to
    compute its candidates (by their positions in the call), and its token's id (0: none)."""

    task: Task
    inputs: Inputs
    compute: Compute
    tok: int


class ScoreMemo:
    """Scores per slot and task shape, kept while the slot's inputs stay the same (see the module).

    A caller whose rows come from an immutable source (the extender's cluster state) passes it as
    ``token``: a slot found valid under a token is taken without reading its inputs again, for the
    candidates marked ``fixed`` (read as the token has them, without ledger readings laid over).

    Thread-safe: one lock around each call (the extender may score from several threads).

    >>> memo = ScoreMemo()
    >>> calls = []
    >>> left, cpu, model = np.array([[1000, 500], [1000, 1000]]), np.array([8000, 8000]), np.array([0, 0])
    >>> def inputs(positions):
    ...     return left[positions], cpu[positions], model[positions]
    >>> def compute(positions):
    ...     calls.append(positions.tolist())
    ...     return 10 * positions.astype(np.int64), np.full(positions.size, -1)
    >>> memo.scores("shapes", Task(1000, 0, 1, 1000), np.array([0, 1]), 2, inputs, compute)[0].tolist()
    [0, 10]
    >>> left[1, 1] = 0  # node 1 changed: only it is computed again
    >>> memo.scores("shapes", Task(1000, 0, 1, 1000), np.array([0, 1]), 2, inputs, compute)[0].tolist()
    [0, 10]
    >>> calls
    [[0, 1], [1]]
    """

    def __init__(self, budget_bytes: int = MEMO_BYTES, max_tasks: int = MAX_TASKS) -> None:
        self._budget, self._max_tasks = budget_bytes, max_tasks
        self._lock = threading.Lock()
        self._token: object = None
        self._token_id = 0
        self._reset(None, 0, 0)

    def _reset(self, workload_key: Hashable, slots: int, width: int) -> None:
        self._workload_key = workload_key
        self._seen_gpu = np.full((slots, width), -1, dtype=np.int64)
        self._seen_cpu = np.full(slots, -1, dtype=np.int64)
        self._seen_model = np.full(slots, -2, dtype=np.int64)
        self._version = np.ones(slots, dtype=np.int32)
        self._next_version = 2
        self._tasks: OrderedDict[tuple[int, int, int], _Kept] = OrderedDict()

    @property
    def tasks_kept(self) -> int:
        return len(self._tasks)

    def scores(
        self,
        workload_key: Hashable,
        task: Task,
        slots: npt.NDArray[np.intp],
        width: int,
        inputs: Inputs,
        compute: Compute,
        token: object = None,
        fixed: npt.NDArray[np.bool_] | None = None,
    ) -> Scores:
        """The scores and GPUs of ``task`` on the candidates, one per entry of ``slots``.

        Parameters
        ----------
        workload_key : hashable
            What the scores were computed against besides the rows (the typical shapes and the model
            vocabulary): a different key drops everything kept.
        slots : ndarray of shape (n,)
            Each candidate's stable position; -1 for one that is never kept (a node the state lacks).
        width : int
            GPUs per row in the inputs: a different width drops everything kept.
        inputs : callable
            The candidates' rows at some positions of this call (:data:`Inputs`).
        compute : callable
            The policy's scores for the candidates at some positions of this call.
        token : object, optional
            The immutable source of the rows; valid slots under it are taken without reading inputs.
        fixed : ndarray of shape (n,), bool, optional
            The candidates read as ``token`` has them (all, when None).
        """
        with self._lock:
            if token is None:
                tok = 0
            else:
                if token is not self._token:
                    self._token, self._token_id = token, self._token_id % (np.iinfo(np.int32).max - 1) + 1
                tok = self._token_id
            if slots.shape[0] == 0:
                return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
            self._fit(workload_key, width, int(slots.max()) + 1)
            return self._scores(_Call(task, inputs, compute, tok), slots, fixed)

    def _fit(self, workload_key: Hashable, width: int, size: int) -> None:
        """Drop everything kept for another workload or width; make room for ``size`` slots."""
        if workload_key != self._workload_key or width != self._seen_gpu.shape[1]:
            self._reset(workload_key, size, width)
        elif size > self._version.shape[0]:
            self._grow(size)

    def _scores(self, call: _Call, slots: npt.NDArray[np.intp], fixed: npt.NDArray[np.bool_] | None) -> Scores:
        """:meth:`scores` on slots that fit: those valid under the token are taken, the others' inputs
        read and compared with those seen, and the scores missing for them computed (``slots`` not empty)."""
        if slots.min() < 0:  # the candidates the state lacks: computed every time, never kept
            return self._partly_kept(call, slots, fixed)
        kept = self._kept(call.task)
        if call.tok:
            hit = kept.checked[slots] == call.tok
            if fixed is not None:
                hit &= fixed
            if hit.all():
                return kept.score[slots], kept.gpu[slots].astype(np.int64)
            rest = np.flatnonzero(~hit)
        else:
            rest = np.arange(slots.shape[0])
        at = slots[rest]
        rows = call.inputs(rest)
        changed = ~self._same_as_seen(at, rows)
        if changed.any():
            moved = np.flatnonzero(changed)
            self._see(at[moved], _picked(rows, moved))
        missing = np.flatnonzero(kept.version[at] != self._version[at])
        kept_now = np.ones(rest.shape[0], dtype=bool)
        if missing.size:
            read = _picked(rows, missing)
            score, gpu = self._by_content(kept, read, rest[missing], call.compute)
            # Keep only what matches the inputs now seen there (a slot repeated with other inputs does not).
            there = at[missing]
            same = self._same_as_seen(there, read)
            store = there[same]
            kept.score[store] = score[same]
            kept.gpu[store] = gpu[same]
            kept.version[store] = self._version[store]
            kept_now[missing[~same]] = False
        # Valid under the token where read as the token has them; a score from other inputs is not.
        as_token = kept_now if fixed is None else kept_now & fixed[rest]
        kept.checked[at] = np.where(as_token, call.tok, 0)
        result = kept.score[slots], kept.gpu[slots].astype(np.int64)
        if missing.size and not kept_now.all():
            result[0][rest[missing]], result[1][rest[missing]] = score, gpu
        return result

    def _same_as_seen(self, at: npt.NDArray[np.intp], rows: Rows) -> npt.NDArray[np.bool_]:
        """Per candidate, whether its inputs are those last seen at its slot (``at``)."""
        gpu_left, cpu_left, model_id = rows
        same: npt.NDArray[np.bool_] = (
            (self._seen_gpu[at] == gpu_left).all(axis=1)
            & (self._seen_cpu[at] == cpu_left)
            & (self._seen_model[at] == model_id)
        )
        return same

    def _see(self, at: npt.NDArray[np.intp], rows: Rows) -> None:
        """Record ``rows`` as the inputs of slots ``at``, under a new version: what was kept there is stale."""
        gpu_left, cpu_left, model_id = rows
        self._seen_gpu[at] = gpu_left
        self._seen_cpu[at] = cpu_left
        self._seen_model[at] = model_id
        self._version[at] = self._new_version()

    def _by_content(self, kept: _Kept, rows: Rows, positions: npt.NDArray[np.intp], compute: Compute) -> Scores:
        """Scores for these rows: those whose inputs some slot had before from :attr:`_Kept.by_content`,
        the others computed (in one batch) and remembered there. At most :data:`BY_CONTENT_ROWS` rows are
        looked up per call (a whole state's first scoring computes in one batch), and at most
        :data:`BY_CONTENT_ENTRIES` remembered per task shape."""
        if positions.shape[0] > BY_CONTENT_ROWS:
            return compute(positions)
        stacked = np.column_stack(rows).astype(np.int64, copy=False)
        keys = [row.tobytes() for row in stacked]
        table = kept.by_content
        found = [table.get(key) for key in keys]
        todo = np.array([hit is None for hit in found], dtype=bool)
        score = np.empty(positions.shape[0], dtype=np.int64)
        gpu = np.empty(positions.shape[0], dtype=np.int64)
        if not todo.all():
            hits = [hit for hit in found if hit is not None]
            score[~todo] = [hit[0] for hit in hits]
            gpu[~todo] = [hit[1] for hit in hits]
        if todo.any():
            at = np.flatnonzero(todo)
            score[at], gpu[at] = compute(positions[at])
            if len(table) + at.size > BY_CONTENT_ENTRIES:
                table.clear()
            table.update(
                zip([keys[i] for i in at.tolist()], zip(score[at].tolist(), gpu[at].tolist(), strict=True), strict=True)
            )
        return score, gpu

    def _partly_kept(self, call: _Call, slots: npt.NDArray[np.intp], fixed: npt.NDArray[np.bool_] | None) -> Scores:
        """Kept slots through the memo, the others computed directly, merged in call order."""
        inside, outside = np.flatnonzero(slots >= 0), np.flatnonzero(slots < 0)
        score = np.empty(slots.shape[0], dtype=np.int64)
        gpu = np.empty(slots.shape[0], dtype=np.int64)
        score[outside], gpu[outside] = call.compute(outside)
        if not inside.size:
            return score, gpu
        within = _Call(
            call.task, lambda positions: call.inputs(inside[positions]),
            lambda positions: call.compute(inside[positions]), call.tok,
        )  # fmt: skip
        score[inside], gpu[inside] = self._scores(within, slots[inside], None if fixed is None else fixed[inside])
        return score, gpu

    def _new_version(self) -> int:
        if self._next_version >= np.iinfo(np.int32).max:  # every kept score is dropped, once per 2**31 changes
            for kept in self._tasks.values():
                kept.version[:] = 0
            self._version[:] = 1
            self._next_version = 2
        version = self._next_version
        self._next_version += 1
        return version

    def _grow(self, size: int) -> None:
        extra = size - self._version.shape[0]
        self._seen_gpu = np.concatenate([self._seen_gpu, np.full((extra, self._seen_gpu.shape[1]), -1)])
        self._seen_cpu = np.concatenate([self._seen_cpu, np.full(extra, -1, dtype=np.int64)])
        self._seen_model = np.concatenate([self._seen_model, np.full(extra, -2, dtype=np.int64)])
        self._version = np.concatenate([self._version, np.ones(extra, dtype=np.int32)])
        for key, kept in self._tasks.items():
            self._tasks[key] = _Kept(
                np.concatenate([kept.version, np.zeros(extra, dtype=np.int32)]),
                np.concatenate([kept.score, np.zeros(extra, dtype=np.int64)]),
                np.concatenate([kept.gpu, np.full(extra, -1, dtype=np.int16)]),
                np.concatenate([kept.checked, np.zeros(extra, dtype=np.int32)]),
                kept.by_content,
            )

    def _kept(self, task: Task) -> _Kept:
        """This task shape's scores (FGD reads a task's CPU, GPUs and milli, not its memory or
        models), the most recently used; a new one evicts the least recently used past the budget."""
        key = (task.cpu, task.num_gpu, task.gpu_milli)
        kept = self._tasks.get(key)
        if kept is not None:
            self._tasks.move_to_end(key)
            return kept
        slots = self._version.shape[0]
        limit = max(1, min(self._max_tasks, self._budget // max(1, 18 * slots)))
        while len(self._tasks) >= limit:
            self._tasks.popitem(last=False)
        kept = _Kept(
            np.zeros(slots, dtype=np.int32), np.zeros(slots, dtype=np.int64), np.full(slots, -1, dtype=np.int16),
            np.zeros(slots, dtype=np.int32),
        )  # fmt: skip
        self._tasks[key] = kept
        return kept


def _picked(rows: Rows, index: npt.NDArray[np.intp]) -> Rows:
    """The inputs of the candidates at ``index`` among ``rows``."""
    gpu_left, cpu_left, model_id = rows
    return gpu_left[index], cpu_left[index], model_id[index]
