"""Deletion-cost refresher settings, read once from the environment.

| variable | default | meaning |
|---|---|---|
| ``CLUSTER_NAME`` / ``KUBE_API_URL`` + ``KUBE_TOKEN`` / ``KUBECONFIG`` | (one required) | where the API is |
| ``DELETION_COST_CONFIG`` | (none) | the workload config as JSON (see ``CostConfig.from_json``) |
| ``DELETION_COST_CONFIG_PARAMETER`` | (none) | or an SSM parameter holding it (re-read every 5 minutes) |
| ``AMP_QUERY_URL`` | (none) | AMP workspace URL; without it only warm-up and readiness costs apply |
| ``DRY_RUN`` | false | compute and log the changes, write nothing |
| ``MAX_PATCHES_PER_RUN`` | 200 | annotation writes per invocation, all passes together |
| ``PATCH_QPS`` | 10 | annotation writes per second at most |
| ``PASSES`` | 2 | refresh passes per invocation (EventBridge fires every minute: 2 passes is every 30 s) |
| ``INTERVAL_S`` | 30 | seconds from the start of one pass to the start of the next |
| ``DEADLINE_MARGIN_S`` | 5 | no pass or write starts this close to the Lambda deadline |

Without either config variable, the ``metrics`` policy with the source's defaults applies to every
managed pod, with no queries (so only the warm-up and not-ready costs change anything).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from adapters.settings import CLUSTER_ACCESS_ENV, ClusterAccess, load_settings

MANAGED_SELECTOR = "gpu-scheduler.io/deletion-cost=managed"

_ENV = CLUSTER_ACCESS_ENV | {
    "config_json": "DELETION_COST_CONFIG",
    "config_parameter": "DELETION_COST_CONFIG_PARAMETER",
    "amp_query_url": "AMP_QUERY_URL",
    "dry_run": "DRY_RUN",
    "max_patches_per_run": "MAX_PATCHES_PER_RUN",
    "patch_qps": "PATCH_QPS",
    "passes": "PASSES",
    "interval_s": "INTERVAL_S",
    "deadline_margin_s": "DEADLINE_MARGIN_S",
}


@dataclass(frozen=True)
class DeletionCostSettings(ClusterAccess):
    config_json: str = ""
    config_parameter: str = ""
    amp_query_url: str = ""
    dry_run: bool = False
    max_patches_per_run: int = 200
    patch_qps: float = 10.0
    passes: int = 2
    interval_s: float = 30.0
    deadline_margin_s: float = 5.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> DeletionCostSettings:
        """Read the environment; explicit keyword arguments win.

        >>> DeletionCostSettings.from_env({"CLUSTER_NAME": "prod", "PASSES": "1"}).passes
        1
        """
        return load_settings(cls, _ENV, environ, overrides)

    def problems(self) -> list[str]:
        found = self.access_problems()
        if self.config_json and self.config_parameter:
            found.append("DELETION_COST_CONFIG and DELETION_COST_CONFIG_PARAMETER: set one, not both")
        if self.max_patches_per_run < 0:
            found.append(f"MAX_PATCHES_PER_RUN: must be non-negative, got {self.max_patches_per_run}")
        if not self.patch_qps > 0:
            found.append(f"PATCH_QPS: must be positive, got {self.patch_qps}")
        if not 1 <= self.passes <= 10:
            found.append(f"PASSES: expected 1..10, got {self.passes}")
        if self.interval_s < 0 or self.deadline_margin_s < 0:
            found.append("INTERVAL_S and DEADLINE_MARGIN_S: must be non-negative")
        return found
