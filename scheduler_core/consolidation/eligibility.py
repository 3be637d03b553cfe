"""Which running pods the consolidator may move, and which Pending pods it plans for.

A pod is moved only when all of these hold (:func:`why_not_movable` names the first that fails):

- it opted in: label ``gpu-scheduler.io/movable: "true"``;
- it is scheduled by the ``gpu-scheduler`` profile (its replacement comes back through the extender,
  which steers it to the node the plan chose), bound, and not terminating or finished;
- a ReplicaSet or a StatefulSet controls it (``ownerReferences`` with ``controller: true``): evicted, it
  is recreated; a bare pod or a Job's would be lost or rerun;
- it is not marked ``karpenter.sh/do-not-disrupt: "true"`` nor
  ``cluster-autoscaler.kubernetes.io/safe-to-evict: "false"``;
- it has nothing the planner cannot check on its destination: no pod (anti-)affinity, topology spread,
  persistent volume claim or host port, no MIG slice and no DRA claim;
- every PodDisruptionBudget that selects it allows a disruption now (``status.disruptionsAllowed``),
  and a plan moves no more of its pods than that (the Eviction API checks again when it evicts).

Pure: pods and budgets are v1 objects as the API server returns them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler_core.k8s.names import (
    DO_NOT_DISRUPT_ANNOTATION,
    GPU_RESOURCE,
    MILLI_RESOURCE,
    MOVABLE_LABEL,
    SAFE_TO_EVICT_ANNOTATION,
    SCHEDULER_NAME,
    TERMINAL_PHASES,
)
from scheduler_core.k8s.pod_requests import is_mapping
from scheduler_core.k8s.pods import mig_request

CONTROLLERS = frozenset({"ReplicaSet", "StatefulSet"})
"""Owners that recreate an evicted pod from their template."""
MAX_SELECTOR_TERMS = 64
"""matchLabels entries plus matchExpressions read from one PodDisruptionBudget; a longer selector is
taken as matching every pod of its namespace (the budget then protects more pods, never fewer)."""


@dataclass(frozen=True)
class Owner:
    """A pod's controller: what recreates it, and what its replacement will name as owner."""

    kind: str
    name: str
    uid: str


@dataclass(frozen=True)
class Budget:
    """One PodDisruptionBudget: its name, its selector (None: selects nothing) and the disruptions it
    allows now."""

    namespace: str
    name: str
    selector: Mapping[str, Any] | None
    allowed: int

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def selects(self, pod: Mapping[str, Any]) -> bool:
        metadata = _mapping(pod.get("metadata"))
        if metadata.get("namespace") != self.namespace or self.selector is None:
            return False
        return selector_matches(self.selector, _mapping(metadata.get("labels")))


def budgets_of(pdbs: Sequence[Any]) -> list[Budget]:
    """The PodDisruptionBudgets (policy/v1 objects), read; one that is not an object is skipped. A budget
    whose status has no ``disruptionsAllowed`` yet allows none (its controller has not counted it).

    >>> pdb = {"metadata": {"namespace": "ml", "name": "b"}, "spec": {"selector": {"matchLabels": {"app": "x"}}},
    ...        "status": {"disruptionsAllowed": 1}}
    >>> budgets_of([pdb])[0].selects({"metadata": {"namespace": "ml", "labels": {"app": "x"}}})
    True
    """
    found = []
    for pdb in pdbs:
        if not is_mapping(pdb):
            continue
        metadata, spec, status = _mapping(pdb.get("metadata")), _mapping(pdb.get("spec")), _mapping(pdb.get("status"))
        selector = spec.get("selector")
        allowed = status.get("disruptionsAllowed")
        found.append(
            Budget(
                namespace=str(metadata.get("namespace") or ""),
                name=str(metadata.get("name") or ""),
                selector=selector if is_mapping(selector) else None,
                allowed=allowed if isinstance(allowed, int) and not isinstance(allowed, bool) else 0,
            )
        )
    return found


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    """A metav1.LabelSelector against a pod's labels: every ``matchLabels`` pair and every
    ``matchExpressions`` entry (``In``, ``NotIn``, ``Exists``, ``DoesNotExist``); an empty selector matches
    every pod. An entry that cannot be read, or a selector over :data:`MAX_SELECTOR_TERMS`, matches (a
    budget that cannot be read protects its namespace rather than nothing).

    >>> selector_matches({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["web"]}]}, {})
    True
    """
    match_labels = _mapping(selector.get("matchLabels"))
    expressions = selector.get("matchExpressions") or []
    if not isinstance(expressions, list) or len(match_labels) + len(expressions) > MAX_SELECTOR_TERMS:
        return True
    if any(labels.get(key) != value for key, value in match_labels.items()):
        return False
    return all(_expression(entry, labels) for entry in expressions)


def _expression(entry: object, labels: Mapping[str, Any]) -> bool:
    if not is_mapping(entry):
        return True
    key, operator, values = str(entry.get("key")), entry.get("operator"), entry.get("values") or []
    present = key in labels
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if not isinstance(values, list):
        return True
    if operator == "In":
        return present and labels[key] in values
    if operator == "NotIn":
        return not present or labels[key] not in values
    return True


def owner_of(pod: Mapping[str, Any]) -> Owner | None:
    """The pod's controller (the owner reference with ``controller: true``), or None."""
    for ref in _list(_mapping(pod.get("metadata")).get("ownerReferences")):
        if is_mapping(ref) and ref.get("controller") is True:
            return Owner(str(ref.get("kind") or ""), str(ref.get("name") or ""), str(ref.get("uid") or ""))
    return None


def why_not_movable(pod: Mapping[str, Any], budgets: Sequence[Budget] = ()) -> str:
    """Why the consolidator may not move ``pod`` ("" when it may): the first rule of the module docstring
    that fails, in words.

    >>> pod = {"metadata": {"labels": {"gpu-scheduler.io/movable": "true"},
    ...                     "annotations": {"karpenter.sh/do-not-disrupt": "true"}}}
    >>> why_not_movable(pod)
    'marked karpenter.sh/do-not-disrupt'
    """
    metadata, spec = _mapping(pod.get("metadata")), _mapping(pod.get("spec"))
    annotations = _mapping(metadata.get("annotations"))
    if _mapping(metadata.get("labels")).get(MOVABLE_LABEL) != "true":
        return f'not opted in (label {MOVABLE_LABEL}: "true")'
    if annotations.get(DO_NOT_DISRUPT_ANNOTATION) == "true":
        return f"marked {DO_NOT_DISRUPT_ANNOTATION}"
    if annotations.get(SAFE_TO_EVICT_ANNOTATION) == "false":
        return f'marked {SAFE_TO_EVICT_ANNOTATION}: "false"'
    if spec.get("schedulerName") != SCHEDULER_NAME:
        return f"not scheduled by {SCHEDULER_NAME}: its replacement could not be steered"
    if not spec.get("nodeName") or metadata.get("deletionTimestamp"):
        return "not bound, or terminating"
    if _mapping(pod.get("status")).get("phase") in TERMINAL_PHASES:
        return "finished"
    owner = owner_of(pod)
    if owner is None or owner.kind not in CONTROLLERS or not owner.uid:
        return "no ReplicaSet or StatefulSet recreates it"
    unchecked = unchecked_constraint(spec)
    if unchecked:
        return f"has {unchecked}, which the planner cannot check on another node"
    selecting = [budget for budget in budgets if budget.selects(pod)]
    if len(selecting) > 1:  # the Eviction API refuses such a pod (500: more than one budget)
        return f"more than one PodDisruptionBudget selects it ({', '.join(b.key for b in selecting[:3])})"
    for budget in selecting:
        if budget.allowed < 1:
            return f"PodDisruptionBudget {budget.key} allows no disruption"
    return ""


CHECKED_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage", GPU_RESOURCE, MILLI_RESOURCE})
"""What a pod may ask for and still be planned: the rest (EFA, hugepages, another device) the planner does
not count."""


def unchecked_constraint(spec: Mapping[str, Any]) -> str:
    """The first constraint of a pod ``spec`` that the planner does not model, in words ("" for none): a
    moved pod with one stays, and a Pending pod with one is left to kube-scheduler."""
    affinity = _mapping(spec.get("affinity"))
    if affinity.get("podAffinity") or affinity.get("podAntiAffinity"):
        return "pod affinity"
    if spec.get("topologySpreadConstraints"):
        return "topology spread constraints"
    if any(is_mapping(v) and "persistentVolumeClaim" in v for v in _list(spec.get("volumes"))):
        return "a persistent volume claim"
    if spec.get("resourceClaims"):
        return "DRA resource claims"
    for key in ("initContainers", "containers"):
        for container in _list(spec.get(key)):
            container = _mapping(container)
            if any(is_mapping(p) and p.get("hostPort") for p in _list(container.get("ports"))):
                return "a host port"
            resources = _mapping(container.get("resources"))
            asked = {*_mapping(resources.get("requests")), *_mapping(resources.get("limits"))}
            other = sorted(str(r) for r in asked - CHECKED_RESOURCES if not str(r).startswith("nvidia.com/mig-"))
            if other:
                return f"a resource the planner does not count ({other[0][:64]})"
    try:
        return "MIG slices" if mig_request(spec) else ""
    except ValueError as exc:  # InvalidPodError: a MIG request that cannot be read
        return f"a request that cannot be read ({exc})"


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _mapping(value: object) -> Mapping[str, Any]:
    return value if is_mapping(value) else {}
