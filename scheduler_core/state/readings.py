"""What one extender instance learned from the GPU ledger since its snapshot, laid over the state.

The readings themselves are kept by the adapter that makes them (``adapters.ledger_readings``, which
reads the clock and takes a lock); here is the pure part: which readings a state may not reflect yet,
and how they cap the free milli the filter and prioritize see.

The snapshot is rebuilt periodically, so a pod this instance bound ten seconds ago is not in it, nor
are the binds other instances made. Every bind reads the node's ledger item, and says what the ledger
has free there afterwards (this bind and everyone else's included) and which pods it holds there; a
bind refused for want of room says what is really free. Each such reading caps that node's GPUs in
the view filter and prioritize use until a state generated after them (less ``margin_s``, which
covers the time the refresher spends listing pods before it stamps ``generated_at``) replaces it.

The cap is a minimum with the state, which also sees GPU pods the ledger does not (bound by
another scheduler). Counting something twice only makes the view briefly stricter than the ledger;
the ledger, not this view, decides every bind.

A reading may name the pod it is about (``uid``): the extender's own decisions (the node it predicts
for a pod, the GPUs a bind took) are readings too. A live state forgets a pod's readings as soon as
it shows the pod bound, wherever that is, or gone (:meth:`Readings.forget`): the watch confirms or
drops each assumption; an event that shows the pod still pending keeps them. A prediction says the
GPUs its pod will take there (``taken``), which are taken off the node's figures unless its newest
ledger reading holds the pod already (:func:`apply_readings`): binds land in any order, so a figure
of what was left, made while other pods were on their way, would lose them. A decision also
carries the pod's CPU (``cpu``), which fgd_cpu takes off the node's free CPU until then
(:func:`assumed_cpu`): the next pod is scored on the node as this one left it, not as the state last
saw it. A reading about a pod without GPUs has no GPU figures and caps nothing. What is taken off,
not capped, would count twice for a pod the state already counts: only the decisions from
:data:`PREDICTION_MARGIN_S` before the state's stamp on count (a live state forgets the pods it
shows, and a snapshot is stamped just after its listing). kube-scheduler checks CPU itself; this
only steers FGD.

A live state that shows a pod gone from a node also drops the ledger's own readings of that node
(those about no pod) from before (:meth:`Readings.forget_nodes`): they count the gone pod's share,
and would refuse the node for up to ``margin_s`` after the share is free.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from scheduler_core.state.ledger import Demand, LedgerError, choose_gpus

DEFAULT_MARGIN_S = 30.0
DEFAULT_KEEP_S = 600.0
PREDICTION_MARGIN_S = 1.0
"""A decision's CPU and GPUs count over a state stamped at most this long after it (see the module
docstring)."""


@dataclass(frozen=True)
class Observed:
    """The ledger showed ``free`` milli per GPU on ``node`` at ``at`` (Unix seconds), when it held the
    pods ``holds`` there (None: not known); ``free`` None: no figures (a prediction, or a decision about
    a pod without GPUs). A prediction says the GPUs its pod takes instead (``taken``)."""

    node: str
    at: float
    free: tuple[int, ...] | None
    uid: str = ""  # the pod this reading is about, when it is one of the extender's own decisions
    cpu: int = 0  # milli-cores that pod takes on the node (an own decision's; 0: none, or not known)
    taken: tuple[tuple[int, int], ...] = ()  # a prediction's (GPU, milli): taken off, not a cap
    holds: frozenset[str] | None = None  # the pods the ledger held on the node with ``free``


ASSUMED_TTL_S = 3.0
"""How long a prediction made by filter or prioritize counts: kube-scheduler's ``httpTimeout`` in the
generated profile. A pod that has not bound by then was not placed there (or is in the state)."""
MAX_ASSUMED = 4096
"""Predictions kept at most, the oldest dropped first: one per pod in flight, and a request body that
names pods that do not exist cannot grow them without bound."""


class Readings(Protocol):
    """What the extender laid over its state: readings a state stamped ``generated_at`` may not reflect
    (oldest first), new ones, and the ones a live state now shows.

    ``observe`` records what the ledger said (a bind's, or a bind refused for room): a fact that may
    refuse a node. ``assume`` records a prediction filter or prioritize made about a pod named in a
    request, which nothing has checked: it expires within :data:`ASSUMED_TTL_S`, at most
    :data:`MAX_ASSUMED` are kept, and only prioritize sees it (``pending(..., assumed=True)``), so it
    can move a score but never refuse a node (DESIGN section 5: only binds change shared state)."""

    def pending(self, generated_at: float | None, *, assumed: bool = False) -> list[Observed]: ...

    def observe(
        self, node: str, free: Sequence[int] | None, uid: str = "", cpu: int = 0, holds: Iterable[str] | None = None
    ) -> None: ...

    def assume(self, node: str, taken: Sequence[tuple[int, int]], uid: str, cpu: int = 0) -> None: ...

    def forget(self, uids: Iterable[str]) -> None: ...

    def forget_nodes(self, nodes: Iterable[str], before: float) -> None: ...


class NoReadings:
    """Nothing laid over the state, and nothing kept."""

    def pending(self, generated_at: float | None, *, assumed: bool = False) -> list[Observed]:
        return []

    def observe(
        self, node: str, free: Sequence[int] | None, uid: str = "", cpu: int = 0, holds: Iterable[str] | None = None
    ) -> None:
        return None

    def assume(self, node: str, taken: Sequence[tuple[int, int]], uid: str, cpu: int = 0) -> None:
        return None

    def forget(self, uids: Iterable[str]) -> None:
        return None

    def forget_nodes(self, nodes: Iterable[str], before: float) -> None:
        return None


def still_pending(
    seen: Sequence[Observed],
    generated_at: float | None,
    now: float,
    margin_s: float = DEFAULT_MARGIN_S,
    keep_s: float = DEFAULT_KEEP_S,
) -> list[Observed]:
    """The readings of ``seen`` that a state stamped ``generated_at`` may not reflect: those after
    ``generated_at - margin_s``, and never older than ``keep_s`` (all of the last ``keep_s`` when the
    state has no stamp).

    >>> seen = [Observed("a", 10.0, (0,)), Observed("b", 90.0, (0,))]
    >>> [r.node for r in still_pending(seen, generated_at=100.0, now=100.0, margin_s=30.0)]
    ['b']
    """
    cutoff = now - keep_s
    if generated_at is not None:
        cutoff = max(cutoff, generated_at - margin_s)
    return [reading for reading in seen if reading.at >= cutoff]


def apply_readings(
    free: npt.NDArray[np.int32], rows: Sequence[int], seen: Sequence[Observed], generated_at: float | None = None
) -> npt.NDArray[np.int32]:
    """``free`` (shape (n_nodes, max_gpus), a state's stamped ``generated_at``) with the readings of
    ``seen`` laid over; ``rows[i]`` is the row of ``seen[i]``'s node (-1: not among the rows). A copy.

    Each row is the least, GPU by GPU, of the state's figures and the ledger readings' (facts, each GPU
    as its source counts it), and then the pods on their way are taken off it: the predictions (made from
    :data:`PREDICTION_MARGIN_S` before the state's stamp on: of a snapshot, older ones may be in it
    already, as for CPU) of the pods that the node's newest ledger reading does not hold (``holds``;
    all of them where it says not, or there is none). A live state forgets a prediction when it shows
    the pod, so none of them is in the state.

    A bind's reading replaces its pod's prediction, and binds land in any order: the reading of the
    fourth share on a GPU, written before the second and third, counts neither, and they are still on
    their way. A prediction is what its pod takes, not a figure of what is left, for the same reason:
    made while other pods were on their way, a figure would hold whatever they had left out. It is
    taken off where the ledger would put it on what is left (:func:`_take`), after the minimum: two
    figures that placed the same pod on different GPUs would count it twice in a minimum.

    >>> free = np.array([[1000, 1000], [0, 1000]], dtype=np.int32)
    >>> apply_readings(free, [0], [Observed("n1", 0.0, (300, 1000))]).tolist()
    [[300, 1000], [0, 1000]]
    >>> on_their_way = [Observed("n1", 0.0, None, uid, taken=((0, 250),)) for uid in ("u2", "u3")]
    >>> fourth = Observed("n1", 0.0, (500, 1000), "u4", holds=frozenset({"u1", "u4"}))
    >>> apply_readings(free, [0, 0, 0], [*on_their_way, fourth]).tolist()
    [[0, 1000], [0, 1000]]

    A pod written in the same ledger write as the newest reading's, and not read back yet, is not taken
    twice:

    >>> fifth = Observed("n1", 1.0, None, "u5", taken=((1, 250),))
    >>> same_write = Observed("n1", 2.0, (500, 750), "u4", holds=frozenset({"u1", "u4", "u5"}))
    >>> apply_readings(free, [0, 0, 0, 0], [*on_their_way, fifth, same_write]).tolist()
    [[0, 750], [0, 1000]]
    """
    out = free.copy()
    width = out.shape[1]
    since = -np.inf if generated_at is None else generated_at - PREDICTION_MARGIN_S
    on_the_way: dict[int, list[Observed]] = {}
    newest: dict[int, Observed] = {}  # per row, its newest ledger reading
    for row, reading in zip(rows, seen, strict=True):
        if row < 0:
            continue
        if reading.taken:
            if reading.at >= since:
                on_the_way.setdefault(row, []).append(reading)
            continue
        if reading.free is None:
            continue
        cap = np.zeros(width, dtype=np.int32)
        count = min(width, len(reading.free))
        cap[:count] = reading.free[:count]
        np.minimum(out[row], cap, out=out[row])
        if row not in newest or reading.at >= newest[row].at:
            newest[row] = reading
    _take_on_the_way(out, on_the_way, newest)
    return out


def _take_on_the_way(
    free: npt.NDArray[np.int32], on_the_way: dict[int, list[Observed]], newest: dict[int, Observed]
) -> None:
    """Take each row's predictions (row -> predictions) off ``free``, in place, oldest first, but those of
    the pods that the row's newest ledger reading (row -> reading) holds already."""
    for row, predictions in on_the_way.items():
        last = newest.get(row)
        held = last.holds if last is not None and last.holds is not None else frozenset()
        for prediction in sorted(predictions, key=lambda p: p.at):
            if prediction.uid not in held:
                _take(free[row], prediction.taken)


def _take(free: npt.NDArray[np.int32], taken: Sequence[tuple[int, int]]) -> None:
    """Take a prediction's GPUs off one node's ``free``, in place: as many GPUs of the same size, where
    the ledger would put them on what is free now (:func:`~scheduler_core.state.ledger.choose_gpus`);
    the GPUs the prediction named may be full by now, filled by pods whose binds landed first. Nothing
    where they fit nowhere (the bind will be refused).

    >>> free = np.array([0, 500, 1000], dtype=np.int32)
    >>> _take(free, ((0, 250),)); free.tolist()
    [0, 250, 1000]
    """
    sizes = {milli for _, milli in taken}
    if len(sizes) != 1:
        return
    try:
        placed = choose_gpus(free.astype(np.int64), Demand(len(taken), sizes.pop()))
    except LedgerError:  # not a size a pod can take
        return
    for gpu, milli in placed or ():
        free[gpu] -= milli


def assumed_cpu(
    rows: Sequence[int], seen: Sequence[Observed], n_rows: int, generated_at: float | None = None
) -> npt.NDArray[np.int64]:
    """Milli-cores per row that the extender's own decisions among ``seen`` take and a state stamped
    ``generated_at`` may not count yet (those from :data:`PREDICTION_MARGIN_S` before it on; all without a
    stamp); ``rows[i]`` is the row of ``seen[i]``'s node (-1: not among the rows).

    >>> seen = [Observed("a", 9.5, None, "u1", 500), Observed("a", 11.0, (0,), "u2", 250), Observed("b", 11.0, (0,))]
    >>> assumed_cpu([0, 0, 1], seen, 2).tolist(), assumed_cpu([0, 0, 1], seen, 2, generated_at=11.0).tolist()
    ([750, 0], [250, 0])
    """
    since = -np.inf if generated_at is None else generated_at - PREDICTION_MARGIN_S
    taken = np.zeros(n_rows, dtype=np.int64)
    for row, reading in zip(rows, seen, strict=True):
        if row >= 0 and reading.uid and reading.cpu > 0 and reading.at >= since:
            taken[row] += reading.cpu
    return taken
