from __future__ import annotations

from typing import Any

import pytest

from scheduler_core.consolidation.eligibility import budgets_of, selector_matches, why_not_movable
from tests.scheduler_core.consolidation.conftest import gpu_pod


def with_spec(**spec: Any) -> dict[str, Any]:
    return gpu_pod("p", "n", **spec)


@pytest.mark.parametrize(
    ("pod", "why"),
    [
        (gpu_pod("p", "n"), ""),
        (gpu_pod("p", "n", movable=False), "not opted in"),
        (gpu_pod("p", "n", annotations={"karpenter.sh/do-not-disrupt": "true"}), "karpenter.sh/do-not-disrupt"),
        (gpu_pod("p", "n", annotations={"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}), "safe-to-evict"),
        (gpu_pod("p", "n", owner=""), "no ReplicaSet or StatefulSet"),
        (gpu_pod("p"), "not bound"),
        (with_spec(schedulerName="default-scheduler"), "not scheduled by gpu-scheduler"),
        (with_spec(topologySpreadConstraints=[{"maxSkew": 1}]), "topology spread"),
        (with_spec(affinity={"podAntiAffinity": {"x": 1}}), "pod affinity"),
        (with_spec(volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "c"}}]), "persistent volume claim"),
        (with_spec(resourceClaims=[{"name": "gpu"}]), "DRA resource claims"),
    ],
)
def test_each_rule_keeps_a_pod_in_place_and_says_which(pod: dict[str, Any], why: str):
    found = why_not_movable(pod)
    assert (why in found) if why else found == "", found


def test_a_job_pod_and_a_finished_or_terminating_pod_never_move():
    job = gpu_pod("p", "n")
    job["metadata"]["ownerReferences"][0]["kind"] = "Job"
    done = gpu_pod("q", "n")
    done["status"]["phase"] = "Succeeded"
    going = gpu_pod("r", "n")
    going["metadata"]["deletionTimestamp"] = "2026-12-06T10:00:00Z"
    assert [why_not_movable(p) for p in (job, done, going)] == [
        "no ReplicaSet or StatefulSet recreates it", "finished", "not bound, or terminating"]  # fmt: skip


def test_a_budget_that_allows_no_disruption_keeps_the_pods_it_selects_and_only_those():
    budgets = budgets_of([
        {"metadata": {"namespace": "ml", "name": "web"}, "spec": {"selector": {"matchLabels": {"app": "web"}}},
         "status": {"disruptionsAllowed": 0}},
        {"metadata": {"namespace": "ml", "name": "fresh"}, "spec": {"selector": {"matchLabels": {"app": "new"}}}},
        "not a budget",
    ])  # fmt: skip
    assert why_not_movable(gpu_pod("w", "n", owner="web"), budgets) == "PodDisruptionBudget ml/web allows no disruption"
    # A budget whose controller has not counted yet allows none.
    assert "ml/fresh" in why_not_movable(gpu_pod("x", "n", owner="new"), budgets)
    assert why_not_movable(gpu_pod("o", "n", owner="other"), budgets) == ""


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ({}, {"a": "1"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"}, True),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {}, False),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {}, True),
        # Past the bound or unreadable: taken as matching, so the budget protects more, never less.
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["x"]}] * 65}, {}, True),
        ({"matchExpressions": "garbage"}, {}, True),
    ],
)
def test_label_selectors_read_as_the_api_server_reads_them(selector: dict[str, Any], labels: dict[str, str],
                                                          matches: bool):  # fmt: skip
    assert selector_matches(selector, labels) is matches


def test_a_pod_two_budgets_select_is_never_moved_the_eviction_api_would_refuse_it():
    budget = {"spec": {"selector": {"matchLabels": {"app": "web"}}}, "status": {"disruptionsAllowed": 5}}
    budgets = budgets_of([{**budget, "metadata": {"namespace": "ml", "name": n}} for n in ("one", "two")])
    assert why_not_movable(gpu_pod("w", "n", owner="web"), budgets) == (
        "more than one PodDisruptionBudget selects it (ml/one, ml/two)"
    )
    assert why_not_movable(gpu_pod("w", "n", owner="web"), budgets[:1]) == ""


def test_a_pod_asking_for_a_resource_the_planner_does_not_count_stays():
    pod = gpu_pod("efa", "n")
    pod["spec"]["containers"][0]["resources"]["limits"]["vpc.amazonaws.com/efa"] = "4"
    assert why_not_movable(pod) == (
        "has a resource the planner does not count (vpc.amazonaws.com/efa), which the planner cannot check on "
        "another node"
    )
