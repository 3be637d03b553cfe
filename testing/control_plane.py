"""A real Kubernetes control plane on loopback, with no kubelets: etcd, kube-apiserver, kube-scheduler and,
when asked, kube-controller-manager.

No Kubernetes binary is kept in any repository. The harness takes kube-apiserver, kube-scheduler and
kube-controller-manager of one version from ``$KUBE_BIN_DIR`` where it is set, else from the machine's
cache folder (:func:`machine_folder`: ``${XDG_CACHE_HOME:-~/.cache}/eks-gpu-scheduler/kubernetes``,
the binaries themselves or one subfolder per version, the newest taken); etcd is Debian's
``etcd-server``. :func:`missing` says, in one line, what is absent, for tests to skip with. The version
is read from the binaries (:class:`KubeBinaries`): it decides the scheduler configuration's API version
and whether DRA's feature gate is turned on. ``../shared/k8s/README.md`` gives the flags a cluster with
no kubelets needs; they are the ones used here.

Every process runs in its own session with its log in the work folder, and is stopped by PID (TERM,
then KILL), on error too. Fake nodes are created Ready, with their not-ready taint removed; nothing
marks them NotReady later, since no node-lifecycle controller runs.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from functools import lru_cache, partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from manifests.access import EXTENDER
from manifests.access import identities as lambda_identities
from manifests.scheduler import CONFIG_FILE, SCHEDULER_NAME, feature_gate_flags, feature_gates

REPO = Path(__file__).resolve().parents[1]
SHARED_K8S = REPO.parent / "shared" / "k8s"
BINARIES = ("kube-apiserver", "kube-scheduler", "kube-controller-manager")
SCHEDULER_NAMESPACE = "kube-system"
"""Where ``gpu-scheduler scheduler-config`` puts the second scheduler by default."""
TOKEN = "e2e-admin-token"
ADMIN_GROUPS = ("system:masters", EXTENDER.group)
"""The harness's own user (the test's hands: nodes, pods, namespaces): an administrator, also in the
extender's group so that fixtures may create pods that already hold ``assigned-gpus`` (the product's
admission policy lets only that group write it; no product component runs as this user)."""


@dataclass(frozen=True)
class Identity:
    """A user the API server knows by a static token: what one component of the product (or of
    Kubernetes) is in a real cluster."""

    name: str
    user: str
    groups: tuple[str, ...]

    @property
    def token(self) -> str:
        return f"e2e-{self.name}-token"


def identities() -> dict[str, Identity]:
    """Each component's identity, as the product deploys it (``manifests/access.py``,
    ``manifests/scheduler.py``): the second kube-scheduler and ``gpu-scheduler serve`` beside it in its
    pod (the ``gpu-scheduler`` ServiceAccount) and the three Lambdas (their EKS access entries' groups);
    and ``tenant``, a user of no product group, whom a test grants what it probes with.
    Not the product's: kube-controller-manager runs as the harness's administrator, as the cluster's
    own controllers would hold every right they use."""
    account = f"system:serviceaccount:{SCHEDULER_NAMESPACE}:{SCHEDULER_NAME}"
    found = {
        "scheduler": Identity(
            "scheduler", account, ("system:serviceaccounts", f"system:serviceaccounts:{SCHEDULER_NAMESPACE}")
        ),
    }
    # Someone who may edit pods and nothing of the product's: what a tenant's controller can be.
    found["tenant"] = Identity("tenant", "e2e-tenant", ("e2e-tenants",))
    for lambda_identity in lambda_identities(sharing=True):
        found[lambda_identity.name] = Identity(
            lambda_identity.name, f"eks-gpu-scheduler-{lambda_identity.name}", (lambda_identity.group,)
        )
    return found


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


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """Stop a process started in its own session, with everything it started: TERM, then KILL."""
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=15)


def log_tail(path: Path, lines: int) -> str:
    """The last ``lines`` of a log, on one line, for error messages ("" when there is none)."""
    text = path.read_text(errors="replace") if path.exists() else ""
    return " | ".join(text.strip().splitlines()[-lines:])


def serve_in_thread(
    handler: type[BaseHTTPRequestHandler], wrap: Callable[[socket.socket], socket.socket] | None = None
) -> ThreadingHTTPServer:
    """``handler`` on a free loopback port, served by a daemon thread of this process; ``wrap`` (TLS,
    say) replaces the listening socket first. Stop it with ``shutdown()`` and ``server_close()``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    if wrap is not None:
        server.socket = wrap(server.socket)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def machine_folder() -> Path:
    """The machine-level folder the harness looks in when ``$KUBE_BIN_DIR`` is unset: outside every
    checkout, so that each clone on the machine (CI's included) finds the same control plane."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "eks-gpu-scheduler" / "kubernetes"


_VERSION = re.compile(r"^v(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$")


@dataclass(frozen=True)
class KubeBinaries:
    """kube-apiserver, kube-scheduler and kube-controller-manager of one version in ``folder``, as their
    ``--version`` reports it (``v1.33.3``; ``v0.0.0-master+89aaf7c…`` for the captures' 1.25 pre-release
    built without version stamps)."""

    folder: Path
    version: str

    @property
    def release(self) -> tuple[int, int, int, str]:
        """(major, minor, patch, pre-release); an unstamped build (``v0.0.0-…``) or an unreadable
        version is (0, 0, 0, "")."""
        found = _VERSION.match(self.version)
        if found is None:
            return (0, 0, 0, "")
        return (int(found[1]), int(found[2]), int(found[3]), found[4] or "")

    @property
    def scheduler_api(self) -> str:
        """The ``KubeSchedulerConfiguration`` API these binaries take: ``v1`` from 1.25.0 (``v1beta3``
        is gone from 1.29); ``v1beta3`` before, the captures' pre-release and unstamped builds
        included."""
        major, minor, _patch, pre = self.release
        released_v1 = (major, minor) > (1, 25) or ((major, minor) == (1, 25) and not pre)
        return "kubescheduler.config.k8s.io/" + ("v1" if released_v1 else "v1beta3")

    @property
    def dra(self) -> tuple[str, tuple[str, ...], dict[str, bool]] | None:
        """Dynamic Resource Allocation where these binaries have it: (the ``resource.k8s.io`` version
        served, kube-apiserver's extra flags, the feature gates kube-scheduler needs). 1.33 serves
        ``v1beta2`` behind the ``DynamicResourceAllocation`` gate (off by default; with ``DRAPrioritizedList``
        for ``firstAvailable`` requests); from 1.34 it is GA,
        ``v1`` and on by default. None before 1.33, whose alpha and beta shapes the product does not
        read."""
        major, minor = self.release[:2]
        if (major, minor) >= (1, 34):
            return ("resource.k8s.io/v1", (), {})
        if (major, minor) == (1, 33):
            # firstAvailable (KEP-4816) is alpha in 1.33 and beta, on by default, from 1.34.
            gate = {"DynamicResourceAllocation": True, "DRAPrioritizedList": True}
            runtime = "--runtime-config=resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true"
            return ("resource.k8s.io/v1beta2", (*feature_gate_flags(gate), runtime), gate)
        return None

    @property
    def mutating_policy(self) -> tuple[str, tuple[str, ...]] | None:
        """MutatingAdmissionPolicy where these binaries have it: (the ``admissionregistration.k8s.io``
        version, kube-apiserver's flags that serve it). Alpha in 1.32 and 1.33 (``v1alpha1``), beta from
        1.34 (``v1beta1``), both behind the ``MutatingAdmissionPolicy`` gate and off by default: the suite
        turns it on, so that share pods get their environment as the product's policy gives it. None
        before 1.32."""
        major, minor = self.release[:2]
        if (major, minor) < (1, 32):
            return None
        api = "admissionregistration.k8s.io/" + ("v1alpha1" if (major, minor) < (1, 34) else "v1beta1")
        return (api, (*feature_gate_flags({"MutatingAdmissionPolicy": True}), f"--runtime-config={api}=true"))

    @property
    def apiserver_flags(self) -> tuple[str, ...]:
        """kube-apiserver's extra flags: DRA's and the mutating policies', gates and APIs each in one flag."""
        flags = [*(self.dra[1] if self.dra else ()), *(self.mutating_policy[1] if self.mutating_policy else ())]
        merged: dict[str, list[str]] = {}
        for flag in flags:
            name, _, value = flag.partition("=")
            merged.setdefault(name, []).append(value)
        return tuple(f"{name}={','.join(values)}" for name, values in merged.items())

    @property
    def scheduler_gates(self) -> dict[str, bool]:
        """kube-scheduler's feature gates: those the product's Deployment sets for this version
        (:func:`manifests.scheduler.feature_gates`), and DRA's."""
        return feature_gates(self.version) | (self.dra[2] if self.dra else {})


def read_binaries(folder: Path) -> KubeBinaries | str:
    """The binaries in ``folder`` and their version, or why they cannot be used (one line)."""
    absent = [name for name in BINARIES if not (folder / name).is_file()]
    if absent:
        return f"{folder} has no {', '.join(absent)}"
    stamp = tuple((folder / name).stat().st_mtime_ns for name in BINARIES)
    return _read_versions(folder, stamp)


@lru_cache(maxsize=8)
def _read_versions(folder: Path, _stamp: tuple[int, ...]) -> KubeBinaries | str:
    versions = {}
    for name in BINARIES:
        try:
            done = subprocess.run([str(folder / name), "--version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{folder / name} does not run here: {exc}"
        words = done.stdout.split()
        if done.returncode != 0 or len(words) != 2 or words[0] != "Kubernetes":
            return f"{folder / name} --version printed {(done.stdout + done.stderr).strip()[:120]!r}"
        versions[name] = words[1]
    if len(set(versions.values())) != 1:
        return f"{folder} holds binaries of different versions: {versions}"
    return KubeBinaries(folder, versions["kube-apiserver"])


def find_binaries() -> KubeBinaries | str:
    """``$KUBE_BIN_DIR`` where it is set; else :func:`machine_folder`, its binaries or, of its
    subfolders that hold all three, the newest version. Why none can be used, in one line, otherwise."""
    explicit = os.environ.get("KUBE_BIN_DIR")
    if explicit:
        found = read_binaries(Path(explicit))
        return found if isinstance(found, KubeBinaries) else f"$KUBE_BIN_DIR: {found}"
    home = machine_folder()
    candidates = [home, *(sorted(p for p in home.iterdir() if p.is_dir()) if home.is_dir() else [])]
    usable = [found for folder in candidates if isinstance(found := read_binaries(folder), KubeBinaries)]
    if not usable:
        return (
            f"no Kubernetes control plane: $KUBE_BIN_DIR is unset and {home} holds none "
            f"(kube-apiserver, kube-scheduler, kube-controller-manager of one version; {SHARED_K8S / 'README.md'})"
        )
    return max(
        usable, key=lambda b: (*b.release[:3], not b.release[3], b.release[3])
    )  # a release over its pre-releases


def missing() -> str:
    """Why a control plane cannot start here, in one line; "" when it can."""
    found = find_binaries()
    if isinstance(found, str):
        return found
    if shutil.which("etcd") is None:
        return "etcd is not installed: apt-get install -y etcd-server (make test installs it as root)"
    if shutil.which("openssl") is None:
        return "openssl is not installed: apt-get install -y openssl"
    return ""


@lru_cache(maxsize=64)
def _health(port: int) -> KubeRest:
    """One client per kube-scheduler port, for its health checks."""
    return KubeRest(f"https://127.0.0.1:{port}", TOKEN)


PORT_ATTEMPTS = 3
"""Starts of a listening process on a fresh port before "address already in use" is an error."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class KubeError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, body: Any, what: str) -> None:
        message = body.get("message") if isinstance(body, dict) else str(body)[:300]
        super().__init__(f"{what}: HTTP {status}: {message}")
        self.status, self.body = status, body


class KubeRest:
    """A small JSON client for the harness itself: one keep-alive HTTPS connection per thread."""

    def __init__(self, url: str, token: str) -> None:
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 443
        self.token = token
        self._context = ssl.create_default_context()
        self._context.check_hostname = False
        self._context.verify_mode = ssl.CERT_NONE  # a loopback apiserver with a self-signed certificate
        self._local = threading.local()

    def _connection(self) -> http.client.HTTPSConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPSConnection(self.host, self.port, context=self._context, timeout=60)
            self._local.conn = conn
        return conn

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        ok: Sequence[int] = (200, 201),
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        status, raw = self.raw(method, path, data, content_type)
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode(errors="replace")
        if status not in ok:
            raise KubeError(status, parsed, f"{method} {path}")
        return parsed

    def raw(self, method: str, path: str, data: bytes | None = None, content_type: str = "") -> tuple[int, bytes]:
        """The status and body bytes of one request (retried once on a dropped keep-alive connection)."""
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                return response.status, response.read()
            except (http.client.HTTPException, OSError):
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def items(self, path: str) -> list[dict[str, Any]]:
        """Every item of a list, following ``continue``."""
        found: list[dict[str, Any]] = []
        token = ""
        while True:
            separator = "&" if "?" in path else "?"
            page = self.get(f"{path}{separator}limit=500" + (f"&continue={urllib.parse.quote(token)}" if token else ""))
            found.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return found

    def patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")


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
        reason = missing()
        if reason:
            raise RuntimeError(reason)
        found = self.binaries or find_binaries()
        assert isinstance(found, KubeBinaries)
        self.binaries = found
        self.workdir.mkdir(parents=True, exist_ok=True)
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
        key, pub = self.workdir / "sa.key", self.workdir / "sa.pub"
        subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True)
        subprocess.run(
            ["openssl", "rsa", "-in", str(key), "-pubout", "-out", str(pub)], check=True, capture_output=True
        )
        tokens = self.workdir / "tokens.csv"
        lines = [f'{TOKEN},admin,admin-uid,"{",".join(ADMIN_GROUPS)}"']
        lines += [f'{i.token},{i.user},{i.name}-uid,"{",".join(i.groups)}"' for i in identities().values()]
        tokens.write_text("\n".join(lines) + "\n")

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
        self.kubeconfig = self.workdir / "kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump(kubeconfig(self.url, TOKEN)))
        for identity in identities().values():
            (self.workdir / f"kubeconfig-{identity.name}").write_text(
                yaml.safe_dump(kubeconfig(self.url, identity.token))
            )
        mutating = ["--mutating-policy", found.mutating_policy[0].rsplit("/", 1)[1]] if found.mutating_policy else []
        # The access documents only (a SecurityGroupPolicy is no access document: it names an unused group).
        argv = ["--url", "https://unused.invalid/extender", "--security-group", "sg-00000000", "--sharing"]
        self.apply_access(generated_manifests([*argv, *mutating]))

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
        """The ReplicaSet and Deployment controllers, for deletion-cost scale-downs."""
        assert self.binaries is not None
        self._spawn(
            "kube-controller-manager",
            [str(self.binaries.folder / "kube-controller-manager"), f"--kubeconfig={self.kubeconfig}",
             "--controllers=replicaset,deployment", "--leader-elect=false", "--bind-address=127.0.0.1",
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


def kubeconfig(url: str, token: str) -> dict[str, Any]:
    """A kubeconfig for ``url`` with a bearer token and no TLS verification (a loopback test cluster)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": url, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "admin"}}],
        "current-context": "e2e",
    }


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def scheduled(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


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


@lru_cache(maxsize=32)
def _scheduler_config_output(argv: tuple[str, ...]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "gpu_scheduler", "scheduler-config", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"gpu-scheduler scheduler-config {' '.join(argv)} exited with {done.returncode}: {done.stderr}"
        )
    return done.stdout


def generated_manifests(argv: Sequence[str]) -> list[dict[str, Any]]:
    """Every document ``gpu-scheduler scheduler-config ARGV`` writes: what the product deploys, exactly. The
    command runs as its own process (the doubles never import the CLI); its output is kept per ``argv``."""
    return [document for document in yaml.safe_load_all(_scheduler_config_output(tuple(argv))) if document]


def generated_scheduler_config(argv: Sequence[str], which: str = CONFIG_FILE) -> dict[str, Any]:
    """The KubeSchedulerConfiguration inside what ``gpu-scheduler scheduler-config ARGV`` writes: the
    ConfigMap the product deploys, exactly; ``which`` of its two (``break-glass.yaml``: no extender)."""
    for document in generated_manifests(argv):
        if document.get("kind") == "ConfigMap" and document["metadata"]["name"].endswith("-config"):
            config: dict[str, Any] = yaml.safe_load(document["data"][which])
            return config
    raise RuntimeError("gpu-scheduler scheduler-config wrote no scheduler ConfigMap")
