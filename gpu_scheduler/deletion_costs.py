"""``gpu-scheduler deletion-costs``: a dry run of the deletion-cost policy from files.

PODS.json is a v1 PodList or a JSON list of v1 Pods; METRICS.json maps ``"namespace/pod"`` to an object
with any of ``active_requests``, ``cache_hit_rate``, ``avg_response_time_ms`` and ``active_connections``.
Without ``--config`` the ``metrics`` policy with the source's defaults applies to every pod.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np

from scheduler_core.deletion_cost import (
    ALL_METRICS,
    ANNOTATION,
    CostConfig,
    PodSignals,
    compute_costs,
    format_cost,
    parse_cost,
)
from scheduler_core.errors import InvalidArgsError
from scheduler_core.replicaset import scale_down_order


def pod_list(document: Any) -> list[Mapping[str, Any]]:
    items = document.get("items") if isinstance(document, Mapping) else document
    if not isinstance(items, list) or not all(isinstance(p, Mapping) for p in items):
        raise InvalidArgsError("pods: expected a v1 PodList or a JSON list of v1 Pods")
    return items


def pod_key(pod: Mapping[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace', 'default')}/{metadata.get('name', '')}"


def _age_s(pod: Mapping[str, Any], now: float) -> float:
    status, metadata = pod.get("status") or {}, pod.get("metadata") or {}
    for stamp in (status.get("startTime"), metadata.get("creationTimestamp")):
        if isinstance(stamp, str):
            try:
                return now - datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return math.inf  # no timestamp: not a new pod


def _ready(pod: Mapping[str, Any]) -> bool:
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
        metadata = pod.get("metadata") or {}
        workload = config.workload_of(str(metadata.get("namespace", "default")), metadata.get("labels") or {})
        if workload is not None:
            groups.setdefault(config.workloads.index(workload), []).append(pod)
    for index, members in groups.items():
        columns = {name: np.full(len(members), np.nan) for name in ALL_METRICS}
        for i, pod in enumerate(members):
            values = metrics.get(pod_key(pod)) or {}
            for name in ALL_METRICS:
                value = values.get(name) if isinstance(values, Mapping) else None
                if isinstance(value, int | float) and not isinstance(value, bool):
                    columns[name][i] = value
        signals = PodSignals.build(columns, [_age_s(p, now) for p in members], [_ready(p) for p in members])
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
            metadata["annotations"] = {**(metadata.get("annotations") or {}), ANNOTATION: format_cost(new)}
            pod = {**pod, "metadata": metadata}
        updated.append(pod)
    return [pod_key(p) for p in scale_down_order(updated, now)[:count]]


def current_cost(pod: Mapping[str, Any]) -> int | None:
    return parse_cost(((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION))
