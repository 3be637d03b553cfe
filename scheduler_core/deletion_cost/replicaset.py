"""Which pods a ReplicaSet scale-down removes: the controller's victim ranking, reproduced.

The ReplicaSet controller sorts its active pods with ``ActivePodsWithRanks`` and deletes from the
front. The pod deleted first sorts first:

1. unassigned before assigned;
2. Pending < Unknown < Running;
3. not ready before ready;
4. lower ``controller.kubernetes.io/pod-deletion-cost`` first (missing or invalid counts as 0);
5. more active pods of the same set on the same node first;
6. ready for a shorter time first;
7. more container restarts first;
8. newer first.

Kubernetes 1.22+ compares 6 and 8 on a logarithmic scale (``LogarithmicScaleDown``) and breaks the
last ties randomly; this reproduces the plain ordering, with the pod's namespace/name as the final
tie-break so that the result is deterministic.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from scheduler_core.deletion_cost.policy import parse_cost
from scheduler_core.k8s.names import DELETION_COST_ANNOTATION

_PHASE_RANK = {"Pending": 0, "Unknown": 1, "Running": 2}


def _time(value: object) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _ready_since(pod: Mapping[str, Any]) -> float | None:
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            if condition.get("status") == "True":
                return _time(condition.get("lastTransitionTime")) or 0.0
            return None
    return None


def scale_down_order(pods: Sequence[Mapping[str, Any]], now: float) -> list[Mapping[str, Any]]:
    """``pods`` (v1 Pods of one ReplicaSet) in the order a scale-down deletes them.

    ``now`` is Unix seconds, used for how long each pod has been ready.

    >>> pods = [{"metadata": {"name": "a", "annotations": {DELETION_COST_ANNOTATION: "100"}}, "spec": {"nodeName": "n"},
    ...          "status": {"phase": "Running"}},
    ...         {"metadata": {"name": "b"}, "spec": {"nodeName": "n"}, "status": {"phase": "Running"}}]
    >>> [p["metadata"]["name"] for p in scale_down_order(pods, now=0.0)]
    ['b', 'a']
    """
    per_node = Counter((p.get("spec") or {}).get("nodeName") or "" for p in pods)

    def key(pod: Mapping[str, Any]) -> tuple[Any, ...]:
        metadata, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        node = spec.get("nodeName") or ""
        ready_since = _ready_since(pod)
        restarts = sum(
            int(c.get("restartCount", 0)) for c in status.get("containerStatuses") or [] if isinstance(c, Mapping)
        )
        created = _time(metadata.get("creationTimestamp")) or 0.0
        return (
            node != "",  # unassigned first
            _PHASE_RANK.get(str(status.get("phase")), 1),
            ready_since is not None,  # not ready first
            parse_cost((metadata.get("annotations") or {}).get(DELETION_COST_ANNOTATION)) or 0,
            -per_node[node] if node else 0,  # more pods on the same node first
            (now - ready_since) if ready_since is not None else 0.0,  # ready for less time first
            -restarts,  # more restarts first
            -created,  # newer first
            f"{metadata.get('namespace', '')}/{metadata.get('name', '')}",
        )

    return sorted(pods, key=key)
