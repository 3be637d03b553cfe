"""Where the harness finds Kubernetes' binaries, and what their version decides.

No Kubernetes binary is kept in any repository. The harness takes kube-apiserver, kube-scheduler and
kube-controller-manager of one version from ``$KUBE_BIN_DIR`` where it is set, else from the machine's
cache folder (:func:`machine_folder`: ``${XDG_CACHE_HOME:-~/.cache}/eks-gpu-scheduler/kubernetes``,
the binaries themselves or one subfolder per version, the newest taken); etcd is Debian's
``etcd-server``. :func:`missing` says, in one line, what is absent, for tests to skip with. The version
is read from the binaries (:class:`KubeBinaries`): it decides the scheduler configuration's API version
and whether DRA's feature gate is turned on. ``../shared/k8s/README.md`` gives the flags a cluster with
no kubelets needs; they are the ones :mod:`testing.control_plane` uses.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from manifests.scheduler import feature_gate_flags, feature_gates

SHARED_K8S = Path(__file__).resolve().parents[2] / "shared" / "k8s"
BINARIES = ("kube-apiserver", "kube-scheduler", "kube-controller-manager")


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
