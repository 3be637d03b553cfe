"""How a tenant could try to give a container a GPU the ledger did not give it, and the generated
``gpu-scheduler-share-env`` admission policy's answer, evaluated by a real CEL evaluator as the API server
evaluates it. A share pod's containers read ``NVIDIA_VISIBLE_DEVICES`` (and the size variables) from the
annotations the bind writes (``manifests/share_env.py``); no pod may set them any other way, and a share
pod must read them. ``tests/e2e/test_reserved_shares.py`` sends a few of the same pods through a real 1.33
API server, with the mutating policy that adds the entries."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import celpy
import pytest

from manifests.access import TRUSTED_NAMESPACE_LABEL
from manifests.share_env import share_env, share_env_policy
from tests.conftest import make_pod
from tests.manifests.test_admission_cel import _plain, evaluate


def refusals(
    pod: dict[str, Any],
    *,
    sub_resource: str = "",
    namespace: str = "team",
    namespace_labels: dict[str, str] | None = None,
    device: str = "env",
) -> list[str]:
    """The messages of the policy's failed validations for ``pod`` (a CREATE, or with ``sub_resource``
    the update that adds an ephemeral container), with ``SHARE_DEVICE`` ``device``; empty: admitted."""
    (policy,) = [d for d in share_env_policy(device) if d["kind"] == "ValidatingAdmissionPolicy"]
    spec = policy["spec"]
    operation = "UPDATE" if sub_resource else "CREATE"
    rule = f"pods/{sub_resource}" if sub_resource else "pods"
    assert any(
        rule in r["resources"] and operation in r["operations"] for r in spec["matchConstraints"]["resourceRules"]
    )
    activation: dict[str, Any] = {
        "request": {"operation": operation, "subResource": sub_resource, "userInfo": {"username": "tenant"}},
        "object": pod,
        "namespaceObject": {"metadata": {"name": namespace, "labels": namespace_labels or {}}},
    }
    variables: dict[str, Any] = {}
    for variable in spec["variables"]:
        value = evaluate(variable["expression"], {**activation, "variables": variables})
        # Passed in again as JSON: a CEL bool is an int to the JSON conversion.
        variables[variable["name"]] = bool(value) if isinstance(value, celpy.celtypes.BoolType) else _plain(value)
    activation["variables"] = variables
    return [v["message"] for v in spec["validations"] if not evaluate(v["expression"], activation)]


def share_pod(device: str = "env") -> dict[str, Any]:
    """A quarter-GPU share as the mutating policy leaves it (or its tenant writes it), with ``SHARE_DEVICE``
    ``device``."""
    pod = make_pod("share", 0, milli=250)
    pod["spec"]["containers"][0]["env"] = [{"name": "HOME", "value": "/tmp"}, *share_env(device)]
    return pod


def whole_pod() -> dict[str, Any]:
    return make_pod("whole", 1)


@pytest.mark.parametrize("device", ["cdi", "env"])
def test_the_share_pod_the_product_expects_and_other_pods_are_admitted(device: str) -> None:
    assert refusals(share_pod(device), device=device) == []
    assert refusals(whole_pod(), device=device) == []
    assert refusals(make_pod("cpu", 0), device=device) == []


def test_with_a_cdi_device_a_share_reads_no_gpu_variable_and_still_may_not_set_one() -> None:
    """With ``SHARE_DEVICE=cdi`` the GPU is a CDI device in the Binding: a share carries only its size
    variables (or none: the bare share is admitted), and naming a GPU by the variable is refused all the
    same (defence in depth: the toolkit is set to ignore it)."""
    assert [e["name"] for e in share_env("cdi")] == [
        "GPU_PORTION", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    ]  # fmt: skip
    assert refusals(make_pod("bare", 0, milli=250), device="cdi") == []
    found = refusals(_env(share_pod("cdi"), {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}), device="cdi")
    assert any(VISIBLE_ONLY_FROM_ANNOTATION in message for message in found), found


def _env(pod: dict[str, Any], *entries: dict[str, Any], container: str = "containers") -> dict[str, Any]:
    pod["spec"][container][0].setdefault("env", []).extend(entries)
    return pod


VISIBLE_ONLY_FROM_ANNOTATION = "NVIDIA_VISIBLE_DEVICES may only be read from the annotation"
SIZES_ONLY_FROM_ANNOTATIONS = "may only be read from the gpu-scheduler.io annotations the bind writes"
SHARE_NEEDS_ENTRIES = "every container of a GPU share must read NVIDIA_VISIBLE_DEVICES from the bind's annotation"


def _ephemeral(pod: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["ephemeralContainers"] = [
        {"name": "debug", "image": "busybox", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}
    ]
    return pod


HOSTILE: dict[str, tuple[Callable[[], dict[str, Any]], str]] = {
    # Every GPU of the node, in a pod that asks for one or for none.
    "all GPUs in a whole-GPU pod": (
        lambda: _env(whole_pod(), {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}),
        VISIBLE_ONLY_FROM_ANNOTATION,
    ),
    "a GPU index in a pod without GPUs": (
        lambda: _env(make_pod("cpu", 0), {"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}),
        VISIBLE_ONLY_FROM_ANNOTATION,
    ),
    # Another GPU in a share: a value beside the entries (the later one wins in a container).
    "a second, literal entry in a share": (
        lambda: _env(share_pod(), {"name": "NVIDIA_VISIBLE_DEVICES", "value": "GPU-0aaa"}),
        VISIBLE_ONLY_FROM_ANNOTATION,
    ),
    "another annotation": (
        lambda: _env(
            make_pod("cpu", 0),
            {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['x']"}}},
        ),
        VISIBLE_ONLY_FROM_ANNOTATION,
    ),
    "a ConfigMap key": (
        lambda: _env(
            whole_pod(),
            {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {"name": "gpus", "key": "all"}}},
        ),
        VISIBLE_ONLY_FROM_ANNOTATION,
    ),
    "an init container": (
        lambda: _env(
            _with_init(whole_pod()), {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}, container="initContainers"
        ),
        VISIBLE_ONLY_FROM_ANNOTATION,
    ),
    # A bigger share than the ledger gave: the MPS limits set by hand.
    "an MPS memory limit of its own": (
        lambda: _env(share_pod(), {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=80G"}),
        SIZES_ONLY_FROM_ANNOTATIONS,
    ),
    "all the SMs": (
        lambda: _env(share_pod(), {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "100"}),
        SIZES_ONLY_FROM_ANNOTATIONS,
    ),
    # A share that does not read its GPU: envFrom, the image's own env, or nothing, decides then.
    "a share without the entries": (lambda: make_pod("bare", 0, milli=250), SHARE_NEEDS_ENTRIES),
    "a share whose init container lacks them": (lambda: _with_init(share_pod()), SHARE_NEEDS_ENTRIES),
}


def _with_init(pod: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["initContainers"] = [{"name": "init", "image": "busybox", "resources": {}}]
    return pod


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_pod_that_sets_a_gpu_another_way_is_refused(name: str) -> None:
    make, refusal = HOSTILE[name]
    found = refusals(make())
    assert any(refusal in message for message in found), found


def test_an_ephemeral_container_may_not_set_it_either() -> None:
    """``kubectl debug`` on a share: the debug container needs no entries, and may not name a GPU."""
    found = refusals(_ephemeral(share_pod()), sub_resource="ephemeralcontainers")
    assert found and all(VISIBLE_ONLY_FROM_ANNOTATION in message for message in found), found
    plain = _ephemeral(share_pod())
    plain["spec"]["ephemeralContainers"][0]["env"] = []
    assert refusals(plain, sub_resource="ephemeralcontainers") == []


def test_a_namespace_labelled_trusted_and_kube_system_may_set_it() -> None:
    """The GPU Operator's own pods (its validator, DCGM) and the device plugin set NVIDIA_VISIBLE_DEVICES=all."""
    pod = _env(make_pod("validator", 0), {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})
    assert refusals(copy.deepcopy(pod), namespace_labels={TRUSTED_NAMESPACE_LABEL: "trusted"}) == []
    assert refusals(copy.deepcopy(pod), namespace="kube-system") == []
    assert refusals(copy.deepcopy(pod), namespace_labels={TRUSTED_NAMESPACE_LABEL: "yes"}) != []
