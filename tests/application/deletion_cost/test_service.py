"""The deletion-cost refresher: 300 pods in 3 namespaces, the API double, a real Prometheus, moto SSM."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from adapters.amp import PrometheusClient
from adapters.kube import connect_url
from adapters.metric_catalogue import CATALOGUE, DELETION_COST
from application.deletion_cost import service
from application.deletion_cost.settings import DeletionCostSettings
from scheduler_core.deletion_cost.policy import CostConfig
from scheduler_core.deletion_cost.replicaset import scale_down_order
from scheduler_core.errors import ConfigError
from scheduler_core.k8s.names import (
    DELETION_COST_ANNOTATION,
    DISRUPTION_COST_ANNOTATION,
    DO_NOT_DISRUPT_ANNOTATION,
    DO_NOT_DISRUPT_OWNER,
)
from scheduler_core.simulator.synthetic import make_pod
from testing.kube_double import KubeApiDouble
from tests.conftest import FakeLambdaContext, assert_catalogued, prometheus_with, requires_prometheus

pytestmark = pytest.mark.server  # the API server double, Prometheus, moto

TOKEN = "cost-token"
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC).timestamp()
MANAGED = {"gpu-scheduler.io/deletion-cost": "managed"}
CONFIG = {
    "hysteresis": 10,
    "workloads": [
        {
            "namespace": "web",
            "selector": "app=frontend",
            "policy": "metrics",
            "queries": {
                "active_requests": 'sum by (namespace, pod) (app_active_requests{namespace="{namespace}"})',
                "cache_hit_rate": 'avg by (namespace, pod) (app_cache_hit_ratio{namespace="{namespace}"})',
                "avg_response_time_ms": 'avg by (namespace, pod) (app_latency_ms{pod=~"{pod}"})',
            },
        },
        {
            "namespace": "cache",
            "selector": "app=redis",
            "policy": "connections",
            "queries": {"active_connections": 'sum by (namespace, pod) (redis_connected_clients{namespace="cache"})'},
        },
        {"namespace": "batch", "selector": "app=loader", "policy": "static", "static_cost": 50},
    ],
}


def stamp(seconds_ago: float, now: float = NOW) -> str:
    return datetime.fromtimestamp(now - seconds_ago, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def web_metrics(i: int) -> tuple[float, float, float]:
    """Requests, hit rate and latency of web pod i: every latency band and the cap are covered."""
    return float(i * 3 % 250), (i % 11) / 10, [50.0, 100.0, 300.0, 500.0, 900.0][i % 5]


def expected_web(i: int) -> int:
    requests, hit, latency = web_metrics(i)
    bonus = 50 if latency < 100 else 20 if latency < 500 else 0
    return min(1000, math.floor(5 * requests) + math.floor(100 * min(hit, 1.0)) + bonus)


def build_pods(now: float = NOW) -> list[dict[str, Any]]:
    """100 pods per namespace, 90 managed; web pod 3 is young, web 4 not ready; web and cache 5-7 have no metrics."""
    pods = []
    for namespace, app in (("web", "frontend"), ("cache", "redis"), ("batch", "loader")):
        for i in range(100):
            pod = make_pod(f"{app}-{i:03d}", 0, namespace=namespace, node_name="node-1", phase="Running")
            pod["metadata"]["labels"] = {"app": app, **(MANAGED if i < 90 else {})}
            pod["metadata"]["creationTimestamp"] = stamp(3600, now)
            ready = "False" if (namespace, i) == ("web", 4) else "True"
            pod["status"] |= {
                "startTime": stamp(10 if (namespace, i) == ("web", 3) else 3600, now),
                "conditions": [{"type": "Ready", "status": ready}],
            }
            pods.append(pod)
    return pods


def series() -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    names = ("app_active_requests", "app_cache_hit_ratio", "app_latency_ms", "redis_connected_clients")
    families: dict[str, dict[tuple[tuple[str, str], ...], float]] = {name: {} for name in names}
    for i in range(100):
        if i in (5, 6, 7):
            continue
        labels = (("namespace", "web"), ("pod", f"frontend-{i:03d}"))
        requests, hit, latency = web_metrics(i)
        families["app_active_requests"][labels] = requests
        families["app_cache_hit_ratio"][labels] = hit
        families["app_latency_ms"][labels] = latency
        families["redis_connected_clients"][(("namespace", "cache"), ("pod", f"redis-{i:03d}"))] = float(i * 7)
    return families


def expected_costs() -> dict[str, int | None]:
    costs: dict[str, int | None] = {}
    for i in range(90):
        costs[f"web/frontend-{i:03d}"] = (
            -50 if i == 3 else -100 if i == 4 else None if i in (5, 6, 7) else expected_web(i)
        )
        costs[f"cache/redis-{i:03d}"] = None if i in (5, 6, 7) else min(1000, 10 * i * 7)
        costs[f"batch/loader-{i:03d}"] = 50
    return costs


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with prometheus_with(series(), tmp_path_factory.mktemp("prometheus")) as url:
        yield url


@pytest.fixture
def api() -> Iterator[KubeApiDouble]:
    with KubeApiDouble(tokens=[TOKEN]) as double:
        double.load("pods", build_pods())
        yield double


class FakeTime:
    def __init__(self) -> None:
        self.t = 0.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


def run(api: KubeApiDouble, amp_url: str | None, *, config: Any = CONFIG, time_left: float = 900.0,
        fake: FakeTime | None = None, **settings: Any) -> service.RunReport:  # fmt: skip
    settings.setdefault("passes", 1)
    settings.setdefault("max_patches_per_run", 1000)
    fake = fake or FakeTime()
    services = service.CostServices(
        kube=connect_url(api.url, TOKEN, sleep=lambda _s: None),
        prometheus=PrometheusClient(amp_url, timeout_s=5) if amp_url else None,
        config=lambda: CostConfig.from_json(config),
    )
    return service.refresh(
        DeletionCostSettings(kube_api_url=api.url, **settings), services,
        time_left=lambda: time_left - fake.t, now=lambda: NOW, clock=fake.clock, sleep=fake.sleep,
    )  # fmt: skip


def annotations(api: KubeApiDouble, key: str = DELETION_COST_ANNOTATION) -> dict[str, str | None]:
    return {
        f"{p['metadata']['namespace']}/{p['metadata']['name']}": (p["metadata"].get("annotations") or {}).get(key)
        for p in api.objects("pods")
    }


@requires_prometheus
def test_costs_are_written_once_and_only_on_managed_pods(api: KubeApiDouble, prometheus: str) -> None:
    report = run(api, prometheus)
    assert report.status == "ok", report.error
    (only,) = report.passes
    assert only.pods_seen == 270 and only.query_failures == 0
    assert only.metrics_missing == 6  # web and cache 5-7 have no series: their costs are left alone
    expected = expected_costs()
    written = annotations(api)
    for key, cost in expected.items():
        assert written[key] == (None if cost is None else str(cost)), key
    unmanaged = [key for key in written if int(key[-3:]) >= 90]
    assert all(written[key] is None for key in unmanaged)
    assert not [r for r in api.writes() if int(r.path[-3:]) >= 90]
    assert only.cost_patches == 264 and len(api.writes()) == 264
    patch = json.loads(api.writes()[0].body)
    cost = patch["metadata"]["annotations"][DELETION_COST_ANNOTATION]
    assert patch == {"metadata": {"annotations": {DELETION_COST_ANNOTATION: cost}}}
    assert {r.content_type for r in api.writes()} == {"application/merge-patch+json"}
    assert sum(only.cost_ranges.values()) == 270 and only.cost_ranges["warming"] == 2

    again = run(api, prometheus)
    assert again.passes[0].cost_patches == 0 and again.passes[0].cost_unchanged == 264
    assert len(api.writes()) == 264


@requires_prometheus
def test_hysteresis_holds_and_invalid_values_are_replaced(api: KubeApiDouble, prometheus: str) -> None:
    run(api, prometheus)
    target = expected_costs()
    near, far, bad = "frontend-010", "frontend-011", "frontend-012"
    for name, value in ((near, str(target[f"web/{near}"] + 9)), (far, str(target[f"web/{far}"] + 10)), (bad, "007")):
        pod = api.get("pods", name, "web")
        pod["metadata"]["annotations"][DELETION_COST_ANNOTATION] = value
        api.load("pods", [pod])
    api.requests.clear()
    report = run(api, prometheus)
    assert report.passes[0].cost_patches == 2
    written = annotations(api)
    assert written[f"web/{near}"] == str(target[f"web/{near}"] + 9)  # moved by 9 < 10: kept
    assert written[f"web/{far}"] == str(target[f"web/{far}"])
    assert written[f"web/{bad}"] == str(target[f"web/{bad}"])  # "007" is not canonical: rewritten


@requires_prometheus
def test_a_scale_down_by_three_removes_the_three_lowest_value_pods(api: KubeApiDouble, prometheus: str) -> None:
    run(api, prometheus)
    web = [
        p for p in api.objects("pods") if p["metadata"]["namespace"] == "web" and int(p["metadata"]["name"][-3:]) < 90
    ]
    victims = [p["metadata"]["name"] for p in scale_down_order(web, NOW)[:3]]
    # Not ready goes first whatever its cost, then the lowest costs: the young pod (-50), then the
    # pods without metrics (no annotation counts as 0) before any positive cost.
    assert victims[0] == "frontend-004"
    assert victims[1] == "frontend-003"
    assert victims[2] in {"frontend-005", "frontend-006", "frontend-007"}


def test_dry_run_writes_nothing(api: KubeApiDouble) -> None:
    report = run(api, None, dry_run=True)
    assert report.passes[0].planned == 90 + 2  # without AMP: batch's static 90, and web's two overrides
    assert api.writes() == []


def test_the_write_budget_and_qps_are_honoured(api: KubeApiDouble) -> None:
    fake = FakeTime()
    report = run(api, None, fake=fake, max_patches_per_run=40, patch_qps=20)
    assert report.passes[0].cost_patches == 40 and report.passes[0].deferred == 52
    assert len(api.writes()) == 40
    assert sum(fake.slept) == pytest.approx(39 / 20)  # 20 writes per second, the first one at once


def test_passes_are_interval_apart_and_stop_before_the_deadline(api: KubeApiDouble) -> None:
    fake = FakeTime()
    report = run(api, None, fake=fake, passes=2, interval_s=30, patch_qps=1000)
    assert len(report.passes) == 2 and report.passes_skipped == 0
    assert sum(fake.slept) == pytest.approx(30)  # pacing plus the wait: the second pass starts 30 s in
    assert report.passes[1].cost_patches == 0  # the first pass did it all

    short = run(api, None, fake=FakeTime(), passes=3, interval_s=30, time_left=30)
    assert len(short.passes) == 1 and short.passes_skipped == 2


def test_pods_that_change_mid_run(api: KubeApiDouble) -> None:
    api.fail_next("PATCH", r"/namespaces/batch/pods/loader-000$", 404)
    api.fail_next("PATCH", r"/namespaces/batch/pods/loader-001$", 409)
    api.fail_next("PATCH", r"/namespaces/batch/pods/loader-002$", 422)
    report = run(api, None)
    (only,) = report.passes
    assert only.pods_gone == 1 and only.patch_failures == 1
    assert annotations(api)["batch/loader-001"] == "50"  # retried once after a fresh read
    reads = [r for r in api.requests if r.method == "GET" and r.path.endswith("/loader-001")]
    assert len(reads) == 1
    assert annotations(api)["batch/loader-002"] is None


def test_finished_and_terminating_pods_are_left_alone(api: KubeApiDouble) -> None:
    done = api.get("pods", "loader-000", "batch")
    done["status"]["phase"] = "Succeeded"
    going = api.get("pods", "loader-001", "batch")
    going["metadata"]["deletionTimestamp"] = stamp(1)
    api.load("pods", [done, going])
    report = run(api, None)
    assert report.passes[0].pods_seen == 268
    assert annotations(api)["batch/loader-000"] is None and annotations(api)["batch/loader-001"] is None


def test_failed_queries_keep_costs_and_are_counted(api: KubeApiDouble) -> None:
    report = run(api, "http://127.0.0.1:9")
    assert report.status == "ok" and report.passes[0].query_failures == 4
    assert report.passes[0].metrics_missing == 90 - 2 + 90  # web (but for the overrides) and cache


def test_a_bad_config_fails_the_run_naming_the_field(api: KubeApiDouble) -> None:
    bad = {"workloads": [{"namespace": "web", "policy": "metrics", "cap": 2**40, "queries": {"nope": "up"}}]}
    report = run(api, None, config=bad)
    assert report.status == "failed"
    assert "workloads[0].queries.nope" in report.error and "workloads[0].cap" in report.error
    assert api.writes() == []


def test_config_from_ssm_keeps_the_last_good_version(monkeypatch: pytest.MonkeyPatch, aws_session: Any) -> None:
    ssm = aws_session.client("ssm")
    ssm.put_parameter(Name="/gpu-scheduler/deletion-cost", Value=json.dumps(CONFIG), Type="String")
    settings = DeletionCostSettings(kube_api_url="http://x", config_parameter="/gpu-scheduler/deletion-cost")
    load = service.config_loader(settings)
    assert [w.namespace for w in load().workloads] == ["web", "cache", "batch"]
    ssm.put_parameter(Name="/gpu-scheduler/deletion-cost", Value="{not json", Type="String", Overwrite=True)
    from aws_lambda_powertools.utilities import parameters

    parameters.clear_caches()
    assert [w.namespace for w in load().workloads] == ["web", "cache", "batch"]  # the last good one
    parameters.clear_caches()
    with pytest.raises(ConfigError, match="is not JSON"):
        service.config_loader(settings)()  # a fresh loader has no last good version to keep


def test_lambda_handler_emits_counts_and_the_cost_histogram(
    api: KubeApiDouble, fresh_handler: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    api.load("pods", build_pods(time.time()))  # the handler runs on the real clock
    handler = fresh_handler(
        "lambdas.deletion_cost.handler",
        KUBE_API_URL=api.url,
        KUBE_TOKEN=TOKEN,
        PASSES="1",
        DELETION_COST_CONFIG=json.dumps(CONFIG),
    )

    class Context(FakeLambdaContext):
        def get_remaining_time_in_millis(self) -> int:
            return 60_000

    summary = handler.lambda_handler({"source": "aws.events"}, Context())
    assert summary["status"] == "ok", summary
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line]
    main = next(d for d in docs if "PodsSeen" in d)
    value = {k: v[0] if isinstance(v, list) else v for k, v in main.items()}
    assert value["PodsSeen"] == 270 and value["CostPatches"] == 92 and value["RunFailures"] == 0
    ranges = {d["range"]: d["PodsByCostRange"] for d in docs if "PodsByCostRange" in d}
    ranges = {k: v[0] if isinstance(v, list) else v for k, v in ranges.items()}
    assert set(ranges) == {"warming", "default", "medium", "high"} and sum(ranges.values()) == 270
    assert assert_catalogued(docs, DELETION_COST) == {m.name for m in CATALOGUE if m.service == DELETION_COST}


def karpenter(gates: str) -> dict[str, Any]:
    """Karpenter's Deployment as its Helm chart writes it, with these ``FEATURE_GATES``."""
    env = [{"name": "FEATURE_GATES", "value": gates}, {"name": "LOG_LEVEL", "value": "info"}]
    container = {"name": "controller", "image": "public.ecr.aws/karpenter/controller:1.14.1", "env": env}
    return {"metadata": {"name": "karpenter", "namespace": "kube-system"},
            "spec": {"template": {"spec": {"containers": [container]}}}}  # fmt: skip


def test_under_karpenters_pod_deletion_cost_management_costs_go_to_its_disruption_cost(api: KubeApiDouble) -> None:
    api.load("deployments", [karpenter("NodeRepair=false,PodDeletionCostManagement=true")])
    (on,) = run(api, None).passes
    assert on.cost_annotation == DISRUPTION_COST_ANNOTATION and on.cost_patches == 92
    assert annotations(api, DISRUPTION_COST_ANNOTATION)["batch/loader-000"] == "50"
    assert annotations(api, DISRUPTION_COST_ANNOTATION)["web/frontend-004"] == "-100"
    assert set(annotations(api).values()) == {None}  # pod-deletion-cost is Karpenter's now: never written
    assert run(api, None).passes[0].cost_patches == 0  # read back from where they went: nothing to do
    # The gate off: the usual annotation, as before Karpenter was looked at.
    api.load("deployments", [karpenter("PodDeletionCostManagement=false")])
    (off,) = run(api, None).passes
    assert off.cost_annotation == DELETION_COST_ANNOTATION and off.cost_patches == 92
    assert annotations(api)["batch/loader-000"] == "50"


def test_a_karpenter_deployment_that_cannot_be_read_fails_the_pass_and_writes_nothing(api: KubeApiDouble) -> None:
    api.fail_next("GET", r"/deployments/karpenter$", 403)
    report = run(api, None)
    assert report.status == "failed" and "Karpenter's Deployment kube-system/karpenter" in report.error
    assert api.writes() == []
    assert run(api, None).passes[0].cost_annotation == DELETION_COST_ANNOTATION  # none there (404): the usual one
    assert not [r for r in api.requests if "deployments" in r.path and r.method != "GET"]
    before = len([r for r in api.requests if "deployments" in r.path])
    assert run(api, None, karpenter_deployment="").status == "ok"  # never looked for
    assert len([r for r in api.requests if "deployments" in r.path]) == before


def test_pods_at_the_threshold_carry_do_not_disrupt_and_lose_only_the_refreshers_own(api: KubeApiDouble) -> None:
    guarded_by_hand = api.get("pods", "loader-010", "batch")
    guarded_by_hand["metadata"].setdefault("annotations", {})[DO_NOT_DISRUPT_ANNOTATION] = "30m"
    api.load("pods", [guarded_by_hand])
    (first,) = run(api, None, do_not_disrupt_from=40).passes
    assert first.guards_set == 89  # batch's 90 at 50, but the one guarded by hand
    guards, owners = annotations(api, DO_NOT_DISRUPT_ANNOTATION), annotations(api, DO_NOT_DISRUPT_OWNER)
    assert guards["batch/loader-000"] == "true" and owners["batch/loader-000"] == "deletion-cost"
    assert guards["batch/loader-010"] == "30m" and owners["batch/loader-010"] is None
    assert guards["web/frontend-003"] is None  # -50: cheap to lose
    (again,) = run(api, None, do_not_disrupt_from=40).passes
    assert again.guards_set == again.guards_cleared == 0
    (raised,) = run(api, None, do_not_disrupt_from=60).passes
    assert raised.guards_cleared == 89 and raised.guards_set == 0
    guards, owners = annotations(api, DO_NOT_DISRUPT_ANNOTATION), annotations(api, DO_NOT_DISRUPT_OWNER)
    assert guards["batch/loader-000"] is None and owners["batch/loader-000"] is None
    assert guards["batch/loader-010"] == "30m"  # someone else's: never touched
