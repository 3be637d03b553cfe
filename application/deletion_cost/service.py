"""Deletion-cost refresher: ``controller.kubernetes.io/pod-deletion-cost`` from live metrics.

The orchestration of one invocation, returning a frozen :class:`RunReport`; the Lambda handler and
``gpu-scheduler refresh deletion-cost`` both call :func:`refresh`. EventBridge invokes it every
minute; each invocation makes ``PASSES`` passes ``INTERVAL_S`` apart (2 and 30 s: a refresh every
30 s, as the source asks), never past the deadline margin. One pass:

1. lists the pods labelled ``gpu-scheduler.io/deletion-cost=managed`` (paginated; no other pod is
   ever read or written), skipping finished pods and pods being deleted;
2. runs each distinct metric query once (AMP, SigV4), with results keyed by ``namespace`` and ``pod``;
3. computes every pod's cost at once (:mod:`scheduler_core.deletion_cost.policy`);
4. writes the annotation, one merge patch per pod, only where it is missing or invalid or moved by at
   least the hysteresis; most needed first, within ``MAX_PATCHES_PER_RUN`` and ``PATCH_QPS``.

Pods that change mid-run: a 404 is skipped and counted, a 409 is retried once after a fresh read,
a 422 is logged with its value and skipped.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from adapters.amp import PrometheusClient, PrometheusQueryError
from adapters.kube import KubeClient
from adapters.kube_transport import DeadlineReachedError, KubeApiError
from adapters.kube_types import CostPod
from application.deletion_cost.settings import DeletionCostSettings
from scheduler_core.deletion_cost.karpenter import cost_annotation
from scheduler_core.deletion_cost.plan import (
    CostChange,
    GuardChange,
    costs_for,
    current_cost,
    metrics_by_pod,
    plan_changes,
    plan_guards,
    pod_key,
    render_queries,
)
from scheduler_core.deletion_cost.policy import COST_RANGES, CostConfig, format_cost
from scheduler_core.errors import ConfigError
from scheduler_core.k8s.names import DELETION_COST_ANNOTATION, MANAGED_SELECTOR, TERMINAL_PHASES

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PassReport:
    pods_seen: int = 0
    cost_patches: int = 0
    cost_unchanged: int = 0
    metrics_missing: int = 0
    patch_failures: int = 0
    pods_gone: int = 0
    planned: int = 0
    deferred: int = 0  # planned, but over the write budget or out of time: next pass or run
    query_failures: int = 0
    cost_annotation: str = DELETION_COST_ANNOTATION
    """Where the costs went: ``karpenter.sh/disruption-cost`` where Karpenter manages the other one."""
    guards_set: int = 0
    guards_cleared: int = 0
    cost_ranges: dict[str, int] = field(default_factory=dict)
    phases_ms: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RunReport:
    status: str = "ok"
    error: str = ""
    dry_run: bool = False
    passes: tuple[PassReport, ...] = ()
    passes_skipped: int = 0
    run_ms: float = 0.0

    def total(self, name: str) -> int:
        return sum(int(getattr(p, name)) for p in self.passes)


@dataclass
class CostServices:
    kube: KubeClient
    prometheus: PrometheusClient | None
    config: Callable[[], CostConfig]


def build_services(settings: DeletionCostSettings, session: Any, logger: Any = log) -> CostServices:
    """The clients the refresher needs, from ``settings`` and a boto3 session."""
    prometheus = None
    if settings.amp_query_url:
        region, credentials = session.region_name or "", session.get_credentials()
        prometheus = PrometheusClient(settings.amp_query_url, region=region, credentials=credentials)
    return CostServices(settings.connect(session), prometheus, config_loader(settings, logger))


class _Budget:
    """At most ``remaining`` writes, no faster than ``qps``."""

    def __init__(self, remaining: int, qps: float, clock: Callable[[], float], sleep: Callable[[float], None]):
        self.remaining, self.gap_s = remaining, 1.0 / qps
        self._clock, self._sleep = clock, sleep
        self._last = float("-inf")

    def take(self) -> bool:
        if self.remaining <= 0:
            return False
        wait = self._last + self.gap_s - self._clock()
        if wait > 0:
            self._sleep(wait)
        self._last = self._clock()
        self.remaining -= 1
        return True


def refresh(
    settings: DeletionCostSettings,
    services: CostServices,
    *,
    time_left: Callable[[], float],
    now: Callable[[], float] = time.time,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    logger: Any = log,
) -> RunReport:
    """One invocation: ``settings.passes`` passes ``interval_s`` apart, inside the deadline margin."""
    started = clock()
    report = RunReport(dry_run=settings.dry_run)
    try:
        config = services.config()
    except ConfigError as exc:
        logger.error("no usable deletion-cost config", extra={"error": str(exc)})
        return replace(report, status="failed", error=f"deletion-cost config: {exc}")
    services.kube.deadline = lambda: time_left() - settings.deadline_margin_s
    budget = _Budget(settings.max_patches_per_run, settings.patch_qps, clock, sleep)
    passes: list[PassReport] = []
    previous_start = previous_duration = 0.0
    for number in range(settings.passes):
        if number:
            wait = max(0.0, previous_start + settings.interval_s - clock())
            if time_left() - settings.deadline_margin_s < wait + previous_duration:
                report = replace(report, passes_skipped=settings.passes - number)
                logger.info("not enough time for another pass", extra={"skipped": report.passes_skipped})
                break
            sleep(wait)
        previous_start = clock()
        try:
            passes.append(_one_pass(settings, services, config, budget, now(), logger))
        except (KubeApiError, DeadlineReachedError) as exc:
            report = replace(report, status="failed", error=f"pass {number + 1}: {exc}")
            logger.error("pass failed", extra={"pass": number + 1, "error": str(exc)})
            break
        previous_duration = clock() - previous_start
    return replace(report, passes=tuple(passes), run_ms=1000 * (clock() - started))


def _one_pass(
    settings: DeletionCostSettings,
    services: CostServices,
    config: CostConfig,
    budget: _Budget,
    now: float,
    logger: Any,
) -> PassReport:
    phases: dict[str, float] = {}
    mark = time.perf_counter()

    def phase(name: str) -> None:
        nonlocal mark
        phases[name] = round(1000 * (time.perf_counter() - mark), 1)
        mark = time.perf_counter()

    annotation = _cost_annotation(settings, services.kube)
    listed = services.kube.list_all("pods", label_selector=MANAGED_SELECTOR, item_type=CostPod)
    pods = [p for p in listed if _live(p)]
    phase("list_pods")
    queries = render_queries(config, pods)
    results, query_failures = _query_metrics(services.prometheus, queries, logger)
    phase("query_metrics")
    costs = costs_for(pods, metrics_by_pod(config, pods, results, queries), config, now)
    changes, unchanged = plan_changes(pods, costs, config.hysteresis, annotation)
    guards = plan_guards(pods, costs, settings.do_not_disrupt_from, annotation)
    phase("compute_costs")
    written = _apply(changes, settings, services.kube, config, budget, logger, annotation)
    guarded = _apply_guards(guards, settings, services.kube, budget, logger)
    phase("write")
    return PassReport(
        pods_seen=len(pods),
        cost_unchanged=unchanged,
        metrics_missing=sum(cost is None for cost in costs.values()),
        planned=len(changes),
        query_failures=query_failures,
        cost_annotation=annotation,
        cost_ranges=_ranges(pods, costs, annotation),
        phases_ms=phases,
        **written,
        **guarded,
    )


def _cost_annotation(settings: DeletionCostSettings, kube: KubeClient) -> str:
    """The annotation this pass writes (:func:`scheduler_core.deletion_cost.karpenter.cost_annotation`),
    from Karpenter's Deployment as it is now. No such Deployment: the usual one. One that cannot be read
    fails the pass (a :class:`KubeApiError`): writing the usual annotation under a Karpenter that manages
    it would fight it every minute."""
    if not settings.karpenter_deployment:
        return DELETION_COST_ANNOTATION
    namespace, _, name = settings.karpenter_deployment.partition("/")
    try:
        deployment = kube.get_deployment(namespace, name)
    except KubeApiError as exc:
        if exc.status == 404:
            return DELETION_COST_ANNOTATION
        message = f"reading Karpenter's Deployment {namespace}/{name}: {exc.message}"
        raise KubeApiError(exc.status, exc.reason, message) from exc
    return cost_annotation(deployment)


def _apply(
    changes: list[CostChange],
    settings: DeletionCostSettings,
    kube: KubeClient,
    config: CostConfig,
    budget: _Budget,
    logger: Any,
    annotation: str,
) -> dict[str, int]:
    """Write the changes, most needed first, within the budget and the deadline; the pass's write counts."""
    counts = {"cost_patches": 0, "pods_gone": 0, "patch_failures": 0, "deferred": 0}
    for index, change in enumerate(changes):
        if settings.dry_run:
            logger.info("dry run: would set the deletion cost", extra=_change_log(change))
            continue
        if not budget.take():
            counts["deferred"] = len(changes) - index
            logger.warning("write budget reached", extra={"deferred": counts["deferred"]})
            break
        try:
            outcome = _write(kube, change, config.hysteresis, logger, annotation)
        except DeadlineReachedError:
            counts["deferred"] = len(changes) - index
            logger.warning("deadline reached: writes deferred", extra={"deferred": counts["deferred"]})
            break
        if outcome == "patched":
            counts["cost_patches"] += 1
        elif outcome == "gone":
            counts["pods_gone"] += 1
        elif outcome == "failed":
            counts["patch_failures"] += 1
    return counts


def _live(pod: Mapping[str, Any]) -> bool:
    metadata, status = pod.get("metadata") or {}, pod.get("status") or {}
    return not metadata.get("deletionTimestamp") and status.get("phase") not in TERMINAL_PHASES


def _query_metrics(
    prometheus: PrometheusClient | None, queries: Mapping[str, Any], logger: Any
) -> tuple[dict[str, list[tuple[Mapping[str, str], float]]], int]:
    """Each distinct query's samples, and how many queries failed (their pods keep their costs)."""
    results: dict[str, list[tuple[Mapping[str, str], float]]] = {}
    failures = 0
    if prometheus is None:
        return results, failures
    for query in queries:
        try:
            results[query] = [(s.labels, s.value) for s in prometheus.query(query)]
        except PrometheusQueryError as exc:
            failures += 1
            logger.warning("metric query failed; those costs are kept", extra={"query": query, "error": str(exc)})
    return results, failures


def _apply_guards(
    guards: list[GuardChange], settings: DeletionCostSettings, kube: KubeClient, budget: _Budget, logger: Any
) -> dict[str, int]:
    """Set or take away ``karpenter.sh/do-not-disrupt``, within the same write budget as the costs."""
    counts = {"guards_set": 0, "guards_cleared": 0}
    for change in guards:
        what = {"pod": change.key, "do_not_disrupt": change.guard}
        if settings.dry_run:
            logger.info("dry run: would change do-not-disrupt", extra=what)
            continue
        if not budget.take():
            logger.warning("write budget reached: do-not-disrupt changes deferred", extra=what)
            break
        try:
            kube.patch_pod_annotations(change.namespace, change.name, change.annotations())
        except DeadlineReachedError:
            break
        except KubeApiError as exc:
            if exc.status != 404:
                logger.warning("do-not-disrupt write failed", extra={**what, "error": str(exc)})
            continue
        counts["guards_set" if change.guard else "guards_cleared"] += 1
        logger.info("do-not-disrupt changed", extra=what)
    return counts


def _write(kube: KubeClient, change: CostChange, hysteresis: int, logger: Any, annotation: str) -> str:
    """Patch one pod: "patched", "gone", "skipped" (someone else already set it) or "failed"."""
    for attempt in (1, 2):
        try:
            kube.patch_pod_annotations(
                change.namespace,
                change.name,
                {annotation: format_cost(change.new)},
                retry_conflicts=False,
            )
            logger.info("deletion cost set", extra=_change_log(change))
            return "patched"
        except KubeApiError as exc:
            if exc.status == 404:
                logger.info("pod is gone", extra={"pod": change.key})
                return "gone"
            if exc.status == 422:
                logger.error("the API refused the cost", extra={**_change_log(change), "error": exc.message})
                return "failed"
            if exc.status != 409 or attempt == 2:
                logger.warning("deletion cost write failed", extra={**_change_log(change), "error": str(exc)})
                return "failed"
        # 409: read the pod again; write once more unless it already carries a close enough cost.
        try:
            fresh = kube.get_pod(change.namespace, change.name)
        except KubeApiError as exc:
            if exc.status == 404:
                return "gone"
            return "failed"
        current = current_cost(fresh, annotation)
        if current is not None and abs(current - change.new) < max(hysteresis, 1):
            return "skipped"
    return "failed"


def _change_log(change: CostChange) -> dict[str, Any]:
    return {"pod": change.key, "old_cost": change.old, "new_cost": change.new}


def _ranges(pods: Sequence[Mapping[str, Any]], costs: Mapping[str, int | None], annotation: str) -> dict[str, int]:
    """Pods per cost range, counting the cost each pod will carry (the new one, else its current one)."""
    counts = {name: 0 for name, _, _ in COST_RANGES}
    for pod in pods:
        cost = costs.get(pod_key(pod))
        if cost is None:
            cost = current_cost(pod, annotation) or 0
        for name, low, high in COST_RANGES:
            if low <= cost <= high:
                counts[name] += 1
                break
    return counts


def config_loader(settings: DeletionCostSettings, logger: Any = log) -> Callable[[], CostConfig]:
    """Reads the config each run (SSM through Powertools' 5-minute cache); a bad new version keeps
    the last good one in service, and is logged, so that a typo never stops the refresher."""

    last_good: CostConfig | None = None

    def load() -> CostConfig:
        nonlocal last_good
        if not (settings.config_parameter or settings.config_json):
            return CostConfig()
        try:
            last_good = CostConfig.from_json(_config_document(settings))
        except ConfigError as exc:
            if last_good is None:
                raise
            logger.error("deletion-cost config is unusable; keeping the last good one", extra={"error": str(exc)})
        return last_good

    return load


def _config_document(settings: DeletionCostSettings) -> Any:
    where = "DELETION_COST_CONFIG"
    text = settings.config_json
    if settings.config_parameter:
        from aws_lambda_powertools.utilities import parameters
        from aws_lambda_powertools.utilities.parameters.exceptions import GetParameterError

        where = f"SSM parameter {settings.config_parameter}"
        try:
            text = str(parameters.get_parameter(settings.config_parameter, max_age=300))
        except GetParameterError as exc:
            raise ConfigError(f"{where}: {exc}") from exc
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{where} is not JSON: {exc}") from exc
