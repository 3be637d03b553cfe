"""What this extender instance learned from the GPU ledger since its snapshot.

The snapshot is rebuilt once a minute, so a pod this instance bound ten seconds ago is not in it, nor
are the binds other instances made. Every bind reads the node's ledger item, and says what the ledger
has free there afterwards (this bind and everyone else's included); a bind refused for want of room
says what is really free. Each such reading caps that node's GPUs in the view filter and prioritize
use, in the order they happened, until a snapshot generated after them (less ``margin_s``, which
covers the time the refresher spends listing pods before it stamps ``generated_at``) replaces it.

The cap is a minimum with the snapshot, which also sees GPU pods the ledger does not (bound by
another scheduler). Counting something twice only makes the view briefly stricter than the ledger;
the ledger, not this view, decides every bind.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

DEFAULT_MARGIN_S = 30.0
DEFAULT_KEEP_S = 600.0


@dataclass(frozen=True)
class Observed:
    """The ledger showed ``free`` milli per GPU on ``node`` at ``at`` (Unix seconds)."""

    node: str
    at: float
    free: tuple[int, ...]


class LedgerReadings:
    """This instance's ledger readings, oldest first; thread-safe (the local server is threaded).

    >>> readings = LedgerReadings(clock=lambda: 100.0)
    >>> readings.observe("n1", (300, 1000))
    >>> free = np.array([[1000, 1000], [0, 1000]], dtype=np.int32)
    >>> readings.apply(free, ("n1", "n2"), readings.pending(generated_at=50.0)).tolist()
    [[300, 1000], [0, 1000]]
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

    def observe(self, node: str, free: Sequence[int]) -> None:
        """The ledger shows ``free`` milli per GPU on ``node`` now."""
        with self._lock:
            self._seen.append(Observed(node, self._clock(), tuple(int(v) for v in free)))

    def pending(self, generated_at: float | None) -> list[Observed]:
        """Readings the state stamped ``generated_at`` may not reflect (all of the last ``keep_s`` when it
        has no stamp), oldest first; older ones are forgotten."""
        with self._lock:
            if not self._seen:
                return []
            cutoff = self._clock() - self.keep_s
            if generated_at is not None:
                cutoff = max(cutoff, generated_at - self.margin_s)
            self._seen = [seen for seen in self._seen if seen.at >= cutoff]
            return list(self._seen)

    @staticmethod
    def apply(free: npt.NDArray[np.int32], names: Sequence[str], seen: Sequence[Observed]) -> npt.NDArray[np.int32]:
        """``free`` (one row per name), each observed node's GPUs capped at what the ledger had free; a copy."""
        index = {name: row for row, name in enumerate(names)}
        out = free.copy()
        width = out.shape[1]
        for reading in seen:
            row = index.get(reading.node)
            if row is None:
                continue
            cap = np.zeros(width, dtype=np.int32)
            count = min(width, len(reading.free))
            cap[:count] = reading.free[:count]
            np.minimum(out[row], cap, out=out[row])
        return out
