"""Whole-GPU demand for shares that fit nowhere: what the placeholder pods stand for.

A pending share requests ``gpu-scheduler.io/gpu-milli``, which no autoscaler can provision for (an
unknown extended resource). So the shares that kube-scheduler marked ``Unschedulable`` are grouped by
what a node must have for them (their GPU model and memory annotations, node selector, required node
affinity and tolerations), and each group stands for ``ceil(sum of milli / 1000)`` whole GPUs: that many
one-GPU placeholder pods (``manifests/placeholder.py``), with the group's requirements, are what Karpenter
or cluster-autoscaler sees and adds nodes for. A placeholder that got bound has done its job (a node
with a free GPU of that kind exists) and goes, freeing the GPU for the shares; so do those beyond the
demand. Everything here is pure; ``lambdas/node_state/service.py`` lists and writes.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduler_core.errors import InvalidPodError
from scheduler_core.k8s.names import (
    GPU_RESOURCE,
    LABEL_MEMORY,
    LABEL_MODEL,
    MILLI_PER_GPU,
    MILLI_RESOURCE,
    PLACEHOLDER_GROUP_LABEL,
    SCHEDULER_NAME,
)
from scheduler_core.k8s.pods import effective_requests

REQUIREMENT_ANNOTATIONS = (LABEL_MODEL, LABEL_MEMORY)
"""The pod annotations a placeholder copies: the extender filters nodes by them."""


@dataclass(frozen=True)
class ShareDemand:
    """One group of pending shares with the same node requirements: ``gpus`` whole GPUs, and the
    ``requirements`` a placeholder carries (``annotations``, ``nodeSelector``, ``affinity`` with the
    required node affinity only, ``tolerations``). ``key`` names the group (a digest of them)."""

    key: str
    gpus: int
    shares: int
    requirements: Mapping[str, Any] = field(default_factory=dict)


def unschedulable_share(pod: Mapping[str, Any]) -> int:
    """The milli of a pending share of the ``gpu-scheduler`` profile that kube-scheduler marked
    ``Unschedulable`` (0 for any other pod: bound, terminating, asking whole GPUs, or not refused yet).

    >>> pod = {"spec": {"schedulerName": "gpu-scheduler", "containers": [{"resources": {"requests": {
    ...     "gpu-scheduler.io/gpu-milli": "250"}}}]}, "status": {"phase": "Pending", "conditions": [
    ...     {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}
    >>> unschedulable_share(pod)
    250
    """
    spec, status, metadata = pod.get("spec") or {}, pod.get("status") or {}, pod.get("metadata") or {}
    if spec.get("nodeName") or metadata.get("deletionTimestamp") or spec.get("schedulerName") != SCHEDULER_NAME:
        return 0
    if status.get("phase", "Pending") != "Pending":
        return 0
    refused = any(
        (c.get("type"), c.get("status"), c.get("reason")) == ("PodScheduled", "False", "Unschedulable")
        for c in status.get("conditions") or ()
        if isinstance(c, Mapping)
    )
    if not refused:
        return 0
    try:
        gpus, milli = effective_requests(spec, (GPU_RESOURCE, MILLI_RESOURCE))
    except InvalidPodError:
        return 0
    return milli if gpus == 0 and 0 < milli < MILLI_PER_GPU else 0


def requirements_of(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What a node must have for ``pod``, as a placeholder carries it."""
    spec, metadata = pod.get("spec") or {}, pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    found: dict[str, Any] = {
        "annotations": {k: annotations[k] for k in REQUIREMENT_ANNOTATIONS if isinstance(annotations.get(k), str)},
        "nodeSelector": dict(spec.get("nodeSelector") or {}),
        "tolerations": list(spec.get("tolerations") or []),
    }
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    found["affinity"] = (
        {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}} if required else {}
    )
    return found


def group_key(requirements: Mapping[str, Any]) -> str:
    """A short, stable name for a group's requirements (a label value: 10 hexadecimal digits).

    >>> h100 = {"annotations": {"gpu.nvidia.com/model": "H100"}}
    >>> group_key(h100) == group_key(dict(h100)) != group_key({"annotations": {"gpu.nvidia.com/model": "L4"}})
    True
    """
    text = json.dumps(requirements, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def share_demand(pods: Sequence[Mapping[str, Any]]) -> list[ShareDemand]:
    """The whole-GPU demand of the unschedulable shares among ``pods``, by group, largest first.

    >>> def share(milli, model):
    ...     return {"metadata": {"annotations": {"gpu.nvidia.com/model": model}},
    ...             "spec": {"schedulerName": "gpu-scheduler", "containers": [{"resources": {"requests": {
    ...                 "gpu-scheduler.io/gpu-milli": str(milli)}}}]},
    ...             "status": {"phase": "Pending", "conditions": [
    ...                 {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}
    >>> [(d.gpus, d.shares) for d in share_demand([share(250, "H100")] * 40 + [share(600, "L4")] * 3)]
    [(10, 40), (2, 3)]
    """
    milli: dict[str, int] = {}
    count: dict[str, int] = {}
    requirements: dict[str, dict[str, Any]] = {}
    for pod in pods:
        share = unschedulable_share(pod)
        if not share:
            continue
        needs = requirements_of(pod)
        key = group_key(needs)
        requirements.setdefault(key, needs)
        milli[key] = milli.get(key, 0) + share
        count[key] = count.get(key, 0) + 1
    groups = [ShareDemand(key, math.ceil(total / MILLI_PER_GPU), count[key], requirements[key])
              for key, total in milli.items()]  # fmt: skip
    return sorted(groups, key=lambda d: (-d.gpus, d.key))


@dataclass(frozen=True)
class PlaceholderPlan:
    """The placeholders to create (group key and index) and to delete (pod names)."""

    create: tuple[tuple[str, int], ...] = ()
    delete: tuple[str, ...] = ()


def plan_placeholders(demand: Sequence[ShareDemand], placeholders: Sequence[Mapping[str, Any]]) -> PlaceholderPlan:
    """Placeholders ``0..gpus-1`` of each group, unbound; every bound one, and every one past its group's
    demand, deleted. A group with a bound placeholder gets no new one this time: a node with room for its
    shares exists, and the shares (of a higher priority) take that room once the placeholder is gone; the
    next plan sees what is still pending. ``placeholders`` are the existing placeholder pods (labelled
    with their group).

    >>> demand = [ShareDemand("k", 2, 7)]
    >>> existing = [{"metadata": {"name": "p-k-0", "labels": {"gpu-scheduler.io/placeholder-group": "k"}},
    ...              "spec": {"nodeName": "n"}},
    ...             {"metadata": {"name": "p-k-5", "labels": {"gpu-scheduler.io/placeholder-group": "k"}}, "spec": {}}]
    >>> plan_placeholders(demand, existing)
    PlaceholderPlan(create=(), delete=('p-k-0', 'p-k-5'))
    >>> plan_placeholders(demand, existing[1:])
    PlaceholderPlan(create=(('k', 0), ('k', 1)), delete=('p-k-5',))
    """
    wanted = {d.key: d.gpus for d in demand}
    kept: dict[str, set[int]] = {}
    landed: set[str] = set()
    delete: list[str] = []
    for pod in placeholders:
        metadata, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        name = str(metadata.get("name") or "")
        key = (metadata.get("labels") or {}).get(PLACEHOLDER_GROUP_LABEL, "")
        index = name.rsplit("-", 1)[-1]
        if spec.get("nodeName"):
            landed.add(key)
            delete.append(name)
        elif key not in wanted or not index.isdigit() or int(index) >= wanted[key]:
            delete.append(name)
        elif not metadata.get("deletionTimestamp"):
            kept.setdefault(key, set()).add(int(index))
    create = tuple(
        (d.key, i) for d in demand if d.key not in landed for i in range(d.gpus) if i not in kept.get(d.key, set())
    )
    return PlaceholderPlan(create, tuple(sorted(delete)))
