"""The cluster as it is now: the state rebuilt off the hot path from a list+watch of nodes and pods.

``gpu-scheduler serve --watch`` decides from this instead of a snapshot. A
:class:`~adapters.cluster_mirror.ClusterMirror` lists and watches the cluster (nodes, and the non-terminal
pods bound to a node, as the refresher lists them), and a thread of its own rebuilds the
:class:`~scheduler_core.state.cluster.ClusterState` when something changed, a few milliseconds after
the change (``min_interval_s``), and publishes it whole: filter and prioritize read the latest one and
never wait for a rebuild.

What it also does with each rebuild:

- the extender's own decisions (``readings``, uid-tagged) about every pod the new state shows bound,
  wherever, or gone, are forgotten: the state now says where the pod went;
- a share pod that is gone or finished is handed to ``on_gone(node, uid)``, which frees its share in the
  GPU ledger (``serve`` passes the binder's release) within seconds instead of at the next reconcile.

:meth:`LiveState.catch_up` lets filter wait for a change that frees capacity (a pod gone, a node
changed) to be in the state before it refuses a node for what is in use: kube-scheduler 1.33 retries
a pod that the extender refused the moment such an event reaches its own informer, and a refusal
from a state a few milliseconds older would leave the pod waiting for some later event.

Lag, the time from an event's arrival to the state that includes it, is kept for :meth:`stats`
(``/metrics``). It does not include the API server's own delivery time.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import replace
from typing import Any

from adapters.cluster_mirror import ClusterMirror, pod_node
from adapters.kube import DRA_KINDS, KubeClient
from scheduler_core.errors import ClusterStateUnavailableError
from scheduler_core.k8s.dra import DraFacts, dra_facts_of
from scheduler_core.scoring.locality import DEFAULT_LABEL_KEYS
from scheduler_core.state.allocation import PodUse, pod_use
from scheduler_core.state.cluster import ClusterState, NodeFacts
from scheduler_core.state.readings import Readings

log = logging.getLogger(__name__)

REBUILD_SPACING = 4.0
"""A rebuild that took T seconds waits ``REBUILD_SPACING x T`` after it, and at least ``min_interval_s``:
rebuilding takes at most a fifth of a core however fast events come, and filter and prioritize (which
see this instance's own decisions at once, through the readings) keep the rest."""
DELETION_WAIT_S = 0.05
"""How long :meth:`LiveState.catch_up` waits for the deletion of a terminating pod to arrive, when none
has: kube-scheduler's watch and this one get it within a millisecond or two of each other here."""


class LiveState(ClusterMirror):
    """A :data:`~scheduler_core.extender.facade.ClusterSource` fed by a list+watch (see the module docstring).

    Parameters
    ----------
    connect : returns a KubeClient; called once per watching thread
    label_keys : the label keys indexed for locality
    readings : the extender's readings, whose uid-tagged entries each rebuild confirms or drops
    on_gone : called with (node, pod UID) for a share pod that is gone or finished, off the watch thread
    """

    def __init__(
        self,
        connect: Callable[[], KubeClient],
        *,
        label_keys: Sequence[str] = DEFAULT_LABEL_KEYS,
        readings: Readings | None = None,
        on_gone: Callable[[str, str], object] | None = None,
        min_interval_s: float = 0.025,
        watch_timeout_s: int = 300,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        dra_api: str | None = None,
    ) -> None:
        super().__init__(
            connect, on_gone=on_gone, watch_timeout_s=watch_timeout_s, monotonic=monotonic, dra_api=dra_api
        )
        self.label_keys = tuple(label_keys)
        self.readings = readings
        self.min_interval_s = min_interval_s
        self._wall = wall
        self._uses: dict[str, PodUse] = {}  # each pod read once, when its event arrives
        self._facts: NodeFacts | None = None  # the nodes read once, again only when one changes
        self._dra: DraFacts | None = None  # DRA's objects read once, again only when one changes
        self._changed: dict[str, float] = {}  # pod UID -> when its latest event arrived (monotonic)
        # UIDs of the pods whose latest event shows them placed (bound to a node) or gone: the rebuild that
        # takes them forgets the extender's readings about them. A pending pod's event (its creation, a
        # status update) is not among them: prioritize's prediction for it stands until it binds.
        self._settled: set[str] = set()
        self._freed_on: set[str] = set()  # nodes a pod left since the last rebuild took the changes
        self._terminating: dict[str, set[str]] = {}  # node -> UIDs of its pods that have a deletionTimestamp
        self._state: ClusterState | None = None
        # Events counted as they arrive; the latest that may free capacity, and the count the published
        # state includes (catch_up compares them).
        self._received = 0
        self._freeing = 0
        self._node_changed = 0  # the last node list received: every node's facts may have changed
        self._node_events: dict[str, int] = {}  # per node, its last event received
        self._published = 0
        self.lag_s: deque[float] = deque(maxlen=20_000)
        self.counters["rebuilds"] = 0
        self.counters["catch_ups"] = 0
        self.published_versions = {"nodes": "", "pods": ""}  # what the latest published state includes
        self.last_rebuild_ms = 0.0
        self._next_at = 0.0

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> LiveState:
        super().start()
        self._thread(self._build_forever, name="state-builder")
        return self

    def wait_synced(self, timeout_s: float) -> bool:
        """True once every list is in (:attr:`synced`) and a state is built from them."""
        deadline = self._monotonic() + timeout_s
        while self._monotonic() < deadline:
            if self._state is not None:
                return True
            time.sleep(0.02)
        return self._state is not None

    # -- the cluster source -------------------------------------------------------------------
    def __call__(self) -> ClusterState:
        state = self._state
        if state is None:
            with self._lock:
                waiting = [kind for kind in self.kinds if kind not in self._synced]
                if self.dra_api is None:
                    waiting.append("resource.k8s.io discovery")
            raise ClusterStateUnavailableError(
                f"the live state is still listing the cluster ({', '.join(waiting) or 'building'});"
                " kube-scheduler retries the pod",
                kind="syncing",
            )
        return state

    def catch_up(self, timeout_s: float, nodes: Collection[str] = (), *, node_facts: bool = False) -> bool:
        """Wait, at most ``timeout_s``, until the published state includes every change received so far
        that may free capacity (a pod deleted or finished, a node added or changed, a new list); with
        ``node_facts``, every change received of ``nodes``, nodes this state is known to be behind on. Where
        none is pending but one of ``nodes`` holds a terminating pod (with ``node_facts``: any of
        ``nodes``), first wait up to :data:`DELETION_WAIT_S` for such a change to arrive:
        kube-scheduler's own watch may have had it a moment before this one. True when it waited for a
        change and it is in now; False when there was none, or the wait timed out."""
        deadline = self._monotonic() + timeout_s

        def counter() -> int:
            if not node_facts:
                return self._freeing
            return max([self._node_changed, *(self._node_events.get(node, 0) for node in nodes)])

        with self._wake:
            target = counter()
            if target <= self._published:
                if not (node_facts and nodes) and not any(self._terminating.get(node) for node in nodes):
                    return False
                arrived = self._wake.wait_for(
                    lambda: counter() > target or self._stop.is_set(), timeout=min(timeout_s, DELETION_WAIT_S)
                )
                if not arrived or self._stop.is_set():
                    return False
                target = counter()
            self.counters["catch_ups"] += 1
            left = max(0.0, deadline - self._monotonic())
            caught = self._wake.wait_for(lambda: self._published >= target or self._stop.is_set(), timeout=left)
            return bool(caught) and self._published >= target

    def stats(self) -> dict[str, Any]:
        """Counters, the watch positions, and the lag over the recent events (seconds)."""
        state = self._state
        return {
            **self.counters,
            "resource_versions": dict(self.versions),
            "published_resource_versions": dict(self.published_versions),
            "synced": state is not None,
            "nodes": state.table.n_nodes if state is not None else 0,
            "invalid_nodes": len(state.table.invalid) if state is not None else 0,  # over a cap: refused
            "dra_watched": bool(self.dra_api),
            **lag_quantiles(self.lag_s),
            "last_rebuild_ms": round(self.last_rebuild_ms, 2),
        }

    # -- changes ------------------------------------------------------------------------------
    def _listed(self, kind: str, fresh: dict[str, dict[str, Any]], previous: dict[str, dict[str, Any]]) -> None:
        super()._listed(kind, fresh, previous)
        self._received += 1
        self._freeing = self._received
        if kind == "pods":
            self._freed_on.update(pod_node(pod) for uid, pod in previous.items() if uid not in fresh)
            self._terminating = {}
            for uid, pod in fresh.items():
                if (pod.get("metadata") or {}).get("deletionTimestamp"):
                    self._terminating.setdefault(pod_node(pod), set()).add(uid)
            self._changed.update(dict.fromkeys(fresh, self._monotonic()))
            self._settled.update(uid for uid, pod in fresh.items() if pod_node(pod))
            self._settled.update(uid for uid in previous if uid not in fresh)
            self._uses = {uid: pod_use(pod) for uid, pod in fresh.items()}
        elif kind == "nodes":
            self._facts = None
            self._node_changed = self._received
        else:
            self._dra = None

    def _changed_one(self, kind: str, event: str, key: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        super()._changed_one(kind, event, key, obj, old)
        self._received += 1
        # What may free capacity (a bind only takes some); any DRA change may be a claim let go.
        if kind != "pods" or event == "DELETED":
            self._freeing = self._received
        if kind != "pods":
            if kind == "nodes":
                self._facts = None
                self._node_events[key] = self._received
            else:
                self._dra = None
            return
        node = pod_node(old or obj)
        if event == "DELETED" or not (obj.get("metadata") or {}).get("deletionTimestamp"):
            self._terminating.get(node, set()).discard(key)
        else:
            self._terminating.setdefault(node, set()).add(key)
        if event == "DELETED":
            self._uses.pop(key, None)
            self._freed_on.add(node)
        else:
            self._uses[key] = pod_use(obj)
        self._changed[key] = self._monotonic()
        if event == "DELETED" or pod_node(obj):
            self._settled.add(key)
        else:
            self._settled.discard(key)  # pending again (a relist's stale view): nothing to confirm yet

    # -- rebuilding ---------------------------------------------------------------------------
    def _build_forever(self) -> None:
        while not self._stop.is_set():
            with self._wake:
                while (self._dirty_since is None or not self.synced) and not self._stop.is_set():
                    self._wake.wait(timeout=1.0)
                if self._stop.is_set():
                    return
            # Let a burst of events land in one rebuild (see REBUILD_SPACING).
            time.sleep(max(0.0, self._next_at - self._monotonic()))
            with self._wake:
                nodes = list(self._objects["nodes"].values()) if self._facts is None else None
                dra_objects = self._dra_lists() if self._dra is None else None
                uses = list(self._uses.values())
                changed, self._changed = self._changed, {}
                settled, self._settled = self._settled, set()
                freed_on, self._freed_on = self._freed_on, set()
                self._dirty_since = None
                versions = dict(self.versions)
                received = self._received
            if nodes is not None:
                facts = NodeFacts.of(nodes)
                with self._wake:
                    # A node event meanwhile has cleared it again: the next rebuild reads the nodes anew.
                    self._facts = facts if self._facts is None and self.versions["nodes"] == versions["nodes"] else None
            else:
                assert self._facts is not None
                facts = self._facts
            dra = self._dra
            if dra_objects is not None:
                try:
                    dra = dra_facts_of(dra_objects)
                except Exception:  # as _rebuild: one bad object must not freeze the state
                    log.exception("reading DRA's objects failed; keeping the previous state")
                    continue
                with self._wake:
                    same = all(self.versions[kind] == versions[kind] for kind in DRA_KINDS)
                    self._dra = dra if self._dra is None and same else None
            if self._rebuild(facts, uses, changed, settled, freed_on - {""}, dra):
                with self._wake:
                    self.published_versions = versions
                    self._published = received
                    self._wake.notify_all()

    def _rebuild(
        self, facts: NodeFacts, uses: list[PodUse], changed: dict[str, float], settled: set[str],
        freed_on: set[str], dra: DraFacts | None = None,
    ) -> bool:  # fmt: skip
        started_wall, started = self._wall(), self._monotonic()
        try:
            state = ClusterState.from_uses(facts, uses, label_keys=self.label_keys, dra=dra)
        except Exception:  # one bad object must not freeze the state: keep the last good one
            log.exception("rebuilding the live state failed; keeping the previous one")
            return False
        if self.readings is not None and freed_on:
            # The ledger's counts on those nodes include what is free now; dropped before the state that
            # shows it is published, so no filter sees the new state under the old cap.
            self.readings.forget_nodes(freed_on, started_wall)
        self._state = replace(state, generated_at=started_wall)
        done = self._monotonic()
        self.last_rebuild_ms = 1000 * (done - started)
        self._next_at = done + max(self.min_interval_s, REBUILD_SPACING * (done - started))
        self.counters["rebuilds"] += 1
        self.lag_s.extend(done - at for at in changed.values())
        if self.readings is not None and settled:
            self.readings.forget(settled)  # bound somewhere, or gone: the state says which now
        return True


def lag_quantiles(lags: Iterable[float]) -> dict[str, float]:
    """p50, p99 and the largest of ``lags`` (seconds), as ``lag_p50_s``, ``lag_p99_s``, ``lag_max_s``."""
    ordered = sorted(lags)

    def quantile(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0

    return {
        "lag_p50_s": round(quantile(0.5), 4),
        "lag_p99_s": round(quantile(0.99), 4),
        "lag_max_s": round(ordered[-1], 4) if ordered else 0.0,
    }


def prometheus_text(stats: dict[str, Any], prefix: str = "gpu_scheduler_live_state") -> str:
    """``stats`` as Prometheus text exposition (gauges and counters; nested maps become labels).

    >>> print(prometheus_text({"events": 3, "lag_p99_s": 0.01, "resource_versions": {"pods": "17"}}), end="")
    gpu_scheduler_live_state_events 3
    gpu_scheduler_live_state_lag_p99_s 0.01
    gpu_scheduler_live_state_resource_version{kind="pods"} 17
    """
    lines = []
    for name, value in stats.items():
        if isinstance(value, dict):
            singular = name.removesuffix("s")  # resource_versions -> resource_version{kind=...}
            lines += [f'{prefix}_{singular}{{kind="{k}"}} {_number(v)}' for k, v in value.items()]
        else:
            lines.append(f"{prefix}_{name} {_number(value)}")
    return "\n".join(lines) + "\n"


def _number(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    try:
        return repr(float(value)) if isinstance(value, float) else str(int(value))
    except (TypeError, ValueError):
        return "0"
