"""Deletion costs for real pods: which new value each managed pod gets, and which writes to make.

Shared by ``gpu-scheduler deletion-costs`` (a dry run from files) and the deletion-cost refresher.
``metrics`` maps ``"namespace/pod"`` to an object with any of ``active_requests``, ``cache_hit_rate``,
``avg_response_time_ms`` and ``active_connections``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from scheduler_core.deletion_cost.policy import (
    ALL_METRICS,
    CostConfig,
    PodSignals,
    compute_costs,
    format_cost,
    parse_cost,
)
from scheduler_core.deletion_cost.replicaset import scale_down_order
from scheduler_core.errors import InvalidArgsError
from scheduler_core.k8s.names import DELETION_COST_ANNOTATION, DO_NOT_DISRUPT_ANNOTATION, DO_NOT_DISRUPT_OWNER


def pod_list(document: Any) -> list[Mapping[str, Any]]:
    items = document.get("items") if isinstance(document, Mapping) else document
    if not isinstance(items, list) or not all(isinstance(p, Mapping) for p in items):
        raise InvalidArgsError("pods: expected a v1 PodList or a JSON list of v1 Pods")
    return items


def pod_key(pod: Mapping[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace', 'default')}/{metadata.get('name', '')}"


def pod_age_s(pod: Mapping[str, Any], now: float) -> float:
    """Seconds since the pod started (``status.startTime``, else its creation); inf when unknown."""
    status, metadata = pod.get("status") or {}, pod.get("metadata") or {}
    for stamp in (status.get("startTime"), metadata.get("creationTimestamp")):
        if isinstance(stamp, str):
            try:
                return now - datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return math.inf  # no timestamp: not a new pod


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """The pod's ``Ready`` condition is True."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def costs_for(
    pods: Sequence[Mapping[str, Any]], metrics: Mapping[str, Any], config: CostConfig, now: float
) -> dict[str, int | None]:
    """New cost per ``namespace/pod`` (None: no new value, or no workload manages the pod)."""
    if not isinstance(metrics, Mapping):
        raise InvalidArgsError('metrics: expected an object of "namespace/pod": {metric: value}')
    result: dict[str, int | None] = {pod_key(p): None for p in pods}
    groups: dict[int, list[Mapping[str, Any]]] = {}
    for pod in pods:
        index = workload_index(config, pod)
        if index is not None:
            groups.setdefault(index, []).append(pod)
    for index, members in groups.items():
        columns = {name: np.full(len(members), np.nan) for name in ALL_METRICS}
        for i, pod in enumerate(members):
            values = metrics.get(pod_key(pod)) or {}
            for name in ALL_METRICS:
                value = values.get(name) if isinstance(values, Mapping) else None
                if isinstance(value, int | float) and not isinstance(value, bool):
                    columns[name][i] = value
        signals = PodSignals.build(columns, [pod_age_s(p, now) for p in members], [pod_ready(p) for p in members])
        outcome = compute_costs(config.workloads[index].policy, signals)
        for pod, cost, ok in zip(members, outcome.cost.tolist(), outcome.has_value.tolist(), strict=True):
            result[pod_key(pod)] = cost if ok else None
    return result


def victims(pods: Sequence[Mapping[str, Any]], costs: Mapping[str, int | None], count: int, now: float) -> list[str]:
    """The first ``count`` pods a scale-down removes once the new costs are written."""
    updated = []
    for pod in pods:
        new = costs.get(pod_key(pod))
        if new is not None:
            metadata = dict(pod.get("metadata") or {})
            metadata["annotations"] = {
                **(metadata.get("annotations") or {}),
                DELETION_COST_ANNOTATION: format_cost(new),
            }
            pod = {**pod, "metadata": metadata}
        updated.append(pod)
    return [pod_key(p) for p in scale_down_order(updated, now)[:count]]


def workload_index(config: CostConfig, pod: Mapping[str, Any]) -> int | None:
    """Index in ``config.workloads`` of the first workload that manages ``pod``, or None."""
    metadata = pod.get("metadata") or {}
    workload = config.workload_of(str(metadata.get("namespace", "default")), metadata.get("labels") or {})
    return None if workload is None else config.workloads.index(workload)


def current_cost(pod: Mapping[str, Any], annotation: str = DELETION_COST_ANNOTATION) -> int | None:
    """The cost ``pod`` carries in ``annotation`` (the refresher writes one of two:
    :func:`scheduler_core.deletion_cost.karpenter.cost_annotation`); None when absent or invalid."""
    return parse_cost(((pod.get("metadata") or {}).get("annotations") or {}).get(annotation))


@dataclass(frozen=True)
class CostChange:
    """One annotation write: ``old`` is None when the annotation is missing or invalid."""

    namespace: str
    name: str
    old: int | None
    new: int

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def plan_changes(
    pods: Sequence[Mapping[str, Any]],
    costs: Mapping[str, int | None],
    hysteresis: int,
    annotation: str = DELETION_COST_ANNOTATION,
) -> tuple[list[CostChange], int]:
    """The writes worth making, most needed first, and how many pods are left as they are.

    A pod is written when it has a new cost and its ``annotation`` is missing or invalid, or the cost
    moved by at least ``hysteresis``. Missing or invalid annotations come first, then the largest moves.

    >>> pod = {"metadata": {"namespace": "ns", "name": "a", "annotations": {DELETION_COST_ANNOTATION: "100"}}}
    >>> plan_changes([pod], {"ns/a": 105}, hysteresis=10)
    ([], 1)
    >>> plan_changes([pod], {"ns/a": 200}, hysteresis=10)[0]
    [CostChange(namespace='ns', name='a', old=100, new=200)]
    """
    changes: list[CostChange] = []
    unchanged = 0
    for pod in pods:
        new = costs.get(pod_key(pod))
        if new is None:
            continue
        old = current_cost(pod, annotation)
        if old is not None and abs(new - old) < max(hysteresis, 1):
            unchanged += 1
            continue
        metadata = pod.get("metadata") or {}
        changes.append(CostChange(str(metadata.get("namespace", "default")), str(metadata.get("name", "")), old, new))
    changes.sort(key=lambda c: (c.old is not None, -abs(c.new - (c.old or 0))))
    return changes, unchanged


@dataclass(frozen=True)
class GuardChange:
    """``karpenter.sh/do-not-disrupt`` set on a pod (``guard``) or taken away from it."""

    namespace: str
    name: str
    guard: bool

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def annotations(self) -> dict[str, str | None]:
        """The merge patch: the annotation and its owner mark together, or both removed."""
        if self.guard:
            return {DO_NOT_DISRUPT_ANNOTATION: "true", DO_NOT_DISRUPT_OWNER: GUARD_OWNER}
        return {DO_NOT_DISRUPT_ANNOTATION: None, DO_NOT_DISRUPT_OWNER: None}


GUARD_OWNER = "deletion-cost"


def plan_guards(
    pods: Sequence[Mapping[str, Any]],
    costs: Mapping[str, int | None],
    threshold: int,
    annotation: str = DELETION_COST_ANNOTATION,
) -> list[GuardChange]:
    """Which pods get ``karpenter.sh/do-not-disrupt``: those whose cost (the new one, else the one they
    carry in ``annotation``) is at least ``threshold`` (0: none); and which lose it, of those this
    refresher guarded (its owner mark), once their cost falls below it or the threshold is off. A pod
    that already carries the annotation by anyone else's hand is never touched.

    >>> pod = {"metadata": {"namespace": "ns", "name": "a", "annotations": {}}}
    >>> plan_guards([pod], {"ns/a": 900}, 800)
    [GuardChange(namespace='ns', name='a', guard=True)]
    >>> plan_guards([pod], {"ns/a": 700}, 800)
    []
    """
    changes = []
    for pod in pods:
        metadata = pod.get("metadata") or {}
        present = metadata.get("annotations") or {}
        owned = present.get(DO_NOT_DISRUPT_OWNER) == GUARD_OWNER
        cost = costs.get(pod_key(pod))
        if cost is None:
            cost = current_cost(pod, annotation)
        wanted = threshold > 0 and cost is not None and cost >= threshold
        namespace, name = str(metadata.get("namespace", "default")), str(metadata.get("name", ""))
        if wanted and DO_NOT_DISRUPT_ANNOTATION not in present:
            changes.append(GuardChange(namespace, name, True))
        elif not wanted and owned:
            changes.append(GuardChange(namespace, name, False))
    return changes


def render_queries(config: CostConfig, pods: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[int, str]]]:
    """Each distinct PromQL to run, and the (workload index, metric) pairs it answers.

    A query template may use ``{namespace}`` (the workload's namespace) and ``{pod}`` (a regex
    alternation of the workload's managed pod names, for ``pod=~"{pod}"``). Plain substitution, not
    ``str.format``: PromQL's own braces stay as they are. Identical queries run once.

    >>> from scheduler_core.deletion_cost.policy import CostPolicy, Workload
    >>> query = {"active_connections": 'sum by (namespace, pod) (conns{namespace="{namespace}"})'}
    >>> config = CostConfig((Workload("web", {}, CostPolicy(policy="connections"), query),))
    >>> render_queries(config, [{"metadata": {"namespace": "web", "name": "a"}}])
    {'sum by (namespace, pod) (conns{namespace="web"})': [(0, 'active_connections')]}
    """
    members: dict[int, list[str]] = {}
    for pod in pods:
        index = workload_index(config, pod)
        if index is not None:
            members.setdefault(index, []).append(str((pod.get("metadata") or {}).get("name", "")))
    queries: dict[str, list[tuple[int, str]]] = {}
    for index, names in sorted(members.items()):
        workload = config.workloads[index]
        alternation = "|".join(sorted(name.replace(".", "\\\\.") for name in names))
        for metric, template in sorted(workload.queries.items()):
            text = template.replace("{namespace}", workload.namespace).replace("{pod}", alternation)
            queries.setdefault(text, []).append((index, metric))
    return queries


def metrics_by_pod(
    config: CostConfig,
    pods: Sequence[Mapping[str, Any]],
    results: Mapping[str, Sequence[tuple[Mapping[str, str], float]]],
    queries: Mapping[str, Sequence[tuple[int, str]]],
) -> dict[str, dict[str, float]]:
    """``{"namespace/pod": {metric: value}}`` from query results keyed by ``namespace`` and ``pod`` labels.

    A sample counts only for a pod of the workload whose query produced it; a query with no result
    (it failed) leaves its metric missing for those pods.
    """
    workload_of_pod = {pod_key(pod): workload_index(config, pod) for pod in pods}
    metrics: dict[str, dict[str, float]] = {}
    for query, uses in queries.items():
        for labels, value in results.get(query, ()):
            key = f"{labels.get('namespace', '')}/{labels.get('pod', '')}"
            index = workload_of_pod.get(key)
            for answered, metric in uses:
                if index is not None and index == answered:
                    metrics.setdefault(key, {})[metric] = value
    return metrics
