"""The GPU labels the refresher owns (``gpu.nvidia.com/model|memory|count``): which each node's should be
(from GPU Feature Discovery, else EC2's ``GpuInfo`` for its instance type), planned while listing, and the
job that patches them after the snapshot is written: one merge patch per node, concurrently, until the
deadline margin; what it skips is reported."""

from __future__ import annotations

from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from adapters.ec2_gpu import GpuInfoCatalog
from adapters.kube_transport import DeadlineReachedError, KubeApiError
from application.node_state.run import Plan, Run
from scheduler_core.k8s.names import GFD_PRODUCT, LABEL_INSTANCE_TYPE
from scheduler_core.k8s.node_labels import LabelPolicy, desired_info, label_changes


def plan_labels(
    nodes: list[dict[str, Any]], catalog: GpuInfoCatalog | None, policy: LabelPolicy, logger: Any
) -> tuple[Plan, dict[str, int]]:
    """Label changes per node, and the nodes left unlabelled by reason; applies the changes to the
    listed objects so the snapshot matches."""
    needs_ec2 = {
        labels.get(LABEL_INSTANCE_TYPE)
        for node in nodes
        if GFD_PRODUCT not in (labels := node["metadata"].get("labels") or {})
    }
    ec2 = catalog.lookup(t for t in needs_ec2 if isinstance(t, str)) if catalog is not None else {}
    plan: Plan = []
    unlabelled: dict[str, list[str]] = defaultdict(list)
    for node in nodes:
        metadata = node["metadata"]
        labels = metadata.get("labels")
        if not isinstance(labels, dict):
            labels = metadata["labels"] = {}
        desired = desired_info(labels, ec2)
        if desired.info is None:
            unlabelled[desired.reason].append(metadata["name"])
            continue
        changes = label_changes(labels, desired.info, policy)
        if changes:
            plan.append((metadata["name"], changes))
            labels.update(changes)
    for reason, names in unlabelled.items():
        logger.info("nodes left unlabelled", extra={"reason": reason, "nodes": len(names), "sample": names[:5]})
    return plan, {reason: len(names) for reason, names in unlabelled.items()}


def apply_labels(run: Run) -> None:
    """The job: the label patches, timed as ``patch_labels``."""
    with run.phase("patch_labels"):
        run.note(**_patch_labels(run))


def _patch_labels(run: Run) -> dict[str, Any]:
    """Send the label patches, concurrently, until the deadline; the report's label counts."""
    settings, kube, logger = run.settings, run.services.kube, run.logger
    if settings.label_dry_run:
        for name, changes in run.plan:
            logger.info("dry run: would label node", extra={"node": name, "labels": changes})
        return {}

    def patch(item: tuple[str, dict[str, str]]) -> str:
        name, changes = item
        try:
            kube.patch_node_labels(name, changes)
        except DeadlineReachedError:
            return "skipped"
        except KubeApiError as exc:
            logger.warning("label patch failed", extra={"node": name, "labels": changes, "error": str(exc)})
            return "failed"
        logger.info("labelled node", extra={"node": name, "labels": changes})
        return "labeled"

    with ThreadPoolExecutor(max_workers=settings.patch_concurrency, thread_name_prefix="label") as pool:
        outcomes = list(pool.map(patch, run.plan))
    skipped = outcomes.count("skipped")
    if skipped:
        logger.warning("deadline reached: label patches skipped until the next run", extra={"skipped": skipped})
    return {
        "nodes_labeled": outcomes.count("labeled"),
        "label_patch_failures": outcomes.count("failed"),
        "label_patches_skipped": skipped,
    }
