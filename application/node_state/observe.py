"""The run's first job: list the cluster. Nodes (and their label plan, applied to the listed objects so that
the snapshot matches), with the ledger the ledger's items and the unbound pods, then the bound pods and,
where the API serves it, DRA's objects. The order is the ledger reconcile's safety (the module docstring of
:mod:`application.node_state.ledger`). A failed list ends the run: there is nothing to write a snapshot
from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from adapters.kube import DRA_KINDS, KubeClient
from adapters.kube_transport import DeadlineReachedError, KubeApiError
from adapters.kube_types import SchedulingPod
from application.node_state.labels import plan_labels
from application.node_state.ledger import note_bound, read_ledger
from application.node_state.run import Run, node_name
from scheduler_core.k8s.dra import DraFacts, dra_facts_of
from scheduler_core.k8s.node_labels import LabelPolicy

ASSIGNED_NON_TERMINAL = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"


@dataclass(frozen=True)
class DraLists:
    """DRA's objects as listed (``api`` "" where the API serves no version the product reads)."""

    api: str = ""
    lists: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    versions: tuple[str, ...] = ()

    def facts(self) -> DraFacts | None:
        if not self.api:
            return None
        return dra_facts_of(self.lists)

    def summary(self, facts: DraFacts | None) -> dict[str, Any]:
        if facts is None:
            return {}
        return {"api": self.api, "nodes": len(facts.managed), "gpus_published": sum(facts.published.values()),
                "gpus_claimed": sum(facts.claimed.values()), "extended_resource": facts.extended}  # fmt: skip


def list_dra(kube: KubeClient) -> DraLists:
    """DeviceClasses, ResourceSlices and ResourceClaims, where the API serves DRA."""
    api = kube.dra_api()
    if not api:
        return DraLists()
    lists, versions = {}, []
    for kind in DRA_KINDS:
        lists[kind], version = kube.list_with_version(kind)
        versions.append(version)
    return DraLists(api, lists, tuple(versions))


def list_cluster(run: Run) -> None:
    """The job: the lists above into ``run``; on an API error or the deadline, the run fails here."""
    kube, services, logger = run.services.kube, run.services, run.logger
    try:
        with run.phase("list_nodes"):
            nodes, run.nodes_version = kube.list_with_version("nodes")
            run.nodes = [node for node in nodes if node_name(node)]
        policy = cast(LabelPolicy, run.settings.label_policy)  # validated by NodeStateSettings
        with run.phase("plan_labels"):
            run.plan, unlabelled = plan_labels(run.nodes, services.catalog, policy, logger)
        run.note(nodes_seen=len(run.nodes), unlabelled=unlabelled, label_patches_planned=len(run.plan))
        run.ledger = read_ledger(run) if services.ledger is not None else None
        with run.phase("list_pods"):
            run.pods, run.pods_version = kube.list_with_version(
                "pods", field_selector=ASSIGNED_NON_TERMINAL, item_type=SchedulingPod
            )
        run.note(pods_seen=len(run.pods))
        if run.ledger is not None:
            note_bound(run.ledger, run.pods)
        with run.phase("list_dra"):
            run.dra = list_dra(kube)
    except (KubeApiError, DeadlineReachedError) as exc:
        logger.error("run failed before a snapshot could be built", extra={"error": str(exc)})
        run.note(status="failed", error=f"listing the cluster failed: {exc}")
        run.stop = True
