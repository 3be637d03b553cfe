"""``gpu-scheduler consolidate`` and ``explain``'s consolidation line, through the CLI's own entry point."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpu_scheduler.cli import main
from testing.kube_double import KubeApiDouble
from tests.scheduler_core.consolidation.conftest import gpu_node, gpu_pod

NODES = [gpu_node("a"), gpu_node("b"), gpu_node("c")]
PODS = [*(gpu_pod(f"a{i}", "a", owner="train") for i in range(5)), gpu_pod("b0", "b", owner="infer"),
        *(gpu_pod(f"c{i}", "c", movable=False) for i in range(5))]  # fmt: skip
BIG = gpu_pod("big", gpus=8, owner="", pending=True)


def test_explain_says_which_moves_would_place_a_pod_no_node_fits(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    cluster, pod = tmp_path / "cluster.json", tmp_path / "pod.json"
    cluster.write_text(json.dumps({"nodes": NODES, "pods": PODS}))
    pod.write_text(json.dumps(BIG))
    assert main(["explain", "--pod", str(pod), "--cluster", str(cluster)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == "consolidation: 1 move(s) would place it on b: ml/b0 (ReplicaSet/infer) b -> a, cost 0"
    assert main(["explain", "--pod", str(pod), "--cluster", str(cluster), "--json", "--moves", "0"]) == 0
    assert "consolidation" not in json.loads(capsys.readouterr().out)
    assert main(["explain", "--pod", str(pod), "--cluster", str(cluster), "--moves", "101"]) == 2
    assert "--moves: expected 0..100, got 101" in capsys.readouterr().err


def dry_run(tmp_path: Path, pods: list[dict[str, Any]], *flags: str) -> None:
    """``consolidate --dry-run FLAGS`` on the API double holding NODES and ``pods``: it writes nothing."""
    kubeconfig = tmp_path / "kubeconfig"
    with KubeApiDouble(tokens=["t"]) as api:
        api.load("nodes", NODES)
        api.load("pods", pods)
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": api.url}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        }))  # fmt: skip
        assert main(["consolidate", "--dry-run", "--kubeconfig", str(kubeconfig), *flags]) == 0
        assert api.writes() == []


def test_the_dry_run_prints_each_move_with_its_reason_and_cost_and_evicts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    dry_run(tmp_path, [*PODS, BIG])
    *text, last = capsys.readouterr().out.splitlines()
    assert text[:3] == [
        "1 Pending pods no node fits; 1 plans, 1 moves",
        "plan for ml/big: 8 GPUs on b, cost 0",
        "  move ml/b0 (ReplicaSet/infer) b -> a, cost 0: makes room on b for ml/big",
    ]
    assert "5 pods not movable: not opted in" in text[-1]
    assert json.loads(last)["dry_run"] is True


def test_a_real_run_without_holds_is_refused_before_it_reads_the_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("HOLDS_URI", raising=False)
    assert main(["consolidate", "--kubeconfig", str(tmp_path / "absent")]) == 2
    assert "HOLDS_URI: required unless DRY_RUN: the extender reads the holds there" in capsys.readouterr().err
    assert main(["consolidate", "--dry-run", "--max-moves-per-run", "-1", "--kubeconfig", str(tmp_path / "k")]) == 2
    assert "MAX_MOVES_PER_RUN: expected 0..100, got -1" in capsys.readouterr().err


def test_the_dry_run_of_emptying_a_node_prints_its_moves(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    dry_run(tmp_path, PODS, "--empty-nodes", "1")
    *text, last = capsys.readouterr().out.splitlines()
    assert text[1:3] == [
        "empty b for scale-down, cost 0",
        "  move ml/b0 (ReplicaSet/infer) b -> a, cost 0: empties b for scale-down",
    ]
    assert [e["node"] for e in json.loads(last)["emptied"]] == ["b"]
