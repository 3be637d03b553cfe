"""This extender instance's ledger readings: the clock-reading, thread-safe keeper of what its binds saw.

What the readings mean, and how they cap the state, is :mod:`scheduler_core.state.readings`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence

from scheduler_core.state.readings import DEFAULT_KEEP_S, DEFAULT_MARGIN_S, Observed, still_pending


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

    def observe(self, node: str, free: Sequence[int] | None, uid: str = "", cpu: int = 0) -> None:
        """``node`` has ``free`` milli per GPU now (the ledger says so, or ``uid``'s placement leaves that;
        None: no GPU figures), and ``uid`` takes ``cpu`` milli-cores there."""
        with self._lock:
            if uid:  # the latest decision about a pod replaces the earlier ones
                self._seen = [seen for seen in self._seen if seen.uid != uid]
            figures = None if free is None else tuple(int(v) for v in free)
            self._seen.append(Observed(node, self._clock(), figures, uid, int(cpu)))

    def forget(self, uids: Iterable[str]) -> None:
        """Drop the readings about these pods: the state shows them now."""
        gone = set(uids)
        if not gone:
            return
        with self._lock:
            self._seen = [seen for seen in self._seen if seen.uid not in gone]

    def forget_nodes(self, nodes: Iterable[str], before: float) -> None:
        """Drop the ledger's readings (those about no pod) of these nodes made before ``before`` (Unix
        seconds): a state shows a pod gone from each since, so they count a share that is free now."""
        stale = set(nodes)
        if not stale:
            return
        with self._lock:
            self._seen = [seen for seen in self._seen if seen.uid or seen.node not in stale or seen.at >= before]

    def pending(self, generated_at: float | None) -> list[Observed]:
        """Readings the state stamped ``generated_at`` may not reflect, oldest first; older ones are
        forgotten (:func:`scheduler_core.state.readings.still_pending`)."""
        with self._lock:
            if not self._seen:
                return []
            self._seen = still_pending(self._seen, generated_at, self._clock(), self.margin_s, self.keep_s)
            return list(self._seen)
