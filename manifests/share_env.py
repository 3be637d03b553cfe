"""What a GPU share's containers are given: its GPU, as a CDI device, and its size, as environment variables.

The path (``docs/sharing.md``, "From pod to container"):

1. the bind records the share on GPU *k* of its node in the ledger, and that GPU's reservation pod
   (``manifests/reservation.py``) holds the GPU in Kubernetes' count and reports its UUID;
2. the bind writes :func:`share_annotations` into the **Binding**, which the API server merges onto the
   pod in the same write as ``nodeName``: no kubelet ever sees the pod bound without them. The bind waits
   for the UUID (:data:`manifests.reservation.UUID_WAIT_S`); a share whose GPU's UUID is not known is
   not bound;
3. the GPU reaches every container of the pod one of two ways, the extender's ``SHARE_DEVICE``:

   - ``cdi`` (the default): the Binding names the GPU's CDI device in ``nvidia.cdi.k8s.io/pod``, which the
     NVIDIA container toolkit's NRI plugin reads and containerd injects. No tenant may write that key (nor
     any ``cdi.k8s.io/`` one: ``manifests.access``), and with the toolkit's
     ``accept-nvidia-visible-devices-envvar-when-unprivileged`` off, no ``NVIDIA_VISIBLE_DEVICES`` from a
     pod's ``env``, ``envFrom`` or image config names a GPU;
   - ``env``: each container reads ``NVIDIA_VISIBLE_DEVICES`` from the annotation through the downward API
     (:func:`share_env`), which needs the toolkit to accept that variable from unprivileged containers:
     then any container on the node that sets it by a route this module's policy cannot see (``envFrom`` a
     ConfigMap, an image's config) sees the GPUs it names, every one with ``all``.

   Either way each container reads the share's size from the annotations through the downward API, for
   the runtimes that enforce one (:data:`SHARE_ENV`).

Who adds the ``env`` entries to a share pod, and keeps everyone else from setting them:

- :func:`share_env_mutation`: a MutatingAdmissionPolicy that adds them to every container of a share
  pod, where the API server serves one (``admissionregistration.k8s.io/v1alpha1`` behind a feature gate
  in 1.32 and 1.33, ``v1beta1`` from 1.34; EKS serves neither in 2026);
- :func:`share_env_policy`: a ValidatingAdmissionPolicy (GA since 1.30; EKS serves it) that refuses, with
  ``env``, a share pod whose containers lack ``NVIDIA_VISIBLE_DEVICES``'s entry (saying what to add, for
  clusters without the mutating policy), and any pod whose containers set ``NVIDIA_VISIBLE_DEVICES`` or the
  size variables any other way in their ``env``. The annotations themselves only the extender may write
  (``manifests.access``'s ``gpu-scheduler-assigned-gpus`` policy covers ``BIND_ANNOTATIONS``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from manifests.access import TRUSTED_NAMESPACE
from manifests.admission import core_rule, denying_policy
from scheduler_core.k8s.annotations import GPU_UUID, bind_annotation_problems
from scheduler_core.k8s.names import (
    CDI_ANNOTATION_PREFIXES,
    CDI_DEVICE_ANNOTATION,
    CDI_DEVICE_KIND,
    GPU_PORTION_ANNOTATION,
    MILLI_PER_GPU,
    MILLI_RESOURCE,
    MPS_MEMORY_ANNOTATION,
    MPS_THREADS_ANNOTATION,
    SCHEDULER_NAME,
    SHARE_DEVICES,
    VISIBLE_DEVICES_ANNOTATION,
)


@dataclass(frozen=True)
class ShareEnv:
    """One environment variable of a share's containers, read from one pod annotation."""

    name: str
    annotation: str
    enforced_by: str


SHARE_ENV = (
    ShareEnv(
        "NVIDIA_VISIBLE_DEVICES",
        VISIBLE_DEVICES_ANNOTATION,
        "the NVIDIA container toolkit: the container sees this GPU and no other",
    ),
    ShareEnv("GPU_PORTION", GPU_PORTION_ANNOTATION, "nothing: the share's fraction, for the application"),
    ShareEnv(
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        MPS_THREADS_ANNOTATION,
        "MPS, where the node runs its control daemon: the share of the GPU's SMs",
    ),
    ShareEnv(
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
        MPS_MEMORY_ANNOTATION,
        "MPS, where the node runs its control daemon: the share's GPU memory (device 0 is the one visible)",
    ),
)
"""The variables, in the order they are added; docs/sharing.md lists them from here."""


def shared_env(device: str = "cdi") -> tuple[ShareEnv, ...]:
    """The variables a share's containers read from the annotations with ``SHARE_DEVICE`` ``device``: the
    size alone with ``cdi`` (the GPU is a CDI device), and ``NVIDIA_VISIBLE_DEVICES`` first with ``env``."""
    if device not in SHARE_DEVICES:
        raise ValueError(f"SHARE_DEVICE: expected one of {', '.join(SHARE_DEVICES)}, got {device!r}")
    return SHARE_ENV if device == "env" else SHARE_ENV[1:]


def share_annotations(uuid: str, milli: int, memory_mib: int, *, device: str = "cdi") -> dict[str, str]:
    """The annotations a share of ``milli`` on the GPU ``uuid`` (``memory_mib`` of memory; 0 when
    unknown, and then no memory limit is written) carries from its Binding on; with ``device`` ``cdi``,
    the GPU's CDI device too. Each value is of the one shape admission lets a Binding carry.

    >>> for key, value in share_annotations("GPU-8a1b2c3d-0000-1111-2222-333344445555", 250, 143771).items():
    ...     print(key, value)
    gpu-scheduler.io/visible-devices GPU-8a1b2c3d-0000-1111-2222-333344445555
    gpu-scheduler.io/gpu-portion 0.25
    gpu-scheduler.io/mps-thread-percentage 25
    gpu-scheduler.io/mps-memory-limit 0=35942MB
    nvidia.cdi.k8s.io/pod k8s.device-plugin.nvidia.com/gpu=GPU-8a1b2c3d-0000-1111-2222-333344445555

    Raises
    ------
    ValueError
        ``milli`` is no share, ``uuid`` no GPU UUID, or ``device`` not one of :data:`SHARE_DEVICES`.
    """
    if not 0 < milli < MILLI_PER_GPU:
        raise ValueError(f"a share is 1..999 milli of one GPU, got {milli}")
    if device not in SHARE_DEVICES:
        raise ValueError(f"SHARE_DEVICE: expected one of {', '.join(SHARE_DEVICES)}, got {device!r}")
    values = {
        "NVIDIA_VISIBLE_DEVICES": uuid,
        "GPU_PORTION": f"{milli / MILLI_PER_GPU:.3f}".rstrip("0"),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, math.ceil(milli * 100 / MILLI_PER_GPU))),
    }
    if memory_mib > 0:  # floor: a limit rounded up would let the shares of a GPU overrun it together
        values["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={memory_mib * milli // MILLI_PER_GPU}MB"
    annotations = {env.annotation: values[env.name] for env in SHARE_ENV if env.name in values}
    if device == "cdi":
        annotations[CDI_DEVICE_ANNOTATION] = f"{CDI_DEVICE_KIND}={uuid}"
    problems = bind_annotation_problems(annotations)
    if problems:
        raise ValueError("; ".join(problems))
    return annotations


def field_path(env: ShareEnv) -> str:
    return f"metadata.annotations['{env.annotation}']"


def share_env(device: str = "cdi") -> list[dict[str, Any]]:
    """The ``env`` entries every container of a share pod carries (what the mutating policy adds), with
    ``SHARE_DEVICE`` ``device`` (:func:`shared_env`)."""
    return [{"name": env.name, "valueFrom": {"fieldRef": {"fieldPath": field_path(env)}}} for env in shared_env(device)]


# ---- admission ------------------------------------------------------------------------------------
def _containers(obj: str, *, ephemeral: bool) -> str:
    kinds = ["initContainers"] + (["ephemeralContainers"] if ephemeral else [])
    parts = [f"{obj}.spec.containers"] + [f"(has({obj}.spec.{k}) ? {obj}.spec.{k} : [])" for k in kinds]
    return " + ".join(parts)


_MILLI = f"'{MILLI_RESOURCE}'"
IS_SHARE = (
    f"({_containers('object', ephemeral=False)}).exists(c, has(c.resources) && ("
    f"(has(c.resources.requests) && {_MILLI} in c.resources.requests) || "
    f"(has(c.resources.limits) && {_MILLI} in c.resources.limits)))"
)
"""A pod whose containers ask for ``gpu-scheduler.io/gpu-milli``: a share (or whole GPUs asked in milli,
whose Binding carries no share annotations: their variables read as empty, and the device plugin gives
them their GPUs). Written out in full: a match condition cannot read a policy's variables."""


def _from_annotation(env: ShareEnv) -> str:
    return f'has(e.valueFrom) && has(e.valueFrom.fieldRef) && e.valueFrom.fieldRef.fieldPath == "{field_path(env)}"'


def share_env_policy(device: str = "cdi") -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicy (and binding) described in the module docstring, for ``SHARE_DEVICE``
    ``device``. Ephemeral containers (``kubectl debug``) are checked too: they need not carry the entries,
    but may not set the variables another way."""
    visible, *sizes = SHARE_ENV
    shared_env(device)  # a known device, or ValueError
    spec: dict[str, Any] = {
        "matchConstraints": {
            "resourceRules": [core_rule("pods", "CREATE"), core_rule("pods/ephemeralcontainers", "UPDATE")]
        },
        "variables": [
            {"name": "all_containers", "expression": _containers("object", ephemeral=True)},
            {"name": "gpu_containers", "expression": _containers("object", ephemeral=False)},
            {"name": "share", "expression": IS_SHARE},
            {"name": "trusted", "expression": TRUSTED_NAMESPACE},
        ],
        "validations": [
            {
                "expression": (
                    "variables.trusted || variables.all_containers.all(c, !has(c.env) || c.env.all(e, "
                    f"e.name != '{visible.name}' || ({_from_annotation(visible)})))"
                ),
                "message": (
                    f"{visible.name} may only be read from the annotation {visible.annotation}, which the "
                    "gpu-scheduler bind writes (valueFrom.fieldRef.fieldPath: "
                    f"{field_path(visible)})"
                ),
                "reason": "Forbidden",
            },
            {
                "expression": (
                    "!variables.share || variables.all_containers.all(c, !has(c.env) || c.env.all(e, "
                    + " && ".join(f"(e.name != '{env.name}' || ({_from_annotation(env)}))" for env in sizes)
                    + "))"
                ),
                "message": (
                    "a GPU share's "
                    + ", ".join(env.name for env in sizes)
                    + " may only be read from the gpu-scheduler.io annotations the bind writes"
                ),
                "reason": "Forbidden",
            },
        ],
    }
    if device == "env":  # the GPU reaches the containers through the variable: each one must read it
        spec["validations"].append(_every_gpu_container_reads(visible))
    return denying_policy(f"{SCHEDULER_NAME}-share-env", spec)


def _every_gpu_container_reads(visible: ShareEnv) -> dict[str, Any]:
    """With ``SHARE_DEVICE=env``: the validation that every container of a share pod, ephemeral ones aside,
    reads ``visible`` from the bind's annotation, whose refusal says what to add."""
    return {
        "expression": (
            "request.subResource == 'ephemeralcontainers' || !variables.share || "
            "variables.gpu_containers.all(c, has(c.env) && c.env.exists(e, "
            f"e.name == '{visible.name}'))"
        ),
        "message": (
            f"every container of a GPU share must read {visible.name} from the bind's annotation: add "
            f'env: [{{name: {visible.name}, valueFrom: {{fieldRef: {{fieldPath: "{field_path(visible)}"}}}}}}] '
            "(and the size variables: docs/sharing.md), or serve the MutatingAdmissionPolicy "
            f"{SCHEDULER_NAME}-share-env that adds them"
        ),
        "reason": "Invalid",
    }


MUTATING_APIS = tuple(f"admissionregistration.k8s.io/{v}" for v in ("v1alpha1", "v1beta1", "v1"))
"""The MutatingAdmissionPolicy versions the product writes: alpha in 1.32 and 1.33 and beta in 1.34 and
1.35 (each behind the ``MutatingAdmissionPolicy`` feature gate and its ``--runtime-config``, off by
default), GA and served by default from 1.36."""


def _env_patches(field: str, device: str) -> str:
    """JSON patches that give each container of ``spec.field`` the :func:`share_env` entries it lacks: an
    empty ``env`` where it has none, then one ``add`` per missing name. A container that sets one of the
    names another way keeps it, and :func:`share_env_policy` refuses the pod.

    Patches, not an apply configuration: server-side apply may not set a ``fieldRef`` (an atomic
    struct). One object per patch: kube-apiserver 1.33 fails converting a patch value that is a list of
    objects."""
    kind = f"Object.spec.{field}.env"
    where = f'"/spec/{field}/" + string(i) + "/env"'
    lists = [f'object.spec.{field}.transformList(i, c, !has(c.env), JSONPatch{{op: "add", path: {where}, value: []}})']
    for env in shared_env(device):
        entry = (
            f'{kind}{{name: "{env.name}", valueFrom: {kind}.valueFrom{{fieldRef: '
            f'{kind}.valueFrom.fieldRef{{fieldPath: "{field_path(env)}"}}}}}}'
        )
        lacks = f'!has(c.env) || !c.env.exists(e, e.name == "{env.name}")'
        patch = f'JSONPatch{{op: "add", path: {where} + "/-", value: {entry}}}'
        lists.append(f"object.spec.{field}.transformList(i, c, {lacks}, {patch})")
    return f"(has(object.spec.{field}) ? {' + '.join(lists)} : [])"


def share_env_mutation(api_version: str, device: str = "cdi") -> list[dict[str, Any]]:
    """The MutatingAdmissionPolicy (and binding) that gives every container and init container of a share
    pod :func:`share_env` (for ``SHARE_DEVICE`` ``device``), in ``api_version`` (one of
    :data:`MUTATING_APIS`). Its failure refuses the pod: with ``env``, a share created without the entries
    would be refused by :func:`share_env_policy` anyway."""
    if api_version not in MUTATING_APIS:
        raise ValueError(f"mutating policy API: expected one of {', '.join(MUTATING_APIS)}, got {api_version!r}")
    name = f"{SCHEDULER_NAME}-share-env"
    labels = {"app.kubernetes.io/part-of": "eks-gpu-scheduler"}
    expression = f"{_env_patches('containers', device)} + {_env_patches('initContainers', device)}"
    return [
        {
            "apiVersion": api_version,
            "kind": "MutatingAdmissionPolicy",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "matchConstraints": {"resourceRules": [core_rule("pods", "CREATE")]},
                "matchConditions": [{"name": "is-a-share", "expression": IS_SHARE}],
                "failurePolicy": "Fail",
                "reinvocationPolicy": "IfNeeded",
                "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": expression}}],
            },
        },
        {
            "apiVersion": api_version,
            "kind": "MutatingAdmissionPolicyBinding",
            "metadata": {"name": name, "labels": labels},
            "spec": {"policyName": name},
        },
    ]


def container_env(pod: Mapping[str, Any], container: Mapping[str, Any]) -> dict[str, str]:
    """The environment a kubelet gives ``container`` of ``pod`` from its ``env`` entries: values, and
    fieldRefs to the pod's annotations, labels, name and namespace (an absent key reads as ``""``, as the
    kubelet resolves it). Other sources are left out."""
    metadata = pod.get("metadata") or {}
    found: dict[str, str] = {}
    for entry in container.get("env") or []:
        ref = ((entry.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        if ref is None:
            if "valueFrom" not in entry:
                found[entry["name"]] = str(entry.get("value", ""))
            continue
        for kind in ("annotations", "labels"):
            prefix = f"metadata.{kind}['"
            if ref.startswith(prefix) and ref.endswith("']"):
                found[entry["name"]] = str((metadata.get(kind) or {}).get(ref[len(prefix) : -2], ""))
        if ref in ("metadata.name", "metadata.namespace"):
            found[entry["name"]] = str(metadata.get(ref.split(".")[1], ""))
    return found


def container_gpus(pod: Mapping[str, Any], container: Mapping[str, Any], device: str = "cdi") -> tuple[str, ...]:
    """The GPU UUIDs ``container`` of ``pod`` is given by a runtime set up as ``docs/sharing.md`` says for
    ``SHARE_DEVICE`` ``device``: with ``cdi``, the devices of kind :data:`CDI_DEVICE_KIND` that the pod's CDI
    annotations name (the pod's, and the container's own ``nvidia.cdi.k8s.io/container.<name>``); with
    ``env``, those its ``NVIDIA_VISIBLE_DEVICES`` names as the kubelet resolves it (:func:`container_env`).
    What a device plugin gives the container for ``nvidia.com/gpu`` is not included."""
    if device == "env":
        named = container_env(pod, container).get("NVIDIA_VISIBLE_DEVICES", "")
        return tuple(part for part in named.split(",") if part)
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    keys = [CDI_DEVICE_ANNOTATION, f"nvidia.cdi.k8s.io/container.{container.get('name', '')}"]
    keys += [key for key in annotations if key.startswith(CDI_ANNOTATION_PREFIXES[0])]
    found = []
    for key in keys:
        for name in str(annotations.get(key) or "").split(","):
            kind, _, uuid = name.strip().partition("=")
            if kind == CDI_DEVICE_KIND and GPU_UUID.fullmatch(uuid):
                found.append(uuid)
    return tuple(found)
