"""The consolidator's run against the API server double (``testing/kube_double.py``), which serves the
Eviction API as the real one answers it (404, 409 on a UID precondition, 429 from a budget), with the
holds in a file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from adapters.holds_source import HoldsSource, read_book
from adapters.kube import connect_url
from adapters.metric_catalogue import CATALOGUE, CONSOLIDATOR
from adapters.snapshot_store import FileSnapshotStore
from application.consolidation import service
from application.consolidation.settings import ConsolidationSettings
from scheduler_core.consolidation.holds import Hold, HoldBook, hold_refusals
from scheduler_core.errors import ConfigError
from scheduler_core.k8s.pods import PodDemand
from testing.kube_double import KubeApiDouble
from tests.conftest import FakeLambdaContext, assert_catalogued
from tests.scheduler_core.consolidation.conftest import gpu_node, gpu_pod

pytestmark = pytest.mark.server  # the API server double

TOKEN = "consolidator-token"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
NOW = 1_800_000_000.0


def cluster() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Three 8-GPU nodes: a with 5 movable pods, b with 2 movable ones, c with 5 that may not move; one
    Pending 8-GPU pod: the plan empties b."""
    nodes = [gpu_node("a"), gpu_node("b"), gpu_node("c")]
    pods = [*(gpu_pod(f"a{i}", "a", owner="train") for i in range(5)),
            gpu_pod("b0", "b", owner="infer"), gpu_pod("b1", "b", owner="infer"),
            *(gpu_pod(f"c{i}", "c", movable=False) for i in range(5)),
            gpu_pod("big", gpus=8, owner="", pending=True)]  # fmt: skip
    return nodes, pods


@pytest.fixture
def api() -> Iterator[KubeApiDouble]:
    with KubeApiDouble(tokens=[TOKEN]) as double:
        nodes, pods = cluster()
        double.load("nodes", nodes)
        double.load("pods", pods)
        yield double


class Clock:
    def __init__(self) -> None:
        self.t = NOW
        self.slept: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


def run(api: KubeApiDouble, holds: Path | None, clock: Clock | None = None, **settings: Any) -> service.RunReport:
    clock = clock or Clock()
    config = ConsolidationSettings(kube_api_url=api.url, holds_uri=str(holds) if holds else "", **settings)
    services = service.Services(
        connect_url(api.url, TOKEN, sleep=lambda _s: None), FileSnapshotStore(holds) if holds else None
    )
    return service.consolidate(config, services, time_left=lambda: 60.0, now=clock.now, sleep=clock.sleep)


def names(api: KubeApiDouble) -> set[str]:
    return {p["metadata"]["name"] for p in api.objects("pods")}


def test_a_dry_run_plans_and_changes_nothing(api: KubeApiDouble, tmp_path: Path):
    report = run(api, tmp_path / "holds.json", dry_run=True)
    assert report.status == "ok" and report.moves_planned == 2 and report.evictions == 0
    assert report.plans[0]["pod"] == "ml/big" and report.plans[0]["node"] == "b"
    assert {m["pod"] for m in report.plans[0]["moves"]} == {"ml/b0", "ml/b1"}
    assert names(api) == {p["metadata"]["name"] for p in cluster()[1]}
    assert not (tmp_path / "holds.json").exists() and api.writes() == []


def test_a_run_writes_the_holds_then_evicts_and_counts_the_evictions_against_the_hour(
    api: KubeApiDouble, tmp_path: Path
):
    holds, clock = tmp_path / "holds.json", Clock()
    report = run(api, holds, clock, settle_s=2.0, hold_s=120.0)
    assert report.status == "ok" and report.evictions == 2, report
    assert names(api) == {p["metadata"]["name"] for p in cluster()[1]} - {"b0", "b1"}
    assert clock.slept == [2.0]
    book = read_book(FileSnapshotStore(holds))
    assert [(h.name, h.node, h.gpus, h.until) for h in book.holds] == [("big", "b", 8, NOW + 120.0)]
    assert sorted((s.owner_name, s.moved) for s in book.steers) == [("infer", "ml/b0"), ("infer", "ml/b1")]
    assert book.evictions == (NOW + 2.0, NOW + 2.0)
    # While the hold waits for its pod, a second run plans nothing new.
    again = run(api, holds, clock)
    assert again.in_flight == 1 and again.plans == () and again.evictions == 0


def test_the_hourly_budget_carries_across_runs(api: KubeApiDouble, tmp_path: Path):
    holds = tmp_path / "holds.json"
    holds.write_text(json.dumps({"version": 1, "evictions": [NOW - 100.0] * 9}))
    report = run(api, holds, max_moves_per_hour=10)
    assert report.hour_budget_left == 1 and report.evictions == 0
    assert report.waiting == {"ml/big": "no plan of at most 1 moves frees what it needs on a node it may use"}


def test_a_hold_whose_pod_is_deleted_lapses_at_its_deadline_and_the_next_run_drops_it(
    api: KubeApiDouble, tmp_path: Path
):
    holds, clock = tmp_path / "holds.json", Clock()
    run(api, holds, clock, hold_s=60.0, settle_s=0.0)
    api.handle("DELETE", "/api/v1/namespaces/ml/pods/big", AUTH, b"")
    source = HoldsSource(FileSnapshotStore(holds), clock=clock.now)
    other = gpu_pod("other", owner="")
    book, now = source()
    assert hold_refusals(book, {"b": 0}, np.array([8]), other, PodDemand(gpus=1), now)[0].tolist() == [True]
    clock.t += 61.0
    book, now = source()
    assert hold_refusals(book, {"b": 0}, np.array([8]), other, PodDemand(gpus=1), now)[0].tolist() == [False]
    report = run(api, holds, clock)
    assert report.holds_lapsed == 1 and report.holds_kept == 0 and report.in_flight == 0
    assert read_book(FileSnapshotStore(holds)).holds == ()


def test_a_hold_whose_pod_bound_on_its_node_is_kept(api: KubeApiDouble, tmp_path: Path):
    holds, clock = tmp_path / "holds.json", Clock()
    run(api, holds, clock, settle_s=0.0)
    api.handle("POST", "/api/v1/namespaces/ml/pods/big/binding", AUTH, json.dumps({"target": {"name": "b"}}).encode())
    report = run(api, holds, clock)
    assert (report.holds_kept, report.holds_lapsed, report.pending, report.evictions) == (1, 0, 0, 0)


def test_a_budgets_refusal_ends_that_plan(api: KubeApiDouble, tmp_path: Path):
    """The budget changed between the list and the eviction: the Eviction API's 429 is the answer."""
    api.fail_next("POST", r"/eviction$", 429)
    report = run(api, tmp_path / "holds.json")
    assert (report.status, report.evictions, report.evictions_refused) == ("ok", 0, 1), report
    assert {"b0", "b1"} <= names(api)
    # Refused before anything moved: its hold and steers go at once, and the next run may plan again.
    book = read_book(FileSnapshotStore(tmp_path / "holds.json"))
    assert book.holds == () and book.steers == ()
    assert run(api, tmp_path / "holds.json").evictions == 2


def test_a_pod_gone_before_its_eviction_is_passed_over(api: KubeApiDouble, tmp_path: Path):
    api.fail_next("POST", r"/eviction$", 404)
    report = run(api, tmp_path / "holds.json")
    assert (report.status, report.evictions, report.pods_gone) == ("ok", 1, 1), report


def test_an_unreadable_book_stops_the_run_before_any_eviction(api: KubeApiDouble, tmp_path: Path):
    holds = tmp_path / "holds.json"
    holds.write_text("{not json")
    report = run(api, holds)
    assert report.status == "failed" and "holds document: not JSON" in report.error
    assert api.writes() == []


def test_settings_name_every_problem():
    with pytest.raises(ConfigError) as bad:
        ConsolidationSettings.from_env({"CLUSTER_NAME": "c", "MAX_MOVES_PER_RUN": "101", "HOLD_S": "5"})
    message = str(bad.value)
    assert "HOLDS_URI: required unless DRY_RUN" in message and "MAX_MOVES_PER_RUN: expected 0..100" in message
    assert "HOLD_S: expected 10..3600 seconds, got 5.0" in message


def test_the_lambda_handler_emits_the_catalogued_metrics(
    api: KubeApiDouble, tmp_path: Path, fresh_handler: Any, capsys: pytest.CaptureFixture[str]
):
    handler = fresh_handler("lambdas.consolidation.handler", KUBE_API_URL=api.url, KUBE_TOKEN=TOKEN,
                            HOLDS_URI=str(tmp_path / "holds.json"), SETTLE_S="0")  # fmt: skip

    class Context(FakeLambdaContext):
        def get_remaining_time_in_millis(self) -> int:
            return 60_000

    summary = handler.lambda_handler({"source": "aws.events"}, Context())
    assert summary["status"] == "ok" and summary["evictions"] == 2, summary
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line]
    values = {k: v[0] if isinstance(v, list) else v for k, v in docs[0].items()}
    assert (values["Plans"], values["MovesPlanned"], values["Evictions"], values["RunFailures"]) == (1, 2, 2, 0)
    assert assert_catalogued(docs, CONSOLIDATOR) == {m.name for m in CATALOGUE if m.service == CONSOLIDATOR}


def test_with_nothing_pending_a_run_empties_a_node_holds_it_and_counts_it_kept_once_the_autoscaler_removed_it(
    tmp_path: Path,
):
    holds, clock = tmp_path / "holds.json", Clock()
    with KubeApiDouble(tokens=[TOKEN]) as double:
        nodes, pods = cluster()
        double.load("nodes", nodes)
        double.load("pods", [p for p in pods if p["metadata"]["name"] != "big"])
        report = run(double, holds, clock, empty_nodes=1, settle_s=0.0)
        assert report.status == "ok" and report.plans == () and report.evictions == 2, report
        (emptied,) = report.emptied
        assert emptied["node"] == "b" and sorted(m["pod"] for m in emptied["moves"]) == ["ml/b0", "ml/b1"]
        assert all(m["destination"] == "a" for m in emptied["moves"])
        (hold,) = read_book(FileSnapshotStore(holds)).holds
        assert (hold.uid, hold.node) == ("", "b")
        # Held for no pod: every GPU pod is kept off b until then.
        book, now = HoldsSource(FileSnapshotStore(holds), clock=clock.now)()
        refused = hold_refusals(book, {"b": 0}, np.array([8]), gpu_pod("x", owner=""), PodDemand(gpus=1), now)[0]
        assert refused.tolist() == [True]
        assert run(double, holds, clock).in_flight == 1  # b still there
        double.handle("DELETE", "/api/v1/nodes/b", AUTH, b"")
        after = run(double, holds, clock)
        assert (after.holds_kept, after.holds_lapsed, after.in_flight) == (1, 0, 0)


def test_malformed_objects_fail_the_run_with_a_reason_and_never_raise(tmp_path: Path):
    with KubeApiDouble(tokens=[TOKEN]) as double:
        nodes, pods = cluster()
        odd = gpu_pod("odd", "a", owner="train")
        odd["metadata"]["ownerReferences"] = 5
        odd["spec"]["volumes"] = 5
        double.load("nodes", nodes)
        double.load("pods", [*pods, odd])
        report = run(double, tmp_path / "holds.json")
    assert report.status == "ok" and report.unmovable.get("no ReplicaSet or StatefulSet recreates it") == 1
    book = HoldBook((Hold("ml", "big", "uid-big", "a", 8, NOW + 60),))
    assert service.settle(book, [{"metadata": [1]}, 5, {"spec": "x"}], NOW, {"a"}) == (HoldBook(), 0, 1)
