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


def _volume(pod: dict[str, Any], source: dict[str, Any]) -> None:
    pod["spec"]["volumes"].append({"name": "extra", **source})


HOSTILE: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "another image": (lambda p: _container(p).update(image="example.com/miner:1"), "the image"),
    "another command": (lambda p: _container(p).update(command=["sh", "-c", "id"]), "program as command"),
    "arguments to it": (lambda p: _container(p).update(args=["--discover"]), "no args"),
    "a second container": (lambda p: p["spec"]["containers"].append(_container(copy.deepcopy(p))), "one container"),
    "an init container": (lambda p: p["spec"].update(initContainers=[_container(copy.deepcopy(p))]), "no other"),
    "a secret in its env": (
        lambda p: _container(p)["env"].append(
            {"name": "S", "valueFrom": {"secretKeyRef": {"name": "aws", "key": "key"}}}
        ),
        "env values or fieldRefs only",
    ),
    "envFrom": (lambda p: _container(p).update(envFrom=[{"secretRef": {"name": "aws"}}]), "no envFrom"),
    "privileged": (lambda p: _container(p)["securityContext"].update(privileged=True), "no privilege"),
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
    "two GPUs": (lambda p: _container(p)["resources"]["limits"].update({"nvidia.com/gpu": "2"}), "one nvidia.com/gpu"),
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
    "privileged": (lambda p: _container(p)["securityContext"].update(privileged=True), "no privilege"),
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
