"""GPU reservation pods through the real control plane (``manifests/reservation.py``).

- kube-scheduler's own count of ``nvidia.com/gpu``, under the generated configuration, holds the GPUs
  that reservation pods take: with shares on 3 of a node's 8 GPUs and a reservation pod for each, a
  6-GPU pod is refused for ``Insufficient nvidia.com/gpu`` and a 5-GPU pod binds (so the extender, too,
  counts each of those GPUs once, by its shares);
- the reservation program (``shares/reserve_gpu.py``), with a token the API server binds to one
  reservation pod (TokenRequest), writes its GPU's UUID on that pod over HTTPS, verifying the API
  server's certificate; the same token may not write another pod, another annotation, a label, or a
  pod in another namespace. On 1.30 and later the generated admission policy refuses those (the Role
  cannot say which pod); before 1.30 (the captures' 1.25) only the namespace is the Role's to refuse.

Here the harness creates the reservation pods (as its administrator) to test the pods and the program
alone; ``test_reserved_shares.py`` has the bind create them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from manifests.reservation import (
    ACCOUNT,
    NAMESPACE,
    PRIORITY_CLASS,
    PROGRAM_CONFIG_MAP,
    program_config_map,
    reservation_name,
    reservation_pod,
)
from scheduler_core.k8s.names import ASSIGNED_GPUS_ANNOTATION, RESERVED_GPU_ANNOTATION
from scheduler_core.simulator.synthetic import CATALOGUE, make_node, make_pod
from shares.reserve_gpu import ReservationError, report
from testing.control_plane import ControlPlane
from testing.product import Processes
from tests.e2e.conftest import start_scheduler

A100 = next(shape for shape in CATALOGUE if shape.model == "A100" and shape.gpus == 8)
NODE = "a100-0"
WORK = "reserved"


def policies_served(cluster: ControlPlane) -> bool:
    assert cluster.binaries is not None
    return cluster.binaries.release[:2] >= (1, 30)


def share(slot: int) -> dict[str, Any]:
    """Half of GPU ``slot`` of the node, bound there with the annotation the extender's bind writes."""
    made = make_pod(f"share-{slot}", 0, namespace="shares", node_name=NODE, milli=500)
    made["metadata"]["annotations"][ASSIGNED_GPUS_ANNOTATION] = f"{slot}:500"
    return made


@pytest.fixture(scope="module")
def reserved(cluster: ControlPlane) -> dict[str, dict[str, Any]]:
    """Shares on three of an 8-GPU node's GPUs and a reservation pod for each. The program's ConfigMap,
    PriorityClass and identity are what ``scheduler-config --sharing`` generated, applied at the
    harness's start. (The harness's administrator writes ``assigned-gpus`` here, as the bind would.)"""
    assert cluster.api.get(f"/apis/scheduling.k8s.io/v1/priorityclasses/{PRIORITY_CLASS}")["value"] == 1_000_000_000
    program = cluster.api.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/{PROGRAM_CONFIG_MAP}")
    assert program["data"] == program_config_map()["data"]
    assert cluster.api.get(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{ACCOUNT}")
    cluster.add_nodes([make_node(NODE, A100, "us-east-1a")])
    cluster.create_pods([share(slot) for slot in range(3)])
    cluster.create_pods([reservation_pod(NODE, slot) for slot in range(3)])
    return {name: cluster.pod(NAMESPACE, name) for name in (reservation_name(NODE, slot) for slot in range(3))}


def test_kube_schedulers_own_count_holds_the_reserved_gpus_and_the_extender_counts_them_once(
    cluster: ControlPlane, product: Processes, reserved: dict[str, dict[str, Any]]
) -> None:
    """kube-scheduler refuses the 6-GPU pod by its own count (its filters run before the extender's);
    the extender, whose state counts GPUs 0-2 by the shares' annotations and not again by the
    reservation pods, lets the 5-GPU pod through."""
    url = product.serve("serve", ["--watch", "--kubeconfig", str(cluster.kubeconfig_of("scheduler"))])
    start_scheduler(cluster, url)
    try:
        cluster.create_pods([make_pod("six", 6, namespace=WORK)])
        assert "Insufficient nvidia.com/gpu" in cluster.wait_failed(WORK, "six")
        cluster.create_pods([make_pod("five", 5, namespace=WORK)])
        assert cluster.wait_bound(WORK, "five") == NODE
    finally:
        cluster.stop_scheduler()
        cluster.delete_namespace_pods(WORK)


def _bound_account(cluster: ControlPlane, pod: dict[str, Any], folder: Path) -> Path:
    """What the kubelet mounts in a reservation pod: a token the API server binds to that pod, and the CA."""
    ref = {"kind": "Pod", "apiVersion": "v1", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
    granted = cluster.api.request(
        "POST",
        f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{ACCOUNT}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
         "spec": {"boundObjectRef": ref, "expirationSeconds": 600}},
    )  # fmt: skip
    folder.mkdir()
    (folder / "token").write_text(granted["status"]["token"])
    (folder / "ca.crt").write_bytes((cluster.workdir / "certs" / "apiserver.crt").read_bytes())
    return folder


def _environ(cluster: ControlPlane, name: str, namespace: str = NAMESPACE) -> dict[str, str]:
    host, port = cluster.url.removeprefix("https://").rsplit(":", 1)
    return {
        "POD_NAMESPACE": namespace,
        "POD_NAME": name,
        "KUBERNETES_SERVICE_HOST": host,
        "KUBERNETES_SERVICE_PORT": port,
    }


def test_the_program_reports_its_gpu_on_its_own_pod_and_nowhere_else(
    cluster: ControlPlane, reserved: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    first, second = list(reserved)[:2]
    account = _bound_account(cluster, reserved[first], tmp_path / "account")
    uuid = "GPU-b24f6c0d-6ae9-42ac-08cc-b778eb47ca12"
    report(uuid, _environ(cluster, first), account)
    assert cluster.pod(NAMESPACE, first)["metadata"]["annotations"][RESERVED_GPU_ANNOTATION] == uuid

    cluster.ensure_namespaces(["elsewhere"])
    cluster.create_pods([make_pod(first, 0, namespace="elsewhere")])
    with pytest.raises(ReservationError, match="HTTP Error 403"):
        report(uuid, _environ(cluster, first, "elsewhere"), account)  # the Role's namespace only
    assert RESERVED_GPU_ANNOTATION not in (cluster.pod("elsewhere", first)["metadata"].get("annotations") or {})

    if not policies_served(cluster):
        return
    before = cluster.pod(NAMESPACE, second)
    with pytest.raises(ReservationError, match="HTTP Error 403"):
        report(uuid, _environ(cluster, second), account)
    assert cluster.pod(NAMESPACE, second)["metadata"] == before["metadata"]
    # Its own pod, but not a GPU's UUID: refused, on the third pod (the first has its UUID for good).
    third = list(reserved)[2]
    with pytest.raises(ReservationError, match="HTTP Error 422"):
        report("GPU-x", _environ(cluster, third), _bound_account(cluster, reserved[third], tmp_path / "third"))
    as_pod = _rest_as(cluster, account)
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{first}"
    for patch, refusal in (
        ({"metadata": {"annotations": {"other": "x"}}}, f"may change only {RESERVED_GPU_ANNOTATION}"),
        ({"metadata": {"labels": {"app.kubernetes.io/name": "x"}}}, "may not change labels, spec or status"),
        ({"metadata": {"finalizers": ["example.com/keep"]}}, "may not change metadata.finalizers"),
        ({"metadata": {"annotations": {RESERVED_GPU_ANNOTATION: None}}}, f"{RESERVED_GPU_ANNOTATION} is written once"),
        (
            {"metadata": {"annotations": {RESERVED_GPU_ANNOTATION: "GPU-00000000-0000-0000-0000-000000000000"}}},
            f"{RESERVED_GPU_ANNOTATION} is written once",
        ),
        ({"metadata": {"annotations": {RESERVED_GPU_ANNOTATION: uuid}}}, None),  # the same again: allowed
    ):
        status, body = as_pod.raw("PATCH", path, json.dumps(patch).encode(), "application/merge-patch+json")
        if refusal is None:
            assert status == 200, body
        else:
            assert status == 403 and refusal in json.loads(body)["message"], body


def _rest_as(cluster: ControlPlane, account: Path) -> Any:
    from testing.kube_rest import KubeRest

    return KubeRest(cluster.url, (account / "token").read_text())
