"""``gpu-scheduler demo``: the stock kube-scheduler and gpu-scheduler side by side, FGD beside fgd_cpu, the
live step's one line, the synth, and output at least every few seconds."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from unittest.mock import patch

import numpy as np
import pytest

import gpu_scheduler.demo as demo
import gpu_scheduler.demo_output as demo_output
from gpu_scheduler.cli import main
from scheduler_core.simulator.simulate import simulate
from scheduler_core.simulator.traces import synthetic_trace, write_trace
from tests.cdk.conftest import write_stand_in_package


def run_demo(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    argv = ["demo", "--json", "--placement-seeds", "", "--no-live", *extra]
    assert main(argv) == 0
    summary: dict[str, Any] = json.loads(capsys.readouterr().out)
    return summary


@pytest.mark.slow
def test_the_default_demo_shows_the_stock_scheduler_and_gpu_scheduler_apart(capsys: pytest.CaptureFixture[str]):
    summary = run_demo(capsys)
    stock, ours = summary["stock"], summary["gpu_scheduler"]
    for side in (stock, ours):
        assert side["pods_placed"] + side["pods_pending"] == summary["pods"] == 150
        assert sum(side["pods_pending_by_gpus"].values()) == side["pods_pending"]
        assert 0 <= side["gpus_free_on_partly_used_nodes"] <= side["gpus_free"]
    # The acceptance: different numbers, and the product's the better ones, on the default cluster.
    assert stock["pods_pending"] > ours["pods_pending"]
    assert stock["gpus_free_on_partly_used_nodes"] > 2 * ours["gpus_free_on_partly_used_nodes"]
    assert stock["eight_gpu_nodes_free"] < ours["eight_gpu_nodes_free"]
    assert summary["latency_ms"]["filter"]["calls"] >= ours["pods_placed"]
    assert summary["server_exit_code"] == 0


@pytest.mark.slow
def test_the_demo_is_the_same_every_run_and_for_both_node_forms(capsys: pytest.CaptureFixture[str]):
    """One seed, one outcome: NodeNames against a snapshot and full Node objects against a cluster file
    decide alike, and a rerun changes nothing (the outcome does not hang on timing)."""
    small = ("--nodes", "24", "--pods", "40", "--seed", "3")
    names = run_demo(capsys, *small, "--mode", "names")
    again = run_demo(capsys, *small, "--mode", "names")
    nodes = run_demo(capsys, *small, "--mode", "nodes")
    assert names["gpu_scheduler"] == again["gpu_scheduler"] == nodes["gpu_scheduler"]
    assert names["stock"] == nodes["stock"]


def test_the_text_explains_each_figure_and_says_what_to_run_next(capsys: pytest.CaptureFixture[str]):
    assert main(["demo", "--nodes", "24", "--pods", "40", "--placement-seeds", "", "--no-live"]) == 0
    text = capsys.readouterr().out
    for header in ("[1/3", "[2/3", "[3/3"):
        assert header in text
    assert "stock kube-scheduler" in text and "What it means" in text and "What you saw" in text
    assert "gpu-scheduler explain --pod examples/pods/eight-gpus.yaml --cluster examples/cluster.json" in text
    assert "off (--no-live)" in text
    assert max(len(line) for line in text.splitlines()) <= 100, "one screen: no line past 100 columns"


def test_a_long_step_prints_a_line_every_tick(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    monkeypatch.setattr(demo_output, "TICK_S", 0.05)
    steps = demo_output.Steps(1)
    steps.step("a step")
    with steps.working("a slow part"):
        time.sleep(0.3)
    steps.progress("pods", 3, 10)  # the last line is fresh: nothing
    time.sleep(0.06)
    steps.progress("pods", 4, 10)
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("[1/1 ") and lines[1].endswith("s] a step")
    assert sum("a slow part: still working" in line for line in lines) >= 3
    assert [line.split(" (")[0].strip() for line in lines if "pods:" in line] == ["pods: 4/10"]


def test_without_kubernetes_binaries_the_live_step_is_one_line_that_says_how_to_turn_it_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    monkeypatch.setenv("KUBE_BIN_DIR", str(tmp_path))
    live = demo.live_burst()
    assert "skipped" in live and str(tmp_path) in live["skipped"]
    text = demo._format_live(live)
    assert "off:" in text and "$KUBE_BIN_DIR" in text and "docs/testing.md" in text and "make demo again" in text


@pytest.mark.slow
def test_the_sharing_step_runs_the_simulators_protocol_on_a_synthetic_trace_without_openb(tmp_path: Path):
    placement = demo.placement_comparison((2,), openb=tmp_path / "absent", jobs=1)
    assert placement["trace"].startswith("synthetic") and placement["seeds"] == [2]
    cluster, tasks = synthetic_trace(150, 1200, np.random.default_rng(0))
    for policy, figures in placement["policies"].items():
        assert figures["unallocated_gpu_pct_100"] == pytest.approx(
            simulate(cluster, tasks, policy, 2).at("unallocated_pct", 100), abs=1e-3
        )
        assert figures["unallocated_gpu_pct_100_per_seed"] == [figures["unallocated_gpu_pct_100"]]
    assert "seed by seed, gpu-scheduler leaves fewer unallocated on" in demo._format_placement(placement)


@pytest.mark.slow
def test_the_sharing_step_reads_the_openb_trace_where_fgd_and_ours_differ(tmp_path: Path):
    """A stand-in openb directory (a synthetic trace under gpuspec10's file names) is read, and named."""
    cluster, tasks = synthetic_trace(30, 200, np.random.default_rng(5))
    write_trace(cluster, tasks, tmp_path / "openb_node_list_gpu_node.csv", tmp_path / "openb_pod_list_gpuspec10.csv")
    placement = demo.placement_comparison((1, 2), openb=tmp_path, jobs=1)
    assert placement["trace"] == f"openb gpuspec10 ({tmp_path})" and placement["seeds"] == [1, 2]
    assert set(placement["policies"]) == {"fgd", "fgd_cpu"}


@pytest.mark.slow
def test_the_synth_step_summarises_the_stack_and_names_a_failure(tmp_path: Path):
    package = write_stand_in_package(tmp_path / "package")
    steps = demo_output.Steps(1, quiet=True)
    report = demo.synthesise(steps, [f"packageDir={package}"], tmp_path / "cdk.out")
    assert report["exit_code"] == 0 and report["cdk_nag"]["AwsSolutions"]["violations"] == 0
    text = demo._format_synth(report)
    assert f"stack GpuScheduler: {report['resources']} resources" in text and "acknowledged with reasons" in text
    failed = demo.synthesise(steps, [f"packageDir={package}", "sharedDevice=cdi"], tmp_path / "cdk.out")
    assert failed["exit_code"] == 2 and "sharedDevice: no such context key" in failed["error"]
    assert demo._format_synth(failed).startswith("      synth failed (2): cdk synth:")


def test_bad_sizes_are_refused_naming_them(capsys: pytest.CaptureFixture[str]):
    with patch.dict("os.environ", {}):
        assert main(["demo", "--nodes", "0"]) == 2
    assert "--nodes: expected 1..1000" in capsys.readouterr().err
