"""This extender instance's own recent binds, laid over a snapshot that does not show them yet.

The snapshot is rebuilt once a minute, so a pod this instance bound ten seconds ago is not in it. Its
GPUs are taken off the free milli that filter and prioritize read, until a snapshot generated after
the bind (less ``margin_s``, which covers the time the refresher spends listing pods before it stamps
``generated_at``) replaces the view. Counting a bind twice only makes the view briefly stricter than
the ledger; the ledger, not this view, decides every bind.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scheduler_core.ledger import Pairs

DEFAULT_MARGIN_S = 30.0
DEFAULT_KEEP_S = 600.0


@dataclass(frozen=True)
class Bound:
    node: str
    pairs: Pairs
    at: float  # Unix seconds


class RecentBinds:
    """Binds made by this instance, newest last; thread-safe (the local server is threaded).

    >>> recent = RecentBinds(clock=lambda: 100.0)
    >>> recent.record("n1", ((1, 250),))
    >>> free = np.array([[1000, 1000]], dtype=np.int32)
    >>> recent.apply(free, ("n1",), recent.pending(generated_at=50.0)).tolist()
    [[1000, 750]]
    >>> recent.pending(generated_at=200.0)
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
        self._binds: list[Bound] = []

    def record(self, node: str, pairs: Pairs) -> None:
        with self._lock:
            self._binds.append(Bound(node, tuple(pairs), self._clock()))

    def pending(self, generated_at: float | None) -> list[Bound]:
        """Binds the state stamped ``generated_at`` may not show (all of the last ``keep_s`` when it
        has no stamp); older ones are forgotten."""
        with self._lock:
            if not self._binds:
                return []
            cutoff = self._clock() - self.keep_s
            if generated_at is not None:
                cutoff = max(cutoff, generated_at - self.margin_s)
            self._binds = [bound for bound in self._binds if bound.at >= cutoff]
            return list(self._binds)

    @staticmethod
    def apply(free: npt.NDArray[np.int32], names: Sequence[str], binds: Sequence[Bound]) -> npt.NDArray[np.int32]:
        """``free`` (one row per name) less the binds' milli, never below 0; a copy."""
        index = {name: row for row, name in enumerate(names)}
        out = free.copy()
        for bound in binds:
            row = index.get(bound.node)
            if row is None:
                continue
            for gpu, milli in bound.pairs:
                if gpu < out.shape[1]:
                    out[row, gpu] = max(0, int(out[row, gpu]) - milli)
        return out
