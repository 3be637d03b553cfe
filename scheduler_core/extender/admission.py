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
  ``nodeSelector`` and its required node affinity (:mod:`scheduler_core.k8s.node_affinity`, as
  kube-scheduler's NodeAffinity filter evaluates it), and the pod tolerates its
  ``NoSchedule``/``NoExecute`` taints;
- the pod's CPU, memory and pod slot fit in the node's allocatable (:mod:`scheduler_core.k8s.resources`,
  as NodeResourcesFit counts a pod's request).

:func:`room_refusal` adds the pods already bound there: the pod's CPU must fit in what their requests
leave free. That is a dynamic fact (DESIGN section 5): only a state that follows the cluster as it
changes (a watch) may refuse a bind for it, and the facade asks only such a state
(:meth:`~scheduler_core.extender.facade.Extender.admit`); a snapshot minutes old would refuse pods
whose room a deletion freed since. Memory and pod slots in use are not in the state, so they are
checked against the allocatable only.

The other plugins' verdicts (inter-pod affinity, topology spread, volumes, ports) are not re-checked:
they are kube-scheduler's, and a bind that skipped them can still only place a pod of this profile on a
node that admits it and holds its requests.

Room on the GPUs is not checked here: the ledger's conditional write decides that, with the only fresh
count there is. The reasons name the caller's own inputs only (the pod's spec, the node it named),
never another pod's UID, node or requests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from scheduler_core.errors import InvalidPodError
from scheduler_core.k8s.names import SCHEDULER_NAME
from scheduler_core.k8s.node_affinity import required_affinity, unmet
from scheduler_core.k8s.pods import PodDemand
from scheduler_core.k8s.resources import CPU, NO_LIMIT, describe, insufficient, node_allocatable, pod_requests
from scheduler_core.k8s.taints import untolerated
from scheduler_core.scoring.gpu_fit import filter_nodes
from scheduler_core.state.cluster import ClusterState

_MAX_REASONS = 4  # unmet terms named in one refusal


def bind_refusal(
    pod: Mapping[str, Any],
    node: Mapping[str, Any],
    demand: PodDemand,
    state: ClusterState,
    *,
    scheduler_name: str = SCHEDULER_NAME,
) -> str:
    """Why binding ``pod`` (as read from the API server) to ``node`` is not this extender's to do; ``""``
    when it is. ``demand`` is the pod's, ``state`` the extender's cluster state. Every check reads the
    pod, the node object and the node's static facts in ``state``; none reads what is in use there
    (:func:`room_refusal` does).

    >>> node = {"metadata": {"name": "n", "labels": {"gpu.nvidia.com/model": "A100"}},
    ...         "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "48"}}}
    >>> state = ClusterState.from_objects([node])
    >>> pod = {"spec": {"schedulerName": "gpu-scheduler"}, "status": {"phase": "Pending"}}
    >>> bind_refusal(pod, node, PodDemand(gpus=1), state)
    ''
    >>> bind_refusal(pod, node, PodDemand(gpus=1, models=frozenset({"H100"})), state)
    'node n does not pass the filter for this pod: GPU model A100 not in H100'
    >>> bind_refusal({"spec": {"schedulerName": "default-scheduler"}}, node, PodDemand(gpus=1), state)
    "the pod is not scheduled by 'gpu-scheduler'"
    >>> huge = {"spec": {"schedulerName": "gpu-scheduler",
    ...                  "containers": [{"resources": {"requests": {"cpu": "10000"}}}]}}
    >>> bind_refusal(huge, node, PodDemand(), state)
    "node n is too small for the pod: it requests cpu 10000, more than the node's allocatable"
    """
    refusal = _pod_refusal(pod, scheduler_name)
    if refusal:
        return refusal
    name = (node.get("metadata") or {}).get("name", "")
    row = state.table.index.get(name)
    if row is None:
        return f"node {name[:253]!r} is not in the cluster state"
    table = state.table.take(np.array([row]), [name])
    static = filter_nodes(table, table.alloc_gpus, demand, check_free=False)
    if not static.feasible[0]:
        return f"node {name} does not pass the filter for this pod: {static.messages[0]}"
    return _node_refusal(pod, node, name)


def _pod_refusal(pod: Mapping[str, Any], scheduler_name: str) -> str:
    """Why the pod itself is not this extender's to bind (being deleted, not Pending, another scheduler's)."""
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "the pod is being deleted"
    if phase != "Pending":
        return f"the pod is {phase}, not Pending"
    if (pod.get("spec") or {}).get("schedulerName") != scheduler_name:
        return f"the pod is not scheduled by {scheduler_name!r}"
    return ""


def _node_refusal(pod: Mapping[str, Any], node: Mapping[str, Any], name: str) -> str:
    """Why kube-scheduler's own filters would refuse ``node`` (named ``name``) for the pod: its nodeSelector,
    required node affinity, untolerated taints, or CPU, memory and pod slots past the node's allocatable."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    unmatched = [f"{key}={value}" for key, value in selector.items() if labels.get(key) != value]
    if unmatched:
        return f"node {name} does not match the pod's nodeSelector ({', '.join(unmatched)})"
    affinity = unmet(required_affinity(pod), name, labels)
    if affinity:
        shown = "; ".join(affinity[:_MAX_REASONS]) + ("; ..." if len(affinity) > _MAX_REASONS else "")
        return f"node {name} does not match the pod's required node affinity ({shown})"
    taints = untolerated(node, pod)
    if taints:
        return f"node {name} has taints the pod does not tolerate: {', '.join(taints)}"
    try:
        request = pod_requests(pod)
    except InvalidPodError as exc:
        return f"the pod's requests cannot be read: {exc}"
    lacking = insufficient(request, node_allocatable([node]))[0]
    if lacking.any():
        return (
            f"node {name} is too small for the pod: it requests {describe(request, lacking)}, "
            "more than the node's allocatable"
        )
    return ""


def room_refusal(pod: Mapping[str, Any], node: Mapping[str, Any], state: ClusterState) -> str:
    """Why the pods already bound to ``node`` leave too little for ``pod``; ``""`` when they do not, or
    when ``state`` does not know. Only for a ``state`` fresh enough to refuse a node for what is in use
    (a watch: see the module docstring); CPU only, the one use the state holds
    (:attr:`~scheduler_core.state.cluster.ClusterState.free_cpu`).

    >>> node = {"metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "48"}}}
    >>> def pod(cpu, bound=None):
    ...     return {"spec": {"nodeName": bound, "containers": [{"resources": {"requests": {"cpu": cpu}}}]}}
    >>> state = ClusterState.from_objects([node], [pod("40", bound="n")])
    >>> room_refusal(pod("8"), node, state)
    ''
    >>> room_refusal(pod("9"), node, state)
    'node n has too little left for the pod: it requests cpu 9, more than the pods bound there leave free'
    """
    name = (node.get("metadata") or {}).get("name", "")
    row = state.table.index.get(name)
    if row is None or state.free_cpu is None:
        return ""
    try:
        request = pod_requests(pod)
    except InvalidPodError as exc:
        return f"the pod's requests cannot be read: {exc}"
    free = np.full((1, request.shape[0]), NO_LIMIT, dtype=np.int64)
    free[0, CPU] = state.free_cpu[row]
    lacking = insufficient(request, free)[0]
    if lacking.any():
        return (
            f"node {name} has too little left for the pod: it requests {describe(request, lacking)}, "
            "more than the pods bound there leave free"
        )
    return ""
