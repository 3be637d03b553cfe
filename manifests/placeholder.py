"""Placeholder pods: whole-GPU demand an autoscaler can act on, for shares that fit nowhere.

Karpenter and cluster-autoscaler add nodes for pods kube-scheduler marked ``Unschedulable`` whose
requests a node they can launch would satisfy; a share's ``gpu-scheduler.io/gpu-milli`` is no resource
they know. So the node-state refresher keeps, per group of such shares, one placeholder per whole GPU
the group needs (:mod:`scheduler_core.state.demand`): a pod of the ``gpu-scheduler`` profile (so the
extender holds it to the shares' GPU model and memory, which it carries as annotations) requesting
``nvidia.com/gpu: 1``, with the shares' node selector, required node affinity and tolerations, and a
priority below every workload's that never preempts (:func:`priority_class`). The autoscaler adds a node
for them; kube-scheduler then binds the shares (of a higher priority) or a placeholder there; a bound
placeholder is never bound: the extender's bind deletes it instead (its job is done: a node with room
for its shares exists), which also makes kube-scheduler retry the shares at once.

Here: the pod, its PriorityClass and namespace, and who may create them (the node-state group), with an
admission policy that admits in :data:`NAMESPACE` only pods of the placeholder's shape.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from manifests.access import CONTAINER, EXTENDER, NODE_STATE, POD_RESTRICTED, RBAC, RESTRICTED, pod_shape_policy
from scheduler_core.errors import InvalidPodError
from scheduler_core.k8s.autoscaler import autoscaler_affinity
from scheduler_core.k8s.names import (
    GPU_RESOURCE,
    PLACEHOLDER_APP,
    PLACEHOLDER_GROUP_LABEL,
    PLACEHOLDER_NAMESPACE,
    SCHEDULER_NAME,
)
from scheduler_core.k8s.pods import pod_demand

NAMESPACE = PLACEHOLDER_NAMESPACE
PRIORITY_CLASS = "gpu-share-placeholder"
PRIORITY = -5
"""Below the default (0): pending shares and every other workload go first; nothing is preempted for it.
Above cluster-autoscaler's ``--expendable-pods-priority-cutoff`` (-10), under which it adds no node for a
pod."""
COMMAND = ["python3", "-c", "import signal; signal.pause()"]
"""What a placeholder runs if a kubelet starts it before the refresher deletes it: nothing, asleep (the
reservation image, which the cluster pulls already)."""
_LABELS = {"app.kubernetes.io/name": PLACEHOLDER_APP, "app.kubernetes.io/part-of": "eks-gpu-scheduler"}


def placeholder_name(key: str, index: int) -> str:
    """Placeholder ``index`` of group ``key``: the index says which of the group's GPUs it stands for.

    >>> placeholder_name("0a1b2c3d4e", 2)
    'gpu-placeholder-0a1b2c3d4e-2'
    """
    return f"{PLACEHOLDER_APP}-{key}-{index}"


def placeholder_pod(
    key: str, index: int, requirements: Mapping[str, Any], *, image: str, cpu_milli: int = 1, memory: int = 16 << 20
) -> dict[str, Any]:
    """Placeholder ``index`` of the group ``key``: one GPU, the CPU (milli-cores) and memory (bytes) of the
    shares it stands for, the group's ``requirements`` (:func:`scheduler_core.state.demand.requirements_of`),
    scheduled by the ``gpu-scheduler`` profile."""
    spec: dict[str, Any] = {
        "schedulerName": SCHEDULER_NAME,
        "priorityClassName": PRIORITY_CLASS,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 0,
        "securityContext": copy.deepcopy(POD_RESTRICTED),
        "containers": [
            {
                "name": "placeholder",
                "image": image,
                "command": list(COMMAND),
                "resources": {
                    "requests": {"cpu": f"{max(1, cpu_milli)}m", "memory": str(max(1, memory)), GPU_RESOURCE: "1"},
                    "limits": {GPU_RESOURCE: "1"},
                },
                "securityContext": copy.deepcopy(RESTRICTED),
            }
        ],
    }
    for field in ("nodeSelector", "affinity", "tolerations"):
        if requirements.get(field):
            spec[field] = copy.deepcopy(requirements[field])
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": placeholder_name(key, index),
            "namespace": NAMESPACE,
            "labels": {**_LABELS, PLACEHOLDER_GROUP_LABEL: key},
            "annotations": dict(requirements.get("annotations") or {}),
        },
        "spec": spec,
    }
    _for_autoscalers(pod)
    return pod


def _for_autoscalers(pod: dict[str, Any]) -> None:
    """Write the shares' GPU model and memory into the placeholder's required node affinity, as Karpenter
    and cluster-autoscaler read them (:func:`~scheduler_core.k8s.autoscaler.autoscaler_affinity`): the
    placeholder is what they add a node for, and a node of another GPU would be refused to the shares.
    Left as it is where nothing is to add or no known instance type fits (the shares then wait, and
    ``explain`` says why)."""
    try:
        terms, _ = autoscaler_affinity(pod, pod_demand(pod))
    except InvalidPodError:
        return
    if terms is not None:
        node_affinity = pod["spec"].setdefault("affinity", {}).setdefault("nodeAffinity", {})
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": terms}


def is_placeholder(pod: Mapping[str, Any]) -> bool:
    """A placeholder pod: in :data:`NAMESPACE`, with the placeholder's name label (only placeholders are
    admitted there)."""
    metadata = pod.get("metadata") or {}
    return (
        metadata.get("namespace") == NAMESPACE
        and (metadata.get("labels") or {}).get("app.kubernetes.io/name") == PLACEHOLDER_APP
    )


def priority_class() -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": PRIORITY_CLASS, "labels": dict(_LABELS)},
        "value": PRIORITY,
        "preemptionPolicy": "Never",
        "globalDefault": False,
        "description": "eks-gpu-scheduler: whole-GPU demand for shares that fit nowhere, for autoscalers",
    }


def placeholder_manifests(image: str, scheduler_account: str) -> list[dict[str, Any]]:
    """The namespace, the PriorityClass, the Role there (pods create and delete) of the node-state group
    (which keeps the placeholders), the extender's group and ``scheduler_account`` (whose bind deletes a
    placeholder instead of binding it), and the admission policy that admits there only placeholders
    running ``image``, in apply order."""
    account_namespace, account = scheduler_account.removeprefix("system:serviceaccount:").split(":", 1)
    container = CONTAINER
    command = ", ".join(f"'{part}'" for part in COMMAND)
    checks = [
        (f"{container}.image == '{image}' && has({container}.command) && {container}.command == [{command}]",
         f"the image {image} asleep"),
        (f"!has({container}.args) && !has({container}.env) && !has({container}.envFrom) && "
         f"!has({container}.volumeMounts)", "no args, env or mounts"),
        ("!has(object.spec.volumes) || object.spec.volumes.size() == 0", "no volumes"),
        (f"object.spec.schedulerName == '{SCHEDULER_NAME}' && object.spec.priorityClassName == '{PRIORITY_CLASS}'",
         f"the {SCHEDULER_NAME} profile and the {PRIORITY_CLASS} priority"),
        ("!has(object.spec.nodeName) || object.spec.nodeName == ''", "no nodeName"),
        ("has(object.spec.automountServiceAccountToken) && !object.spec.automountServiceAccountToken",
         "no ServiceAccount token"),
    ]  # fmt: skip
    keeper = [{"apiGroup": RBAC, "kind": "Group", "name": NODE_STATE.group}]
    retirer = [
        {"apiGroup": RBAC, "kind": "Group", "name": EXTENDER.group},
        {"kind": "ServiceAccount", "name": account, "namespace": account_namespace},
    ]
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": dict(_LABELS)}},
        priority_class(),
        *_role(f"{PLACEHOLDER_APP}-keeper", ["create", "delete"], keeper),
        *_role(f"{PLACEHOLDER_APP}-retirer", ["delete"], retirer),
        *pod_shape_policy(f"{SCHEDULER_NAME}-placeholder-pods", NAMESPACE, "a placeholder", checks),
    ]


def _role(name: str, verbs: list[str], subjects: list[dict[str, str]]) -> list[dict[str, Any]]:
    """A Role on pods in :data:`NAMESPACE` with ``verbs``, bound to ``subjects``."""
    meta = {"name": name, "namespace": NAMESPACE, "labels": dict(_LABELS)}
    return [
        {"apiVersion": f"{RBAC}/v1", "kind": "Role", "metadata": meta,
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": verbs}]},
        {"apiVersion": f"{RBAC}/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": name}, "subjects": subjects},
    ]  # fmt: skip
