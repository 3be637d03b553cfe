"""Who is who on the control plane, and the files that say so: each component's identity and static
token, the token file kube-apiserver reads them from, the service-account key pair it signs with, and a
kubeconfig per identity."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from manifests.access import EXTENDER
from manifests.access import identities as lambda_identities
from scheduler_core.k8s.names import SCHEDULER_NAME

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
    for lambda_identity in lambda_identities(sharing=True, consolidation=True):
        found[lambda_identity.name] = Identity(
            lambda_identity.name, f"eks-gpu-scheduler-{lambda_identity.name}", (lambda_identity.group,)
        )
    return found


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


def write_service_account_keys(workdir: Path) -> tuple[Path, Path]:
    """An RSA key pair for kube-apiserver to sign and check service-account tokens with (``sa.key``,
    ``sa.pub`` in ``workdir``): the private key's path and the public key's."""
    key, pub = workdir / "sa.key", workdir / "sa.pub"
    subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True)
    subprocess.run(["openssl", "rsa", "-in", str(key), "-pubout", "-out", str(pub)], check=True, capture_output=True)
    return key, pub


def write_token_file(workdir: Path) -> Path:
    """kube-apiserver's ``--token-auth-file`` (``tokens.csv`` in ``workdir``): the harness's administrator
    and every identity of :func:`identities`, each with its groups."""
    tokens = workdir / "tokens.csv"
    lines = [f'{TOKEN},admin,admin-uid,"{",".join(ADMIN_GROUPS)}"']
    lines += [f'{i.token},{i.user},{i.name}-uid,"{",".join(i.groups)}"' for i in identities().values()]
    tokens.write_text("\n".join(lines) + "\n")
    return tokens


def write_kubeconfigs(workdir: Path, url: str) -> Path:
    """A kubeconfig for ``url`` per identity (``kubeconfig-NAME`` in ``workdir``) and the administrator's
    (``kubeconfig``), whose path this returns."""
    admin = workdir / "kubeconfig"
    admin.write_text(yaml.safe_dump(kubeconfig(url, TOKEN)))
    for identity in identities().values():
        (workdir / f"kubeconfig-{identity.name}").write_text(yaml.safe_dump(kubeconfig(url, identity.token)))
    return admin
