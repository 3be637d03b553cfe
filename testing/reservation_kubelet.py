"""A stand-in for what runs on a GPU node, for reservation pods only: the kubelet and the device plugin.

No kubelet, device plugin or GPU runs on this machine. For each reservation pod bound to a node
(``manifests/reservation.py``), :class:`ReservationKubelet` does what they would:

- the device plugin gives it a GPU of its node that no other live reservation pod there holds (each
  node's GPUs have made-up UUIDs, the same for the same node and index on every run);
- the kubelet reports it Running (its status, as the node's kubelet writes it: the harness's user here);
- the container runs the reservation program's report step (``shares.reserve_gpu.report``) with a
  token the API server binds to that pod (TokenRequest, as the kubelet mounts it), so the UUID is written
  by the pod's own identity, through the product's admission policy.

Everything else is the product against the real API server.
"""

from __future__ import annotations

import tempfile
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from manifests.reservation import ACCOUNT, NAMESPACE
from scheduler_core.k8s.names import RESERVED_GPU_ANNOTATION
from shares.reserve_gpu import ReservationError, report
from testing.control_plane import ControlPlane
from testing.kube_rest import KubeError

_NAMESPACE_UUID = uuid.UUID("6f1c1a47-9a0e-4f0d-9a43-2d8f3c1f6a10")


def gpu_uuid(node: str, index: int) -> str:
    """The made-up UUID of GPU ``index`` of ``node``, shaped as NVML writes one.

    >>> gpu_uuid("a100-0", 0) == gpu_uuid("a100-0", 0) != gpu_uuid("a100-0", 1)
    True
    """
    return f"GPU-{uuid.uuid5(_NAMESPACE_UUID, f'{node}/{index}')}"


class ReservationKubelet:
    """Runs reservation pods, as described in the module docstring, until :meth:`close`. ``gpus`` is
    every node's GPU count (as its device plugin advertises). ``reported`` counts the UUIDs written."""

    def __init__(self, cluster: ControlPlane, gpus: int = 8, *, poll_s: float = 0.1) -> None:
        self.cluster, self.gpus, self.poll_s = cluster, gpus, poll_s
        self.reported = 0
        self.errors: list[str] = []
        self._folder = Path(tempfile.mkdtemp(prefix="reservation-kubelet-"))
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="reservation-kubelet-node")
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="reservation-kubelet", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._pool.shutdown(wait=True)

    def __enter__(self) -> ReservationKubelet:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._round()
            except (KubeError, OSError) as exc:
                self.errors.append(str(exc))
            self._stop.wait(self.poll_s)

    def _round(self) -> None:
        pods = [pod for pod in self.cluster.pods(NAMESPACE) if not pod["metadata"].get("deletionTimestamp")]
        held: dict[str, set[str]] = {}
        for pod in pods:
            reported = (pod["metadata"].get("annotations") or {}).get(RESERVED_GPU_ANNOTATION)
            if reported:
                held.setdefault(pod["spec"].get("nodeName", ""), set()).add(reported)
        starts: dict[str, list[tuple[dict[str, Any], str]]] = {}
        for pod in pods:
            node = pod["spec"].get("nodeName")
            if not node or RESERVED_GPU_ANNOTATION in (pod["metadata"].get("annotations") or {}):
                continue
            free = [gpu_uuid(node, i) for i in range(self.gpus) if gpu_uuid(node, i) not in held.get(node, set())]
            if not free:
                self.errors.append(f"{pod['metadata']['name']}: no GPU left on {node} (the kubelet would refuse it)")
                continue
            starts.setdefault(node, []).append((pod, free[0]))
            held.setdefault(node, set()).add(free[0])
        # Each node's kubelet works apart from the others': the nodes' pods are started side by side.
        for error in self._pool.map(self._start_all, starts.values()):
            if error:
                self.errors.append(error)

    def _start_all(self, pods: list[tuple[dict[str, Any], str]]) -> str:
        """Start one node's pods, in turn; the error that stopped it ("" for none)."""
        try:
            for pod, gpu in pods:
                self._start(pod, gpu)
        except (KubeError, OSError) as exc:
            return str(exc)
        return ""

    def _still_there(self, pod: dict[str, Any]) -> bool:
        """Whether this very pod (its name and UID) still exists."""
        try:
            current = self.cluster.pod(NAMESPACE, pod["metadata"]["name"])
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return bool(current["metadata"].get("uid") == pod["metadata"]["uid"])

    def _start(self, pod: dict[str, Any], gpu: str) -> None:
        name = pod["metadata"]["name"]
        if (pod.get("status") or {}).get("phase") != "Running":
            try:
                self.cluster.mark_running(NAMESPACE, name, started_s_ago=0)
            except KubeError as exc:
                if exc.status in (404, 409):
                    return  # deleted, or replaced, meanwhile: the next round sees it as it is now
                raise
        account = self._folder / pod["metadata"]["uid"]
        granted = self.cluster.api.request(
            "POST",
            f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{ACCOUNT}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": name,
                                         "uid": pod["metadata"]["uid"]}, "expirationSeconds": 600}},
        )  # fmt: skip
        account.mkdir(exist_ok=True)
        (account / "token").write_text(granted["status"]["token"])
        (account / "ca.crt").write_bytes((self.cluster.workdir / "certs" / "apiserver.crt").read_bytes())
        host, port = self.cluster.url.removeprefix("https://").rsplit(":", 1)
        environ = {"POD_NAMESPACE": NAMESPACE, "POD_NAME": name, "KUBERNETES_SERVICE_HOST": host,
                   "KUBERNETES_SERVICE_PORT": port}  # fmt: skip
        try:
            report(gpu, environ, account)
        except ReservationError as exc:
            if self._still_there(pod):
                raise KubeError(0, str(exc), f"reporting {name}'s GPU") from exc
            return  # deleted meanwhile (a 404, or a 401 for the token bound to it): what a kubelet sees too
        with self._lock:
            self.reported += 1
