"""Shares held in Kubernetes' own count, through the real control plane: the bind creates a GPU's
reservation pod before the first share on it binds, the releases remove it after the last, and the
node-state refresher's reconcile repairs what neither did.

``gpu-scheduler serve --watch --ledger-table`` binds as the second scheduler's ServiceAccount, on the
configuration ``scheduler-config --sharing`` generates, whose manifests (the reservation namespace, its
RBAC and admission policies) the harness applied at its start. :class:`ReservationKubelet` plays the
kubelet and the device plugin for reservation pods only (``testing/reservation_kubelet.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from adapters.gpu_ledger import LedgerStore, create_table
from manifests.placeholder import NAMESPACE as PLACEHOLDERS
from manifests.reservation import NAMESPACE as RESERVATIONS
from manifests.reservation import reservation_name, reservation_pod
from manifests.share_env import share_env, shared_env
from scheduler_core.k8s.names import (
    ASSIGNED_GPUS_ANNOTATION,
    CDI_DEVICE_ANNOTATION,
    CDI_DEVICE_KIND,
    RESERVED_GPU_ANNOTATION,
    VISIBLE_DEVICES_ANNOTATION,
)
from scheduler_core.simulator.synthetic import CATALOGUE, make_node, make_pod
from testing.bind_watch import BindWatch
from testing.control_plane import ControlPlane
from testing.kube_binaries import find_binaries
from testing.kube_rest import KubeRest
from testing.moto import dynamodb_client
from testing.product import reservation_agreement, share_usage
from testing.reservation_kubelet import ReservationKubelet, gpu_uuid
from tests.e2e.conftest import ServeSharing, let_tenant
from tests.security.test_reservation_pods import HOSTILE

SHAPE = {shape.model: shape for shape in CATALOGUE}
TABLE = "reserved-ledger"
SOLO = "a100-solo"


def share(name: str, milli: int, model: str, namespace: str, *, authored: bool = False) -> dict[str, Any]:
    """A share pod as its tenant writes it: without the env entries (the mutating policy adds them, where
    the API server serves one), or ``authored`` with them, as on a cluster without (EKS in 2026)."""
    pod = make_pod(name, 0, namespace=namespace, models=model, milli=milli)
    pod["spec"]["containers"][0]["resources"]["requests"].update(cpu="50m", memory="64Mi")
    if authored or not mutating(pod):
        pod["spec"]["containers"][0]["env"] = share_env()
    return pod


POD_EDITS = [{"apiGroups": [""], "resources": ["pods", "pods/ephemeralcontainers"],
              "verbs": ["get", "create", "update", "patch"]}]  # fmt: skip
"""What a tenant's pod editor may do: create and edit pods, and add debug containers."""


def create_as(api: KubeRest, namespace: str, pod: dict[str, Any]) -> tuple[int, str]:
    """The status and message of creating ``pod`` in ``namespace`` as ``api``'s user."""
    status, raw = api.raw("POST", f"/api/v1/namespaces/{namespace}/pods", json.dumps(pod).encode(), "application/json")
    return status, (json.loads(raw).get("message", "") if raw else "")


def mutating(_pod: Any = None) -> bool:
    """Whether this suite's API server serves the product's MutatingAdmissionPolicy (1.32 and later)."""
    binaries = find_binaries()
    return not isinstance(binaries, str) and binaries.mutating_policy is not None


def containers_get_their_gpu(found: dict[str, Any], shares: int) -> None:
    """Every container of the ``shares`` bound shares reads, as the kubelet resolves its env, the UUID its
    GPU's reservation pod reported (``reservation_agreement``)."""
    assert found["containers_checked"] == shares and found["containers_wrong_gpu"] == 0, found


@pytest.fixture(scope="module")
def ledger(moto_env: dict[str, str]) -> LedgerStore:
    store = LedgerStore(TABLE, dynamodb_client(moto_env["AWS_ENDPOINT_URL_DYNAMODB"]))
    create_table(store.client, TABLE)
    return store


@pytest.fixture(scope="module")
def serving(cluster: ControlPlane, ledger: LedgerStore, serve_sharing: ServeSharing) -> Iterator[str]:
    cluster.add_nodes([make_node(SOLO, SHAPE["A100"], "us-east-1a")])
    url, _ = serve_sharing(TABLE)
    yield url
    cluster.stop_scheduler()


def bind_all(cluster: ControlPlane, pods: list[dict[str, Any]]) -> None:
    """Create ``pods`` (of one namespace) and wait until the API server reports every one bound."""
    watch = BindWatch(cluster.api, pods[0]["metadata"]["namespace"])
    try:
        cluster.create_pods(pods, workers=8)
        assert watch.wait(len(pods), timeout_s=300), f"{len(watch.bound_at)} of {len(pods)} bound"
    finally:
        watch.close()


def reservations(cluster: ControlPlane) -> list[dict[str, Any]]:
    return cluster.pods(RESERVATIONS)


def clear(cluster: ControlPlane, work: str) -> None:
    """What a test may leave when it fails, gone: its pods and every reservation pod (which the tests
    after it count)."""
    cluster.delete_namespace_pods(work)
    cluster.delete_namespace_pods(RESERVATIONS)


def agreement(cluster: ControlPlane, namespace: str) -> dict[str, Any]:
    return reservation_agreement(cluster.pods(namespace), reservations(cluster))


def test_the_first_share_on_a_gpu_brings_its_reservation_pod_and_kube_scheduler_counts_that_gpu(
    cluster: ControlPlane, serving: str, kubelet: ReservationKubelet
) -> None:
    """Three 600-milli shares take three GPUs of the 8-GPU node (none fits beside another); each GPU gets
    its reservation pod, which reports a UUID of its own. kube-scheduler's own count then refuses a
    6-GPU pod (its NodeResourcesFit says so, before any extender) and binds a 5-GPU one. When the shares
    go, their reservation pods go within 10 s (serve's watch), and the GPUs are whole again."""
    work = "reserved-small"
    cluster.create_pods([share(f"s-{i}", 600, "A100", work, authored=i == 2) for i in range(3)])
    slots = set()
    for i in range(3):
        assert cluster.wait_bound(work, f"s-{i}") == SOLO
        text = cluster.pod(work, f"s-{i}")["metadata"]["annotations"][ASSIGNED_GPUS_ANNOTATION]
        slot = int(text.split(":")[0])
        slots.add(slot)
        # Created before the share's Binding: there by the time the share is seen bound.
        assert cluster.pod(RESERVATIONS, reservation_name(SOLO, slot))["spec"]["nodeName"] == SOLO
    assert len(slots) == 3
    # A share is bound only with its GPU's UUID: reported by then.
    found = agreement(cluster, work)
    assert (found["missing"], found["orphans"], found["uuids"], found["uuid_clashes"]) == ([], [], 3, 0)
    containers_get_their_gpu(found, 3)
    for i in range(3):  # the mutating policy's entries, or the tenant's own: once each, not twice
        names = [e["name"] for e in cluster.pod(work, f"s-{i}")["spec"]["containers"][0]["env"]]
        assert sorted(names) == sorted(env.name for env in shared_env("cdi")), names

    cluster.create_pods([make_pod("six", 6, namespace=work, models="A100")])
    assert "Insufficient nvidia.com/gpu" in cluster.wait_failed(work, "six")
    cluster.create_pods([make_pod("five", 5, namespace=work, models="A100")])
    assert cluster.wait_bound(work, "five") == SOLO

    for name in ("six", "five", *(f"s-{i}" for i in range(3))):
        cluster.delete_pod(work, name)
    cluster.wait_for(lambda: not reservations(cluster), 10, "the reservation pods to go with their shares")


def test_a_hand_made_reservation_pod_of_another_shape_is_refused(cluster: ControlPlane, serving: str) -> None:
    """The reservation namespace admits reservation pods only, whoever asks (the admission policy that
    keeps a stolen extender credential from running anything else on a GPU node; 1.30 and later). A
    tenant has no right there at all."""
    tenant = cluster.api_as("tenant")
    status, _ = tenant.raw(
        "POST", f"/api/v1/namespaces/{RESERVATIONS}/pods", json.dumps(reservation_pod(SOLO, 7)).encode(),
        "application/json",
    )  # fmt: skip
    assert status == 403  # no Role for a tenant there at all
    assert cluster.binaries is not None
    if cluster.binaries.release[:2] < (1, 30):
        return  # no ValidatingAdmissionPolicy before 1.30: the shape is not checked there (docs/sharing.md)
    as_scheduler = cluster.api_as("scheduler")
    for name in ("another image", "another command", "the host's network", "a hostPath volume", "a secret in its env"):
        change, refusal = HOSTILE[name]
        pod = reservation_pod(SOLO, 7)
        change(pod)
        status, body = as_scheduler.raw(
            "POST", f"/api/v1/namespaces/{RESERVATIONS}/pods", json.dumps(pod).encode(), "application/json"
        )
        assert status == 403 and refusal in body.decode(), (status, body[:300])
    assert not reservations(cluster)


def test_a_tenant_cannot_give_a_container_a_gpu_the_ledger_did_not(
    cluster: ControlPlane, serving: str, kubelet: ReservationKubelet
) -> None:
    """A tenant who may create and edit pods (and add debug containers) tries, through the real API server
    and the generated policies, to name a GPU itself: in a pod's env, in the bind's annotations at creation
    or after the bind, in a larger MPS share, in a debug container. Each is refused, with the policy's
    reason; the honest share is bound with its GPU's UUID. (1.30 and later: no admission policies before.)"""
    work = "reserved-tenant"
    assert cluster.binaries is not None
    if cluster.binaries.release[:2] < (1, 30):
        return
    cluster.ensure_namespaces([work])
    tenant = let_tenant(cluster, work, "editor", POD_EDITS)
    everything = make_pod("everything", 1, namespace=work, models="A100")
    everything["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    status, message = create_as(tenant, work, everything)
    assert status == 403 and "NVIDIA_VISIBLE_DEVICES may only be read from the annotation" in message, message
    forged = share("forged", 250, "A100", work)
    forged["metadata"]["annotations"][VISIBLE_DEVICES_ANNOTATION] = gpu_uuid(SOLO, 0)
    status, message = create_as(tenant, work, forged)
    assert status == 403 and "only the gpu-scheduler extender may set" in message, message
    greedy = share("greedy", 250, "A100", work)
    greedy["spec"]["containers"][0].setdefault("env", []).append(
        {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "100"}
    )
    status, message = create_as(tenant, work, greedy)
    assert status == 403 and "may only be read from the gpu-scheduler.io annotations" in message, message
    for key in (CDI_DEVICE_ANNOTATION, "nvidia.cdi.k8s.io/container.main", "cdi.k8s.io/mine"):  # a CDI device itself
        device = make_pod("device", 0, namespace=work)
        device["metadata"]["annotations"][key] = f"{CDI_DEVICE_KIND}={gpu_uuid(SOLO, 3)}"
        status, message = create_as(tenant, work, device)
        assert status == 403 and "only the gpu-scheduler extender may" in message, (key, message)

    status, message = create_as(tenant, work, share("honest", 250, "A100", work))
    assert status == 201, message
    assert cluster.wait_bound(work, "honest") == SOLO
    containers_get_their_gpu(agreement(cluster, work), 1)
    path = f"/api/v1/namespaces/{work}/pods/honest"
    for key, value in ((VISIBLE_DEVICES_ANNOTATION, gpu_uuid(SOLO, 7)),
                       (CDI_DEVICE_ANNOTATION, f"{CDI_DEVICE_KIND}={gpu_uuid(SOLO, 7)}"),
                       ("cdi.k8s.io/more", f"{CDI_DEVICE_KIND}={gpu_uuid(SOLO, 6)}")):  # fmt: skip
        swap = {"metadata": {"annotations": {key: value}}}
        status, raw = tenant.raw("PATCH", path, json.dumps(swap).encode(), "application/merge-patch+json")
        assert status == 403 and b"only the gpu-scheduler extender may" in raw, raw[:300]
    everything_env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    debug = {"spec": {"ephemeralContainers": [{"name": "debug", "image": "busybox", "env": everything_env}]}}
    status, raw = tenant.raw(
        "PATCH", f"{path}/ephemeralcontainers", json.dumps(debug).encode(), "application/strategic-merge-patch+json"
    )
    assert status == 403 and b"NVIDIA_VISIBLE_DEVICES may only be read" in raw, raw[:300]
    containers_get_their_gpu(agreement(cluster, work), 1)  # nothing changed
    cluster.delete_namespace_pods(work)
    cluster.wait_for(lambda: not reservations(cluster), 10, "the reservation pods to go with their shares")


def test_400_quarter_shares_on_200_nodes_each_gpu_reserved_once_and_after_churn_nothing_left_over(
    cluster: ControlPlane, serving: str, ledger: LedgerStore, kubelet: ReservationKubelet
) -> None:
    """The acceptance: 400 quarter-GPU pods on 200 8-GPU nodes bind onto at most 101 GPUs, each of which
    has exactly one reservation pod (made before its first share's Binding), reporting a UUID of its
    own; the ledger equals the annotations. Then half the shares go and 200 more come: 10 s after the
    last bind, no reservation pod is left without shares and no GPU with shares lacks one."""
    work = "reserved-burst"
    try:
        cluster.add_nodes([make_node(f"h100-{i:03d}", SHAPE["H100"], "us-east-1b") for i in range(200)])
        bind_all(cluster, [share(f"q-{i:03d}", 250, "H100", work) for i in range(400)])
        pods = cluster.pods(work)
        usage = share_usage(pods, ledger.scan())
        assert usage["gpus_used"] <= 101 and usage["gpus_over_1000_milli"] == 0, usage
        assert usage["ledger_equals_annotations"] and usage["bound_without_annotation"] == 0
        found = reservation_agreement(pods, reservations(cluster))
        assert (found["missing"], found["orphans"]) == ([], []), found
        assert found["reservation_pods"] == usage["gpus_used"]
        assert found["uuids"] == usage["gpus_used"] and found["uuid_clashes"] == 0
        containers_get_their_gpu(found, 400)

        for i in range(0, 400, 2):
            cluster.delete_pod(work, f"q-{i:03d}")
        bind_all(cluster, [share(f"r-{i:03d}", 250, "H100", work) for i in range(200)])
        time.sleep(10)
        found = agreement(cluster, work)
        assert (found["missing"], found["orphans"]) == ([], []), found
        usage = share_usage(cluster.pods(work), ledger.scan())
        assert usage["ledger_equals_annotations"] and found["reservation_pods"] == usage["gpus_used"]
        containers_get_their_gpu(found, 400)
        cluster.delete_namespace_pods(work)
        cluster.wait_for(lambda: not reservations(cluster), 30, "the reservation pods to go with their shares")
    finally:
        clear(cluster, work)


def test_the_reconcile_creates_a_missing_reservation_pod_and_removes_one_without_shares(
    cluster: ControlPlane, serving: str, ledger: LedgerStore, moto_env: dict[str, str], tmp_path: Any
) -> None:
    """What no release saw: a reservation pod deleted by hand under a share, and one made for a GPU that
    holds none. One ``refresh node-state`` run, as the node-state identity, puts both right."""
    work = "reserved-reconcile"
    try:
        cluster.create_pods([share("kept", 400, "A100", work)])
        assert cluster.wait_bound(work, "kept") == SOLO
        (slot,) = [int(cluster.pod(work, "kept")["metadata"]["annotations"][ASSIGNED_GPUS_ANNOTATION].split(":")[0])]
        cluster.delete_pod(RESERVATIONS, reservation_name(SOLO, slot))
        stray = 7 if slot != 7 else 6
        cluster.create_pods([reservation_pod(SOLO, stray)])
        assert {p["metadata"]["name"] for p in reservations(cluster)} == {reservation_name(SOLO, stray)}

        report = refresh_once(cluster, moto_env, tmp_path / "snapshot.npz")
        assert report["reservations"]["reservations_created"] == 1, report
        assert report["reservations"]["reservations_deleted"] == 1, report
        assert {p["metadata"]["name"] for p in reservations(cluster)} == {reservation_name(SOLO, slot)}
        cluster.wait_for(
            lambda: RESERVED_GPU_ANNOTATION in (cluster.pod(RESERVATIONS, reservation_name(SOLO, slot))["metadata"]
                                                .get("annotations") or {}),
            30, "the re-created reservation pod's UUID",
        )  # fmt: skip
        assert refresh_once(cluster, moto_env, tmp_path / "snapshot.npz")["reservations"]["uuid_mismatches"] == 0
        # The device plugin gave the re-created pod another GPU than the share's Binding named (here: its
        # report rewritten by hand): the reconcile says so.
        other = {"metadata": {"annotations": {RESERVED_GPU_ANNOTATION: gpu_uuid("elsewhere", 0)}}}
        cluster.api.request("PATCH", f"/api/v1/namespaces/{RESERVATIONS}/pods/{reservation_name(SOLO, slot)}", other,
                            content_type="application/merge-patch+json")  # fmt: skip
        assert refresh_once(cluster, moto_env, tmp_path / "snapshot.npz")["reservations"]["uuid_mismatches"] == 1
        cluster.delete_pod(work, "kept")
        cluster.wait_for(lambda: not reservations(cluster), 10, "the reservation pod to go with its share")
    finally:
        clear(cluster, work)


def refresh_once(cluster: ControlPlane, moto_env: dict[str, str], snapshot: Any, **env: str) -> dict[str, Any]:
    """One ``gpu-scheduler refresh node-state`` run as the node-state identity, with the ledger (and the
    settings ``env`` gives); its report."""
    done = subprocess.run(
        [sys.executable, "-m", "gpu_scheduler", "refresh", "node-state", "--once", "--no-ec2", "--kubeconfig",
         str(cluster.kubeconfig_of("node-state")), "--snapshot", str(snapshot), "--ledger-table", TABLE],
        capture_output=True, text=True, timeout=120, env={**moto_env, **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return report


def unschedulable(pod: dict[str, Any]) -> bool:
    return any(
        (c.get("type"), c.get("status"), c.get("reason")) == ("PodScheduled", "False", "Unschedulable")
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def test_shares_that_fit_nowhere_become_whole_gpu_placeholders_that_go_once_nodes_come(
    cluster: ControlPlane, serving: str, moto_env: dict[str, str], tmp_path: Any
) -> None:
    """40 quarter-GPU shares of a model no node has are unschedulable: one refresher run stands up exactly
    10 one-GPU placeholders with the shares' model (what Karpenter or cluster-autoscaler provisions for:
    kube-scheduler marks them Unschedulable too). Three nodes of that model come (12 GPUs): the shares
    bind within a minute, no placeholder is ever bound (the bind deletes one instead), and the next run
    removes any left."""
    work = "reserved-pending"
    cluster.create_pods([share(f"p-{i:02d}", 250, "L40S", work) for i in range(40)], workers=8)
    cluster.wait_for(lambda: all(unschedulable(p) for p in cluster.pods(work)) and len(cluster.pods(work)) == 40,
                     60, "the 40 shares refused")  # fmt: skip
    report = refresh_once(cluster, moto_env, tmp_path / "snapshot.npz")
    assert report["placeholders"]["demand_gpus"] == 10 and report["placeholders"]["created"] == 10, report
    assert report["placeholders"]["unschedulable_shares"] == 40
    placeholders = cluster.pods(PLACEHOLDERS)
    assert len(placeholders) == 10
    for pod in placeholders:
        (container,) = pod["spec"]["containers"]
        # One GPU, and the CPU and memory of the four shares it stands for (50m and 64Mi each).
        assert container["resources"]["requests"] == {"nvidia.com/gpu": "1", "cpu": "200m", "memory": str(256 << 20)}
        assert pod["metadata"]["annotations"]["gpu.nvidia.com/model"] == "L40S"
    cluster.wait_for(lambda: all(unschedulable(p) for p in cluster.pods(PLACEHOLDERS)), 60, "the placeholders refused")
    assert (
        refresh_once(cluster, moto_env, tmp_path / "snapshot.npz")["placeholders"]["created"] == 0
    )  # kept as they are

    cluster.add_nodes([make_node(f"l40s-{i}", SHAPE["L40S"], "us-east-1c") for i in range(3)])
    # Whatever kube-scheduler tries first, a placeholder is never bound (the bind removes it instead), so
    # every share finds its room.
    cluster.wait_for(lambda: all(p["spec"].get("nodeName") for p in cluster.pods(work)), 60, "the 40 shares bound")
    assert not any(p["spec"].get("nodeName") for p in cluster.pods(PLACEHOLDERS))
    report = refresh_once(cluster, moto_env, tmp_path / "snapshot.npz")
    assert report["placeholders"]["demand_gpus"] == 0 and report["placeholders"]["created"] == 0, report
    assert cluster.pods(PLACEHOLDERS) == []
    cluster.delete_namespace_pods(work)
    cluster.wait_for(lambda: not reservations(cluster), 10, "the reservation pods to go with their shares")


def test_forty_shares_with_forty_tolerations_stand_no_more_placeholders_than_the_cap(
    cluster: ControlPlane, serving: str, moto_env: dict[str, str], tmp_path: Any
) -> None:
    """40 one-milli shares, each tolerating a taint of its own, of a model no node has: before the caps, 40
    whole-GPU placeholders (one group each). Now the refresher, told ``PLACEHOLDERS_PER_NAMESPACE=3``, stands
    3, reports the 37 GPUs it held back, and stands no more on its next run."""
    work = "reserved-tolerations"
    pods = []
    for k in range(40):
        pod = share(f"t-{k:02d}", 1, "T4", work)  # no node of this module has one
        pod["spec"]["tolerations"] = [{"key": f"dummy-{k}", "operator": "Exists", "effect": "NoSchedule"}]
        pods.append(pod)
    cluster.create_pods(pods, workers=8)
    try:
        cluster.wait_for(lambda: len(cluster.pods(work)) == 40 and all(unschedulable(p) for p in cluster.pods(work)),
                         60, "the 40 shares refused")  # fmt: skip
        for _ in range(2):
            report = refresh_once(cluster, moto_env, tmp_path / "snapshot.npz", PLACEHOLDERS_PER_NAMESPACE="3")
            assert report["placeholders"]["demand_gpus"] == 40 and report["placeholders"]["held_back"] == 37, report
            assert len(cluster.pods(PLACEHOLDERS)) == 3
    finally:
        cluster.delete_namespace_pods(work)
        refresh_once(cluster, moto_env, tmp_path / "snapshot.npz")
    assert cluster.pods(PLACEHOLDERS) == []
