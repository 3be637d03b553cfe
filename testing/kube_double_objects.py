"""What the API double (:mod:`testing.kube_double`) does to the objects it stores: their JSON as the API
server writes it, merge patches, the validation the real server applies to labels and the pod-deletion-cost
annotation, and a reservation pod's report of its GPU."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from typing import Any

from testing.kube_double_requests import ApiError, Route

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
KINDS = {"nodes": "Node", "pods": "Pod", "deviceclasses": "DeviceClass", "resourceslices": "ResourceSlice",
          "resourceclaims": "ResourceClaim", "deployments": "Deployment",
          "poddisruptionbudgets": "PodDisruptionBudget"}  # fmt: skip
"""The kind of each resource the double serves."""
# Strategic merge: the merge key of each list field the double knows; other lists are replaced.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "conditions": "type",
    "addresses": "type",
    "taints": "key",
    "tolerations": "key",
    "env": "name",
    "ports": "containerPort",
    "volumes": "name",
    "volumeMounts": "mountPath",
}
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def encode(obj: Any) -> bytes:
    """The apiserver's compact JSON, ending in a newline."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def raw(obj: Mapping[str, Any]) -> bytes:
    """An object as it appears in a list: compact JSON, no newline."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def with_kind(kind: str, obj: Mapping[str, Any]) -> bytes:
    """One object as a GET, PUT or PATCH returns it: with its ``kind`` and ``apiVersion``."""
    return encode({"kind": KINDS[kind], "apiVersion": "apps/v1" if kind == "deployments" else "v1", **obj})


def conflict(route: Route) -> ApiError:
    """409 ``Conflict`` for a write whose ``resourceVersion`` is not the object's."""
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {route.kind} "{route.name}": the object has been modified; please apply'
        " your changes to the latest version and try again",
        {"name": route.name, "kind": route.kind},
    )


def report_reservation(pod: dict[str, Any]) -> None:
    """What a GPU node does with a reservation pod bound to it: Running, its GPU's UUID reported."""
    from scheduler_core.k8s.names import RESERVED_GPU_ANNOTATION
    from scheduler_core.state.allocation import reservation_of
    from testing.reservation_kubelet import gpu_uuid

    slot = reservation_of(pod)
    if slot is not None:
        pod["metadata"].setdefault("annotations", {})[RESERVED_GPU_ANNOTATION] = gpu_uuid(*slot)
        pod["status"]["phase"] = "Running"


# ---- patching --------------------------------------------------------------------------------
def merge_patch(target: Any, patch: Any, *, strategic: bool = False) -> Any:
    """RFC 7386 merge patch (``null`` deletes); with ``strategic``, lists with a known merge key merge
    item by item, as the apiserver's strategic merge does for those fields."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif strategic and key in MERGE_KEYS and isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list(result[key], value, MERGE_KEYS[key])
        else:
            result[key] = merge_patch(result.get(key), value, strategic=strategic)
    return result


def _merge_list(current: list[Any], patch: list[Any], merge_key: str) -> list[Any]:
    merged = copy.deepcopy(current)
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            merged.append(copy.deepcopy(item))
            continue
        for i, existing in enumerate(merged):
            if isinstance(existing, dict) and existing.get(merge_key) == item[merge_key]:
                if item.get("$patch") == "delete":
                    merged.pop(i)
                else:
                    merged[i] = merge_patch(existing, item, strategic=True)
                break
        else:
            if item.get("$patch") != "delete":
                merged.append(copy.deepcopy(item))
    return merged


# ---- validation ------------------------------------------------------------------------------
def validate(route: Route, obj: Mapping[str, Any]) -> None:
    """422 ``Invalid``, with the server's message and causes, for an invalid label on any object or an
    invalid ``pod-deletion-cost`` on a pod."""
    metadata = obj.get("metadata") or {}
    kind = KINDS[route.kind]
    causes: list[dict[str, str]] = []
    for key, value in (metadata.get("labels") or {}).items():
        problem = _label_problem(key, value)
        if problem:
            causes.append({"reason": "FieldValueInvalid", "message": problem, "field": "metadata.labels"})
    if route.kind == "pods":
        cost = (metadata.get("annotations") or {}).get(DELETION_COST)
        if cost is not None and not _valid_deletion_cost(cost):
            cause = {
                "reason": "FieldValueInvalid",
                "message": f"Invalid value: {json.dumps(cost)}: must be a 32bit integer",
                "field": f"metadata.annotations[{DELETION_COST}]",
            }
            # The real server reports this cause twice (fixture b5b): once from metadata, once from spec.
            causes += [cause, dict(cause)]
    if causes:
        summary = "; ".join(f"{c['field']}: {c['message']}" for c in causes[:1])
        raise ApiError(
            422,
            "Invalid",
            f'{kind} "{route.name}" is invalid: {summary}',
            {"name": route.name, "kind": kind, "causes": causes},
        )


def _label_problem(key: object, value: object) -> str:
    if not isinstance(key, str) or not isinstance(value, str):
        return f"label {key!r}: keys and values must be strings"
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return f"Invalid value: {json.dumps(key)}: prefix part must be a DNS-1123 subdomain"
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        return f"Invalid value: {json.dumps(key)}: name part must consist of alphanumeric characters"
    if len(value) > 63 or not _LABEL_NAME.match(value):
        return (
            f"Invalid value: {json.dumps(value)}: a valid label must be an empty string or consist of alphanumeric"
            " characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        )
    return ""


def _valid_deletion_cost(value: object) -> bool:
    # apimachinery: the first character must be a digit or '-', then strconv.ParseInt(value, 10, 32).
    if not isinstance(value, str) or not re.fullmatch(r"-?[0-9]+", value):
        return False
    return -(2**31) <= int(value) < 2**31
