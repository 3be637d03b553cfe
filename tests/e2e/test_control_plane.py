"""The control plane the suite runs on serves what its version has, and the harness configures it by
that version: the scheduler configuration's API version, ValidatingAdmissionPolicy (1.30 and later) and
Dynamic Resource Allocation (1.33 behind its feature gate, GA from 1.34). On 1.33 a ResourceClaim is
allocated by kube-scheduler itself, on the product's generated profile, with no kubelet and no driver.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from scheduler_core.simulator.synthetic import CATALOGUE, make_node
from testing.control_plane import ControlPlane
from testing.kube_binaries import KubeBinaries
from tests.e2e.conftest import start_scheduler

NAMESPACE = "dra"
DRIVER = "gpu.example.com"
H100 = next(shape for shape in CATALOGUE if shape.model == "H100")


def served(cluster: ControlPlane, group_version: str) -> set[str]:
    """The resources the API server serves in ``group_version`` (empty when it serves none)."""
    status, raw = cluster.api.raw("GET", f"/apis/{group_version}")
    if status == 404:
        return set()
    assert status == 200, raw[:300]
    return {resource["name"] for resource in json.loads(raw)["resources"]}


def binaries(cluster: ControlPlane) -> KubeBinaries:
    assert cluster.binaries is not None
    return cluster.binaries


def test_the_scheduler_runs_the_generated_configuration_in_the_api_version_of_its_binaries(
    cluster: ControlPlane,
) -> None:
    config = start_scheduler(cluster, "http://127.0.0.1:1")
    try:
        ran = yaml.safe_load((cluster.workdir / "kube-scheduler.yaml").read_text())
    finally:
        cluster.stop_scheduler()
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"  # what the product generates
    assert ran["apiVersion"] == binaries(cluster).scheduler_api
    assert {k: v for k, v in ran.items() if k not in ("apiVersion", "clientConnection")} == {
        k: v for k, v in config.items() if k not in ("apiVersion", "clientConnection")
    }


def test_validating_admission_policy_is_served_from_1_30(cluster: ControlPlane) -> None:
    # The product's admission policies (manifests/access.py) need it; 1.25 serves none.
    resources = served(cluster, "admissionregistration.k8s.io/v1")
    expected = binaries(cluster).release[:2] >= (1, 30)
    assert ("validatingadmissionpolicies" in resources) == expected, sorted(resources)


def dra_objects(api: str) -> list[tuple[str, dict[str, Any]]]:
    """A DeviceClass, one node's ResourceSlice of two GPUs, and a claim for one of them (the
    ``v1beta2`` shapes, which ``v1`` keeps)."""
    meta = {"name": DRIVER}
    return [
        (f"/apis/{api}/deviceclasses", {"apiVersion": api, "kind": "DeviceClass", "metadata": meta,
         "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]}}),
        (f"/apis/{api}/resourceslices", {"apiVersion": api, "kind": "ResourceSlice",
         "metadata": {"name": "h100-a-gpus"},
         "spec": {"driver": DRIVER, "nodeName": "h100-a",
                  "pool": {"name": "h100-a", "generation": 1, "resourceSliceCount": 1},
                  "devices": [{"name": "gpu-0"}, {"name": "gpu-1"}]}}),
        (f"/apis/{api}/namespaces/{NAMESPACE}/resourceclaims", {"apiVersion": api, "kind": "ResourceClaim",
         "metadata": {"name": "one-gpu", "namespace": NAMESPACE},
         "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}}),
    ]  # fmt: skip


def claim_pod() -> dict[str, Any]:
    container = {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "claims-a-gpu", "namespace": NAMESPACE},
        "spec": {
            "schedulerName": "gpu-scheduler",
            "containers": [container],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "one-gpu"}],
        },
    }


def test_dra_is_served_where_the_version_has_it_and_kube_scheduler_allocates_a_claim(cluster: ControlPlane) -> None:
    dra = binaries(cluster).dra
    if dra is None:  # before 1.33: nothing of resource.k8s.io that the product reads
        assert not served(cluster, "resource.k8s.io/v1beta2") and not served(cluster, "resource.k8s.io/v1")
        return
    api = dra[0]
    assert {"deviceclasses", "resourceslices", "resourceclaims"} <= served(cluster, api)
    cluster.add_nodes([make_node("h100-a", H100, "us-east-1a")])
    cluster.ensure_namespaces([NAMESPACE])
    for path, body in dra_objects(api):
        cluster.api.request("POST", path, body)
    # --gpu-pods-only: a pod whose GPU is a claim does not reach the extender (a dead URL here).
    start_scheduler(cluster, "http://127.0.0.1:1", "--gpu-pods-only")
    try:
        cluster.api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", claim_pod())
        assert cluster.wait_bound(NAMESPACE, "claims-a-gpu", timeout_s=60) == "h100-a"
    finally:
        cluster.stop_scheduler()
    claim = cluster.api.get(f"/apis/{api}/namespaces/{NAMESPACE}/resourceclaims/one-gpu")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (DRIVER, "h100-a")
    assert result["device"] in ("gpu-0", "gpu-1")
    assert [owner["name"] for owner in claim["status"]["reservedFor"]] == ["claims-a-gpu"]
