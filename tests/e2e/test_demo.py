"""``make demo``'s live step: a burst of one-GPU pods through a real kube-scheduler, on its default
scoring and then through ``serve --watch`` (``bench.e2e.run_burst``, its own control plane)."""

from __future__ import annotations

from gpu_scheduler.demo import _format_live, live_burst
from testing.control_plane import ControlPlane


def test_the_demo_burst_packs_to_the_ideal_where_kube_scheduler_alone_spreads(cluster: ControlPlane) -> None:
    # ``cluster`` only makes the module skip, with its one line, where there is no control plane.
    live = live_burst(nodes=12, pods=32)
    assert live["ideal_nodes"] == 4
    assert live["gpu_scheduler"]["bound"] == live["kube_scheduler_alone"]["bound"] == 32
    assert live["gpu_scheduler"]["nodes_used"] == 4
    assert live["kube_scheduler_alone"]["nodes_used"] >= 8, "LeastAllocated spreads one-GPU pods over the nodes"
    assert live["gpu_scheduler"]["staleness"]["binds"] == 32
    assert "4 nodes used" in _format_live(live) and "(the fewest possible: 4)" in _format_live(live)
