"""The node-state refresher's watch mode against a real control plane, as EventBridge runs it on Lambda.

:class:`Schedule` starts ``gpu-scheduler refresh node-state --once --watch W`` every ``period_s``, each
in its own process (one Lambda instance each), so that consecutive ones overlap by ``W - period_s``: the
handover. :func:`probe` changes the cluster while they run and measures what the extender sees through
:class:`~adapters.snapshot_store.SnapshotSource`, re-checking the store every second as it does on Lambda:
how long each change takes to reach it, and whether the stored revision ever went back.
Used by ``tests/e2e/test_lambda_watch.py`` and ``gpu-scheduler bench e2e-lambda-watch``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from adapters.live_state import lag_quantiles
from adapters.snapshot_store import SnapshotSource, SnapshotStore, SnapshotStoreError
from scheduler_core.errors import ClusterStateUnavailableError
from scheduler_core.simulator.synthetic import make_pod
from scheduler_core.state.snapshot import Revision, snapshot_revision
from testing.control_plane import ControlPlane
from testing.product import Processes


class Schedule:
    """EventBridge's rate for the refresher: an invocation now and then every ``period_s``, ``count`` in
    all, each ``gpu-scheduler refresh node-state --once --watch WATCH_S`` in its own process (``watch_s``
    0: no watch, the run alone); their names in :class:`Processes` are ``names``."""

    def __init__(
        self,
        product: Processes,
        cluster: ControlPlane,
        env: Mapping[str, str],
        snapshot_uri: str,
        *,
        watch_s: float,
        period_s: float,
        count: int,
        extra: Sequence[str] = (),
    ) -> None:
        self.product = product
        self.argv = ["node-state", "--once", "--no-ec2", *(["--watch", f"{watch_s}s"] if watch_s else []),
                     "--kubeconfig", str(cluster.kubeconfig_of("node-state")),
                     "--snapshot", snapshot_uri, *extra]  # fmt: skip
        self.env, self.period_s, self.count = env, period_s, count
        self.names: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="schedule", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for index in range(self.count):
            if index and self._stop.wait(self.period_s):
                return
            name = f"node-state-{index}"
            self.product.refresher(name, self.argv, self.env)
            self.names.append(name)

    def stop(self) -> None:
        """Start no more invocations (those running watch on to their end)."""
        self._stop.set()
        self._thread.join()

    def reports(self, timeout_s: float) -> list[dict[str, Any]]:
        """Each started invocation's run report, once it has exited."""
        self.stop()
        deadline = time.monotonic() + timeout_s
        for name in self.names:
            self.product.running[name].wait(timeout=max(1.0, deadline - time.monotonic()))
        reports = []
        for name in self.names:
            wait_until = time.monotonic() + 5
            while not self.product.reports(name) and time.monotonic() < wait_until:
                time.sleep(0.05)  # the report's copier thread may still be writing
            found = self.product.reports(name)
            if not found:
                raise AssertionError(f"{name} exited without a report: {self.product.tail(name)}")
            reports.append(found[-1])
        return reports


@dataclass
class Probe:
    lags_s: list[float] = field(default_factory=list)  # API change -> the extender's state shows it
    missed: int = 0  # changes not seen within the probe's limit
    revisions: list[Revision] = field(default_factory=list)  # the stored revision, each time it changed
    went_back: list[tuple[Revision, Revision]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"changes": len(self.lags_s) + self.missed, "missed": self.missed, **lag_quantiles(self.lags_s),
                "revisions_seen": len(self.revisions), "revision_went_back": len(self.went_back)}  # fmt: skip


def probe(
    cluster: ControlPlane,
    store: SnapshotStore,
    *,
    namespace: str,
    node: str,
    duration_s: float,
    limit_s: float = 15.0,
) -> Probe:
    """For ``duration_s``: create a one-GPU pod bound to ``node``, wait until the extender's snapshot
    shows it, delete it, wait until it shows that, and so on; meanwhile record every revision stored."""
    found = Probe()
    source = SnapshotSource(store, refresh_s=1.0, max_age_s=3600)
    done = threading.Event()
    watcher = threading.Thread(target=_revisions, args=(store, found, done), daemon=True)
    watcher.start()
    deadline = time.monotonic() + duration_s
    try:
        index = 0
        while time.monotonic() < deadline:
            name = f"probe-{index}"
            pod = make_pod(name, 1, namespace=namespace, node_name=node)  # bound already: no scheduler needed
            cluster.api.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
            _until_used(source, node, 1, limit_s, found)
            cluster.delete_pod(namespace, name)
            _until_used(source, node, 0, limit_s, found)
            index += 1
    finally:
        done.set()
        watcher.join(timeout=5)
    return found


def wait_stored(store: SnapshotStore, timeout_s: float) -> None:
    """Until the store holds a snapshot (the first invocation's run has written it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if store.fetch(None) is not None:
                return
        except SnapshotStoreError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"no snapshot in {timeout_s:.0f} s")


def _until_used(source: SnapshotSource, node: str, gpus: int, limit_s: float, found: Probe) -> None:
    changed = time.monotonic()
    while time.monotonic() - changed < limit_s:
        try:
            state = source.current()
            row = state.table.index.get(node)
            if row is not None and int(state.used_gpus[row]) == gpus:
                found.lags_s.append(time.monotonic() - changed)
                return
        except ClusterStateUnavailableError:
            pass
        time.sleep(0.02)
    found.missed += 1


def _revisions(store: SnapshotStore, found: Probe, done: threading.Event) -> None:
    etag: str | None = None
    while not done.wait(0.1):
        try:
            fetched = store.fetch(etag)
        except SnapshotStoreError:
            continue
        if fetched is None:
            continue
        etag = fetched.etag
        revision = snapshot_revision(fetched.data)
        if revision is None:
            continue
        if found.revisions and revision < found.revisions[-1]:
            found.went_back.append((found.revisions[-1], revision))
        if not found.revisions or revision != found.revisions[-1]:
            found.revisions.append(revision)
