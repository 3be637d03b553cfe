"""GPU reservation pods: one per shared GPU, so that Kubernetes itself counts the GPU that shares hold.

A share of a GPU requests ``gpu-scheduler.io/gpu-milli``, which kube-scheduler ignores and no device
plugin serves. A reservation pod bound to the share's node requests ``nvidia.com/gpu: 1``: the stock
NVIDIA device plugin (or the GPU Operator's) picks a physical GPU for it, and kube-scheduler, the
kubelet and the autoscalers count that GPU as taken. The pod runs ``shares/reserve_gpu.py`` (shipped
in :func:`program_config_map`, run by a stock Python image), which reports the GPU's UUID on the pod
itself, with the pod's own ServiceAccount token.

Here: the pod (:func:`reservation_pod`), its PriorityClass, the program's ConfigMap, and the identity
the pod runs as (:func:`reservation_access`): a ServiceAccount whose Role patches pods in the
reservation namespace only, and a ValidatingAdmissionPolicy (Kubernetes 1.30 or newer) that lets a
token patch only the pod it is bound to (the ``authentication.kubernetes.io/pod-name`` and ``pod-uid``
a pod's projected token carries), and only the ``gpu-scheduler.io/reserved-gpu`` annotation of it,
once, with a GPU UUID.

The cluster state counts a reservation pod's CPU but not its GPU (:func:`scheduler_core.state.allocation.pod_use`):
the shares on that GPU hold it already, by their ``assigned-gpus``.

The pods are made and removed by ``shares/reservations.py`` (the bind, the releases, the reconcile),
as the identities :func:`keeper_access` names: the extender's group, the node-state refresher's, and the
second scheduler's ServiceAccount (``gpu-scheduler serve`` run beside the scheduler). They may create pods in
:data:`NAMESPACE` only, and only of :func:`reservation_pod`'s shape (:func:`keeper_access`'s admission
policy): a stolen extender credential cannot run another image, another command, or a privileged pod on a
GPU node.

The shares' containers get the reported UUID through their Binding's annotations
(``manifests/share_env.py``).
"""

from __future__ import annotations

import copy
import hashlib
import re
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from manifests.access import CONTAINER, EXTENDER, NODE_STATE, POD_RESTRICTED, RESTRICTED, pod_shape_policy
from manifests.admission import denying_policy, frozen_list_checks, metadata_map, only_these_change
from scheduler_core.k8s.annotations import GPU_UUID
from scheduler_core.k8s.names import (
    GPU_RESOURCE,
    RESERVATION_APP,
    RESERVATION_NAMESPACE,
    RESERVATION_SLOT_LABEL,
    RESERVED_GPU_ANNOTATION,
    SCHEDULER_NAME,
)

NAMESPACE = RESERVATION_NAMESPACE
ACCOUNT = RESERVATION_APP
USER = f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"
PROGRAM_CONFIG_MAP = "gpu-reservation-program"


def _program() -> Path:
    """The reservation pods' program, ``shares/reserve_gpu.py``: it lives with the share lifecycle that
    runs it; these manifests ship its text in a ConfigMap (found, not imported: it runs in the pod)."""
    spec = find_spec("shares.reserve_gpu")
    if spec is None or spec.origin is None:
        raise RuntimeError("shares/reserve_gpu.py, the reservation pods' program, is not installed")
    return Path(spec.origin)


PROGRAM = _program()
MOUNT = "/opt/gpu-reservation"
DEFAULT_IMAGE = "public.ecr.aws/docker/library/python:3.12-slim"
"""A stock Python image: the program needs the standard library and the NVML the container toolkit mounts."""
NO_RESERVATIONS = "none"
"""The image setting that turns reservation pods off (an empty variable keeps the default)."""
PRIORITY_CLASS = "gpu-reservation"
UUID_PATTERN = f"^{GPU_UUID.pattern}$"
"""How NVML writes a GPU's UUID (``nvmlDeviceGetUUID``), for CEL's ``matches``."""
UUID_WAIT_S = 10.0
"""How long the bind of a share waits for its GPU's reservation pod to report the UUID (the kubelet starts
the pod, the device plugin allocates, the program reports): a share is bound only with its GPU's UUID.
The generated bind ``httpTimeout`` covers it (``manifests.scheduler``)."""
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
MAX_NAME = 253
_LABELS = {"app.kubernetes.io/name": ACCOUNT, "app.kubernetes.io/part-of": "eks-gpu-scheduler"}


def reserving(image: str) -> bool:
    """Whether reservation pods are made with the image setting ``image`` (:data:`NO_RESERVATIONS`: not)."""
    return bool(image) and image != NO_RESERVATIONS


def image_problems(setting: str, image: object) -> list[str]:
    """What is wrong with ``image`` as the reservation image setting named ``setting`` (it goes into an
    admission policy's expression, so only an image reference's characters are taken).

    >>> image_problems("RESERVATION_IMAGE", "python:3.12 slim")
    ["RESERVATION_IMAGE: expected a container image reference or 'none', got 'python:3.12 slim'"]
    """
    if isinstance(image, str) and re.fullmatch(r"[\w.:/@-]+", image):
        return []
    return [f"{setting}: expected a container image reference or '{NO_RESERVATIONS}', got {image!r}"]


def reservation_name(node: str, slot: int) -> str:
    """The reservation pod of GPU ``slot`` (the ledger's index) on ``node``: one name per GPU, so that
    whoever creates it twice gets a 409. A node name too long for it (a pod's name has 253 characters at
    most, as a node's) is cut and a digest of the whole added.

    >>> reservation_name("ip-10-0-1-7.ec2.internal", 3)
    'gpu-reservation-ip-10-0-1-7.ec2.internal-3'
    >>> len(reservation_name("n" * 253, 7))
    253
    """
    name = f"{ACCOUNT}-{node}-{slot}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    tail = f"-{digest}-{slot}"
    return f"{ACCOUNT}-{node[: MAX_NAME - len(ACCOUNT) - 1 - len(tail)].rstrip('.-')}{tail}"


ENV_NAMES = ("POD_NAME", "POD_NAMESPACE", "NVIDIA_DRIVER_CAPABILITIES", "PYTHONUNBUFFERED")
"""The reservation program's environment (:func:`reservation_pod`): no other name is admitted, so that no
``NVIDIA_VISIBLE_DEVICES`` (every GPU) or ``PYTHON*`` variable that runs other code reaches it."""


def reservation_pod(node: str, slot: int, *, image: str = DEFAULT_IMAGE) -> dict[str, Any]:
    """The reservation pod of GPU ``slot`` on ``node``: bound there directly (``nodeName``: it is the
    share's node, chosen already), one ``nvidia.com/gpu``, every taint tolerated (GPU nodes are often
    tainted), out of reach of preemption (:func:`priority_class`) and of Karpenter's consolidation, and
    as little CPU and memory as a sleeping Python needs, as requests and limits alike."""
    environment = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},  # NVML, no compute
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": reservation_name(node, slot),
            "namespace": NAMESPACE,
            "labels": {**_LABELS, RESERVATION_SLOT_LABEL: str(slot)},
            "annotations": {"karpenter.sh/do-not-disrupt": "true"},
        },
        "spec": {
            "nodeName": node,
            "serviceAccountName": ACCOUNT,
            "priorityClassName": PRIORITY_CLASS,
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": 5,
            "securityContext": copy.deepcopy(POD_RESTRICTED),
            "containers": [
                {
                    "name": "reserve",
                    "image": image,
                    "command": ["python3", f"{MOUNT}/{PROGRAM.name}"],
                    "env": environment,
                    # Requests equal to limits: Guaranteed, the last to be evicted under node pressure.
                    "resources": {
                        "requests": {"cpu": "10m", "memory": "64Mi", GPU_RESOURCE: "1"},
                        "limits": {"cpu": "10m", "memory": "64Mi", GPU_RESOURCE: "1"},
                    },
                    "volumeMounts": [{"name": "program", "mountPath": MOUNT, "readOnly": True}],
                    "securityContext": copy.deepcopy(RESTRICTED),
                }
            ],
            "volumes": [{"name": "program", "configMap": {"name": PROGRAM_CONFIG_MAP}}],
        },
    }


def priority_class() -> dict[str, Any]:
    """The reservation pods' PriorityClass: the highest a user's class may have, so that no pod preempts
    one (that would free ``nvidia.com/gpu`` under the shares still on the GPU), and ``preemptionPolicy:
    Never``, so that one never preempts anything either (it goes where its shares already are)."""
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": PRIORITY_CLASS, "labels": dict(_LABELS)},
        "value": 1_000_000_000,
        "preemptionPolicy": "Never",
        "globalDefault": False,
        "description": "eks-gpu-scheduler: a GPU that shares hold, counted by Kubernetes",
    }


def program_config_map() -> dict[str, Any]:
    """The ConfigMap the reservation pods run the program from."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": PROGRAM_CONFIG_MAP, "namespace": NAMESPACE, "labels": dict(_LABELS)},
        "data": {PROGRAM.name: PROGRAM.read_text()},
    }


def reservation_access() -> list[dict[str, Any]]:
    """The reservation pods' ServiceAccount, its Role and RoleBinding (pods patch, in :data:`NAMESPACE`
    only), and the admission policy that keeps each token to its own pod's ``reserved-gpu`` annotation
    (:func:`_own_pod_policy`), in apply order."""
    meta = {"name": ACCOUNT, "namespace": NAMESPACE, "labels": dict(_LABELS)}
    rbac = "rbac.authorization.k8s.io"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}],
        },
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": rbac, "kind": "Role", "name": ACCOUNT},
            "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}],
        },
        *denying_policy(f"{SCHEDULER_NAME}-reservation-own-pod", _own_pod_policy()),
    ]


def _own_pod_policy() -> dict[str, Any]:
    """A policy spec: a reservation pod's token changes only the pod it is bound to (the ``pod-name`` and
    ``pod-uid`` its projected token carries), and of it only the ``reserved-gpu`` annotation, written once
    and as a GPU UUID."""
    key = RESERVED_GPU_ANNOTATION
    extra = "request.userInfo.extra"
    own_pod = (
        f"'{POD_NAME_EXTRA}' in {extra} && '{POD_UID_EXTRA}' in {extra} && "
        f"{extra}['{POD_NAME_EXTRA}'] == [object.metadata.name] && {extra}['{POD_UID_EXTRA}'] == [object.metadata.uid]"
    )
    return {
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["UPDATE"],
                    "resources": ["pods", "pods/status"],
                }
            ]
        },
        "matchConditions": [{"name": "is-a-reservation-pod", "expression": f"request.userInfo.username == '{USER}'"}],
        "variables": [
            {"name": "new", "expression": metadata_map("object", "annotations")},
            {"name": "old", "expression": metadata_map("oldObject", "annotations")},
        ],
        "validations": [
            {
                "expression": own_pod,
                "message": f"{USER} may change only the pod its token is bound to",
                "reason": "Forbidden",
            },
            {
                "expression": only_these_change("variables.new", "variables.old", [RESERVED_GPU_ANNOTATION]),
                "message": f"{USER} may change only {RESERVED_GPU_ANNOTATION} in metadata.annotations",
                "reason": "Forbidden",
            },
            {  # written once: a container that could rewrite it could point the shares at another GPU
                "expression": f"!('{key}' in variables.old) || ('{key}' in variables.new && "
                f"variables.new['{key}'] == variables.old['{key}'])",
                "message": f"{RESERVED_GPU_ANNOTATION} is written once",
                "reason": "Forbidden",
            },
            {
                "expression": f"!('{key}' in variables.new) || variables.new['{key}'].matches('{UUID_PATTERN}')",
                "message": f"{RESERVED_GPU_ANNOTATION} must be a GPU UUID (GPU- and 32 hexadecimal digits)",
                "reason": "Invalid",
            },
            {
                "expression": (
                    f"({metadata_map('object', 'labels')}) == ({metadata_map('oldObject', 'labels')}) && "
                    "object.spec == oldObject.spec && (!has(object.status) || object.status == oldObject.status)"
                ),
                "message": f"{USER} may not change labels, spec or status",
                "reason": "Forbidden",
            },
            *frozen_list_checks(USER),
        ],
    }


KEEPER = f"{ACCOUNT}-keeper"
"""The Role (and its binding) of those who create and delete reservation pods."""


def keeper_access(scheduler_account: str, *, image: str = DEFAULT_IMAGE) -> list[dict[str, Any]]:
    """The Role that lets the extender's group, the node-state group and ``scheduler_account`` (the second
    scheduler's ServiceAccount as ``system:serviceaccount:NS:NAME``) create, read and delete pods in
    :data:`NAMESPACE`, and the admission policy that admits there only pods of :func:`reservation_pod`'s
    shape running ``image``, whoever creates them (:func:`_reservation_pod_checks`)."""
    rbac = "rbac.authorization.k8s.io"
    meta = {"name": KEEPER, "namespace": NAMESPACE, "labels": dict(_LABELS)}
    account_namespace, account = scheduler_account.removeprefix("system:serviceaccount:").split(":", 1)
    return [
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "delete"]}],
        },
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": rbac, "kind": "Role", "name": KEEPER},
            "subjects": [
                {"apiGroup": rbac, "kind": "Group", "name": EXTENDER.group},
                {"apiGroup": rbac, "kind": "Group", "name": NODE_STATE.group},
                {"kind": "ServiceAccount", "name": account, "namespace": account_namespace},
            ],
        },
        *pod_shape_policy(
            f"{SCHEDULER_NAME}-reservation-pods", NAMESPACE, "a GPU reservation pod", _reservation_pod_checks(image)
        ),
    ]


def _reservation_pod_checks(image: str) -> list[tuple[str, str]]:
    """What a pod in :data:`NAMESPACE` must be beside ``POD_SHAPE_CHECKS``, as (CEL expression, what it asks
    for): :func:`reservation_pod`'s image, command, environment, priority, GPU, ServiceAccount and volumes,
    bound to a node, with no GPU reported yet."""
    container = CONTAINER
    command = ", ".join(f"'{part}'" for part in ("python3", f"{MOUNT}/{PROGRAM.name}"))
    env_names = ", ".join(f"'{name}'" for name in ENV_NAMES)
    root_ca = "has(s.configMap) && s.configMap.name == 'kube-root-ca.crt'"
    allowed_sources = f"has(s.serviceAccountToken) || has(s.downwardAPI) || ({root_ca})"
    return [
        (f"{container}.image == '{image}'", f"the image {image}"),
        (f"has({container}.command) && {container}.command == [{command}]", "the reservation program as command"),
        (f"!has({container}.args) || {container}.args.size() == 0", "no args"),
        (f"!has({container}.envFrom) || {container}.envFrom.size() == 0", "no envFrom"),
        (
            f"!has({container}.env) || {container}.env.all(e, !has(e.valueFrom) || has(e.valueFrom.fieldRef))",
            "env values or fieldRefs only",
        ),
        (
            f"!has({container}.env) || {container}.env.all(e, e.name in [{env_names}])",
            f"no env but {', '.join(ENV_NAMES)}",
        ),
        (f"object.spec.priorityClassName == '{PRIORITY_CLASS}'", f"the {PRIORITY_CLASS} priority"),
        (
            f"has({container}.resources.limits) && '{GPU_RESOURCE}' in {container}.resources.limits && "
            f"string({container}.resources.limits['{GPU_RESOURCE}']) == '1'",
            f"one {GPU_RESOURCE}",
        ),
        (f"object.spec.serviceAccountName == '{ACCOUNT}'", f"the ServiceAccount {ACCOUNT}"),
        ("has(object.spec.nodeName) && object.spec.nodeName != ''", "a nodeName (the shares' node)"),
        (
            f"!has(object.metadata.annotations) || !('{RESERVED_GPU_ANNOTATION}' in object.metadata.annotations)",
            f"no {RESERVED_GPU_ANNOTATION} yet (the pod reports its GPU itself)",
        ),
        (
            "!has(object.spec.volumes) || object.spec.volumes.all(v, "
            f"(has(v.configMap) && v.configMap.name == '{PROGRAM_CONFIG_MAP}') || "
            f"(has(v.projected) && v.projected.sources.all(s, {allowed_sources})))",
            f"only volumes of the {PROGRAM_CONFIG_MAP} ConfigMap and the ServiceAccount's token",
        ),
    ]


def reservation_manifests(scheduler_account: str, *, image: str = DEFAULT_IMAGE) -> list[dict[str, Any]]:
    """Everything reservation pods need, in apply order: their namespace, PriorityClass, program, identity,
    and who may create them (:func:`keeper_access`)."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": dict(_LABELS)}},
        priority_class(),
        program_config_map(),
        *reservation_access(),
        *keeper_access(scheduler_account, image=image),
    ]
