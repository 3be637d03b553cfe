"""Placeholder pods (GPU sharing with reservation pods): one per whole GPU that the unschedulable shares
need, by group, within the caps (:mod:`scheduler_core.state.demand`, the pod from
``manifests/placeholder.py``), so that an autoscaler buys the node they wait for. The node-state refresher
keeps them (:func:`keep_placeholders`, one of its jobs); the bind retires one that a node has room for
(:mod:`shares.binder`)."""

from __future__ import annotations

from typing import Any

from adapters.kube import KubeClient
from adapters.kube_transport import DeadlineReachedError, KubeApiError
from manifests.placeholder import placeholder_pod
from scheduler_core.k8s.names import PLACEHOLDER_APP, PLACEHOLDER_NAMESPACE, SCHEDULER_NAME
from scheduler_core.state.demand import PlaceholderCaps, cap_demand, plan_placeholders, share_demand

PENDING_SHARES = f"spec.nodeName=,spec.schedulerName={SCHEDULER_NAME},status.phase=Pending"
"""The pods that may be unschedulable shares of the profile (the rest of the test is on the pod)."""


def keep_placeholders(kube: KubeClient, image: str, caps: PlaceholderCaps, logger: Any) -> dict[str, int]:
    """Keep the placeholders up to date; the node-state report's counts. An API error ends the job, logged: the next
    run tries again."""
    done = {"demand_gpus": 0, "unschedulable_shares": 0, "held_back": 0, "created": 0, "deleted": 0, "errors": 0}
    try:
        pending = kube.list_all("pods", field_selector=PENDING_SHARES)
        existing = kube.list_all(
            "pods",
            label_selector=f"app.kubernetes.io/name={PLACEHOLDER_APP}",
            field_selector=f"metadata.namespace={PLACEHOLDER_NAMESPACE}",
        )
        demand = cap_demand(share_demand(pending), caps)
        done["demand_gpus"] = sum(d.gpus for d in demand)
        done["unschedulable_shares"] = sum(d.shares for d in demand)
        done["held_back"] = sum(d.held_back for d in demand)
        if done["held_back"]:
            logger.warning("placeholders held back by their caps", extra={
                "gpus": done["held_back"], "per_namespace": caps.per_namespace, "total": caps.total,
                "namespaces": sorted({d.namespace for d in demand if d.held_back})[:20]})  # fmt: skip
        plan = plan_placeholders(demand, existing)
        for name in plan.delete:
            try:
                kube.delete_pod(PLACEHOLDER_NAMESPACE, name, grace_period_s=0)
                done["deleted"] += 1
            except KubeApiError as exc:
                if exc.status != 404:
                    raise
        groups = {d.key: d for d in demand}
        for key, index in plan.create:
            cpu, memory = groups[key].per_gpu[index]
            body = placeholder_pod(key, index, groups[key].requirements, image=image, cpu_milli=cpu, memory=memory)
            try:
                kube.create_pod(PLACEHOLDER_NAMESPACE, body)
                done["created"] += 1
            except KubeApiError as exc:
                if exc.status != 409:
                    raise
    except (KubeApiError, DeadlineReachedError) as exc:
        done["errors"] += 1
        logger.warning("placeholders not kept up to date; the next run tries again", extra={"error": str(exc)})
    return done
