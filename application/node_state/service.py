"""Node-state refresher: GPU labels on nodes, and the cluster snapshot the extender serves from.

One run is a list of jobs (:data:`JOBS`), each its own unit with its own failure handling, run in order by
:func:`refresh`, which returns a frozen :class:`RunReport`; the Lambda handler
(``lambdas/node_state/handler.py``) and ``gpu-scheduler refresh node-state`` both call it.

1. **list** (:mod:`~application.node_state.observe`): every node (``limit=500`` pages with ``continue``), the
   GPU labels each should have (EC2 ``GpuInfo`` for the instance types of nodes without complete GFD labels,
   cached across invocations), with the ledger its items and the unbound pods, then the non-terminal pods
   bound to nodes (decoded straight into :class:`adapters.kube_types.SchedulingPod`) and, where the API
   serves ``resource.k8s.io`` (DRA), its DeviceClasses, ResourceSlices and ResourceClaims: GPUs that claims
   hold are in use, and nodes whose GPUs DRA manages take no share (:mod:`scheduler_core.k8s.dra`). A failed
   list fails the run;
2. **utilization** (:mod:`~application.node_state.publish`): one PromQL query for DCGM utilisation; if it
   fails, the last known values are carried over from the previous snapshot, with their age;
3. **snapshot**: whole-GPU and milli use per GPU, written atomically to ``SNAPSHOT_URI``; a failed write
   fails the run, and the jobs below still run;
4. **labels** (:mod:`~application.node_state.labels`): ``gpu.nvidia.com/model|memory|count`` patched where
   they should change: one merge patch per node, concurrently, until the deadline margin; what it skips
   is reported;
5. **ledger** (:mod:`~application.node_state.ledger`), with ``LEDGER_TABLE`` (GPU sharing): the reconcile of
   the GPU ledger with the pods, then the reservation pods;
6. **placeholders** (:mod:`~shares.placeholders`), with reservation pods: one placeholder
   pod per whole GPU that unschedulable shares need, within the caps;
7. **watch** (:mod:`~application.node_state.watch`), with ``WATCH_S`` and an ok run: the snapshot kept
   fresh from a list+watch until ``WATCH_S`` after the run started.

The snapshot is written before the labels, so that a slow API cannot leave the extender stale; it already
reflects the labels being written.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from adapters.amp import PrometheusClient
from adapters.ec2_gpu import GpuInfoCatalog
from adapters.gpu_ledger import LedgerStore
from adapters.snapshot_store import open_store
from application.node_state.labels import apply_labels
from application.node_state.ledger import reconcile_ledger
from application.node_state.observe import list_cluster
from application.node_state.publish import publish_snapshot, read_utilization
from application.node_state.run import Run, RunReport, Services
from application.node_state.settings import NodeStateSettings
from application.node_state.watch import watch
from manifests.reservation import reserving
from shares.placeholders import keep_placeholders
from shares.reservations import Reservations

__all__ = ["JOBS", "Job", "RunReport", "Services", "build_services", "refresh"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Job:
    """One unit of a run: ``step`` reads what the jobs before found in the :class:`Run`, handles its own
    failures (logged, counted in the report) and notes its report fields; ``wanted`` says whether this run
    has it at all."""

    name: str
    step: Callable[[Run], None]
    wanted: Callable[[Run], bool] = lambda run: True


def placeholders(run: Run) -> None:
    """The placeholder job (:mod:`shares.placeholders`), timed as ``placeholders``."""
    assert run.services.reservations is not None
    with run.phase("placeholders"):
        image, caps = run.services.reservations.image, run.settings.placeholder_caps
        run.note(placeholders=keep_placeholders(run.services.kube, image, caps, run.logger))


JOBS: tuple[Job, ...] = (
    Job("list", list_cluster),
    Job("utilization", read_utilization),
    Job("snapshot", publish_snapshot),
    Job("labels", apply_labels),
    Job("ledger", reconcile_ledger, lambda run: run.ledger is not None),
    Job("placeholders", placeholders,
        lambda run: run.ledger is not None and run.services.reservations is not None),
    Job("watch", watch, lambda run: run.settings.watch_s > 0 and run.report.status == "ok"),
)  # fmt: skip


def build_services(settings: NodeStateSettings, session: Any, *, ec2: bool = True) -> Services:
    """The clients one run needs, from ``settings`` and a boto3 session (kept while a Lambda stays warm,
    and the EC2 cache with them). ``ec2`` False looks up no instance type: nodes without GPU Feature
    Discovery labels then keep the GPU labels they have."""
    prometheus = (
        PrometheusClient(
            settings.amp_query_url, region=session.region_name or "", credentials=session.get_credentials()
        )
        if settings.amp_query_url
        else None
    )
    kube = settings.connect(session)
    reserve = bool(settings.ledger_table) and reserving(settings.reservation_image)
    return Services(
        kube=kube,
        store=open_store(settings.snapshot_uri, s3_client=session.client("s3")),
        catalog=GpuInfoCatalog(session.client("ec2")) if ec2 else None,
        prometheus=prometheus,
        ledger=LedgerStore(settings.ledger_table, session.client("dynamodb")) if settings.ledger_table else None,
        reservations=Reservations(lambda: kube, settings.reservation_image) if reserve else None,
    )


def refresh(
    settings: NodeStateSettings,
    services: Services,
    *,
    time_left: Callable[[], float],
    now: Callable[[], float] = time.time,
    logger: Any = log,
) -> RunReport:
    """One refresher run (see the module docstring); ``time_left`` gives seconds to the deadline."""
    run = Run(settings, services, time_left, now, logger, RunReport(dry_run=settings.label_dry_run, phases_ms={}))
    kube = services.kube
    kube.deadline = lambda: time_left() - settings.deadline_margin_s
    retries_before = kube.retries
    for job in JOBS:
        if job.wanted(run):
            job.step(run)
        if run.stop:  # the cluster could not be listed: nothing to build from
            return replace(run.report, run_ms=1000 * (time.perf_counter() - run.started))
    return replace(run.report, api_retries=kube.retries - retries_before,
                   run_ms=1000 * (time.perf_counter() - run.started))  # fmt: skip
