"""``gpu-scheduler bench moves`` and ``bench churn``: their arguments, and a run on openb against ``simulate``."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.cli import count_list, fraction_list
from bench.moves import run_churn, run_moves
from tests.conftest import SHARED

OPENB = SHARED / "data" / "openb"


@pytest.mark.parametrize("text", ["-1", "1,x", ""])
def test_move_budgets_are_whole_numbers_from_0(text: str) -> None:
    assert count_list("0,1,2,4") == [0, 1, 2, 4]
    with pytest.raises(argparse.ArgumentTypeError, match="whole numbers"):
        count_list(text)


@pytest.mark.parametrize("text", ["0", "-0.5", "nan", "a"])
def test_loads_are_numbers_above_0(text: str) -> None:
    assert fraction_list("0.95,1") == [0.95, 1.0]
    with pytest.raises(argparse.ArgumentTypeError):
        fraction_list(text)


def test_without_the_trace_both_say_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENB_DIR", str(tmp_path / "absent"))
    with pytest.raises(ValueError, match="absent: the openb trace is research-use only"):
        run_moves("public", 1, [0])
    with pytest.raises(ValueError, match="absent: the openb trace is research-use only"):
        run_churn("default", 1, [0.9], [0])


@pytest.mark.slow
@pytest.mark.skipif(not OPENB.is_dir(), reason=f"{OPENB} is absent (the openb trace is not shipped)")
def test_no_moves_is_simulate_and_a_trace_without_times_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from scheduler_core.placement.model import Workload
    from scheduler_core.simulator.simulate import simulate
    from scheduler_core.simulator.traces import read_nodes, read_tasks

    monkeypatch.setenv("OPENB_DIR", str(OPENB))
    report = run_moves("gpuspec33", 1, [0, 1], jobs=1)
    cluster = read_nodes(OPENB / "openb_node_list_gpu_node.csv")
    tasks = read_tasks(OPENB / "openb_pod_list_gpuspec33.csv")
    plain = simulate(cluster, tasks, "fgd_cpu", 42, workload=Workload.typical(tasks, cluster.models))
    row = report["means"]["gpuspec33"]
    assert row["K0"] == {"unalloc_100": round(plain.at("unallocated_pct", 100), 3), "moves_per_1000": 0.0}
    assert row["K1"]["moves_per_1000"] > 0 and row["K1"]["unalloc_100"] < row["K0"]["unalloc_100"]
    assert row["fgd_released"] == pytest.approx(12.164)
    with pytest.raises(ValueError, match=r"multigpu20\.csv: missing columns creation_time, deletion_time"):
        run_churn("multigpu20", 1, [0.9], [0], jobs=1)
