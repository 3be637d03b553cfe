"""Which binds are this extender's to make: the ``bind`` verb's guard, checked before anything is written.

kube-scheduler only ever asks the extender to bind a pod it scheduled with this profile onto a node
that passed every filter. (The generated profile sends the extender every pod it schedules, CPU-only
ones included, so that GPU nodes' CPU goes where it strands no GPU; a pod that requests no GPU is
bound with nothing recorded.) Anyone else who reaches the verb can ask for anything, so
:func:`bind_refusal` checks each of those facts on the pod and node as the API server has them now,
and the binder refuses, changing nothing, unless:

- the pod is Pending, not terminating, and names this scheduler's profile;
- the node is in the cluster state, passes the extender's own static filter for the pod (model,
  memory per GPU, GPU count: what never changes between filter and bind), matches the pod's
  ``nodeSelector``, and the pod tolerates its ``NoSchedule``/``NoExecute`` taints.

Required node affinity and the other plugins' verdicts are not re-checked: they are kube-scheduler's,
and a bind that skipped them can still only place a pod of this profile on a GPU node that fits it.

Room (free GPUs) is not checked here: the ledger's conditional write decides that, with the only fresh
count there is. The reasons name the caller's own inputs only, never another pod's UID or node.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from scheduler_core.k8s.names import SCHEDULER_NAME
from scheduler_core.k8s.pods import PodDemand
from scheduler_core.k8s.taints import untolerated
from scheduler_core.scoring.gpu_fit import filter_nodes
from scheduler_core.state.cluster import ClusterState


def bind_refusal(
    pod: Mapping[str, Any],
    node: Mapping[str, Any],
    demand: PodDemand,
    state: ClusterState,
    *,
    scheduler_name: str = SCHEDULER_NAME,
) -> str:
    """Why binding ``pod`` (as read from the API server) to ``node`` is not this extender's to do; ``""``
    when it is. ``demand`` is the pod's, ``state`` the extender's cluster state.

    >>> node = {"metadata": {"name": "n", "labels": {"gpu.nvidia.com/model": "A100"}},
    ...         "status": {"allocatable": {"nvidia.com/gpu": "8"}}}
    >>> state = ClusterState.from_objects([node])
    >>> pod = {"spec": {"schedulerName": "gpu-scheduler"}, "status": {"phase": "Pending"}}
    >>> bind_refusal(pod, node, PodDemand(gpus=1), state)
    ''
    >>> bind_refusal(pod, node, PodDemand(gpus=1, models=frozenset({"H100"})), state)
    'node n does not pass the filter for this pod: GPU model A100 not in H100'
    >>> bind_refusal({"spec": {"schedulerName": "default-scheduler"}}, node, PodDemand(gpus=1), state)
    "the pod is not scheduled by 'gpu-scheduler'"
    """
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    if metadata.get("deletionTimestamp"):
        return "the pod is being deleted"
    if phase != "Pending":
        return f"the pod is {phase}, not Pending"
    if spec.get("schedulerName") != scheduler_name:
        return f"the pod is not scheduled by {scheduler_name!r}"
    name = (node.get("metadata") or {}).get("name", "")
    row = state.table.index.get(name)
    if row is None:
        return f"node {name[:253]!r} is not in the cluster state"
    table = state.table.take(np.array([row]), [name])
    static = filter_nodes(table, table.alloc_gpus, demand, check_free=False)
    if not static.feasible[0]:
        return f"node {name} does not pass the filter for this pod: {static.messages[0]}"
    labels = (node.get("metadata") or {}).get("labels") or {}
    selector = spec.get("nodeSelector") or {}
    unmatched = [f"{key}={value}" for key, value in selector.items() if labels.get(key) != value]
    if unmatched:
        return f"node {name} does not match the pod's nodeSelector ({', '.join(unmatched)})"
    taints = untolerated(node, pod)
    if taints:
        return f"node {name} has taints the pod does not tolerate: {', '.join(taints)}"
    return ""
