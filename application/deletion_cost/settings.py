"""Deletion-cost refresher settings, read once from the environment (the table in ``docs/configuration.md``
is generated from the declarations below).

Without either config variable, the ``metrics`` policy with the source's defaults applies to every
managed pod, with no queries (so only the warm-up and not-ready costs change anything).
"""

from __future__ import annotations

from dataclasses import dataclass

from adapters.metric_catalogue import DELETION_COST, NAMESPACE
from adapters.settings import ClusterAccess, env_names, setting
from scheduler_core.errors import Namer


@dataclass(frozen=True)
class DeletionCostSettings(ClusterAccess):
    """The deletion-cost refresher's settings (:meth:`~adapters.settings.ClusterAccess.from_env`).

    >>> DeletionCostSettings.from_env({"CLUSTER_NAME": "prod", "PASSES": "1"}).passes
    1
    """

    config_json: str = setting("DELETION_COST_CONFIG", "", "the workload config as JSON (see `CostConfig.from_json`)")
    config_parameter: str = setting(
        "DELETION_COST_CONFIG_PARAMETER", "", "or an SSM parameter holding it (re-read every 5 minutes)"
    )
    amp_query_url: str = setting(
        "AMP_QUERY_URL", "", "AMP workspace URL; without it only warm-up and readiness costs apply"
    )
    dry_run: bool = setting("DRY_RUN", False, "compute and log the changes, write nothing")
    max_patches_per_run: int = setting(
        "MAX_PATCHES_PER_RUN", 200, "annotation writes per invocation, all passes together"
    )
    patch_qps: float = setting("PATCH_QPS", 10.0, "annotation writes per second at most")
    passes: int = setting(
        "PASSES", 2, "refresh passes per invocation (EventBridge fires every minute: 2 passes is every 30 s)"
    )
    interval_s: float = setting("INTERVAL_S", 30.0, "seconds from the start of one pass to the start of the next")
    deadline_margin_s: float = setting(
        "DEADLINE_MARGIN_S", 5.0, "no pass or write starts this close to the Lambda deadline"
    )
    karpenter_deployment: str = setting(
        "KARPENTER_DEPLOYMENT",
        "kube-system/karpenter",
        "Karpenter's Deployment, NAMESPACE/NAME: with its PodDeletionCostManagement gate on, costs go to "
        "`karpenter.sh/disruption-cost`; empty: never look",
    )
    do_not_disrupt_from: int = setting(
        "DO_NOT_DISRUPT_FROM",
        0,
        "pods whose cost is at least this carry `karpenter.sh/do-not-disrupt` (taken away again below it); 0: none",
    )
    metrics_namespace: str = setting(
        "POWERTOOLS_METRICS_NAMESPACE", NAMESPACE, "CloudWatch namespace of the EMF metrics"
    )
    service: str = setting("POWERTOOLS_SERVICE_NAME", DELETION_COST, "service name in logs and metrics")

    def problems(self, name: Namer | None = None) -> list[str]:
        """Every invalid setting, each named by ``name`` of its field (its variable by default)."""
        name = name or env_names(type(self))
        found = self.access_problems(name)
        if self.config_json and self.config_parameter:
            found.append(f"{name('config_json')} and {name('config_parameter')}: set one, not both")
        if self.max_patches_per_run < 0:
            found.append(f"{name('max_patches_per_run')}: must be non-negative, got {self.max_patches_per_run}")
        if not self.patch_qps > 0:
            found.append(f"{name('patch_qps')}: must be positive, got {self.patch_qps}")
        if not 1 <= self.passes <= 10:
            found.append(f"{name('passes')}: expected 1..10, got {self.passes}")
        if self.interval_s < 0 or self.deadline_margin_s < 0:
            found.append(f"{name('interval_s')} and {name('deadline_margin_s')}: must be non-negative")
        namespace, _, deployment = self.karpenter_deployment.partition("/")
        if self.karpenter_deployment and not (namespace and deployment and "/" not in deployment):
            given = self.karpenter_deployment
            found.append(f"{name('karpenter_deployment')}: expected NAMESPACE/NAME or empty, got {given!r}")
        if self.do_not_disrupt_from < 0:
            found.append(f"{name('do_not_disrupt_from')}: must be non-negative, got {self.do_not_disrupt_from}")
        return found
