"""This extender instance's ledger readings: the clock-reading, thread-safe keeper of what its binds saw.

What the readings mean, and how they cap the state, is :mod:`scheduler_core.state.readings`.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from scheduler_core.state.readings import (
    ASSUMED_TTL_S,
    DEFAULT_KEEP_S,
    DEFAULT_MARGIN_S,
    MAX_ASSUMED,
    Observed,
    still_pending,
)


class LedgerReadings:
    """This instance's ledger readings, oldest first; thread-safe (the local server is threaded).

    >>> readings = LedgerReadings(clock=lambda: 100.0)
    >>> readings.observe("n1", (300, 1000))
    >>> [r.free for r in readings.pending(generated_at=50.0)]
    [(300, 1000)]
    >>> readings.pending(generated_at=200.0)
    []
    """

    def __init__(
        self,
        margin_s: float = DEFAULT_MARGIN_S,
        keep_s: float = DEFAULT_KEEP_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.margin_s, self.keep_s = margin_s, keep_s
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: list[Observed] = []
        self._assumed: OrderedDict[str, Observed] = OrderedDict()  # by pod UID, oldest first

    def observe(
        self, node: str, free: Sequence[int] | None, uid: str = "", cpu: int = 0, holds: Iterable[str] | None = None
    ) -> None:
        """The ledger says ``node`` has ``free`` milli per GPU now (after ``uid``'s bind, when it names a
        pod; None: no GPU figures), holding the pods ``holds`` there (None: not known), and ``uid`` takes
        ``cpu`` milli-cores there."""
        held = None if holds is None else frozenset(holds)
        with self._lock:
            if uid:  # the latest word about a pod replaces the earlier ones
                self._seen = [seen for seen in self._seen if seen.uid != uid]
                self._assumed.pop(uid, None)
            self._seen.append(Observed(node, self._clock(), _figures(free), uid, int(cpu), holds=held))

    def assume(self, node: str, taken: Sequence[tuple[int, int]], uid: str, cpu: int = 0) -> None:
        """A prediction about ``uid``, a pod named in a request (see
        :class:`~scheduler_core.state.readings.Readings`): it takes ``taken`` ((GPU, milli) pairs) and
        ``cpu`` milli-cores on ``node``. Kept :data:`ASSUMED_TTL_S`, the oldest of more than
        :data:`MAX_ASSUMED` dropped, seen by prioritize only. Constant time, whatever is kept."""
        if not uid:
            return
        pairs = tuple((int(gpu), int(milli)) for gpu, milli in taken)
        with self._lock:
            self._assumed.pop(uid, None)
            self._assumed[uid] = Observed(node, self._clock(), None, uid, int(cpu), taken=pairs)
            while len(self._assumed) > MAX_ASSUMED:
                self._assumed.popitem(last=False)

    def forget(self, uids: Iterable[str]) -> None:
        """Drop the readings about these pods: the state shows them now."""
        gone = set(uids)
        if not gone:
            return
        with self._lock:
            self._seen = [seen for seen in self._seen if seen.uid not in gone]
            for uid in gone & self._assumed.keys():
                del self._assumed[uid]

    def forget_nodes(self, nodes: Iterable[str], before: float) -> None:
        """Drop the ledger's readings (those about no pod) of these nodes made before ``before`` (Unix
        seconds): a state shows a pod gone from each since, so they count a share that is free now."""
        stale = set(nodes)
        if not stale:
            return
        with self._lock:
            self._seen = [seen for seen in self._seen if seen.uid or seen.node not in stale or seen.at >= before]

    def pending(self, generated_at: float | None, *, assumed: bool = False) -> list[Observed]:
        """Readings the state stamped ``generated_at`` may not reflect, oldest first; older ones are
        forgotten (:func:`scheduler_core.state.readings.still_pending`). With ``assumed``, the
        predictions of the last :data:`ASSUMED_TTL_S` too (they are the newest)."""
        with self._lock:
            if self._assumed:
                expired = self._clock() - ASSUMED_TTL_S
                while self._assumed and next(iter(self._assumed.values())).at < expired:
                    self._assumed.popitem(last=False)
            if self._seen:
                self._seen = still_pending(self._seen, generated_at, self._clock(), self.margin_s, self.keep_s)
            if not assumed or not self._assumed:
                return list(self._seen)
            return sorted([*self._seen, *self._assumed.values()], key=lambda seen: seen.at)


def _figures(free: Sequence[int] | None) -> tuple[int, ...] | None:
    return None if free is None else tuple(int(v) for v in free)
