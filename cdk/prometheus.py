"""What Amazon Managed Prometheus scrapes and evaluates: the managed scraper's configuration, and the
recording and alerting rules. Plain data (no CDK), so the tests can run it through a real Prometheus.

The exporters and their series, as the real ones name them:

- **the second kube-scheduler** (``gpu-scheduler`` pods, port 10259, ``/metrics`` made anonymous by
  ``--authorization-always-allow-paths``): ``scheduler_schedule_attempts_total{profile,result}``,
  ``scheduler_scheduling_attempt_duration_seconds_bucket{profile,result,le}``,
  ``scheduler_pending_pods{queue}``;
- **DCGM exporter** (port 9400): ``DCGM_FI_DEV_GPU_UTIL{gpu,UUID,modelName,Hostname,namespace,pod}``, with
  ``namespace``/``pod`` set while a pod holds the GPU; scraped only in its own namespace
  (``gpu-operator`` by default);
- **kube-state-metrics** (port 8080; only in its own namespace, ``kube-system`` by default), started with
  ``--metric-annotations-allowlist=pods=[controller.kubernetes.io/pod-deletion-cost]`` so that
  ``kube_pod_annotations`` carries ``annotation_controller_kubernetes_io_pod_deletion_cost``; also
  ``kube_node_status_allocatable``, ``kube_pod_container_resource_requests``, ``kube_pod_status_phase``,
  ``kube_pod_created``.

The scrape configuration relabels the deletion-cost annotation into ``deletion_cost_range`` with the same
ranges the deletion-cost refresher reports (``PodsByCostRange``), so the two views agree.

Each exporter's series are trusted for what they describe (GPU utilisation is 30 % of the score), so each
job discovers pods only in the exporter's own namespace: a pod elsewhere that carries the exporter's labels
and port is never scraped. No job sets ``honor_labels``: a label the scrape attaches wins over an exposed
one of the same name. The DCGM and kube-state-metrics jobs attach no ``namespace``/``pod`` labels of their
own, so the exporters' (the workload's, the described object's) come through as exposed; the exporter pod
is named by ``node`` and ``exporter_pod``.
"""

from __future__ import annotations

import re
from typing import Any

from scheduler_core.deletion_cost.policy import COST_RANGES as DELETION_COST_RANGES

SCHEDULER_PROFILE = "gpu-scheduler"
GPU = 'resource="nvidia_com_gpu"'
COST_LABEL = "annotation_controller_kubernetes_io_pod_deletion_cost"
RANGE_LABEL = "deletion_cost_range"
# A regex over the annotation's value for each of the refresher's ranges (scheduler_core.deletion_cost.
# COST_RANGES: warming < 0, default 0, medium 1..99, high >= 100); Prometheus anchors relabel regexes.
_RANGE_REGEX = {"warming": r"-[0-9]+", "default": r"0", "medium": r"[1-9][0-9]?", "high": r"[1-9][0-9]{2,}"}
COST_RANGES = tuple((name, _RANGE_REGEX[name]) for name, _, _ in DELETION_COST_RANGES)
KSM_FLAG = "--metric-annotations-allowlist=pods=[controller.kubernetes.io/pod-deletion-cost]"


def deletion_cost_relabelling() -> list[dict[str, Any]]:
    """``metric_relabel_configs`` adding ``deletion_cost_range`` to series carrying the annotation."""
    return [
        {"source_labels": [COST_LABEL], "regex": regex, "target_label": RANGE_LABEL, "replacement": name}
        for name, regex in COST_RANGES
    ]


DCGM_NAMESPACE = "gpu-operator"
KSM_NAMESPACE = "kube-system"
SCHEDULER_NAMESPACE = "kube-system"


def _pods_in(namespace: str) -> list[dict[str, Any]]:
    """Pod discovery limited to one namespace."""
    return [{"role": "pod", "namespaces": {"names": [namespace]}}]


def _keep_port(port: str) -> dict[str, Any]:
    return {"source_labels": ["__meta_kubernetes_pod_container_port_number"], "regex": port, "action": "keep"}


def _exporter_labels(*, pod_label: str) -> list[dict[str, Any]]:
    """Target labels naming the exporter pod: ``node``, and the pod as ``pod_label``."""
    return [
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": pod_label},
        {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"},
    ]


def scrape_configuration(
    *, interval_s: int = 30, dcgm_namespace: str = DCGM_NAMESPACE, ksm_namespace: str = KSM_NAMESPACE
) -> dict[str, Any]:
    """The managed scraper's Prometheus configuration: three jobs, each found by pod labels and port in its
    own namespace."""
    return {
        "global": {"scrape_interval": f"{interval_s}s"},
        "scrape_configs": [
            {
                "job_name": SCHEDULER_PROFILE,
                "kubernetes_sd_configs": _pods_in(SCHEDULER_NAMESPACE),
                "scheme": "https",
                # kube-scheduler serves a self-signed certificate; the scrape stays inside the VPC.
                "tls_config": {"insecure_skip_verify": True},
                "relabel_configs": [
                    {
                        "source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"],
                        "regex": SCHEDULER_PROFILE,
                        "action": "keep",
                    },
                    _keep_port("10259"),
                    {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                    *_exporter_labels(pod_label="pod"),
                ],
            },
            {
                "job_name": "dcgm-exporter",
                "kubernetes_sd_configs": _pods_in(dcgm_namespace),
                # The GPU operator labels its exporter app=nvidia-dcgm-exporter; the Helm chart uses
                # app.kubernetes.io/name=dcgm-exporter. Either is kept.
                "relabel_configs": [
                    {
                        "source_labels": [
                            "__meta_kubernetes_pod_label_app",
                            "__meta_kubernetes_pod_label_app_kubernetes_io_name",
                        ],
                        "regex": "nvidia-dcgm-exporter;.*|.*;dcgm-exporter",
                        "action": "keep",
                    },
                    _keep_port("9400"),
                    # namespace/pod on DCGM series are the workload holding the GPU: left as exposed.
                    *_exporter_labels(pod_label="exporter_pod"),
                ],
            },
            {
                "job_name": "kube-state-metrics",
                "kubernetes_sd_configs": _pods_in(ksm_namespace),
                # No target namespace/pod labels: ksm's own (the described object's) come through as they are.
                "relabel_configs": [
                    {
                        "source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"],
                        "regex": "kube-state-metrics",
                        "action": "keep",
                    },
                    _keep_port("8080"),
                ],
                "metric_relabel_configs": deletion_cost_relabelling(),
            },
        ],
    }


_LIVE = 'max by (namespace, pod) (kube_pod_status_phase{phase=~"Pending|Running"})'
RECORDING_RULES: dict[str, str] = {
    "gpu_scheduler:schedule_attempts:rate5m": (
        f'sum by (result) (rate(scheduler_schedule_attempts_total{{profile="{SCHEDULER_PROFILE}"}}[5m]))'
    ),
    "gpu_scheduler:scheduling_attempt_duration_seconds:p99_5m": (
        "histogram_quantile(0.99, sum by (le) (rate("
        f'scheduler_scheduling_attempt_duration_seconds_bucket{{profile="{SCHEDULER_PROFILE}"}}[5m])))'
    ),
    "gpu_scheduler:node_gpus_allocatable": f"sum by (node) (kube_node_status_allocatable{{{GPU}}})",
    # GPUs requested by pods bound to the node that have not finished.
    "gpu_scheduler:node_gpus_allocated": (
        f'sum by (node) (kube_pod_container_resource_requests{{{GPU}, node!=""}}'
        f" * on (namespace, pod) group_left () {_LIVE})"
    ),
    "gpu_scheduler:node_gpus_free": (
        "gpu_scheduler:node_gpus_allocatable - on (node)"
        " (gpu_scheduler:node_gpus_allocated or on (node) (0 * gpu_scheduler:node_gpus_allocatable))"
    ),
    # Free GPUs on nodes that are partly used: a whole-node job cannot have them.
    "gpu_scheduler:node_gpus_stranded": (
        "(gpu_scheduler:node_gpus_free > 0) and on (node) (gpu_scheduler:node_gpus_allocated > 0)"
    ),
    "gpu_scheduler:node_gpu_utilization:avg5m": "avg by (Hostname) (avg_over_time(DCGM_FI_DEV_GPU_UTIL[5m]))",
}

# name: (expression, for, severity, summary)
ALERTS: dict[str, tuple[str, str, str, str]] = {
    "GpuPodPendingTooLong": (
        "(time() - kube_pod_created) > 600"
        ' and on (namespace, pod) (kube_pod_status_phase{phase="Pending"} == 1)'
        f" and on (namespace, pod) (sum by (namespace, pod) (kube_pod_container_resource_requests{{{GPU}}}) > 0)",
        "1m",
        "warning",
        "GPU pod {{ $labels.namespace }}/{{ $labels.pod }} has been pending for over 10 minutes",
    ),
    "GpuSchedulerErrors": (
        f'sum(rate(scheduler_schedule_attempts_total{{profile="{SCHEDULER_PROFILE}", result="error"}}[5m])) > 0',
        "5m",
        "critical",
        "gpu-scheduler fails scheduling attempts with errors (extender unreachable or answering errors?)",
    ),
    "GpusAllocatedButIdle": (
        'avg by (Hostname, gpu, namespace, pod) (avg_over_time(DCGM_FI_DEV_GPU_UTIL{pod!=""}[30m])) < 5',
        "30m",
        "info",
        "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} is held by {{ $labels.namespace }}/{{ $labels.pod }}"
        " and under 5% busy for 30 minutes",
    ),
}


def rule_groups() -> dict[str, Any]:
    """The rule file AMP evaluates (``CfnRuleGroupsNamespace``), in Prometheus's format."""
    return {
        "groups": [
            {
                "name": "gpu-scheduler-recording",
                "interval": "1m",
                "rules": [{"record": name, "expr": expr} for name, expr in RECORDING_RULES.items()],
            },
            {
                "name": "gpu-scheduler-alerts",
                "rules": [
                    {
                        "alert": name,
                        "expr": expr,
                        "for": duration,
                        "labels": {"severity": severity},
                        "annotations": {"summary": summary},
                    }
                    for name, (expr, duration, severity, summary) in ALERTS.items()
                ],
            },
        ]
    }


def expand(expr: str) -> str:
    """``expr`` with every recorded series replaced by its definition, recursively: what a query returns
    before the rules have run (tests evaluate with this; dashboards may use either form).

    >>> expand("sum(gpu_scheduler:node_gpus_allocatable)")
    'sum((sum by (node) (kube_node_status_allocatable{resource="nvidia_com_gpu"})))'
    """
    pattern = re.compile("|".join(re.escape(name) for name in sorted(RECORDING_RULES, key=len, reverse=True)))
    previous = None
    while previous != expr:
        previous, expr = expr, pattern.sub(lambda m: f"({RECORDING_RULES[m.group(0)]})", expr)
    return expr
