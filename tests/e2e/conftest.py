"""The e2e suite: the product under a real kube-apiserver and kube-scheduler on loopback.

One control plane per module (``testing.control_plane``), the product's own processes beside it
(``testing.product``: ``gpu-scheduler serve`` and ``refresh``), and the scheduler on the configuration
``gpu-scheduler scheduler-config`` generates. Without the binaries or etcd every test here skips with
one line that says what is missing and where to get it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from adapters.gpu_ledger import LedgerStore
from testing.control_plane import ControlPlane
from testing.credentials import identities
from testing.kube_binaries import missing
from testing.kube_rest import KubeRest
from testing.moto import aws_env, dynamodb_client, moto_server
from testing.product import Processes
from testing.product_manifests import generated_scheduler_config
from testing.reservation_kubelet import ReservationKubelet

HERE = Path(__file__).parent
ServeSharing = Callable[..., tuple[str, dict[str, Any]]]
"""Starts ``serve`` on a ledger table (and any more of ``serve``'s flags) and kube-scheduler with sharing: the
URL and the configuration."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    reason = missing()
    if reason:
        pytest.skip(reason)
    with ControlPlane(tmp_path_factory.mktemp("cluster")) as plane:
        yield plane


@pytest.fixture(scope="module")
def kubelet(cluster: ControlPlane) -> Iterator[ReservationKubelet]:
    """The GPU nodes' part for reservation pods (``testing/reservation_kubelet.py``): with sharing, a
    share is bound only once its GPU's reservation pod reported the UUID."""
    with ReservationKubelet(cluster) as stand_in:
        yield stand_in
    assert not stand_in.errors, stand_in.errors[:5]


@pytest.fixture(scope="module")
def product(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Processes]:
    with Processes(tmp_path_factory.mktemp("product")) as processes:
        yield processes


@pytest.fixture(scope="module")
def moto_env() -> Iterator[dict[str, str]]:
    """moto's server for the module, and the environment that points the product's AWS clients at it."""
    with moto_server() as endpoint:
        yield {**os.environ, **aws_env(endpoint)}


def create_ledger(env: dict[str, str], table: str) -> LedgerStore:
    """``gpu-scheduler ledger create --table TABLE`` on moto's DynamoDB, and a store over it."""
    done = subprocess.run(
        [sys.executable, "-m", "gpu_scheduler", "ledger", "create", "--table", table],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return LedgerStore(table, dynamodb_client(env["AWS_ENDPOINT_URL_DYNAMODB"]))


def start_scheduler(cluster: ControlPlane, url: str, *flags: str) -> dict[str, Any]:
    """kube-scheduler on ``gpu-scheduler scheduler-config --url URL FLAGS``; the configuration it runs."""
    config = generated_scheduler_config(["--url", url, *flags])
    cluster.start_scheduler(config)
    return config


@pytest.fixture(scope="module")
def serve_sharing(
    cluster: ControlPlane, product: Processes, moto_env: dict[str, str], kubelet: ReservationKubelet
) -> ServeSharing:
    """``gpu-scheduler serve --watch --ledger-table TABLE`` as the second scheduler's identity, on moto's
    DynamoDB with the reservation pods' kubelet running, and kube-scheduler beside it on ``scheduler-config
    --sharing``, when the module asks: the URL and the configuration kube-scheduler runs."""

    def start(table: str, *flags: str) -> tuple[str, dict[str, Any]]:
        kubeconfig = str(cluster.kubeconfig_of("scheduler"))
        url = product.serve("serve", ["--watch", "--kubeconfig", kubeconfig, "--ledger-table", table, *flags], moto_env)
        return url, start_scheduler(cluster, url, "--sharing")

    return start


def let_tenant(cluster: ControlPlane, namespace: str, role: str, rules: list[dict[str, Any]]) -> KubeRest:
    """The ``tenant`` identity granted ``rules`` in ``namespace`` (a Role and its RoleBinding, both named
    ``role``): its client."""
    rbac, metadata = "rbac.authorization.k8s.io", {"name": role, "namespace": namespace}
    cluster.apply_access([
        {"apiVersion": f"{rbac}/v1", "kind": "Role", "metadata": metadata, "rules": rules},
        {"apiVersion": f"{rbac}/v1", "kind": "RoleBinding", "metadata": metadata,
         "roleRef": {"apiGroup": rbac, "kind": "Role", "name": role},
         "subjects": [{"kind": "User", "name": identities()["tenant"].user}]},
    ])  # fmt: skip
    return cluster.api_as("tenant")


def gpus_of(pod: dict[str, Any]) -> int:
    """``nvidia.com/gpu`` a pod holds, as kube-scheduler counts it: the larger of its app containers'
    sum and its largest init container (requests, else limits). Written out here, apart from the core."""

    def count(containers: Sequence[dict[str, Any]]) -> list[int]:
        found = []
        for container in containers:
            resources = container.get("resources") or {}
            amount = (resources.get("requests") or {}).get("nvidia.com/gpu")
            amount = amount or (resources.get("limits") or {}).get("nvidia.com/gpu") or "0"
            found.append(int(amount))
        return found

    spec = pod["spec"]
    return max([sum(count(spec["containers"])), *count(spec.get("initContainers") or [])])
