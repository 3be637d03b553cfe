"""Consolidator settings, read once from the environment (the table in ``docs/configuration.md`` is
generated from the declarations below)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from adapters.metric_catalogue import CONSOLIDATOR, NAMESPACE
from adapters.settings import ClusterAccess, env_names, setting
from scheduler_core.consolidation.holds import MAX_HOLD_S
from scheduler_core.consolidation.plan import MAX_MOVES
from scheduler_core.errors import Namer

MAX_EMPTY_NODES = 16
"""Nodes one run may empty: with :data:`~scheduler_core.consolidation.plan.MAX_PENDING` plans, the holds
of a run stay under the book's bound (:data:`~scheduler_core.consolidation.holds.MAX_HOLDS`)."""


@dataclass(frozen=True)
class ConsolidationSettings(ClusterAccess):
    """The consolidator's settings (:meth:`~adapters.settings.ClusterAccess.from_env`).

    >>> ConsolidationSettings.from_env({"CLUSTER_NAME": "prod", "HOLDS_URI": "s3://b/holds.json"}).max_moves_per_run
    2
    """

    holds_uri: str = setting(
        "HOLDS_URI", "", "where the holds go, the extender's `HOLDS_URI` (`s3://bucket/key`, `file:///path` or a path)"
    )
    dry_run: bool = setting("DRY_RUN", False, "plan and report, evict nothing and write no hold")
    max_moves_per_run: int = setting("MAX_MOVES_PER_RUN", 2, "evictions per run, all plans together")
    max_moves_per_hour: int = setting("MAX_MOVES_PER_HOUR", 10, "evictions per rolling hour (kept in the holds)")
    max_moves_per_plan: int = setting(
        "MAX_MOVES_PER_PLAN", 2, "evictions to make room for one Pending pod, or to empty one node"
    )
    empty_nodes: int = setting(
        "EMPTY_NODES", 0, "with no pod Pending, nodes a run empties for the autoscaler to remove; 0: none"
    )
    hold_s: float = setting(
        "HOLD_S", 180.0, "how long a plan's holds and steers last: longer than the moved pods take to terminate"
    )
    settle_s: float = setting(
        "SETTLE_S",
        3.0,
        "wait between writing the holds and the first eviction (the extender's SNAPSHOT_REFRESH_S, and more)",
    )
    deadline_margin_s: float = setting("DEADLINE_MARGIN_S", 5.0, "no eviction starts this close to the Lambda deadline")
    metrics_namespace: str = setting(
        "POWERTOOLS_METRICS_NAMESPACE", NAMESPACE, "CloudWatch namespace of the EMF metrics"
    )
    service: str = setting("POWERTOOLS_SERVICE_NAME", CONSOLIDATOR, "service name in logs and metrics")

    def problems(self, name: Namer | None = None) -> list[str]:
        """Every invalid setting, each named by ``name`` of its field (its variable by default)."""
        name = name or env_names(type(self))
        found = self.access_problems(name)
        if not self.holds_uri and not self.dry_run:
            found.append(f"{name('holds_uri')}: required unless {name('dry_run')}: the extender reads the holds there")
        if "://" in self.holds_uri and not self.holds_uri.startswith(("s3://", "file://")):
            found.append(
                f"{name('holds_uri')}: expected s3://bucket/key, file:///path or a path, got {self.holds_uri!r}"
            )
        for key in ("max_moves_per_run", "max_moves_per_hour", "max_moves_per_plan"):
            value = getattr(self, key)
            if not 0 <= value <= MAX_MOVES:
                found.append(f"{name(key)}: expected 0..{MAX_MOVES}, got {value}")
        if not 0 <= self.empty_nodes <= MAX_EMPTY_NODES:
            found.append(f"{name('empty_nodes')}: expected 0..{MAX_EMPTY_NODES}, got {self.empty_nodes}")
        if not (math.isfinite(self.hold_s) and 10.0 <= self.hold_s <= MAX_HOLD_S):
            found.append(f"{name('hold_s')}: expected 10..{MAX_HOLD_S:.0f} seconds, got {self.hold_s}")
        for key in ("settle_s", "deadline_margin_s"):
            value = getattr(self, key)
            if not (math.isfinite(value) and 0 <= value <= 60):
                found.append(f"{name(key)}: expected 0..60 seconds, got {value}")
        return found
