"""One node-state run's shared parts: the clients (:class:`Services`), what the run found so far and its
report (:class:`Run`), and the timing of each phase. Each job in :data:`application.node_state.service.JOBS`
reads the run, and notes its fields of the report on it (:meth:`Run.note`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from adapters.amp import PrometheusClient
from adapters.ec2_gpu import GpuInfoCatalog
from adapters.gpu_ledger import LedgerStore
from adapters.kube import KubeClient
from adapters.snapshot_store import SnapshotStore
from application.node_state.settings import NodeStateSettings
from shares.reservations import Reservations

if TYPE_CHECKING:
    from application.node_state.ledger import LedgerView
    from application.node_state.observe import DraLists
    from application.node_state.publish import Utilization
    from scheduler_core.state.cluster import ClusterState

Plan = list[tuple[str, dict[str, str]]]
"""Label changes per node name."""


@dataclass(frozen=True)
class RunReport:
    status: str = "ok"  # "ok", or "failed" when no snapshot could be written
    error: str = ""
    nodes_seen: int = 0
    nodes_invalid: int = 0  # over a cap of scheduler_core.k8s.limits: refused to every pod
    pods_seen: int = 0
    nodes_labeled: int = 0
    label_patch_failures: int = 0
    label_patches_skipped: int = 0
    label_patches_planned: int = 0
    dry_run: bool = False
    unlabelled: dict[str, int] = field(default_factory=dict)
    utilization_source: str = "none"  # "amp", "previous" or "none"
    amp_query_failed: bool = False
    utilization_age_s: float | None = None
    snapshot_bytes: int = 0
    snapshot_write_ms: float = 0.0
    amp_query_ms: float = 0.0
    run_ms: float = 0.0
    problems: int = 0
    api_retries: int = 0
    phases_ms: dict[str, float] = field(default_factory=dict)
    ledger_drift: dict[str, int] = field(default_factory=dict)
    ledger_writes: int = 0
    ledger_write_conflicts: int = 0  # items a bind changed meanwhile: left for the next run
    ledger_error: str = ""
    reservations: dict[str, int] = field(default_factory=dict)  # reconciled reservation pods: created, deleted
    placeholders: dict[str, int] = field(default_factory=dict)  # whole-GPU demand of unschedulable shares
    snapshot_revision: str = ""
    snapshots_kept_newer: int = 0  # writes skipped: the store already held a newer snapshot
    watch: dict[str, float] = field(default_factory=dict)  # WATCH_S: events, publishes, lag
    dra: dict[str, Any] = field(default_factory=dict)  # the version read, nodes it manages, GPUs published and claimed
    mig: dict[str, Any] = field(default_factory=dict)  # MIG nodes by mode, slices by profile (ClusterState.mig_summary)


@dataclass
class Services:
    kube: KubeClient
    store: SnapshotStore
    catalog: GpuInfoCatalog | None  # None: no EC2 lookups (a cluster outside AWS)
    prometheus: PrometheusClient | None
    ledger: LedgerStore | None = None
    reservations: Reservations | None = None  # with the ledger: one reservation pod per GPU shares hold


@dataclass
class Run:
    """One run: its settings and clients, what the jobs before found (filled in as they go), and the
    report so far. ``stop`` ends the run after the current job."""

    settings: NodeStateSettings
    services: Services
    time_left: Callable[[], float]
    now: Callable[[], float]
    logger: Any
    report: RunReport
    started: float = field(default_factory=time.perf_counter)  # for run_ms
    run_started: float = field(default_factory=time.monotonic)  # where WATCH_S counts from
    stop: bool = False
    # What the jobs found, for the jobs after them:
    nodes: list[dict[str, Any]] = field(default_factory=list)
    nodes_version: str = ""
    pods: list[dict[str, Any]] = field(default_factory=list)
    pods_version: str = ""
    plan: Plan = field(default_factory=list)  # the label changes, already applied to ``nodes``
    ledger: LedgerView | None = None  # with the ledger: what the reconcile needs, read in its safe order
    dra: DraLists | None = None
    utilization: Utilization | None = None
    snapshot: ClusterState | None = None

    @property
    def phases(self) -> dict[str, float]:
        return self.report.phases_ms

    def note(self, **fields: Any) -> None:
        self.report = replace(self.report, **fields)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a phase into the report's ``phases_ms``."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = round(1000 * (time.perf_counter() - started), 1)


def node_name(node: Any) -> str:
    metadata = node.get("metadata") if isinstance(node, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) else ""
