from __future__ import annotations

from typing import Any

import pytest

from scheduler_core.consolidation.plan import plan_consolidation
from scheduler_core.errors import InvalidArgsError
from tests.scheduler_core.consolidation.conftest import gpu_node, gpu_pod


def plan(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], pdbs: Any = (), moves: int = 4) -> Any:
    return plan_consolidation(nodes, pods, pdbs, max_moves=moves, max_moves_per_plan=moves)


def moved(result: Any) -> list[tuple[str, str, str]]:
    return [(m.pod.name, m.source, m.destination) for p in result.plans for m in p.moves]


def test_an_8_gpu_pod_gets_the_node_that_takes_the_fewest_moves_to_empty():
    nodes = [gpu_node("a"), gpu_node("b"), gpu_node("c")]
    pods = [*(gpu_pod(f"a{i}", "a") for i in range(3)), gpu_pod("b0", "b"), gpu_pod("b1", "b"),
            *(gpu_pod(f"c{i}", "c", movable=False) for i in range(5)),
            gpu_pod("big", gpus=8, owner="", pending=True)]  # fmt: skip
    result = plan(nodes, pods)
    assert [(p.pod.name, p.node, p.gpus) for p in result.plans] == [("big", "b", 8)]
    assert sorted(m[:2] for m in moved(result)) == [("b0", "b"), ("b1", "b")]
    assert {m[2] for m in moved(result)} <= {"a", "c"}
    assert result.moves == 2


def test_among_plans_of_as_many_moves_the_cheapest_by_deletion_cost_wins():
    nodes = [gpu_node("a"), gpu_node("b"), gpu_node("c")]
    cost = "controller.kubernetes.io/pod-deletion-cost"
    pods = [gpu_pod("dear", "a", annotations={cost: "500"}), gpu_pod("cheap", "b", annotations={cost: "-10"}),
            *(gpu_pod(f"c{i}", "c") for i in range(4)), gpu_pod("big", gpus=8, owner="", pending=True)]  # fmt: skip
    result = plan(nodes, pods)
    assert [m[0] for m in moved(result)] == ["cheap"]
    assert result.plans[0].cost == -10.0


def test_what_may_not_move_is_never_planned_and_is_counted_by_reason():
    nodes = [gpu_node("a"), gpu_node("b"), gpu_node("c")]
    pods = [gpu_pod("pinned", "a", annotations={"karpenter.sh/do-not-disrupt": "true"}),
            gpu_pod("static", "b", movable=False), gpu_pod("ok0", "c"), gpu_pod("ok1", "c"),
            gpu_pod("big", gpus=8, owner="", pending=True)]  # fmt: skip
    result = plan(nodes, pods)
    assert sorted(m[0] for m in moved(result)) == ["ok0", "ok1"]
    assert result.unmovable == {"marked karpenter.sh/do-not-disrupt": 1,
                                'not opted in (label gpu-scheduler.io/movable: "true")': 1}  # fmt: skip


def test_a_plan_moves_no_more_pods_under_a_budget_than_it_allows():
    nodes = [gpu_node("a"), gpu_node("b")]
    pods = [gpu_pod("w0", "a", owner="web"), gpu_pod("w1", "a", owner="web"), gpu_pod("big", gpus=8, owner="",
            pending=True)]  # fmt: skip
    one = [{"metadata": {"namespace": "ml", "name": "web"}, "spec": {"selector": {"matchLabels": {"app": "web"}}},
            "status": {"disruptionsAllowed": 1}}]  # fmt: skip
    # b is empty: big fits there now, so make b busy with a pod that may not move.
    pods.append(gpu_pod("s", "b", movable=False))
    result = plan(nodes, pods, one)
    assert result.plans == ()
    assert "PodDisruptionBudget ml/web" in result.waiting["ml/big"]
    one[0]["status"]["disruptionsAllowed"] = 2
    assert sorted(m[0] for m in moved(plan(nodes, pods, one))) == ["w0", "w1"]


def test_a_moved_pod_goes_only_where_its_selector_and_tolerations_let_it():
    tainted = gpu_node("t")
    tainted["spec"]["taints"] = [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]
    nodes = [gpu_node("a", pool="p"), gpu_node("b", pool="q"), tainted]
    pods = [gpu_pod("m", "a", nodeSelector={"pool": "p"}), gpu_pod("n", "b"),
            gpu_pod("big", gpus=8, owner="", pending=True)]  # fmt: skip
    # m may only go to pool p (a itself): a cannot be emptied; n may not go to the tainted node t, only to a.
    result = plan(nodes, pods)
    assert moved(result) == [("n", "b", "a")]
    assert result.plans[0].node == "b"


def test_no_plan_for_a_pod_that_fits_now_nor_past_the_runs_budget_and_each_says_why():
    nodes = [gpu_node("a"), gpu_node("b")]
    pods = [gpu_pod("a0", "a"), gpu_pod("b0", "b"), gpu_pod("small", gpus=1, owner="", pending=True),
            gpu_pod("big", gpus=8, owner="", pending=True)]  # fmt: skip
    result = plan(nodes, pods, moves=0)
    assert result.plans == ()
    assert result.waiting == {
        "ml/big": "this run's move budget is spent",
        "ml/small": "this run's move budget is spent",
    }
    result = plan(nodes, pods)
    assert result.waiting == {"ml/small": "it fits on a node now: kube-scheduler will place it"}
    assert [p.pod.name for p in result.plans] == ["big"]


def test_a_cordoned_or_not_ready_node_is_neither_target_nor_destination():
    cordoned, down = gpu_node("c"), gpu_node("d")
    cordoned["spec"]["unschedulable"] = True
    down["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    nodes = [gpu_node("a"), cordoned, down]
    pods = [gpu_pod("a0", "a"), gpu_pod("big", gpus=8, owner="", pending=True)]
    result = plan(nodes, pods)
    assert result.plans == () and "no plan of at most 4 moves" in result.waiting["ml/big"]


def test_the_budgets_are_checked():
    with pytest.raises(InvalidArgsError, match=r"max_moves: expected a whole number in 0\.\.100, got -1"):
        plan_consolidation([], [], max_moves=-1, max_moves_per_plan=1)
    with pytest.raises(InvalidArgsError, match="max_moves_per_plan"):
        plan_consolidation([], [], max_moves=1, max_moves_per_plan=True)


def test_with_nothing_pending_it_empties_the_node_that_costs_least_to_empty_and_only_if_everything_can_go():
    nodes = [gpu_node("a"), gpu_node("b"), gpu_node("c"), gpu_node("d")]
    pods = [
        *(gpu_pod(f"a{i}", "a") for i in range(3)),  # three to move
        gpu_pod("b0", "b"), gpu_pod("b1", "b", movable=False),  # one may not move: b stays
        gpu_pod("c0", "c"), gpu_pod("c1", "c"),  # the cheapest to empty
        *(gpu_pod(f"d{i}", "d") for i in range(4)),
    ]  # fmt: skip
    daemon = gpu_pod("agent", "c", gpus=0, movable=False)
    daemon["metadata"]["labels"]["pod-template-generation"] = "1"  # a DaemonSet's: it stays with its node
    result = plan_consolidation(nodes, [*pods, daemon], max_moves=8, max_moves_per_plan=8, empty_nodes=1)
    assert [(n.node, sorted(m.pod.name for m in n.moves)) for n in result.emptied] == [("c", ["c0", "c1"])]
    assert all(m.destination != "c" and m.reason == "empties c for scale-down" for m in result.emptied[0].moves)
    assert result.moves == 2
    two = plan_consolidation(nodes, pods, max_moves=8, max_moves_per_plan=8, empty_nodes=2)
    # b keeps its pod that may not move; a took c's pods, so it is not emptied in the same run.
    assert [n.node for n in two.emptied] == ["c", "d"]
    assert {m.destination for m in two.emptied[0].moves} == {"a"}
    # The run's budget holds across the nodes: 2 moves empty c, and d's 4 do not fit in what is left.
    assert [
        n.node for n in plan_consolidation(nodes, pods, max_moves=5, max_moves_per_plan=8, empty_nodes=2).emptied
    ] == ["c"]
    # A Pending pod comes first: nothing is emptied while one waits.
    waiting = plan_consolidation(nodes, [*pods, gpu_pod("big", gpus=8, owner="", pending=True)], max_moves=8,
                                 max_moves_per_plan=8, empty_nodes=2)  # fmt: skip
    assert waiting.emptied == ()


def test_a_pending_pod_that_asks_for_no_gpu_or_has_constraints_the_planner_cannot_check_gets_no_plan():
    nodes = [gpu_node("a"), gpu_node("b")]
    pods = [gpu_pod("a0", "a", cpu="90"), gpu_pod("b0", "b", cpu="90")]
    cpu_only = gpu_pod("etl", gpus=0, owner="", pending=True, cpu="20")
    spread = gpu_pod("big", gpus=8, owner="", pending=True, topologySpreadConstraints=[{"maxSkew": 1}])
    result = plan(nodes, [*pods, cpu_only, spread])
    assert result.plans == ()
    assert result.waiting["ml/etl"].startswith("it asks for no GPU")
    assert result.waiting["ml/big"].startswith("it has topology spread constraints")


def test_gpu_indices_are_held_to_the_node_and_whole_gpus_to_their_own():
    nodes = [gpu_node("a", gpus=2), gpu_node("b", gpus=2), gpu_node("c", gpus=8)]
    liar = gpu_pod("liar", "a", gpus=0, annotations={"gpu-scheduler.io/assigned-gpus": "9:500"})
    liar["spec"]["containers"][0]["resources"]["limits"] = {"gpu-scheduler.io/gpu-milli": "500"}
    whole = gpu_pod("whole", "b", annotations={"gpu-scheduler.io/assigned-gpus": "0:1000"})
    plain = gpu_pod("plain", "b")  # not put on GPU 0, which the annotated pod holds
    result = plan_consolidation(nodes, [liar, whole, plain], max_moves=4, max_moves_per_plan=4, empty_nodes=1)
    assert result.unmovable == {"its GPUs on the node are not known": 1}  # a share on GPU 9 of 2
    assert [(n.node, sorted(m.pod.name for m in n.moves)) for n in result.emptied] == [("b", ["plain", "whole"])]


def test_a_pod_that_asks_for_gpu_memory_is_planned_only_on_nodes_that_have_it():
    small = gpu_node("small", model="L4")
    small["metadata"]["labels"]["gpu.nvidia.com/memory"] = "24000"
    nodes = [gpu_node("h", gpus=2), small, gpu_node("spare")]
    pods = [gpu_pod("h0", "h"), gpu_pod("h1", "h"), *(gpu_pod(f"s{i}", "small") for i in range(7)),
            *(gpu_pod(f"x{i}", "spare", movable=False) for i in range(7))]  # fmt: skip
    big = gpu_pod("big", gpus=2, owner="", pending=True, annotations={"gpu.nvidia.com/memory": "80000"})
    result = plan(nodes, [*pods, big])
    # One move would free two GPUs on the 24 GB node; the pod asks for 80 GB: it takes the two on h.
    assert [(p.node, len(p.moves)) for p in result.plans] == [("h", 2)]
