"""``gpu-scheduler replay``: the FGD protocol through the real kube-scheduler and the product, against
``simulate --policy fgd_cpu`` on the same trace and seed (``bench/replay.py``; each replay starts its
own control plane, ledger and ``serve --watch``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from scheduler_core.simulator.traces import openb_dir, synthetic_trace, write_trace
from testing.kube_binaries import missing

UNALLOCATED_TOLERANCE = 1.0
"""Points of unallocated GPU % at 100 % arrived between the replay and simulate on the synthetic trace:
both place every pod by fgd_cpu, but kube-scheduler adds its own plugins and breaks the ties the
extender leaves (a CPU-only pod's best nodes) its own way (measured: 1.0 against 1.67)."""


@pytest.fixture(scope="module", autouse=True)
def control_plane() -> None:
    reason = missing()
    if reason:
        pytest.skip(reason)


def summary(found: dict) -> dict:
    """What a failed comparison needs to be read: both sides' figures without their curves, the
    outcomes, the state's lag and why pods failed."""
    keys = ("outcomes", "state_lag", "failed_by_reason", "seconds")
    sides = {side: {k: v for k, v in found[side].items() if k != "curve_unallocated_gpu_pct"}
             for side in ("replay", "simulate_fgd_cpu")}  # fmt: skip
    return {key: found[key] for key in keys} | sides


def test_replay_and_simulate_place_the_same_pods_and_agree_on_unallocated(tmp_path: Path) -> None:
    from bench.replay import run

    cluster, tasks = synthetic_trace(30, 400, np.random.default_rng(5))
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    write_trace(cluster, tasks, nodes, pods)
    found = run(nodes, pods, seed=42, progress=False)
    replay, simulated = found["replay"], found["simulate_fgd_cpu"]
    assert found["outcomes"]["timed_out"] == found["outcomes"]["off_trace"] == 0
    assert replay["pods"] == simulated["pods"] == found["pods_submitted"], "the same arrivals, in the same order"
    # Up to 90 % arrived every pod fits in both: the same pods placed, so the same unallocated %.
    assert replay["unallocated_gpu_pct"]["80"] == simulated["unallocated_gpu_pct"]["80"]
    assert replay["unallocated_gpu_pct"]["90"] == simulated["unallocated_gpu_pct"]["90"]
    gap = abs(replay["unallocated_gpu_pct"]["100"] - simulated["unallocated_gpu_pct"]["100"])
    assert gap <= UNALLOCATED_TOLERANCE, summary(found)
    assert found["outcomes"]["unschedulable"] == replay["pods_failed"]


def test_a_sampled_replay_of_openb_default(tmp_path: Path) -> None:
    from bench.replay import main

    openb = openb_dir()
    if not (openb / "openb_pod_list_default.csv").exists():
        pytest.skip(f"no openb trace at {openb} (../shared/data/openb or $OPENB_DIR)")

    class Args:
        nodes, pods = openb / "openb_node_list_gpu_node.csv", openb / "openb_pod_list_default.csv"
        seed, tune, until, sample = 42, 1.3, 100.0, 0.1
        json, plot = tmp_path / "replay.json", None

    assert main(Args) == 0
    found = json.loads(Args.json.read_text())
    assert found["nodes"] == 121 and found["outcomes"]["timed_out"] == 0
    replay, simulated = found["replay"], found["simulate_fgd_cpu"]
    assert replay["pods"] == simulated["pods"]
    assert 0 <= replay["unallocated_gpu_pct"]["100"] <= 100
    assert len(replay["curve_unallocated_gpu_pct"]) == 101
