"""Whole-GPU demand for shares that fit nowhere: what the placeholder pods stand for.

A pending share requests ``gpu-scheduler.io/gpu-milli``, which no autoscaler can provision for (an
unknown extended resource). So the shares that kube-scheduler marked ``Unschedulable`` are grouped, per
namespace, by what an autoscaler acts on when it picks a node for a pod (their GPU model and memory
annotations, which become required node affinity; their node selector and required node affinity; and the
tolerations that can matter to a taint: ``NoSchedule`` and ``NoExecute`` ones, without their seconds,
sorted and once each), and each group's shares are packed onto whole GPUs, first fit by decreasing
milli (as the ledger packs them: two 600-milli shares take two GPUs, twenty 1-milli shares one): one
one-GPU placeholder pod per GPU (``manifests/placeholder.py``), asking the CPU and memory of the shares on
it, with the group's requirements, is what Karpenter or cluster-autoscaler sees and adds nodes for. A
placeholder is never bound (the extender's bind deletes one it would bind: its node has room for the
shares); those beyond the demand go too. Everything here is pure; ``shares/placeholders.py`` lists and writes,
as one of the node-state refresher's jobs.

Placeholders live outside their tenants' namespaces and quotas, and autoscalers buy nodes for them, so
their number is capped (:class:`PlaceholderCaps`): per namespace of the shares, and in all. The caps are
shared out one GPU at a time, namespace by namespace in turn, each namespace's largest group first; what
they hold back is counted (:attr:`ShareDemand.held_back`) and reported.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from scheduler_core.errors import InvalidPodError, Namer, by_path
from scheduler_core.k8s.names import (
    GPU_RESOURCE,
    LABEL_MEMORY,
    LABEL_MODEL,
    MILLI_PER_GPU,
    MILLI_RESOURCE,
    PLACEHOLDER_GROUP_LABEL,
    SCHEDULER_NAME,
)
from scheduler_core.k8s.pod_requests import effective_requests
from scheduler_core.k8s.resources import CPU, MEMORY, pod_requests

REQUIREMENT_ANNOTATIONS = (LABEL_MODEL, LABEL_MEMORY)
"""The pod annotations a placeholder copies: the extender filters nodes by them."""


@dataclass(frozen=True)
class PlaceholderCaps:
    """How many placeholders may stand at once: per namespace of the shares they stand for, and in all."""

    per_namespace: int = 16
    total: int = 64

    def problems(self, name: Namer = by_path) -> list[str]:
        """Each cap that is not an integer in range, named by ``name`` of its path (``placeholders.total``)."""
        return [
            f"{name(f'placeholders.{field}')}: expected an integer in 0..{MAX_PLACEHOLDERS}, got {value!r}"
            for field, value in (("per_namespace", self.per_namespace), ("total", self.total))
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PLACEHOLDERS
        ]


MAX_PLACEHOLDERS = 10_000
"""The largest cap a setting may give: a bound on what one refresher run creates, whatever it is told."""


@dataclass(frozen=True)
class ShareDemand:
    """One group of pending shares of one namespace with the same node requirements: the whole GPUs they
    pack onto, each with the CPU (milli) and memory (bytes) its shares request (``per_gpu``), and the
    ``requirements`` a placeholder carries (``annotations``, ``nodeSelector``, ``affinity`` with the
    required node affinity only, ``tolerations``). ``key`` names the group (a digest of the namespace and
    the requirements); ``allowed`` is how many of its GPUs the caps let placeholders stand for (all of them
    until :func:`cap_demand` says otherwise)."""

    key: str
    shares: int
    per_gpu: tuple[tuple[int, int], ...]
    requirements: Mapping[str, Any] = field(default_factory=dict)
    namespace: str = ""
    allowed: int = -1

    @property
    def gpus(self) -> int:
        return len(self.per_gpu)

    @property
    def placeholders(self) -> int:
        """The placeholders this group gets: its GPUs, or fewer where the caps hold it back."""
        return self.gpus if self.allowed < 0 else min(self.allowed, self.gpus)

    @property
    def held_back(self) -> int:
        return self.gpus - self.placeholders


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
    """What a node must have for ``pod``, as a placeholder carries it: only what an autoscaler acts on
    (see the module docstring; :func:`taint_tolerations`)."""
    spec, metadata = pod.get("spec") or {}, pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    found: dict[str, Any] = {
        "annotations": {k: annotations[k] for k in REQUIREMENT_ANNOTATIONS if isinstance(annotations.get(k), str)},
        "nodeSelector": dict(spec.get("nodeSelector") or {}),
        "tolerations": taint_tolerations(spec.get("tolerations")),
    }
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    found["affinity"] = (
        {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}} if required else {}
    )
    return found


_TOLERATION_FIELDS = ("key", "operator", "value", "effect")
_BLOCKING = ("", "NoSchedule", "NoExecute")
"""The effects a taint keeps a pod off a node with (an empty effect tolerates them all)."""


def taint_tolerations(tolerations: Any) -> list[dict[str, str]]:
    """The tolerations of a pod that can let it onto a tainted node, as an autoscaler reads them: those of
    a blocking effect (``PreferNoSchedule`` keeps no pod off a node), without ``tolerationSeconds`` (how long
    a pod stays once tainted, not where it may go), each once, sorted; anything not a toleration is
    dropped.

    >>> for kept in taint_tolerations([{"key": "b", "operator": "Exists", "effect": "NoSchedule"},
    ...         {"key": "a", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
    ...         {"key": "b", "operator": "Exists", "effect": "NoSchedule"},
    ...         {"key": "c", "effect": "PreferNoSchedule"}, "junk"]):
    ...     print(kept)
    {'effect': 'NoExecute', 'key': 'a', 'operator': 'Exists'}
    {'effect': 'NoSchedule', 'key': 'b', 'operator': 'Exists'}
    """
    found: dict[tuple[str, ...], dict[str, str]] = {}
    for toleration in tolerations if isinstance(tolerations, list) else ():
        if not isinstance(toleration, Mapping) or (toleration.get("effect") or "") not in _BLOCKING:
            continue
        kept = {k: v for k in _TOLERATION_FIELDS if isinstance(v := toleration.get(k), str) and v}
        found.setdefault(tuple(f"{k}={v}" for k, v in sorted(kept.items())), dict(sorted(kept.items())))
    return [found[key] for key in sorted(found)]


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
    [(10, 40), (3, 3)]
    """
    shares: dict[str, list[tuple[int, int, int]]] = {}  # key -> (milli, cpu milli, memory bytes)
    requirements: dict[str, tuple[str, dict[str, Any]]] = {}  # key -> (namespace, requirements)
    for pod in pods:
        share = unschedulable_share(pod)
        if not share:
            continue
        needs = requirements_of(pod)
        namespace = str((pod.get("metadata") or {}).get("namespace") or "")
        key = group_key({"namespace": namespace, **needs})
        requirements.setdefault(key, (namespace, needs))
        try:
            asks = pod_requests(pod)
        except InvalidPodError:
            continue
        shares.setdefault(key, []).append((share, int(asks[CPU]), int(asks[MEMORY])))
    groups = [
        ShareDemand(key, len(found), _pack(found), requirements[key][1], requirements[key][0])
        for key, found in shares.items()
    ]
    return sorted(groups, key=lambda d: (-d.gpus, d.key))


def cap_demand(demand: Sequence[ShareDemand], caps: PlaceholderCaps) -> list[ShareDemand]:
    """``demand`` with :attr:`ShareDemand.allowed` set by ``caps``: GPUs are given out one at a time, each
    namespace in turn (by name), each namespace's groups largest first, until a namespace has
    ``caps.per_namespace`` or all have ``caps.total``.

    >>> def group(key, namespace, gpus):
    ...     return ShareDemand(key, gpus, ((1, 1),) * gpus, namespace=namespace)
    >>> capped = cap_demand([group("a", "team-a", 5), group("b", "team-a", 3), group("c", "team-b", 2)],
    ...                     PlaceholderCaps(per_namespace=4, total=5))
    >>> [(d.key, d.placeholders, d.held_back) for d in capped]
    [('a', 3, 2), ('b', 0, 3), ('c', 2, 0)]
    """
    queues: dict[str, list[ShareDemand]] = {}
    for group in sorted(demand, key=lambda d: (-d.gpus, d.key)):
        queues.setdefault(group.namespace, []).append(group)
    given = {group.key: 0 for group in demand}
    per_namespace = dict.fromkeys(queues, 0)
    left = caps.total
    while left > 0:
        progressed = False
        for namespace in sorted(queues):
            if left == 0 or per_namespace[namespace] >= caps.per_namespace:
                continue
            short = next((g for g in queues[namespace] if given[g.key] < g.gpus), None)
            if short is None:
                continue
            given[short.key] += 1
            per_namespace[namespace] += 1
            left -= 1
            progressed = True
        if not progressed:
            break
    return [replace(group, allowed=given[group.key]) for group in demand]


def _pack(shares: list[tuple[int, int, int]]) -> tuple[tuple[int, int], ...]:
    """First fit by decreasing milli onto whole GPUs; each GPU's CPU and memory, summed.

    >>> _pack([(600, 100, 1), (600, 100, 1), (300, 50, 1), (250, 10, 1)])
    ((150, 2), (110, 2))
    """
    free: list[int] = []
    asks: list[list[int]] = []
    for milli, cpu, memory in sorted(shares, key=lambda s: -s[0]):
        gpu = next((i for i, left in enumerate(free) if left >= milli), len(free))
        if gpu == len(free):
            free.append(MILLI_PER_GPU)
            asks.append([0, 0])
        free[gpu] -= milli
        asks[gpu][0] += cpu
        asks[gpu][1] += memory
    return tuple((cpu, memory) for cpu, memory in asks)


@dataclass(frozen=True)
class PlaceholderPlan:
    """The placeholders to create (group key and index) and to delete (pod names)."""

    create: tuple[tuple[str, int], ...] = ()
    delete: tuple[str, ...] = ()


def plan_placeholders(demand: Sequence[ShareDemand], placeholders: Sequence[Mapping[str, Any]]) -> PlaceholderPlan:
    """Placeholders ``0..gpus-1`` of each group, unbound; every one past its group's demand deleted, and
    any bound one (the extender's bind deletes a placeholder rather than bind it; one bound some other
    way is holding a GPU its shares need). A group with a bound placeholder gets no new one this time: a
    node with room for its shares exists, and the next plan sees what is still pending. ``placeholders``
    are the existing placeholder pods (labelled with their group).

    >>> demand = [ShareDemand("k", 7, ((100, 0), (100, 0)))]
    >>> existing = [{"metadata": {"name": "p-k-0", "labels": {"gpu-scheduler.io/placeholder-group": "k"}},
    ...              "spec": {"nodeName": "n"}},
    ...             {"metadata": {"name": "p-k-5", "labels": {"gpu-scheduler.io/placeholder-group": "k"}}, "spec": {}}]
    >>> plan_placeholders(demand, existing)
    PlaceholderPlan(create=(), delete=('p-k-0', 'p-k-5'))
    >>> plan_placeholders(demand, existing[1:])
    PlaceholderPlan(create=(('k', 0), ('k', 1)), delete=('p-k-5',))
    """
    wanted = {d.key: d.placeholders for d in demand}
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
        (d.key, i)
        for d in demand
        if d.key not in landed
        for i in range(d.placeholders)
        if i not in kept.get(d.key, set())
    )
    return PlaceholderPlan(create, tuple(sorted(delete)))
