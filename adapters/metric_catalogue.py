"""Every CloudWatch metric the Lambdas emit (EMF, one namespace), with its unit and dimensions.

The handlers' tests check that what each Lambda emits is exactly what is catalogued here, and the CDK
dashboards and alarms (``cdk/monitoring.py``) name metrics only through this module, so a renamed metric
cannot leave a dashboard silently empty. Every metric carries the ``service`` dimension (the Lambda's
``POWERTOOLS_SERVICE_NAME``); a few add one more, listed in ``dimensions``.

``gpu-scheduler serve`` records the extender's metrics too, and exposes them on ``GET /metrics`` under
the names :func:`prometheus_name` derives from the catalogue (``adapters/telemetry.py`` writes both forms):

- the prefix ``gpu_scheduler_extender_``, then the CloudWatch name in snake case;
- ``Count``: a counter, ``_total`` appended, increased by each value (what CloudWatch's ``Sum`` shows);
- ``Milliseconds``: a histogram in milliseconds (``_bucket``, ``_sum``, ``_count``);
- any other unit (``Seconds``): a gauge holding the last value;
- the extra dimension becomes a label of the same name; ``service`` is left out (one process, one service).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NAMESPACE = "GpuScheduler"
PROMETHEUS_PREFIX = "gpu_scheduler_extender"
EXTENDER = "gpu-scheduler-extender"
NODE_STATE = "gpu-scheduler-node-state"
DELETION_COST = "gpu-scheduler-deletion-cost"
CONSOLIDATOR = "gpu-scheduler-consolidator"


@dataclass(frozen=True)
class MetricSpec:
    name: str
    service: str
    unit: str  # the EMF unit name, as Powertools writes it
    description: str
    dimensions: tuple[str, ...] = ()  # beyond ``service``
    planned: str = ""  # the issue that will emit it, for a metric catalogued ahead of its emitter

    @property
    def all_dimensions(self) -> tuple[str, ...]:
        return ("service", *self.dimensions)


CATALOGUE: tuple[MetricSpec, ...] = (
    # The extender, on Lambda and in `serve`: one set per filter or prioritize call.
    MetricSpec("FilterLatencyMs", EXTENDER, "Milliseconds", "filter handling time inside the extender"),
    MetricSpec("PrioritizeLatencyMs", EXTENDER, "Milliseconds", "prioritize handling time inside the extender"),
    MetricSpec("NodesIn", EXTENDER, "Count", "nodes kube-scheduler sent to filter"),
    MetricSpec("NodesFeasible", EXTENDER, "Count", "nodes that passed filter"),
    MetricSpec("SnapshotAgeSeconds", EXTENDER, "Seconds", "age of the snapshot the decision used"),
    MetricSpec("BadRequests", EXTENDER, "Count", "requests answered 4xx (not JSON, wrong shape, too large, no route)"),
    MetricSpec("InternalErrors", EXTENDER, "Count", "requests answered 500"),
    MetricSpec(
        "Unschedulable", EXTENDER, "Count", "filter calls with no feasible node, by the main reason", ("reason",)
    ),
    MetricSpec(
        "RepliesCut",
        EXTENDER,
        "Count",
        "filter replies over Lambda's 5 MB sent without their failure reasons",
        ("reason",),
    ),
    MetricSpec("SnapshotRefreshFailures", EXTENDER, "Count", "snapshot reloads that failed, by cause", ("reason",)),
    # The extender's bind and preempt verbs (GPU sharing).
    MetricSpec("BindLatencyMs", EXTENDER, "Milliseconds", "bind handling time: ledger write, annotation, Binding"),
    MetricSpec("Binds", EXTENDER, "Count", "pods bound (a repeated bind counts once more)"),
    MetricSpec("BindFailures", EXTENDER, "Count", "binds answered with Error, by cause", ("reason",)),
    MetricSpec("LedgerConflicts", EXTENDER, "Count", "ledger version conflicts hit by binds"),
    MetricSpec("BindRollbacks", EXTENDER, "Count", "ledger entries released after a failed annotation or Binding"),
    MetricSpec("PreemptLatencyMs", EXTENDER, "Milliseconds", "preempt handling time"),
    MetricSpec("PreemptNodesDropped", EXTENDER, "Count", "proposed nodes where the victims free too little GPU"),
    # The node-state refresher: one set per run.
    MetricSpec("NodesSeen", NODE_STATE, "Count", "nodes listed"),
    MetricSpec(
        "NodesInvalid", NODE_STATE, "Count", "nodes over a cap of GPUs, slices or devices: refused to every pod"
    ),
    MetricSpec("NodesLabeled", NODE_STATE, "Count", "nodes whose GPU labels were patched"),
    MetricSpec("LabelPatchFailures", NODE_STATE, "Count", "label patches that failed"),
    MetricSpec("LabelPatchesSkipped", NODE_STATE, "Count", "label patches left for the next run (deadline)"),
    MetricSpec("NodesWithoutGpuInfo", NODE_STATE, "Count", "GPU nodes with no GFD labels and no EC2 GpuInfo"),
    MetricSpec("SnapshotBytes", NODE_STATE, "Bytes", "size of the snapshot written"),
    MetricSpec("SnapshotWriteMs", NODE_STATE, "Milliseconds", "time to write the snapshot"),
    MetricSpec("AmpQueryMs", NODE_STATE, "Milliseconds", "time of the GPU-utilisation query to AMP"),
    MetricSpec("AmpQueryFailures", NODE_STATE, "Count", "utilisation queries that failed"),
    MetricSpec("RunMs", NODE_STATE, "Milliseconds", "whole run"),
    MetricSpec("RunFailures", NODE_STATE, "Count", "runs that did not finish (API unreachable, bad config)"),
    MetricSpec("SnapshotsKeptNewer", NODE_STATE, "Count", "snapshot writes skipped: the store held a newer one"),
    MetricSpec("SnapshotPublishes", NODE_STATE, "Count", "snapshots written from the watch (WATCH_S)"),
    MetricSpec("WatchLagP99Ms", NODE_STATE, "Milliseconds", "watch: first change to its snapshot written, p99"),
    MetricSpec("SharesReleased", NODE_STATE, "Count", "shares of gone pods freed from the watch (LEDGER_TABLE)"),
    MetricSpec("LedgerDrift", NODE_STATE, "Count", "ledger entries the reconcile corrected, by kind", ("kind",)),
    MetricSpec("LedgerReconcileFailures", NODE_STATE, "Count", "reconciles of the GPU ledger that failed"),
    MetricSpec(
        "PlaceholdersHeldBack",
        NODE_STATE,
        "Count",
        "whole GPUs of unschedulable shares left without a placeholder by its caps",
    ),
    MetricSpec("MigNodesUnsettled", NODE_STATE, "Count", "nodes whose MIG layout is changing or invalid"),
    MetricSpec("MigSlicesFree", NODE_STATE, "Count", "MIG slices no bound pod requests, by profile", ("profile",)),
    MetricSpec(
        "MigSlicesStranded",
        NODE_STATE,
        "Count",
        "free MIG slices on nodes where some profile of the layout has none free, by profile",
        ("profile",),
    ),
    MetricSpec("DraNodes", NODE_STATE, "Count", "nodes whose GPUs DRA manages (they take no share)"),
    MetricSpec("DraGpusPublished", NODE_STATE, "Count", "GPUs DRA publishes in complete ResourceSlice pools"),
    MetricSpec("DraGpusClaimed", NODE_STATE, "Count", "GPUs that devices allocated to ResourceClaims hold"),
    # The deletion-cost refresher: one set per invocation (all passes), and the last pass's histogram.
    MetricSpec("PodsSeen", DELETION_COST, "Count", "managed pods listed"),
    MetricSpec("CostPatches", DELETION_COST, "Count", "deletion-cost annotations written"),
    MetricSpec("CostUnchanged", DELETION_COST, "Count", "pods whose cost moved less than the hysteresis"),
    MetricSpec("MetricsMissing", DELETION_COST, "Count", "pods kept at their cost for lack of a metric"),
    MetricSpec("PatchFailures", DELETION_COST, "Count", "annotation writes that failed"),
    MetricSpec("PodsGone", DELETION_COST, "Count", "pods deleted between list and write"),
    MetricSpec("MetricQueryFailures", DELETION_COST, "Count", "PromQL queries that failed"),
    MetricSpec("RunMs", DELETION_COST, "Milliseconds", "whole invocation"),
    MetricSpec("RunFailures", DELETION_COST, "Count", "invocations that did not finish"),
    MetricSpec(
        "PodsByCostRange",
        DELETION_COST,
        "Count",
        "managed pods by cost range: warming, default, medium, high",
        ("range",),
    ),
    # The consolidator: one set per run.
    MetricSpec("PendingPods", CONSOLIDATOR, "Count", "Pending pods of the profile that no node fits, looked at"),
    MetricSpec("Plans", CONSOLIDATOR, "Count", "Pending pods a plan of moves was made for"),
    MetricSpec("NodesEmptied", CONSOLIDATOR, "Count", "nodes emptied for scale-down (EMPTY_NODES)"),
    MetricSpec("MovesPlanned", CONSOLIDATOR, "Count", "moves the run's plans hold"),
    MetricSpec("Evictions", CONSOLIDATOR, "Count", "pods evicted through the Eviction API"),
    MetricSpec("EvictionsRefused", CONSOLIDATOR, "Count", "evictions a PodDisruptionBudget refused (429)"),
    MetricSpec("HoldsKept", CONSOLIDATOR, "Count", "holds whose pod bound on the node held for it"),
    MetricSpec(
        "HoldsLapsed", CONSOLIDATOR, "Count", "holds that ended otherwise: deadline, pod gone or bound elsewhere"
    ),
    MetricSpec("RunMs", CONSOLIDATOR, "Milliseconds", "whole invocation"),
    MetricSpec("RunFailures", CONSOLIDATOR, "Count", "invocations that did not finish"),
)


def prometheus_name(item: MetricSpec, prefix: str = PROMETHEUS_PREFIX) -> str:
    """The Prometheus name of a catalogued metric (see the module docstring).

    >>> prometheus_name(spec("FilterLatencyMs", EXTENDER)), prometheus_name(spec("Unschedulable", EXTENDER))
    ('gpu_scheduler_extender_filter_latency_ms', 'gpu_scheduler_extender_unschedulable_total')
    """
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", item.name).lower()
    return f"{prefix}_{snake}" + ("_total" if item.unit == "Count" else "")


def prometheus_type(item: MetricSpec) -> str:
    """``counter``, ``histogram`` or ``gauge``, by the metric's unit."""
    return {"Count": "counter", "Milliseconds": "histogram"}.get(item.unit, "gauge")


def spec(name: str, service: str) -> MetricSpec:
    """The catalogued metric ``name`` of ``service``; KeyError names both when there is none."""
    for item in CATALOGUE:
        if item.name == name and item.service == service:
            return item
    raise KeyError(f"metric {name!r} of {service!r} is not in adapters/metric_catalogue.py")


def emitted(emf_documents: list[dict[str, object]]) -> set[tuple[str, str, tuple[str, ...]]]:
    """(name, unit, sorted dimensions) of every metric declared in EMF documents (one JSON line each)."""
    found = set()
    for doc in emf_documents:
        aws = doc["_aws"]
        assert isinstance(aws, dict)
        for directive in aws["CloudWatchMetrics"]:
            (dimensions,) = directive["Dimensions"]
            for metric in directive["Metrics"]:
                found.add((metric["Name"], metric["Unit"], tuple(sorted(dimensions))))
    return found


def markdown_table() -> str:
    """The catalogue as the table in ``docs/metrics.md`` (``python -m tools.docs`` writes it there, and a
    test keeps it identical)."""
    rows = ["| service | metric | unit | dimensions | meaning | `serve`'s `/metrics` |", "|---|---|---|---|---|---|"]
    for item in CATALOGUE:
        meaning = item.description + (f" (emitted once {item.planned} lands)" if item.planned else "")
        served = f"`{prometheus_name(item)}` ({prometheus_type(item)})" if item.service == EXTENDER else "-"
        dimensions = ", ".join(item.all_dimensions)
        rows.append(f"| {item.service} | `{item.name}` | {item.unit} | {dimensions} | {meaning} | {served} |")
    return "\n".join(rows) + "\n"


def emit_count(name: str, value: float, *, namespace: str, service: str, **dimension: str) -> None:
    """One EMF document for a count with one extra dimension (``reason=...``, ``kind=...``), apart from
    the invocation's metric set, whose dimensions are fixed."""
    from aws_lambda_powertools.metrics import MetricUnit, single_metric

    ((key, label),) = dimension.items()
    with single_metric(
        name=name, unit=MetricUnit.Count, value=value, namespace=namespace, default_dimensions={"service": service}
    ) as metric:
        metric.add_dimension(name=key, value=label)
