"""DRA through the real kube-scheduler, on the generated configuration with sharing: kube-scheduler itself
allocates GPUs to ResourceClaims (``resource.k8s.io/v1beta2`` on 1.33, behind its gate), and the product
reads those allocations and respects them.

Two H200 nodes run NVIDIA's DRA driver beside the device plugin (``nvidia.com/gpu`` 8, and the same eight
GPUs as devices in a ResourceSlice, as during a migration from one to the other); ``dra-b``'s GPU 7 is cut
into seven MIG devices. No driver or kubelet runs: the slices are written as the driver writes them
(``testing/dra.py``). kube-scheduler allocates:

- ``reserved``: two GPUs for a pod that binds (allocated and reserved);
- ``unreserved``: one GPU for a pod whose Binding an admission policy refuses, so kube-scheduler's
  ``Unreserve`` takes the pod off the claim and leaves the allocation: allocated, reserved for nobody;
- ``either``: a ``firstAvailable`` request whose first choice (nine GPUs) no node has, so its second (one);
- ``slice``: one MIG device, which holds its parent GPU.

kube-scheduler counts none of them in ``nvidia.com/gpu``: the extender must refuse those GPUs to whole-GPU
pods, refuse shares on both nodes, and the node-state refresher's snapshot must count them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.gpu_ledger import LedgerStore
from scheduler_core.simulator.synthetic import InstanceShape, make_node, make_pod
from scheduler_core.state.snapshot import read_snapshot
from testing.control_plane import ControlPlane
from testing.dra import (
    GPU_CLASS,
    MIG_CLASS,
    claim,
    device_classes,
    exactly,
    first_available,
    h200_devices,
    resource_slice,
)
from testing.product import Processes
from testing.reservation_kubelet import ReservationKubelet
from tests.e2e.conftest import create_ledger, start_scheduler

H200 = InstanceShape("p5e.48xlarge", "H200", "NVIDIA-H200", 8, 143771, "191450m", "1999Gi")
NS = "dra"
TABLE = "gpu-ledger-dra"
NODES = ("dra-a", "dra-b", "plain")


def dra_api(cluster: ControlPlane) -> str:
    assert cluster.binaries is not None
    if cluster.binaries.dra is None:
        pytest.skip(f"Kubernetes {cluster.binaries.version} serves no resource.k8s.io the product reads (1.33+)")
    return cluster.binaries.dra[0]


def deny_blocked_bindings() -> list[dict[str, Any]]:
    """An admission policy that refuses the Binding of pods named ``blocked-*``: the bind fails after
    kube-scheduler's PreBind allocated and reserved their claims."""
    rules = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods/binding"]}]
    name = "e2e-deny-blocked-bindings"
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": name},
         "spec": {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": rules},
                  "validations": [{"expression": "!object.metadata.name.startsWith('blocked-')",
                                   "message": "e2e: this pod's binding is refused"}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": {"name": name}, "spec": {"policyName": name, "validationActions": ["Deny"]}},
    ]  # fmt: skip


def claim_pod(name: str, claim_name: str, node: str | None = None) -> dict[str, Any]:
    pod = make_pod(name, 0, namespace=NS)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim_name}]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    if node:
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return pod


def pinned(pod: dict[str, Any], node: str) -> dict[str, Any]:
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return pod


@pytest.fixture(scope="module")
def ledger(moto_env: dict[str, str]) -> LedgerStore:
    return create_ledger(moto_env, TABLE)


@pytest.fixture(scope="module")
def claims(
    cluster: ControlPlane, product: Processes, ledger: LedgerStore, moto_env: dict[str, str],
    kubelet: ReservationKubelet,
) -> Iterator[dict[str, dict[str, Any]]]:  # fmt: skip
    """The nodes, the driver's classes and slices, serve and kube-scheduler with sharing, and the four claims
    as kube-scheduler left them (by name)."""
    api = dra_api(cluster)
    cluster.add_nodes([make_node(name, H200, "us-east-1a") for name in NODES])
    cluster.ensure_namespaces([NS])
    slices = [resource_slice(api, "dra-a", h200_devices("dra-a", 8)),
              resource_slice(api, "dra-b", h200_devices("dra-b", 8, {7: ["1g.18gb"] * 7}))]  # fmt: skip
    for body in (*device_classes(api), *slices):
        plural = {"DeviceClass": "deviceclasses", "ResourceSlice": "resourceslices"}[body["kind"]]
        cluster.api.request("POST", f"/apis/{api}/{plural}", body)
    cluster.apply_access(deny_blocked_bindings())
    url = product.serve(
        "serve", ["--watch", "--kubeconfig", str(cluster.kubeconfig_of("scheduler")), "--ledger-table", TABLE], moto_env
    )
    start_scheduler(cluster, url, "--sharing")
    requests = {
        "reserved": [exactly("gpu", GPU_CLASS, 2)],
        "unreserved": [exactly("gpu", GPU_CLASS, 1)],
        "either": [first_available("gpu", ("all", GPU_CLASS, 9), ("one", GPU_CLASS, 1))],
        "slice": [exactly("gpu", MIG_CLASS, 1)],
    }
    for name, wanted in requests.items():
        cluster.api.request("POST", f"/apis/{api}/namespaces/{NS}/resourceclaims", claim(api, NS, name, wanted))
    cluster.create_pods([claim_pod("server", "reserved", "dra-a"), claim_pod("blocked-1", "unreserved", "dra-a"),
                         claim_pod("trainer", "either", "dra-b"), claim_pod("notebook", "slice")])  # fmt: skip
    try:
        assert {name: cluster.wait_bound(NS, name, 60) for name in ("server", "trainer", "notebook")} == {
            "server": "dra-a", "trainer": "dra-b", "notebook": "dra-b"}  # fmt: skip

        def read(name: str) -> dict[str, Any]:
            found: dict[str, Any] = cluster.api.get(f"/apis/{api}/namespaces/{NS}/resourceclaims/{name}")
            return found

        # kube-scheduler retries the blocked pod: between tries its claim is allocated and reserved for nobody.
        cluster.wait_for(lambda: _allocated(read("unreserved")) and not read("unreserved")["status"].get("reservedFor"),
                         60, "the blocked pod's claim to be allocated and not reserved", poll_s=0.05)  # fmt: skip
        yield {name: read(name) for name in requests}
    finally:
        cluster.stop_scheduler()
        cluster.delete_namespace_pods(NS)


def _allocated(claim: dict[str, Any]) -> bool:
    return bool((claim.get("status") or {}).get("allocation"))


def _devices(claim: dict[str, Any]) -> list[tuple[str, str]]:
    return [(r["pool"], r["device"]) for r in claim["status"]["allocation"]["devices"]["results"]]


def test_kube_scheduler_allocated_each_kind_of_claim(claims: dict[str, dict[str, Any]]) -> None:
    assert [pool for pool, _ in _devices(claims["reserved"])] == ["dra-a", "dra-a"]
    assert [r["name"] for r in claims["reserved"]["status"]["reservedFor"]] == ["server"]
    assert [pool for pool, _ in _devices(claims["unreserved"])] == ["dra-a"]
    (result,) = claims["either"]["status"]["allocation"]["devices"]["results"]
    assert result["request"] == "gpu/one" and result["pool"] == "dra-b"  # the second choice
    ((pool, device),) = _devices(claims["slice"])
    assert pool == "dra-b" and device.startswith("gpu-7-mig-1g18gb-")


def test_whole_gpu_pods_are_refused_the_claimed_gpus_and_shares_every_dra_node(
    cluster: ControlPlane, claims: dict[str, dict[str, Any]], ledger: LedgerStore
) -> None:
    """dra-a: 3 GPUs claimed, 5 free; dra-b: 2 claimed (one whole, one MIG device's parent), 6 free. By
    kube-scheduler's own count all 8 of each are free."""
    cluster.create_pods([
        pinned(make_pod("six-on-a", 6, namespace=NS, models="H200"), "dra-a"),
        pinned(make_pod("seven-on-b", 7, namespace=NS, models="H200"), "dra-b"),
        pinned(make_pod("share-on-a", 0, namespace=NS, models="H200", milli=500), "dra-a"),
    ])  # fmt: skip
    assert "5 of 8 GPUs free, pod needs 6" in cluster.wait_failed(NS, "six-on-a")
    assert "6 of 8 GPUs free, pod needs 7" in cluster.wait_failed(NS, "seven-on-b")
    assert "DRA manages this node's GPUs" in cluster.wait_failed(NS, "share-on-a")
    cluster.create_pods([pinned(make_pod("five-on-a", 5, namespace=NS, models="H200"), "dra-a"),
                         pinned(make_pod("six-on-b", 6, namespace=NS, models="H200"), "dra-b"),
                         make_pod("share", 0, namespace=NS, models="H200", milli=500)])  # fmt: skip
    assert cluster.wait_bound(NS, "five-on-a") == "dra-a" and cluster.wait_bound(NS, "six-on-b") == "dra-b"
    assert cluster.wait_bound(NS, "share", 60) == "plain"  # the one node DRA does not manage
    assert sum(ledger.read("plain", 8).used) == 500


def test_the_snapshot_counts_allocatable_less_claims_less_the_ledger(
    cluster: ControlPlane, claims: dict[str, dict[str, Any]], ledger: LedgerStore, tmp_path: Path
) -> None:
    """The node-state refresher, as its own identity: every node's free GPUs are its allocatable less the
    GPUs its claims hold, less the GPUs the ledger holds; its report says what DRA holds."""
    if any(pod["metadata"]["name"] == "share" for pod in cluster.pods(NS)):  # the previous test's, when it ran
        cluster.wait_bound(NS, "share", 60)
    snapshot_file = tmp_path / "snapshot.npz"
    done = subprocess.run(
        [sys.executable, "-m", "gpu_scheduler", "refresh", "node-state", "--once", "--no-ec2",
         "--kubeconfig", str(cluster.kubeconfig_of("node-state")), "--snapshot", str(snapshot_file)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["status"] == "ok", report
    assert report["dra"] == {"api": dra_api(cluster), "nodes": 2, "gpus_published": 16, "gpus_claimed": 5,
                             "extended_resource": False}  # fmt: skip
    snapshot = read_snapshot(snapshot_file.read_bytes())
    rows = snapshot.table.rows_of(list(NODES))
    claimed = {"dra-a": 3, "dra-b": 2, "plain": 0}
    # With sharing, the bind records whole-GPU pods in the ledger too: it holds every GPU a pod was given.
    held = {node: sum(1 for used in ledger.read(node, 8).used if used) for node in NODES}
    bound = {pod["metadata"]["name"]: pod["spec"].get("nodeName") for pod in cluster.pods(NS)}
    if bound.get("five-on-a"):  # the previous test ran: 5 + 6 whole GPUs, one share on plain
        assert held == {"dra-a": 5, "dra-b": 6, "plain": 1}, bound
    expected = [8 - claimed[n] - held[n] for n in NODES]
    assert snapshot.free_gpus[rows].tolist() == expected
    assert snapshot.claimed_gpus is not None and snapshot.claimed_gpus[rows].tolist() == [claimed[n] for n in NODES]
