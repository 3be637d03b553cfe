"""The consolidator's run: settle the last run's holds, plan, write the holds, evict.

One run (the Lambda's invocation, or ``gpu-scheduler consolidate``):

1. read the nodes, the pods and the PodDisruptionBudgets, and the holds book (``HOLDS_URI``);
2. settle the book: a hold whose pod bound on its node is *kept*; one whose pod bound elsewhere, is gone,
   or whose deadline passed has *lapsed*; both leave the book, and so do steers past their deadline and
   evictions older than an hour;
3. while a hold is still in flight, plan nothing new (one plan's moves settle before the next is made);
   otherwise plan (:func:`~scheduler_core.consolidation.plan.plan_consolidation`) within the run's and the
   hour's move budgets;
4. with a plan and no ``DRY_RUN``: write the holds and steers first, wait ``SETTLE_S`` for the extender to
   read them, then evict each pod through the Eviction API, in the plan's order, with its UID as a
   precondition. A PodDisruptionBudget's refusal (429) ends that pod's plan (its holds lapse on their
   own); a pod already gone (404, 409) is counted and passed over. The book is written again with the
   evictions' times (the hourly budget).

Nothing is evicted without its holds written first, and a run that cannot read the book plans nothing:
the book carries the hourly budget.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from adapters.holds_source import read_book, write_book
from adapters.kube import KubeClient
from adapters.kube_transport import DeadlineReachedError, KubeApiError
from adapters.snapshot_store import SnapshotStore, SnapshotStoreError, open_store
from application.consolidation.settings import ConsolidationSettings
from scheduler_core.consolidation.holds import Hold, HoldBook, HoldsFormatError, Steer
from scheduler_core.consolidation.plan import (
    Consolidation,
    NodePlan,
    PlannedMove,
    PodPlan,
    pending_pods,
    plan_consolidation,
)
from scheduler_core.k8s.limits import MAX_GPUS_PER_NODE

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunReport:
    """What one run did; ``plans`` are the plans made, with each move's reason and cost."""

    status: str = "ok"
    error: str = ""
    dry_run: bool = False
    pending: int = 0
    plans: tuple[dict[str, Any], ...] = ()
    emptied: tuple[dict[str, Any], ...] = ()
    """The nodes emptied for scale-down (``EMPTY_NODES``), each with its moves."""
    moves_planned: int = 0
    evictions: int = 0
    evictions_refused: int = 0
    pods_gone: int = 0
    holds_kept: int = 0
    holds_lapsed: int = 0
    in_flight: int = 0
    """Holds still waiting for their pod: this run planned nothing new."""
    hour_budget_left: int = 0
    waiting: Mapping[str, str] = field(default_factory=dict)
    unmovable: Mapping[str, int] = field(default_factory=dict)
    run_ms: float = 0.0


@dataclass
class Services:
    kube: KubeClient
    store: SnapshotStore | None


def build_services(settings: ConsolidationSettings, session: Any) -> Services:
    """The clients a run needs, from ``settings`` and a boto3 session."""
    store = None
    if settings.holds_uri:
        s3 = session.client("s3") if settings.holds_uri.startswith("s3://") else None
        store = open_store(settings.holds_uri, s3_client=s3)
    return Services(settings.connect(session), store)


def consolidate(
    settings: ConsolidationSettings,
    services: Services,
    *,
    time_left: Callable[[], float],
    now: Callable[[], float] = time.time,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    logger: Any = log,
) -> RunReport:
    """One run (see the module docstring)."""
    started = clock()
    report = RunReport(dry_run=settings.dry_run)
    services.kube.deadline = lambda: time_left() - settings.deadline_margin_s
    try:
        report = _run(settings, services, report, now, sleep, logger)
    except (KubeApiError, DeadlineReachedError, SnapshotStoreError, HoldsFormatError) as exc:
        logger.error("consolidation run failed", extra={"error": str(exc)})
        report = replace(report, status="failed", error=str(exc))
    except Exception as exc:  # an object no rule foresaw: the run fails and says so, the next one retries
        logger.exception("consolidation run failed")
        report = replace(report, status="failed", error=f"{type(exc).__name__}: {exc}")
    return replace(report, run_ms=1000 * (clock() - started))


def _run(
    settings: ConsolidationSettings,
    services: Services,
    report: RunReport,
    now: Callable[[], float],
    sleep: Callable[[float], None],
    logger: Any,
) -> RunReport:
    kube = services.kube
    nodes, pods = kube.list_all("nodes"), kube.list_all("pods")
    pdbs = kube.list_disruption_budgets()
    book = read_book(services.store) if services.store is not None else HoldBook()
    names = {str(_mapping(_mapping(n).get("metadata")).get("name") or "") for n in nodes}
    settled, kept, lapsed = settle(book, pods, now(), names)
    if services.store is not None and not settings.dry_run and settled != book:
        write_book(services.store, settled)
    hour_left = max(0, settings.max_moves_per_hour - len(settled.evictions))
    report = replace(
        report, pending=len(pending_pods(pods)), holds_kept=kept, holds_lapsed=lapsed,
        in_flight=len(settled.holds), hour_budget_left=hour_left,
    )  # fmt: skip
    if settled.holds:
        return report
    plan = plan_consolidation(
        nodes, pods, pdbs,
        max_moves=min(settings.max_moves_per_run, hour_left), max_moves_per_plan=settings.max_moves_per_plan,
        empty_nodes=settings.empty_nodes,
    )  # fmt: skip
    report = replace(
        report, plans=tuple(_described(p) for p in plan.plans), moves_planned=plan.moves,
        emptied=tuple(_described(n) for n in plan.emptied), waiting=dict(plan.waiting), unmovable=dict(plan.unmovable),
    )  # fmt: skip
    logger.info(
        "consolidation plan", extra={"plans": report.plans, "emptied": report.emptied, "waiting": report.waiting}
    )
    if settings.dry_run or not plan.moves:
        return report
    assert services.store is not None  # settings require HOLDS_URI unless DRY_RUN
    return _execute(settings, services.store, kube, settled, plan, report, now, sleep, logger)


def settle(
    book: HoldBook, pods: Sequence[Mapping[str, Any]], at: float, nodes: Collection[str]
) -> tuple[HoldBook, int, int]:
    """``book`` with what is done or lapsed at ``at`` taken out, and how many holds were kept and lapsed. A
    node emptied for scale-down (a hold for no pod) is kept once the node is gone from ``nodes``."""
    by_uid = {str(_mapping(_mapping(p).get("metadata")).get("uid") or ""): p for p in pods}
    done: set[Hold] = set()
    kept = lapsed = 0
    for hold in book.holds:
        pod = by_uid.get(hold.uid) if hold.uid else None
        node = _mapping(_mapping(pod).get("spec")).get("nodeName")
        if (pod is not None and node == hold.node) or (not hold.uid and hold.node not in nodes):
            kept += 1
        elif (hold.uid and (pod is None or node)) or hold.until <= at:
            lapsed += 1
        else:
            continue
        done.add(hold)
    steers = {s for s in book.steers if s.until <= at}
    live = book.without(done, steers)
    return replace(live, evictions=live.live(at).evictions), kept, lapsed


def _execute(
    settings: ConsolidationSettings,
    store: SnapshotStore,
    kube: KubeClient,
    book: HoldBook,
    plan: Consolidation,
    report: RunReport,
    now: Callable[[], float],
    sleep: Callable[[float], None],
    logger: Any,
) -> RunReport:
    """Write the holds, let the extender read them, evict in order; the book again with the evictions."""
    at = now()
    until = at + settings.hold_s
    holds = tuple(Hold(p.pod.namespace, p.pod.name, p.pod.uid, p.node, p.gpus, until) for p in plan.plans)
    # An emptied node is held for no pod: every GPU pod is kept off it until the autoscaler removes it.
    holds += tuple(Hold("", "", "", n.node, MAX_GPUS_PER_NODE, until) for n in plan.emptied)
    planned = [(p.pod.key, p.moves) for p in plan.plans] + [(n.node, n.moves) for n in plan.emptied]
    steers = tuple(
        Steer(m.pod.namespace, m.owner.kind, m.owner.name, m.owner.uid, m.pod.key, m.destination, at, until)
        for _whom, moves in planned
        for m in moves
    )
    book = replace(book, holds=book.holds + holds, steers=book.steers + steers)
    write_book(store, book)
    sleep(settings.settle_s)
    evicted: list[float] = []
    refused = gone = 0
    void: set[str] = set()  # plans a budget refused before any eviction: their holds and steers go
    try:
        for whom, moves in planned:
            done, outcome, missing = _evict(kube, whom, moves, evicted, now, logger)
            refused += outcome == "refused"
            gone += missing
            if outcome == "refused" and not done:
                void.add(whom)
    finally:  # what was evicted counts against the hour, whatever happened after
        kept = [h for h in holds if ((h.name and f"{h.namespace}/{h.name}") or h.node) not in void]
        dropped = {m.pod.key for whom, moves in planned if whom in void for m in moves}
        book = replace(
            book, holds=tuple(h for h in book.holds if h not in holds or h in kept),
            steers=tuple(s for s in book.steers if s not in steers or s.moved not in dropped),
            evictions=book.evictions + tuple(evicted),
        )  # fmt: skip
        write_book(store, book)
    return replace(report, evictions=len(evicted), evictions_refused=refused, pods_gone=gone)


def _evict(
    kube: KubeClient, whom: str, moves: Sequence[PlannedMove], evicted: list[float], now: Callable[[], float],
    logger: Any,
) -> tuple[int, str, int]:  # fmt: skip
    """Evict the pods of one plan (for ``whom``: a Pending pod, or a node emptied) in order: how many went,
    "refused" when a budget said no (the rest of this plan is left) or "", and how many were gone already
    (passed over)."""
    done = gone = 0
    for move in moves:
        try:
            kube.evict_pod(move.pod.namespace, move.pod.name, move.pod.uid)
        except KubeApiError as exc:
            if exc.status == 429:
                logger.warning("eviction refused", extra={"pod": move.pod.key, "for": whom, "error": str(exc)})
                return done, "refused", gone
            if exc.status not in (404, 409):
                raise
            gone += 1
            continue
        done += 1
        evicted.append(now())
        logger.info("evicted", extra={"pod": move.pod.key, "from": move.source, "to": move.destination})
    return done, "", gone


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _described(plan: PodPlan | NodePlan) -> dict[str, Any]:
    """A plan as the report and the dry run print it."""
    about = {"pod": plan.pod.key, "gpus": plan.gpus} if isinstance(plan, PodPlan) else {}
    return {
        **about,
        "node": plan.node,
        "cost": plan.cost,
        "moves": [
            {**{k: v for k, v in asdict(m).items() if k not in ("pod", "owner")}, "pod": m.pod.key,
             "owner": f"{m.owner.kind}/{m.owner.name}"}
            for m in plan.moves
        ],
    }  # fmt: skip
