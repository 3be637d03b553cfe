"""Every PromQL expression in the AMP rules and the Grafana dashboards parses, passes promtool, and returns
sensible data from a real Prometheus holding series shaped like the real exporters' output; the scrape
configuration's deletion-cost relabelling is checked by a real Prometheus scraping an exporter."""

from __future__ import annotations

import http.server
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from adapters.amp import PrometheusClient
from cdk.grafana import DASHBOARDS, expressions, render
from cdk.prometheus import (
    ALERTS,
    COST_LABEL,
    KSM_FLAG,
    RANGE_LABEL,
    RECORDING_RULES,
    expand,
    rule_groups,
    scrape_configuration,
)
from manifests.scheduler import dump_yaml
from testing.prometheus import PROMTOOL
from tests.conftest import prometheus_with, requires_prometheus

pytestmark = pytest.mark.server  # promtool and a real Prometheus

NOW = time.time()
PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")


def _labels(**labels: str) -> tuple[tuple[str, str], ...]:
    return tuple(labels.items())


def _pod_phase(namespace: str, pod: str, phase: str) -> dict[tuple[tuple[str, str], ...], float]:
    """kube-state-metrics writes one series per phase, 1 for the current one."""
    return {_labels(namespace=namespace, pod=pod, uid=f"uid-{pod}", phase=p): float(p == phase) for p in PHASES}


def _gpu(index: str, uuid: str, hostname: str, **pod: str) -> tuple[tuple[str, str], ...]:
    """The DCGM exporter's labels for GPU ``index`` of ``hostname``, and the pod using it (if any)."""
    return _labels(
        gpu=index, UUID=uuid, device=f"nvidia{index}", modelName="NVIDIA A100-SXM4-80GB", Hostname=hostname, **pod
    )


def _cluster() -> dict[str, Any]:
    """Two 8-GPU nodes. gpu-a: trainer-0 (4 GPUs, busy) and trainer-1 (2 GPUs, idle); gpu-b: only a
    finished pod. waiting-0 wants 8 GPUs and has been pending for 20 minutes."""
    return {**_scheduler_series(), **_gpu_series(), **_pod_series()}


def _scheduler_series() -> dict[str, Any]:
    """The second kube-scheduler's own metrics, and another profile's that the expressions must leave out."""
    sched = {"profile": "gpu-scheduler"}
    buckets = {"0.001": 0.2, "0.01": 1.0, "0.1": 1.9, "1": 2.0, "+Inf": 2.0}  # attempts per second at or under le
    return {
        "scheduler_schedule_attempts_total": {
            _labels(**sched, result="scheduled"): (100.0, 2.0),
            _labels(**sched, result="unschedulable"): (10.0, 0.5),
            _labels(**sched, result="error"): (0.0, 0.1),
            _labels(profile="default-scheduler", result="scheduled"): (0.0, 50.0),  # not ours
        },
        "scheduler_scheduling_attempt_duration_seconds_bucket": {
            _labels(**sched, result="scheduled", le=le): (0.0, rate) for le, rate in buckets.items()
        },
        "scheduler_pending_pods": {
            _labels(job="gpu-scheduler", queue=queue): float(n)
            for queue, n in {"active": 0, "backoff": 1, "unschedulable": 3, "gated": 0}.items()
        },
    }


def _gpu_series() -> dict[str, Any]:
    """The DCGM exporter's utilisation of three GPUs (two of them in use) and the nodes' allocatable GPUs."""
    return {
        "DCGM_FI_DEV_GPU_UTIL": {
            _gpu("0", "GPU-0a", "gpu-a", namespace="ml", pod="trainer-0", container="main"): 85.0,
            _gpu("4", "GPU-4a", "gpu-a", namespace="ml", pod="trainer-1", container="main"): 2.0,
            _gpu("0", "GPU-0b", "gpu-b"): 0.0,
        },
        "kube_node_status_allocatable": {
            **{_labels(node=n, resource="nvidia_com_gpu", unit="integer"): 8.0 for n in ("gpu-a", "gpu-b")},
            _labels(node="gpu-a", resource="cpu", unit="core"): 96.0,
        },
    }


def _pod_series() -> dict[str, Any]:
    """kube-state-metrics' view of the four pods: GPU requests, phases, creation times and the deletion-cost
    annotations the refresher wrote."""
    requests = {
        ("trainer-0", "gpu-a", 4), ("trainer-1", "gpu-a", 2), ("done-0", "gpu-b", 8), ("waiting-0", "", 8),
    }  # fmt: skip
    phases = {"trainer-0": "Running", "trainer-1": "Running", "done-0": "Succeeded", "waiting-0": "Pending"}
    costs = {"trainer-0": ("250", "high"), "trainer-1": ("35", "medium"), "waiting-0": ("-50", "warming")}
    return {
        "kube_pod_container_resource_requests": {
            _labels(
                namespace="ml",
                pod=pod,
                uid=f"uid-{pod}",
                container="main",
                node=node,
                resource="nvidia_com_gpu",
                unit="integer",
            ): float(gpus)
            for pod, node, gpus in requests
        },
        "kube_pod_status_phase": {
            k: v for pod, phase in phases.items() for k, v in _pod_phase("ml", pod, phase).items()
        },
        "kube_pod_created": {_labels(namespace="ml", pod=p, uid=f"uid-{p}"): NOW - 1200 for p in phases},
        "kube_pod_annotations": {
            _labels(namespace="ml", pod=pod, uid=f"uid-{pod}", **{COST_LABEL: cost, RANGE_LABEL: name}): 1.0
            for pod, (cost, name) in costs.items()
        },
    }


def all_expressions() -> list[tuple[str, str]]:
    found = [(f"record {name}", expr) for name, expr in RECORDING_RULES.items()]
    found += [(f"alert {name}", expr) for name, (expr, *_) in ALERTS.items()]
    for dashboard in DASHBOARDS:
        found += [(f"{dashboard}: {title}", expr) for title, expr in expressions(render(dashboard))]
    return found


EXPRESSIONS = all_expressions()


@pytest.mark.parametrize(("where", "expr"), EXPRESSIONS, ids=[w for w, _ in EXPRESSIONS])
def test_every_expression_parses(where: str, expr: str) -> None:
    promql_parser.parse(expr)


def test_the_parser_rejects_what_prometheus_would() -> None:
    with pytest.raises(ValueError, match="parenthesis"):
        promql_parser.parse("sum(rate(x[5m])")


@requires_prometheus
def test_promtool_accepts_the_rule_file(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(dump_yaml(rule_groups()))
    result = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(RECORDING_RULES) + len(ALERTS)} rules found" in result.stdout


@requires_prometheus
def test_promtool_accepts_the_scrape_configuration(tmp_path: Path) -> None:
    """Debian builds Prometheus without Kubernetes service discovery, so promtool checks everything else
    (relabelling, TLS, scheme) with a static target in place of ``kubernetes_sd_configs``."""
    scrape = scrape_configuration()
    for job in scrape["scrape_configs"]:
        (sd,) = job.pop("kubernetes_sd_configs")
        assert sd["role"] == "pod"
        job["static_configs"] = [{"targets": ["127.0.0.1:9"]}]
    config = tmp_path / "scrape.yaml"
    config.write_text(dump_yaml(scrape))
    result = subprocess.run([PROMTOOL, "check", "config", str(config)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusClient]:
    with prometheus_with(_cluster(), tmp_path_factory.mktemp("prometheus"), minutes=40) as url:
        yield PrometheusClient(url)


def test_recorded_series_are_used_without_matchers() -> None:
    """A recorded name with a matcher cannot be expanded into its definition for evaluation here."""
    for where, expr in EXPRESSIONS:
        assert not re.search(r"gpu_scheduler:[a-z0-9_:]+\{", expr), where


def _query(client: PrometheusClient, expr: str) -> dict[str, float]:
    """Instant query (recorded series expanded, as before the rules first run), keyed by a label summary."""
    samples = client.query(expand(expr), at=time.time() - 30)
    return {",".join(f"{k}={v}" for k, v in sorted(s.labels.items())): s.value for s in samples}


@requires_prometheus
@pytest.mark.parametrize(("where", "expr"), EXPRESSIONS, ids=[w for w, _ in EXPRESSIONS])
def test_every_expression_returns_data(prometheus: PrometheusClient, where: str, expr: str) -> None:
    assert _query(prometheus, expr), f"{where}: no data for {expand(expr)}"


@requires_prometheus
def test_the_values_are_the_ones_the_cluster_implies(prometheus: PrometheusClient) -> None:
    q = lambda expr: _query(prometheus, expr)  # noqa: E731
    assert q("gpu_scheduler:node_gpus_allocatable") == {"node=gpu-a": 8, "node=gpu-b": 8}
    # The finished pod's 8 GPUs and the pending pod's (no node) are not allocated.
    assert q("gpu_scheduler:node_gpus_allocated") == {"node=gpu-a": 6, "node=gpu-b": 0}
    assert q("gpu_scheduler:node_gpus_free") == {"node=gpu-a": 2, "node=gpu-b": 8}
    assert q("gpu_scheduler:node_gpus_stranded") == {"node=gpu-a": 2}
    attempts = q("gpu_scheduler:schedule_attempts:rate5m")
    assert attempts == pytest.approx({"result=scheduled": 2.0, "result=unschedulable": 0.5, "result=error": 0.1})
    # 99 % of 2.0/s is 1.98/s: between the 0.1 s (1.9/s) and 1 s (2.0/s) buckets, 80 % of the way.
    (p99,) = q("gpu_scheduler:scheduling_attempt_duration_seconds:p99_5m").values()
    assert p99 == pytest.approx(0.1 + 0.9 * 0.8)
    assert list(q(ALERTS["GpuPodPendingTooLong"][0])) == ["namespace=ml,pod=waiting-0,uid=uid-waiting-0"]
    assert list(q(ALERTS["GpusAllocatedButIdle"][0])) == ["Hostname=gpu-a,gpu=4,namespace=ml,pod=trainer-1"]
    assert q(ALERTS["GpuSchedulerErrors"][0]) == pytest.approx({"": 0.1})
    ranges = q(f'count by ({RANGE_LABEL}) (kube_pod_annotations{{{RANGE_LABEL}!=""}})')
    assert ranges == {f"{RANGE_LABEL}=high": 1, f"{RANGE_LABEL}=medium": 1, f"{RANGE_LABEL}=warming": 1}


class _KubeStateMetrics(http.server.BaseHTTPRequestHandler):
    """kube-state-metrics' exposition of kube_pod_annotations, as with the allowlist flag set."""

    COSTS = ("-100", "-1", "0", "1", "99", "100", "1000", "2147483647")

    def do_GET(self) -> None:
        lines = ["# HELP kube_pod_annotations Kubernetes annotations converted to Prometheus labels.",
                 "# TYPE kube_pod_annotations gauge"]  # fmt: skip
        lines += [f'kube_pod_annotations{{namespace="ml",pod="p{i}",uid="u{i}",{COST_LABEL}="{c}"}} 1'
                  for i, c in enumerate(self.COSTS)]  # fmt: skip
        lines.append('kube_pod_annotations{namespace="ml",pod="unannotated",uid="u"} 1')
        body = ("\n".join(lines) + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@requires_prometheus
def test_the_scrape_relabelling_puts_each_cost_in_the_refreshers_range(tmp_path: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _KubeStateMetrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (ksm_job,) = [j for j in scrape_configuration()["scrape_configs"] if j["job_name"] == "kube-state-metrics"]
    job = {
        "job_name": "kube-state-metrics",
        "scrape_interval": "1s",
        "static_configs": [{"targets": [f"127.0.0.1:{server.server_address[1]}"]}],
        "metric_relabel_configs": ksm_job["metric_relabel_configs"],  # exactly what the scraper applies
    }
    config = yaml.safe_dump({"global": {"scrape_interval": "1s"}, "scrape_configs": [job]})
    try:
        with prometheus_with({}, tmp_path, config=config) as url:
            client = PrometheusClient(url)
            deadline = time.monotonic() + 20
            while not (samples := client.query("kube_pod_annotations")) and time.monotonic() < deadline:
                time.sleep(0.5)
    finally:
        server.shutdown()
    assert "honor_labels" not in ksm_job
    # Without honor_labels, ksm's own namespace/pod (the described pod's) still come through as exposed.
    assert {(s.labels.get("namespace"), "exported_namespace" in s.labels) for s in samples} == {("ml", False)}
    got = {s.labels.get(COST_LABEL, ""): s.labels.get(RANGE_LABEL, "") for s in samples}
    assert got == {
        "-100": "warming", "-1": "warming", "0": "default", "1": "medium", "99": "medium",
        "100": "high", "1000": "high", "2147483647": "high", "": "",
    }  # fmt: skip


def test_the_kube_state_metrics_flag_names_the_annotation() -> None:
    assert KSM_FLAG == "--metric-annotations-allowlist=pods=[controller.kubernetes.io/pod-deletion-cost]"
    assert (
        "annotation_"
        + "controller.kubernetes.io/pod-deletion-cost".replace(".", "_").replace("/", "_").replace("-", "_")
        == COST_LABEL
    )


def _jobs(**namespaces: str) -> dict[str, dict[str, Any]]:
    return {job["job_name"]: job for job in scrape_configuration(**namespaces)["scrape_configs"]}


def test_each_exporter_is_discovered_only_in_its_own_namespace() -> None:
    jobs = _jobs()
    namespaces = {
        name: [sd["namespaces"]["names"] for sd in job["kubernetes_sd_configs"]] for name, job in jobs.items()
    }
    assert namespaces == {
        "gpu-scheduler": [["kube-system"]],
        "dcgm-exporter": [["gpu-operator"]],
        "kube-state-metrics": [["kube-system"]],
    }
    moved = _jobs(dcgm_namespace="nvidia", ksm_namespace="monitoring")
    assert moved["dcgm-exporter"]["kubernetes_sd_configs"] == [{"role": "pod", "namespaces": {"names": ["nvidia"]}}]
    assert moved["kube-state-metrics"]["kubernetes_sd_configs"][0]["namespaces"] == {"names": ["monitoring"]}


def test_no_job_lets_a_target_override_the_labels_the_scrape_attaches() -> None:
    for name, job in _jobs().items():
        assert "honor_labels" not in job, name
    # DCGM's namespace/pod name the workload holding the GPU, ksm's the described object: the scrape sets
    # neither, so an exposed value is never renamed to exported_namespace/exported_pod.
    for name in ("dcgm-exporter", "kube-state-metrics"):
        targets = {r.get("target_label") for r in _jobs()[name]["relabel_configs"]}
        assert not targets & {"namespace", "pod"}, name
    assert {r.get("target_label") for r in _jobs()["dcgm-exporter"]["relabel_configs"]} >= {"node", "exporter_pod"}
