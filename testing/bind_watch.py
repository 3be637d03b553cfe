"""A watch on one namespace's pods that stamps each pod's bind the moment the API server reports it."""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time

from testing.kube_rest import KubeRest


class BindWatch:
    """Watches pods from a resourceVersion and records, per pod, when it was first seen bound (monotonic
    seconds): bind rates come from these stamps, taken the moment the API server reports each bind."""

    def __init__(self, api: KubeRest, namespace: str) -> None:
        self.api, self.namespace = api, namespace
        self.bound_at: dict[str, float] = {}
        self.node_of: dict[str, str] = {}
        self.version_of: dict[str, int] = {}  # the resourceVersion of the event that showed the pod bound
        self.nominated: dict[str, str] = {}  # status.nominatedNodeName, as first seen (a preemption's choice)
        self.annotations_of: dict[str, dict[str, str]] = {}  # as the event that showed the pod bound had them
        self.unschedulable: dict[str, str] = {}  # PodScheduled False, Unschedulable: the scheduler's message
        self._changed = threading.Condition()
        self._stop = threading.Event()
        listing = api.get(f"/api/v1/namespaces/{namespace}/pods?limit=1")
        self._version = listing["metadata"]["resourceVersion"]
        self._thread = threading.Thread(target=self._run, name="bind-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        while not self._stop.is_set():
            conn = http.client.HTTPSConnection(self.api.host, self.api.port, context=context, timeout=5)
            query = f"watch=1&resourceVersion={self._version}&allowWatchBookmarks=true"
            path = f"/api/v1/namespaces/{self.namespace}/pods?{query}"
            try:
                conn.request("GET", path, headers={"Authorization": f"Bearer {self.api.token}"})
                response = conn.getresponse()
                for line in response:
                    if self._stop.is_set():
                        break
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    version = (obj.get("metadata") or {}).get("resourceVersion")
                    if version:
                        self._version = version
                    name = (obj.get("metadata") or {}).get("name")
                    node = (obj.get("spec") or {}).get("nodeName")
                    nominee = (obj.get("status") or {}).get("nominatedNodeName")
                    if name and nominee:
                        self.nominated.setdefault(name, nominee)
                    if name and node and name not in self.bound_at:
                        self.bound_at[name] = time.monotonic()
                        self.node_of[name] = node
                        self.version_of[name] = int(version) if version and version.isdigit() else 0
                        self.annotations_of[name] = dict((obj.get("metadata") or {}).get("annotations") or {})
                    for condition in (obj.get("status") or {}).get("conditions") or []:
                        if name and (condition.get("type"), condition.get("status"), condition.get("reason")) == (
                            "PodScheduled", "False", "Unschedulable"):  # fmt: skip
                            self.unschedulable.setdefault(name, str(condition.get("message") or ""))
                    with self._changed:
                        self._changed.notify_all()
            except (OSError, http.client.HTTPException, ValueError):
                time.sleep(0.05)
            finally:
                conn.close()

    def outcome(self, name: str, timeout_s: float) -> tuple[str, str] | None:
        """``("bound", node)`` or ``("unschedulable", message)`` for pod ``name``, once the API server
        reports either; None after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                if name in self.node_of:
                    return "bound", self.node_of[name]
                if name in self.unschedulable:
                    return "unschedulable", self.unschedulable[name]
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._changed.wait(timeout=min(left, 0.5))

    def wait(self, count: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while len(self.bound_at) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return len(self.bound_at) >= count

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
