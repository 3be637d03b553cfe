"""A real Kubernetes control plane on loopback, with no kubelets: etcd, kube-apiserver, kube-scheduler and,
when asked, kube-controller-manager.

The binaries are found by :mod:`testing.kube_binaries`, which also says what is missing for tests to
skip with; the identities, tokens and kubeconfigs the API server knows come from
:mod:`testing.credentials`; the harness talks to it through :class:`testing.kube_rest.KubeRest`.

Every process runs in its own session with its log in the work folder, and is stopped by PID (TERM,
then KILL), on error too. Fake nodes are created Ready, with their not-ready taint removed; nothing
marks them NotReady later, since no node-lifecycle controller runs.
"""

from __future__ import annotations

import http.client
import json
import shutil
import subprocess
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import yaml

from manifests.scheduler import feature_gate_flags
from testing.credentials import TOKEN, identities, write_kubeconfigs, write_service_account_keys, write_token_file
from testing.kube_binaries import KubeBinaries, find_binaries, missing
from testing.kube_rest import KubeError, KubeRest
from testing.processes import free_port, log_tail, stop_group
from testing.product_manifests import generated_manifests

REPO = Path(__file__).resolve().parents[1]


ACCESS_KINDS = {
    "Namespace": "/api/v1/namespaces",
    "PriorityClass": "/apis/scheduling.k8s.io/v1/priorityclasses",
    "ConfigMap": "/api/v1/namespaces/{namespace}/configmaps",
    "ServiceAccount": "/api/v1/namespaces/{namespace}/serviceaccounts",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
    "ValidatingAdmissionPolicy": "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
    "MutatingAdmissionPolicy": "/apis/{api}/mutatingadmissionpolicies",
    "MutatingAdmissionPolicyBinding": "/apis/{api}/mutatingadmissionpolicybindings",
}
"""Where each kind of the product's access-control documents is created (and of the reservation pods'
namespace, PriorityClass and program, which come with them)."""


@lru_cache(maxsize=64)
def _health(port: int) -> KubeRest:
    """One client per kube-scheduler port, for its health checks."""
    return KubeRest(f"https://127.0.0.1:{port}", TOKEN)


PORT_ATTEMPTS = 3
"""Starts of a listening process on a fresh port before "address already in use" is an error."""


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


@dataclass
class ControlPlane:
    """etcd and kube-apiserver on free loopback ports, started by :meth:`start`; the scheduler and the
    controller-manager on demand. Use as a context manager: everything it started is stopped on exit."""

    workdir: Path
    binaries: KubeBinaries | None = None
    processes: dict[str, _Process] = field(default_factory=dict)
    url: str = ""
    kubeconfig: Path = field(default_factory=Path)

    def __enter__(self) -> ControlPlane:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # -- processes ----------------------------------------------------------------------------
    def _spawn(self, name: str, argv: Sequence[str]) -> _Process:
        log = self.workdir / f"{name}.log"
        with log.open("ab") as out:
            popen = subprocess.Popen(
                list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        process = _Process(name, popen, log)
        self.processes[name] = process
        return process

    def _wait(self, name: str, ready: Callable[[], bool], timeout_s: float) -> None:
        process = self.processes[name]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if process.popen.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.popen.returncode}: {self.tail(name)}")
            with suppress(OSError, KubeError, http.client.HTTPException, ValueError):
                if ready():
                    return
            time.sleep(0.2)
        raise RuntimeError(f"{name} was not ready after {timeout_s:.0f} s: {self.tail(name)}")

    def _listening(
        self, name: str, argv: Callable[[int], Sequence[str]], ready: Callable[[int], bool], timeout_s: float
    ) -> int:
        """Start ``argv(port)`` on a free port and wait for ``ready(port)``; the port. A port that another
        process took between the probe and the bind (an outgoing connection's ephemeral port, say) makes the
        process exit with "address already in use": it is started again on another port, twice at most."""
        for attempt in range(PORT_ATTEMPTS):
            port = free_port()
            self._spawn(name, argv(port))
            try:
                self._wait(name, partial(ready, port), timeout_s=timeout_s)
            except RuntimeError as exc:
                if "address already in use" not in str(exc) or attempt == PORT_ATTEMPTS - 1:
                    raise
                self.stop_process(name)
                continue
            return port
        raise AssertionError("unreachable")

    def tail(self, name: str, lines: int = 15) -> str:
        """The last lines of a process's log, for error messages."""
        return log_tail(self.workdir / f"{name}.log", lines)

    def stop_process(self, name: str) -> None:
        process = self.processes.pop(name, None)
        if process is not None:
            stop_group(process.popen)

    def stop(self) -> None:
        """Stop everything, the last started first."""
        for name in reversed(list(self.processes)):
            self.stop_process(name)

    # -- etcd and the API server --------------------------------------------------------------
    def start(self) -> None:
        """etcd, then kube-apiserver on it with the harness's credentials; the kubeconfigs written and the
        product's access documents applied."""
        reason = missing()
        if reason:
            raise RuntimeError(reason)
        found = self.binaries or find_binaries()
        assert isinstance(found, KubeBinaries)
        self.binaries = found
        self.workdir.mkdir(parents=True, exist_ok=True)
        etcd_port = self._start_etcd()
        self._start_apiserver(found, etcd_port)
        self.kubeconfig = write_kubeconfigs(self.workdir, self.url)
        mutating = ["--mutating-policy", found.mutating_policy[0].rsplit("/", 1)[1]] if found.mutating_policy else []
        # The access documents only (a SecurityGroupPolicy is no access document: it names an unused group).
        argv = [
            "--url",
            "https://unused.invalid/extender",
            "--security-group",
            "sg-00000000",
            "--sharing",
            "--consolidation",
        ]
        self.apply_access(generated_manifests([*argv, *mutating]))

    def _start_etcd(self) -> int:
        """etcd on free loopback ports, its data in the work folder; its client port."""
        etcd_port, peer_port, metrics_port = (free_port() for _ in range(3))
        etcd = shutil.which("etcd")
        assert etcd is not None
        self._spawn(
            "etcd",
            [etcd, f"--data-dir={self.workdir / 'etcd'}", f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
             f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
             f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
             f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
             f"--initial-cluster=default=http://127.0.0.1:{peer_port}",
             f"--listen-metrics-urls=http://127.0.0.1:{metrics_port}", "--log-level=warn"],
        )  # fmt: skip
        return etcd_port

    def _start_apiserver(self, found: KubeBinaries, etcd_port: int) -> None:
        """kube-apiserver on etcd at ``etcd_port``, knowing the harness's tokens and service-account keys;
        ``url`` and ``api`` point at it once it is ready."""
        key, pub = write_service_account_keys(self.workdir)
        tokens = write_token_file(self.workdir)

        def apiserver(port: int) -> list[str]:
            return [
                str(found.folder / "kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'certs'}", f"--service-account-key-file={pub}",
                f"--service-account-signing-key-file={key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--token-auth-file={tokens}", "--authorization-mode=RBAC",
                "--service-cluster-ip-range=10.0.0.0/24", "--disable-admission-plugins=ServiceAccount",
                "--allow-privileged=true",  # as EKS runs it: what refuses a privileged pod is admission
                *found.apiserver_flags,
            ]  # fmt: skip

        def ready(port: int) -> bool:
            if self.url != f"https://127.0.0.1:{port}":  # one client per port tried
                self.url = f"https://127.0.0.1:{port}"
                self.api = KubeRest(self.url, TOKEN)
            self.api.request("GET", "/readyz", ok=(200,))
            self.api.get("/api/v1/namespaces/default")
            self.api.get("/api/v1/namespaces/kube-system")
            return True

        self._listening("kube-apiserver", apiserver, ready, timeout_s=90)

    # -- who is who ---------------------------------------------------------------------------
    def kubeconfig_of(self, identity: str) -> Path:
        """A kubeconfig with the token of ``identity`` (one of :func:`identities`): what that component
        uses in the suite, so that it can do only what the product grants it."""
        if identity not in identities():
            raise KeyError(f"no identity {identity!r}; the harness has {', '.join(identities())}")
        return self.workdir / f"kubeconfig-{identity}"

    def api_as(self, identity: str) -> KubeRest:
        """The harness's client, as ``identity``."""
        return KubeRest(self.url, identities()[identity].token)

    def apply_access(self, documents: Iterable[Mapping[str, Any]]) -> list[str]:
        """Create (or replace) the access-control documents among ``documents`` as the product generates
        them: ServiceAccounts, RBAC, and the admission policies where this API server serves them (1.30 and
        later). The names applied, ``Kind/name``."""
        served_vap = self.binaries is not None and self.binaries.release[:2] >= (1, 30)
        served_map = self.binaries is not None and self.binaries.mutating_policy is not None
        applied = []
        for document in documents:
            kind = str(document.get("kind"))
            if kind not in ACCESS_KINDS or (kind.startswith("ValidatingAdmission") and not served_vap):
                continue
            if kind.startswith("MutatingAdmission") and not served_map:
                continue
            metadata = document["metadata"]
            path = ACCESS_KINDS[kind].format(namespace=metadata.get("namespace", "default"), api=document["apiVersion"])
            if "{namespace}" in ACCESS_KINDS[kind]:
                self.ensure_namespaces([metadata.get("namespace", "default")])
            status, _ = self.api.raw("POST", path, json.dumps(document).encode(), "application/json")
            if status == 409:  # there already: the document as generated now replaces it
                current = self.api.get(f"{path}/{metadata['name']}")
                replaced = {
                    **document,
                    "metadata": {**metadata, "resourceVersion": current["metadata"]["resourceVersion"]},
                }
                self.api.request("PUT", f"{path}/{metadata['name']}", replaced)
            elif status not in (200, 201):
                raise KubeError(status, _, f"creating {kind}/{metadata['name']}")
            applied.append(f"{kind}/{metadata['name']}")
        return applied

    # -- the scheduler and the controller-manager ---------------------------------------------
    def start_scheduler(self, config: Mapping[str, Any], *, name: str = "kube-scheduler") -> None:
        """Run kube-scheduler with ``config`` (a KubeSchedulerConfiguration as the product generates it):
        only its ``apiVersion`` is set to the one these binaries take (``v1`` as generated, from 1.25.0),
        and its client is pointed at this cluster. It gets the feature gates the product's Deployment
        gives this version, and DRA's."""
        assert self.binaries is not None
        document = dict(config)
        document["apiVersion"] = self.binaries.scheduler_api
        account = self.kubeconfig_of("scheduler")
        document["clientConnection"] = {**document.get("clientConnection", {}), "kubeconfig": str(account)}
        path = self.workdir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(document))
        folder, gates = self.binaries.folder, self.binaries.scheduler_gates
        self._listening(
            name,
            lambda port: [str(folder / "kube-scheduler"), f"--config={path}", "--bind-address=127.0.0.1",
                          f"--secure-port={port}", f"--authentication-kubeconfig={account}",
                          f"--authorization-kubeconfig={account}", "-v=2", *feature_gate_flags(gates)],
            lambda port: _health(port).raw("GET", "/healthz")[0] == 200,
            timeout_s=60,
        )  # fmt: skip

    def stop_scheduler(self, name: str = "kube-scheduler") -> None:
        self.stop_process(name)

    def start_controller_manager(self) -> None:
        """The ReplicaSet and Deployment controllers (deletion-cost scale-downs, the consolidator's
        replacements) and the disruption controller (PodDisruptionBudgets' ``disruptionsAllowed``)."""
        assert self.binaries is not None
        self._spawn(
            "kube-controller-manager",
            [str(self.binaries.folder / "kube-controller-manager"), f"--kubeconfig={self.kubeconfig}",
             "--controllers=replicaset,deployment,disruption", "--leader-elect=false", "--bind-address=127.0.0.1",
             "--secure-port=0", "--use-service-account-credentials=false"],
        )  # fmt: skip
        time.sleep(0.5)
        if self.processes["kube-controller-manager"].popen.poll() is not None:
            raise RuntimeError(f"kube-controller-manager exited: {self.tail('kube-controller-manager')}")

    # -- objects ------------------------------------------------------------------------------
    def ensure_namespaces(self, names: Iterable[str]) -> None:
        for name in sorted(set(names)):
            self.api.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}}, ok=(200, 201, 409))

    def add_nodes(self, nodes: Sequence[Mapping[str, Any]], *, workers: int = 8) -> None:
        """Create each v1 Node (metadata and spec), then set its status (capacity, allocatable, Ready)
        and clear the not-ready taint admission gave it."""

        def add(node: Mapping[str, Any]) -> None:
            name = node["metadata"]["name"]
            created = self.api.request(
                "POST", "/api/v1/nodes", {"metadata": node["metadata"], "spec": node.get("spec", {})}
            )
            status = dict(node.get("status") or {})
            status.setdefault("conditions", [{"type": "Ready", "status": "True", "reason": "KubeletReady"}])
            status["conditions"] = [
                {**c, "lastHeartbeatTime": _now(), "lastTransitionTime": _now()} for c in status["conditions"]
            ]
            status.setdefault(
                "addresses", [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": name}]
            )
            self.api.request("PUT", f"/api/v1/nodes/{name}/status", {**created, "status": status})
            self.api.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": None}})

        self._each(add, nodes, workers)

    def create_pods(self, pods: Sequence[Mapping[str, Any]], *, workers: int = 8) -> None:
        self.ensure_namespaces(pod["metadata"].get("namespace", "default") for pod in pods)

        def create(pod: Mapping[str, Any]) -> None:
            namespace = pod["metadata"].get("namespace", "default")
            metadata = {k: v for k, v in pod["metadata"].items() if k not in ("uid", "resourceVersion")}
            body = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod["spec"]}
            self.api.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)

        self._each(create, pods, workers)

    def mark_running(self, namespace: str, name: str, *, started_s_ago: float = 600) -> None:
        """What a kubelet would report of a bound pod whose containers came up: phase Running, Ready,
        started ``started_s_ago`` seconds ago."""
        pod = self.pod(namespace, name)
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - started_s_ago))
        conditions = [{"type": kind, "status": "True", "lastTransitionTime": started}
                      for kind in ("Initialized", "Ready", "ContainersReady", "PodScheduled")]  # fmt: skip
        pod["status"] = {**pod.get("status", {}), "phase": "Running", "startTime": started, "conditions": conditions}
        self.api.request("PUT", f"/api/v1/namespaces/{namespace}/pods/{name}/status", pod)

    def delete_pod(self, namespace: str, name: str) -> None:
        """Force-delete: no kubelet confirms termination."""
        self.api.request(
            "DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}?gracePeriodSeconds=0", ok=(200, 202, 404)
        )

    def delete_namespace_pods(self, namespace: str, timeout_s: float = 120) -> None:
        """Force-delete every pod of ``namespace`` (one collection delete) and wait until they are gone."""
        self.api.request("DELETE", f"/api/v1/namespaces/{namespace}/pods?gracePeriodSeconds=0", ok=(200, 202, 404))
        self.wait_for(lambda: not self.pods(namespace), timeout_s, f"the pods of {namespace} to go")

    def pods(self, namespace: str | None = None) -> list[dict[str, Any]]:
        path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
        return self.api.items(path)

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        return result

    def failed_scheduling(self, namespace: str, name: str) -> list[str]:
        """The messages of the pod's ``FailedScheduling`` events, oldest first."""
        selector = urllib.parse.quote(f"involvedObject.name={name},reason=FailedScheduling")
        events = self.api.items(f"/api/v1/namespaces/{namespace}/events?fieldSelector={selector}")
        events.sort(key=lambda e: e.get("eventTime") or e.get("lastTimestamp") or e["metadata"]["creationTimestamp"])
        return [str(e.get("message") or e.get("note") or "") for e in events]

    def wait_bound(self, namespace: str, name: str, timeout_s: float = 30) -> str:
        """The node the pod is bound to, once it is; on timeout, an error with its FailedScheduling messages."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            node = (self.pod(namespace, name).get("spec") or {}).get("nodeName")
            if node:
                return str(node)
            time.sleep(0.1)
        messages = self.failed_scheduling(namespace, name)
        raise TimeoutError(f"{namespace}/{name} not bound after {timeout_s:.0f} s; FailedScheduling: {messages}")

    def wait_failed(self, namespace: str, name: str, timeout_s: float = 30) -> str:
        """The message of the pod's first ``FailedScheduling`` event; an error if it binds or none comes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            messages = self.failed_scheduling(namespace, name)
            if messages:
                return messages[0]
            node = (self.pod(namespace, name).get("spec") or {}).get("nodeName")
            if node:
                raise AssertionError(f"{namespace}/{name} was bound to {node}; expected it to stay pending")
            time.sleep(0.2)
        raise TimeoutError(f"no FailedScheduling event for {namespace}/{name} after {timeout_s:.0f} s")

    def wait_for(self, condition: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.2) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} after {timeout_s:.0f} s")
            time.sleep(poll_s)

    @staticmethod
    def _each(action: Callable[[Any], None], items: Sequence[Any], workers: int) -> None:
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(items) or 1))) as pool:
            list(pool.map(action, items))


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def scheduled(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))
