"""A list+watch of the cluster held in memory: nodes, the non-terminal pods bound to a node, and DRA's objects.

Two threads (one per kind, more with DRA) list and watch, resume from the last ``resourceVersion`` when
a watch ends, and list again on 410. What is held is the raw objects, keyed by UID (pods) or name; the
live state (:mod:`adapters.live_state`) rebuilds the scheduler's state from them, and the node-state
refresher's watch mode (:mod:`application.node_state.watch`) writes snapshots of them. A share pod that
is gone or finished is handed to ``on_gone(node, uid)``, which frees its share in the GPU ledger.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from adapters.errors import AdapterError
from adapters.kube import DRA_KINDS, KubeClient
from adapters.kube_transport import ListExpiredError
from adapters.kube_types import SchedulingPod
from scheduler_core.k8s.names import ASSIGNED_GPUS_ANNOTATION

# Logged under the live state's name, where the mirror's warnings were logged before it had a module of its own.
log = logging.getLogger("adapters.live_state")

FAILURE_LOG_S = 60.0
"""While a list or watch keeps failing, one warning per this many seconds (and per kind)."""
BOUND_NON_TERMINAL = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
"""The pods that hold resources on a node: what the node-state refresher lists, and what is watched."""
Taken = tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, str], dict[str, list[dict[str, Any]]] | None]
"""What :meth:`ClusterMirror.take` returns: the nodes, the pods, the versions, and DRA's objects by kind."""


class ClusterMirror:
    """A list+watch of the cluster's nodes and of the non-terminal pods bound to a node, held in memory,
    and of DRA's DeviceClasses, ResourceSlices and ResourceClaims where the API serves them.

    One thread per kind lists, then watches from the list's ``resourceVersion``, resumes from the last
    one it saw when a watch ends, and lists again on 410. Subclasses react to changes through
    :meth:`_listed` and :meth:`_changed_one` (called with the lock held) and wait on ``_wake``.

    A share pod (one with the ``assigned-gpus`` annotation) that is deleted, finishes, or is missing
    from a new list is handed to ``on_gone(node, uid)`` off the watch thread, which frees its share in
    the GPU ledger within seconds instead of at the next reconcile.

    Parameters
    ----------
    connect : returns a KubeClient; called once per watching thread
    on_gone : called with (node, pod UID) for a share pod that is gone or finished
    watch_timeout_s : how long one watch request lasts before it is resumed
    dra_api : the ``resource.k8s.io`` version to watch (``resource.k8s.io/v1beta2``), "" for none, or None
        to ask the API server once started (:meth:`KubeClient.dra_api`; asked again until it answers, and
        the mirror is not synced until it has)
    """

    def __init__(
        self,
        connect: Callable[[], KubeClient],
        *,
        on_gone: Callable[[str, str], object] | None = None,
        watch_timeout_s: int = 300,
        monotonic: Callable[[], float] = time.monotonic,
        dra_api: str | None = "",
    ) -> None:
        self._connect = connect
        self.on_gone = on_gone
        self.watch_timeout_s = watch_timeout_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._objects: dict[str, dict[str, dict[str, Any]]] = {"nodes": {}, "pods": {}}
        self._synced: set[str] = set()
        self._dirty_since: float | None = None  # the first change not yet taken by the subclass
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._gone = ThreadPoolExecutor(max_workers=2, thread_name_prefix="share-release")
        self._gone_by_node: dict[str, set[str]] = {}  # shares seen gone, not yet released
        self.counters = {"events": 0, "lists": 0, "relists_410": 0, "watch_errors": 0, "released": 0}
        self.versions = {"nodes": "", "pods": ""}
        self.dra_api = dra_api
        self._failures: dict[str, tuple[int, float]] = {}  # what -> (failures not logged, when last logged)

    @property
    def kinds(self) -> tuple[str, ...]:
        """What is watched: nodes, pods, and DRA's objects where :attr:`dra_api` names a version."""
        return ("nodes", "pods", *(DRA_KINDS if self.dra_api else ()))

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> ClusterMirror:
        if self.dra_api is None:
            self._thread(self._discover_dra, name="discover-dra")
        self._watch_kinds(self.kinds)
        return self

    def _watch_kinds(self, kinds: Sequence[str]) -> None:
        with self._lock:
            for kind in kinds:
                self._objects.setdefault(kind, {})
                self.versions.setdefault(kind, "")
        for kind in kinds:
            self._thread(self._watch_forever, kind, name=f"watch-{kind}")

    def _discover_dra(self) -> None:
        """Ask the API server which DRA version it serves until it answers, then watch DRA's objects there
        (none if it serves none). Until then the mirror is not synced: claims it has not read would count
        their GPUs as free."""
        backoff = 0.2
        while not self._stop.is_set():
            try:
                api = self._connect().dra_api()
                break
            except AdapterError as exc:
                self.counters["watch_errors"] += 1
                self._failing("discovering resource.k8s.io", exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
        else:
            return
        with self._wake:
            self.dra_api = api
            self._wake.notify_all()
        self._watch_kinds(tuple(DRA_KINDS) if api else ())

    def _failing(self, what: str, exc: Exception, backoff: float) -> None:
        """Log a failed call of ``what``: its first failure, then one line a minute while it keeps failing
        (an unreachable API server would otherwise fill the log: the retries go on every few seconds)."""
        now = self._monotonic()
        count, last = self._failures.get(what, (0, -math.inf))
        if now - last >= FAILURE_LOG_S:
            more = f" ({count} more failures since the last report)" if count else ""
            log.warning("%s failed, again in %.1f s, retrying with backoff%s: %s", what, backoff, more, exc)
            self._failures[what] = (0, now)
        else:
            log.debug("%s failed, again in %.1f s: %s", what, backoff, exc)
            self._failures[what] = (count + 1, last)

    def _thread(self, target: Callable[..., None], *args: Any, name: str) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def close(self) -> None:
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
        self._gone.shutdown(wait=False, cancel_futures=True)

    def seed(self, kind: str, items: Sequence[dict[str, Any]], version: str) -> None:
        """Start from a list already made (before :meth:`start`): the watch resumes from ``version``."""
        self._objects.setdefault(kind, {})
        self._take_list(kind, items, version)

    def _dra_lists(self) -> dict[str, list[dict[str, Any]]] | None:
        """DRA's objects held, by kind (:func:`~scheduler_core.k8s.dra.dra_facts_of`); None where DRA is not
        watched. Called with the lock held."""
        if not self.dra_api:
            return None
        return {kind: list(self._objects.get(kind, {}).values()) for kind in DRA_KINDS}

    def objects(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, str]]:
        """The nodes, the pods, and the ``resourceVersion`` of each kind they are complete up to."""
        with self._lock:
            return list(self._objects["nodes"].values()), list(self._objects["pods"].values()), dict(self.versions)

    def next_change(self, timeout_s: float) -> float | None:
        """Wait up to ``timeout_s`` for a change not yet taken (:meth:`take`); when the first one arrived
        (monotonic), or None if none came or the mirror was closed."""
        with self._wake:
            self._wake.wait_for(lambda: self._stop.is_set() or (self._dirty_since is not None and self.synced),
                                timeout=timeout_s)  # fmt: skip
            return None if self._stop.is_set() else self._dirty_since

    def take(self) -> Taken:
        """:meth:`objects` and DRA's objects by kind (None where DRA is not watched), all of one moment,
        marking every change so far as taken."""
        with self._lock:
            self._dirty_since = None
            nodes, pods = list(self._objects["nodes"].values()), list(self._objects["pods"].values())
            return nodes, pods, dict(self.versions), self._dra_lists()

    @property
    def synced(self) -> bool:
        """Every kind listed once, DRA's included once discovery has said whether it is served."""
        return self.dra_api is not None and self._synced >= set(self.kinds)

    def gone_on(self, node: str) -> frozenset[str]:
        """The pods seen gone from ``node`` whose shares the ledger may still hold: a bind there frees them
        in its own write (the binder's ``gone``), before the background release gets to them."""
        with self._lock:
            return frozenset(self._gone_by_node.get(node, ()))

    def node(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._objects["nodes"].get(name)

    # -- what subclasses react to (called with the lock held; call these first) ---------------
    def _listed(self, kind: str, fresh: dict[str, dict[str, Any]], previous: dict[str, dict[str, Any]]) -> None:
        """A list of ``kind`` replaced ``previous`` with ``fresh`` (keyed by UID for pods, name for nodes)."""
        if kind == "pods":
            for uid, old in previous.items():
                if uid not in fresh:  # deleted while no watch ran
                    self._gone_share(old)

    def _changed_one(self, kind: str, event: str, key: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        """One watch event; ``old`` is the object it replaces or deletes, if it was held."""
        if kind == "pods" and event == "DELETED":
            self._gone_share(old or obj)

    def _gone_share(self, pod: dict[str, Any] | None) -> None:
        """Hand a gone or finished pod that held a share to ``on_gone``."""
        if pod is None or self.on_gone is None:
            return
        found = share_holder(pod)
        if found is not None:
            self._gone_by_node.setdefault(found[0], set()).add(found[1])
            self._gone.submit(self._release, *found)

    def _release(self, node: str, uid: str) -> None:
        assert self.on_gone is not None
        try:
            self.on_gone(node, uid)
            self.counters["released"] += 1
        except Exception:  # a failed release is the reconcile's to repair; it must not stop the releases
            log.exception("releasing the share of pod %s on %s failed", uid, node)
            return
        with self._lock:
            held = self._gone_by_node.get(node)
            if held is not None:
                held.discard(uid)
                if not held:
                    del self._gone_by_node[node]

    # -- watching -----------------------------------------------------------------------------
    def _watch_forever(self, kind: str) -> None:
        kube: KubeClient | None = None
        version = self.versions[kind]  # set when seeded
        backoff = 0.2
        while not self._stop.is_set():
            try:
                if kube is None:
                    kube = self._connect()
                    if kind in DRA_KINDS and self.dra_api:
                        kube.dra_version = self.dra_api.rpartition("/")[2]
                if not version:
                    items, version = kube.list_with_version(
                        kind, field_selector=self._selector(kind), item_type=self._item_type(kind), restarts=0
                    )
                    self._take_list(kind, items, version)
                    self._failures.pop(f"watching {kind}", None)  # reached again: a new failure is reported
                for event, obj in kube.watch(
                    kind, version, field_selector=self._selector(kind), item_type=self._item_type(kind),
                    timeout_s=self.watch_timeout_s,
                ):  # fmt: skip
                    if self._stop.is_set():
                        return
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    if event == "BOOKMARK":
                        with self._lock:
                            self.versions[kind] = version
                    else:
                        self._apply(kind, event, obj, version)
                backoff = 0.2
            except ListExpiredError:
                self.counters["relists_410"] += 1
                version = ""  # too old: list again
            except AdapterError as exc:
                self.counters["watch_errors"] += 1
                self._failing(f"watching {kind}", exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            self._failures.pop(f"watching {kind}", None)

    def _take_list(self, kind: str, items: Sequence[dict[str, Any]], version: str) -> None:
        fresh = {key: obj for obj in items if (key := _key(kind, obj))}
        with self._wake:
            previous, self._objects[kind] = self._objects[kind], fresh
            self.versions[kind] = version
            self._listed(kind, fresh, previous)
            self._synced.add(kind)
            self._mark_dirty()
        self.counters["lists"] += 1

    def _apply(self, kind: str, event: str, obj: dict[str, Any], version: str) -> None:
        key = _key(kind, obj)
        with self._wake:
            self.versions[kind] = version
            if not key:
                return
            self.counters["events"] += 1
            if event == "DELETED":  # deleted, or (pods) no longer bound and non-terminal: finished
                old = self._objects[kind].pop(key, None)
            else:
                old = self._objects[kind].get(key)
                self._objects[kind][key] = obj
            self._changed_one(kind, event, key, obj, old)
            self._mark_dirty()

    def _mark_dirty(self) -> None:
        if self._dirty_since is None:
            self._dirty_since = self._monotonic()
        self._wake.notify_all()

    @staticmethod
    def _selector(kind: str) -> str:
        return BOUND_NON_TERMINAL if kind == "pods" else ""

    @staticmethod
    def _item_type(kind: str) -> Any:
        return SchedulingPod if kind == "pods" else None


def share_holder(pod: dict[str, Any]) -> tuple[str, str] | None:
    """(node, UID) of a pod that holds GPU shares by the ``assigned-gpus`` annotation, else None."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    uid = (pod.get("metadata") or {}).get("uid")
    if node and uid and ASSIGNED_GPUS_ANNOTATION in annotations:
        return str(node), str(uid)
    return None


def pod_node(pod: dict[str, Any]) -> str:
    """The node a pod is bound to, "" when none."""
    node = (pod.get("spec") or {}).get("nodeName")
    return node if isinstance(node, str) else ""


def _key(kind: str, obj: dict[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    value = metadata.get("uid") if kind == "pods" else metadata.get("name")
    if not isinstance(value, str):
        return ""
    return f"{metadata.get('namespace') or ''}/{value}" if kind == "resourceclaims" else value
