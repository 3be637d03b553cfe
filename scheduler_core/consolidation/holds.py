"""Holds: what a consolidation plan keeps, until a deadline, for the pods it moves and the pod it frees
room for. The consolidator writes them (a small JSON document, :class:`HoldBook`) before it evicts; the
extender reads them and its filter obeys them (:func:`hold_refusals`):

- a **hold** keeps ``gpus`` GPUs of ``node`` for one Pending pod (by UID): any other pod that asks for a
  GPU is refused there unless the node has that many free GPUs beside what it asks;
- a **steer** sends the replacement of a moved pod to the node the plan chose: a pod whose controller is
  the steer's owner, created after the steer was written, is refused on every other node.

Both lapse at ``until`` (one set further than :data:`MAX_HOLD_S` ahead is not obeyed at all); nothing else
removes them from the extender's view, so a plan whose pod is
deleted, or whose replacement cannot go where the plan said, costs at most the hold's length. The
consolidator's next run drops what has lapsed or is done, and counts it. The book also keeps the times
of the evictions of the last hour: the hourly move budget.

Every size is bounded (:data:`MAX_HOLDS`, :data:`MAX_STEERS`, :data:`MAX_EVICTIONS`,
:data:`MAX_DOCUMENT_BYTES`, names as the API server bounds them): a document past any bound is refused
whole, with the field named, and the extender keeps the book it had.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler_core.consolidation.eligibility import owner_of
from scheduler_core.errors import InvalidArgsError
from scheduler_core.k8s.limits import MAX_GPUS_PER_NODE
from scheduler_core.k8s.pods import PodDemand

VERSION = 1
MAX_HOLDS = 64
"""Pending pods held for at once (a run plans for far fewer: its move budget)."""
MAX_STEERS = 256
MAX_EVICTIONS = 4096
"""Eviction times kept for the hourly budget (more than any budget a setting allows)."""
MAX_DOCUMENT_BYTES = 1 << 20
MAX_NAME_CHARS = 253
"""A Kubernetes object or node name (DNS subdomain)."""
MAX_UID_CHARS = 128
STEER_SKEW_S = 5.0
"""A replacement created this long before its steer was written still counts: the consolidator's clock
and the API server's may disagree a little."""
HOUR_S = 3600.0
MAX_HOLD_S = 3600.0
"""The longest a hold or a steer may last (``HOLD_S``'s bound)."""
MAX_CLOCK_SKEW_S = 300.0
"""How far the consolidator's clock may run ahead of the extender's. A hold or steer that ends later than
:data:`MAX_HOLD_S` and this after the time it is judged at is no consolidator's and is not obeyed: a
write that would keep a node from every other pod for good."""
OBEYED_S = MAX_HOLD_S + MAX_CLOCK_SKEW_S


class HoldsFormatError(InvalidArgsError):
    """A holds document that cannot be read, or is past a bound; the message names the field."""


@dataclass(frozen=True)
class Hold:
    """``gpus`` GPUs of ``node`` kept for the Pending pod ``namespace/name`` (``uid``) until ``until``."""

    namespace: str
    name: str
    uid: str
    node: str
    gpus: int
    until: float


@dataclass(frozen=True)
class Steer:
    """The replacement of ``moved`` (a pod of the controller ``owner_kind/owner_name``, ``owner_uid``)
    goes to ``node``: steered from ``since`` until ``until``."""

    namespace: str
    owner_kind: str
    owner_name: str
    owner_uid: str
    moved: str
    node: str
    since: float
    until: float


@dataclass(frozen=True)
class HoldBook:
    """The consolidator's holds, steers and recent evictions (Unix seconds)."""

    holds: tuple[Hold, ...] = ()
    steers: tuple[Steer, ...] = ()
    evictions: tuple[float, ...] = field(default=())

    @cached_property
    def steers_by_owner(self) -> dict[str, tuple[Steer, ...]]:
        """The steers by their owner's UID: a filter looks up its pod's owner, not every steer."""
        found: dict[str, list[Steer]] = {}
        for steer in self.steers:
            found.setdefault(steer.owner_uid, []).append(steer)
        return {uid: tuple(steers) for uid, steers in found.items()}

    def live(self, now: float) -> HoldBook:
        """What has not lapsed at ``now``, and the evictions of the hour before it."""
        return HoldBook(
            tuple(h for h in self.holds if h.until > now),
            tuple(s for s in self.steers if s.until > now),
            tuple(t for t in self.evictions if now - t < HOUR_S),
        )

    def to_json(self) -> bytes:
        document = {
            "version": VERSION,
            "holds": [asdict(h) for h in self.holds],
            "steers": [asdict(s) for s in self.steers],
            "evictions": list(self.evictions),
        }
        return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> HoldBook:
        """Read a document :meth:`to_json` wrote. :class:`HoldsFormatError` names what is wrong.

        >>> book = HoldBook((Hold("ml", "p", "u1", "gpu-0", 8, 100.0),))
        >>> HoldBook.from_json(book.to_json()) == book
        True
        >>> try:
        ...     HoldBook.from_json(b'{"version": 1, "holds": [{"gpus": 8, "node": 7}]}')
        ... except HoldsFormatError as exc:
        ...     print(exc)
        holds[0].namespace: expected a string, got a missing value
        """
        if len(data) > MAX_DOCUMENT_BYTES:
            raise HoldsFormatError(f"holds document: {len(data)} bytes, over the bound of {MAX_DOCUMENT_BYTES}")
        try:
            document = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise HoldsFormatError(f"holds document: not JSON ({exc})") from exc
        if not isinstance(document, dict):
            raise HoldsFormatError("holds document: expected a JSON object")
        if document.get("version") != VERSION:
            raise HoldsFormatError(f"holds document: version {document.get('version')!r}, this reads {VERSION}")
        holds = _entries(document, "holds", MAX_HOLDS)
        steers = _entries(document, "steers", MAX_STEERS)
        evictions = document.get("evictions", [])
        if not isinstance(evictions, list) or len(evictions) > MAX_EVICTIONS:
            raise HoldsFormatError(f"evictions: expected a list of at most {MAX_EVICTIONS} times")
        return cls(
            tuple(_hold(entry, f"holds[{i}]") for i, entry in enumerate(holds)),
            tuple(_steer(entry, f"steers[{i}]") for i, entry in enumerate(steers)),
            tuple(_time(t, f"evictions[{i}]") for i, t in enumerate(evictions)),
        )

    def without(self, holds: set[Hold], steers: set[Steer]) -> HoldBook:
        return replace(
            self,
            holds=tuple(h for h in self.holds if h not in holds),
            steers=tuple(s for s in self.steers if s not in steers),
        )


def hold_refusals(
    book: HoldBook,
    index: Mapping[str, int],
    free_gpus: npt.NDArray[np.int32],
    pod: Mapping[str, Any],
    demand: PodDemand,
    now: float,
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """Where the book refuses ``pod``, on the rows of a node view (``index``: node name -> row;
    ``free_gpus`` shape (n_rows,)): (held for another pod, steered elsewhere), each shape (n_rows,).

    >>> book = HoldBook((Hold("ml", "big", "u-big", "a", 8, 100.0),))
    >>> held, _ = hold_refusals(book, {"a": 0, "b": 1}, np.array([8, 8]), {"metadata": {"uid": "u-small"}},
    ...                         PodDemand(gpus=1), now=50.0)
    >>> held.tolist()
    [True, False]
    """
    n_rows = free_gpus.shape[0]
    held = np.zeros(n_rows, dtype=bool)
    steered = np.zeros(n_rows, dtype=bool)
    metadata = pod.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    if demand.wants_gpu and book.holds:
        uid = metadata.get("uid")
        rows, gpus = [], []
        for hold in book.holds:
            row = index.get(hold.node)
            if now < hold.until <= now + OBEYED_S and hold.uid != uid and row is not None and row < n_rows:
                rows.append(row)
                gpus.append(hold.gpus)
        if rows:
            kept = np.zeros(n_rows, dtype=np.int64)
            np.add.at(kept, rows, gpus)  # holds for several pods on one node add up
            held = (kept > 0) & (free_gpus.astype(np.int64) - kept < max(demand.gpus, 1))
    owner = owner_of(pod) if book.steers else None
    mine = book.steers_by_owner.get(owner.uid, ()) if owner is not None else ()
    if mine:
        created = _created(metadata.get("creationTimestamp"))
        nodes = {
            s.node for s in mine
            if now < s.until <= now + OBEYED_S and s.namespace == metadata.get("namespace")
            and created is not None and created >= s.since - STEER_SKEW_S
        }  # fmt: skip
        if nodes:
            steered[:] = True
            for node in nodes:
                row = index.get(node)
                if row is not None and row < n_rows:
                    steered[row] = False
    return held, steered


def _created(value: object) -> float | None:
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _entries(document: Mapping[str, Any], key: str, bound: int) -> list[Any]:
    entries = document.get(key, [])
    if not isinstance(entries, list):
        raise HoldsFormatError(f"{key}: expected a list")
    if len(entries) > bound:
        raise HoldsFormatError(f"{key}: {len(entries)} entries, over the bound of {bound}")
    return entries


def _hold(entry: object, where: str) -> Hold:
    entry = _object(entry, where)
    gpus = entry.get("gpus")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 0 <= gpus <= MAX_GPUS_PER_NODE:
        raise HoldsFormatError(f"{where}.gpus: expected a whole number in 0..{MAX_GPUS_PER_NODE}, got {gpus!r:.64}")
    return Hold(
        namespace=_text(entry, "namespace", where),
        name=_text(entry, "name", where),
        uid=_text(entry, "uid", where, MAX_UID_CHARS),
        node=_text(entry, "node", where),
        gpus=gpus,
        until=_time(entry.get("until"), f"{where}.until"),
    )


def _steer(entry: object, where: str) -> Steer:
    entry = _object(entry, where)
    return Steer(
        namespace=_text(entry, "namespace", where),
        owner_kind=_text(entry, "owner_kind", where),
        owner_name=_text(entry, "owner_name", where),
        owner_uid=_text(entry, "owner_uid", where, MAX_UID_CHARS),
        moved=_text(entry, "moved", where),
        node=_text(entry, "node", where),
        since=_time(entry.get("since"), f"{where}.since"),
        until=_time(entry.get("until"), f"{where}.until"),
    )


def _object(entry: object, where: str) -> Mapping[str, Any]:
    if not isinstance(entry, dict):
        raise HoldsFormatError(f"{where}: expected an object")
    return entry


def _text(entry: Mapping[str, Any], key: str, where: str, bound: int = MAX_NAME_CHARS) -> str:
    value = entry.get(key)
    if not isinstance(value, str):
        got = "a missing value" if value is None else type(value).__name__
        raise HoldsFormatError(f"{where}.{key}: expected a string, got {got}")
    if len(value) > bound:
        raise HoldsFormatError(f"{where}.{key}: {len(value)} characters, over the bound of {bound}")
    return value


def _time(value: object, where: str) -> float:
    try:  # an integer of a thousand digits is JSON too: float() of it overflows
        ok = not isinstance(value, bool) and isinstance(value, int | float) and 0 <= float(value) < math.inf
    except OverflowError:
        ok = False
    if not ok:
        raise HoldsFormatError(f"{where}: expected Unix seconds, got {str(value)[:64]}")
    return float(value)  # type: ignore[arg-type]
