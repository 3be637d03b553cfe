"""Grafana dashboards for Amazon Managed Grafana, built with ``grafana-foundation-sdk`` and written as
JSON for import. Three dashboards, each panel a PromQL query over what AMP scrapes (``cdk/prometheus.py``):

- **scheduler**: attempts by result, scheduling latency p50/p90/p99, pending pods by queue, GPU pods
  pending over 10 minutes, errors;
- **GPU fleet**: GPUs allocatable/allocated/free/stranded, allocation ratio, stranded GPUs per node,
  utilisation per node, GPUs held but idle;
- **deletion costs**: the source's two panels, the distribution of ``pod-deletion-cost`` values and the
  count of pods by cost range, plus pods without a cost.

Every dashboard takes its Prometheus data source from a ``datasource`` variable, so it imports into any
workspace.
"""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.builders import bargauge, dashboard, histogram, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as models
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from cdk.prometheus import ALERTS, COST_LABEL, RANGE_LABEL, SCHEDULER_PROFILE

DATASOURCE = models.DataSourceRef(type_val="prometheus", uid="${datasource}")
_SCHED = f'profile="{SCHEDULER_PROFILE}"'


def _query(expr: str, legend: str = "", ref: str = "A", *, table: bool = False) -> prometheus.Dataquery:
    query = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DATASOURCE)
    if legend:
        query = query.legend_format(legend)
    if table:
        query = query.format(PromQueryFormat.TABLE).instant()
    return query


def _timeseries(title: str, unit: str, *queries: prometheus.Dataquery) -> timeseries.Panel:
    panel = timeseries.Panel().title(title).unit(unit).datasource(DATASOURCE).height(8).span(12)
    for query in queries:
        panel = panel.with_target(query)
    return panel


def _stat(title: str, expr: str, unit: str = "none") -> stat.Panel:
    return stat.Panel().title(title).unit(unit).datasource(DATASOURCE).height(4).span(6).with_target(_query(expr))


def _attempts(result: str) -> str:
    # Raw, not the recorded series with a matcher: tests evaluate recorded names by expanding them.
    return f'sum(rate(scheduler_schedule_attempts_total{{{_SCHED}, result="{result}"}}[5m]))'


def _dashboard(uid: str, title: str, description: str) -> dashboard.Dashboard:
    return (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["gpu-scheduler", "eks"])
        .refresh("1m")
        .time("now-6h", "now")
        .timezone("browser")
        .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
    )


def scheduler_dashboard() -> dashboard.Dashboard:
    pending_expr = ALERTS["GpuPodPendingTooLong"][0]
    quantile = (
        "histogram_quantile({q}, sum by (le) (rate(scheduler_scheduling_attempt_duration_seconds_bucket{{{s}}}[5m])))"
    )
    return (
        _dashboard("gpu-scheduler", "gpu-scheduler: scheduling", "Is the GPU scheduler placing pods, and how fast?")
        .with_row(dashboard.Row("Now"))
        .with_panel(_stat("Pods scheduled / s", _attempts("scheduled"), "reqps"))
        .with_panel(
            _stat(
                "Unschedulable attempts / s",
                _attempts("unschedulable"),
                "reqps",
            )
        )
        .with_panel(_stat("GPU pods pending > 10 min", f"count({pending_expr}) or vector(0)"))
        .with_panel(_stat("p99 scheduling latency", "gpu_scheduler:scheduling_attempt_duration_seconds:p99_5m", "s"))
        .with_row(dashboard.Row("Attempts and latency"))
        .with_panel(
            _timeseries(
                "Scheduling attempts by result", "reqps", _query("gpu_scheduler:schedule_attempts:rate5m", "{{result}}")
            )
        )
        .with_panel(
            _timeseries(
                "Scheduling attempt latency",
                "s",
                _query(quantile.format(q=0.5, s=_SCHED), "p50", "A"),
                _query(quantile.format(q=0.9, s=_SCHED), "p90", "B"),
                _query("gpu_scheduler:scheduling_attempt_duration_seconds:p99_5m", "p99", "C"),
            )
        )
        .with_panel(
            _timeseries(
                "Pending pods by queue",
                "short",
                _query('sum by (queue) (scheduler_pending_pods{job="gpu-scheduler"})', "{{queue}}"),
            )
        )
        .with_panel(
            _timeseries(
                "Scheduling errors / s",
                "reqps",
                _query(f'sum(rate(scheduler_schedule_attempts_total{{{_SCHED}, result="error"}}[5m]))', "errors"),
            )
        )
    )


def fleet_dashboard() -> dashboard.Dashboard:
    return (
        _dashboard(
            "gpu-fleet", "gpu-scheduler: GPU fleet", "Where are the GPUs, who holds them, and how many are stranded?"
        )
        .with_row(dashboard.Row("Totals"))
        .with_panel(_stat("GPUs allocatable", "sum(gpu_scheduler:node_gpus_allocatable)"))
        .with_panel(_stat("GPUs allocated", "sum(gpu_scheduler:node_gpus_allocated)"))
        .with_panel(_stat("GPUs stranded", "sum(gpu_scheduler:node_gpus_stranded) or vector(0)"))
        .with_panel(_stat("GPUs held but idle", f"count({ALERTS['GpusAllocatedButIdle'][0]}) or vector(0)"))
        .with_row(dashboard.Row("Allocation"))
        .with_panel(
            _timeseries(
                "Allocation ratio",
                "percentunit",
                _query(
                    "sum(gpu_scheduler:node_gpus_allocated) / sum(gpu_scheduler:node_gpus_allocatable)", "allocated"
                ),
            )
        )
        .with_panel(
            bargauge.Panel()
            .title("Stranded GPUs per node")
            .datasource(DATASOURCE)
            .height(8)
            .span(12)
            .with_target(_query("gpu_scheduler:node_gpus_stranded", "{{node}}", table=False))
        )
        .with_panel(
            _timeseries(
                "GPU utilisation per node",
                "percent",
                _query("gpu_scheduler:node_gpu_utilization:avg5m", "{{Hostname}}"),
            )
        )
        .with_panel(_timeseries("Free GPUs per node", "short", _query("gpu_scheduler:node_gpus_free", "{{node}}")))
    )


def deletion_cost_dashboard() -> dashboard.Dashboard:
    # The annotation is a label value: the table query returns it as a column, which Grafana turns into a
    # number and bins (the source's "distribution" panel).
    distribution = (
        histogram.Panel()
        .title("Deletion-cost distribution")
        .datasource(DATASOURCE)
        .height(9)
        .span(12)
        .with_target(_query(f'kube_pod_annotations{{{COST_LABEL}!=""}}', table=True))
        .with_transformation(
            models.DataTransformerConfig(
                id_val="convertFieldType",
                options={"conversions": [{"targetField": COST_LABEL, "destinationType": "number"}]},
            )
        )
        .with_transformation(
            models.DataTransformerConfig(
                id_val="organize",
                options={"includeByName": {COST_LABEL: True}},
            )
        )
    )
    return (
        _dashboard(
            "gpu-scheduler-deletion-costs",
            "gpu-scheduler: pod deletion costs",
            "Will a scale-down remove the right pods?",
        )
        .with_panel(distribution)
        .with_panel(
            _timeseries(
                "Pods by cost range",
                "short",
                _query(
                    f'count by ({RANGE_LABEL}) (kube_pod_annotations{{{RANGE_LABEL}!=""}})', f"{{{{{RANGE_LABEL}}}}}"
                ),
            )
        )
        .with_panel(_stat("Pods with a deletion cost", f'count(kube_pod_annotations{{{COST_LABEL}!=""}}) or vector(0)'))
    )


DASHBOARDS = {"scheduler": scheduler_dashboard, "gpu-fleet": fleet_dashboard, "deletion-costs": deletion_cost_dashboard}


def render(name: str) -> dict[str, Any]:
    """Dashboard ``name`` as the JSON model Grafana imports."""
    document: dict[str, Any] = json.loads(JSONEncoder(sort_keys=True, indent=2).encode(DASHBOARDS[name]().build()))
    return document


def expressions(document: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query in a rendered dashboard."""
    return [
        (panel.get("title", ""), target["expr"])
        for panel in document["panels"]
        for target in panel.get("targets") or []
        if "expr" in target
    ]
