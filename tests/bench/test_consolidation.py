"""``gpu-scheduler bench consolidation``: its cluster is one where moves are needed, and the runs report
what they did."""

from __future__ import annotations

import json

from bench.cli import main
from bench.consolidation import cluster
from scheduler_core.consolidation.plan import plan_consolidation


def test_the_bench_cluster_leaves_no_node_room_for_its_pending_pods_and_moves_make_it():
    nodes, pods = cluster(20, 2, seed=3)
    assert len(nodes) == 20 and sum(1 for p in pods if not p["spec"].get("nodeName")) == 2
    assert plan_consolidation(nodes, pods, max_moves=0, max_moves_per_plan=0).plans == ()
    planned = plan_consolidation(nodes, pods, max_moves=16, max_moves_per_plan=8)
    assert [p.pod.name for p in planned.plans] == ["big-0", "big-1"] and planned.moves >= 8


def test_the_suite_reports_the_plan_and_the_filter_side_by_side(capsys):
    assert main(["consolidation", "--nodes", "50", "--filter-nodes", "50", "--repeat", "1", "--moves", "8"]) == 0
    report = json.loads(capsys.readouterr().out)
    (plan,) = report["plan"]
    assert plan["nodes"] == 50 and plan["plans"] >= 1 and 4 <= plan["moves"] <= 8 and plan["cpu_s_median"] > 0
    (row,) = report["filter"]
    assert row["nodes"] == 50 and row["no_holds_us"] > 0 and row["full_book_us"] > 0 and row["typical_book_us"] > 0
    assert abs(row["full_book_ratio"] - row["full_book_us"] / row["no_holds_us"]) < 0.05  # of unrounded medians
