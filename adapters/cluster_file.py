"""A cluster source read from a JSON file (``{"nodes": [v1 Node], "pods": [v1 Pod]}``, and DRA's objects where
given: :meth:`~scheduler_core.state.cluster.ClusterState.from_document`), for ``serve --cluster``
and ``explain --cluster``: development and tests, beside the snapshot (:mod:`adapters.snapshot_store`) and
the live watch (:mod:`adapters.live_state`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from scheduler_core.errors import InvalidArgsError
from scheduler_core.extender.wire import decode_json
from scheduler_core.state.cluster import ClusterState

log = logging.getLogger(__name__)


class ClusterFile:
    """A cluster JSON file (``{"nodes": [...], "pods": [...]}``) re-read when it changes.

    The file is stat'ed at most every ``refresh_s`` seconds and re-parsed when its size or mtime
    changed. A file that fails to parse on reload keeps the previous state in service (and logs why),
    so a half-written file never empties the cluster.
    """

    def __init__(
        self, path: str | Path, *, refresh_s: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = Path(path)
        self.refresh_s = refresh_s
        self._clock = clock
        self._lock = threading.Lock()
        # Stat before reading: a change made while we read shows up as a new stamp next time.
        try:
            self._stamp = self._stat()
        except OSError as exc:
            raise InvalidArgsError(f"cannot read cluster file {self.path}: {exc.strerror}") from exc
        self._state = load_cluster_file(self.path)
        self._checked_at = clock()

    def _stat(self) -> tuple[int, int]:
        stat = self.path.stat()
        return stat.st_mtime_ns, stat.st_size

    def __call__(self) -> ClusterState:
        now = self._clock()
        if now - self._checked_at < self.refresh_s:
            return self._state
        with self._lock:
            if now - self._checked_at >= self.refresh_s:
                self._checked_at = now
                self._reload_if_changed()
        return self._state

    def _reload_if_changed(self) -> None:
        try:
            stamp = self._stat()
            if stamp == self._stamp:
                return
            self._state = load_cluster_file(self.path)
            self._stamp = stamp
        except (OSError, InvalidArgsError) as exc:
            log.warning("keeping the previous cluster state: %s", exc)


def load_cluster_file(path: Path) -> ClusterState:
    """Read and validate a cluster JSON file; problems are raised as :class:`InvalidArgsError`."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidArgsError(f"cannot read cluster file {path}: {exc.strerror}") from exc
    try:
        state = ClusterState.from_document(decode_json(data))
    except InvalidArgsError as exc:
        raise InvalidArgsError(f"{path}: {exc}") from exc
    for problem in state.problems:
        log.warning("%s: %s", path, problem)
    return state
