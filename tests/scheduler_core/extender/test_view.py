"""The view's two ways of laying ledger readings over the state agree: per GPU on every row (a share,
preempt), and by counts on the observed rows only (a whole-GPU pod, the hot path)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_core.extender.view import node_view
from scheduler_core.extender.wire import ExtenderArgs
from scheduler_core.k8s.names import ASSIGNED_GPUS_ANNOTATION
from scheduler_core.k8s.pods import PodDemand
from scheduler_core.state.cluster import ClusterState
from scheduler_core.state.readings import Observed
from tests.conftest import make_nodes, make_pod

NODES = make_nodes("A100", "T4", "A100", "L40S", "H100")  # 8, 4, 8, 4, 8 GPUs


class Fixed:
    """Readings that are always pending."""

    def __init__(self, seen: list[Observed]) -> None:
        self.seen = seen

    def pending(self, generated_at: float | None, *, assumed: bool = False) -> list[Observed]:
        return list(self.seen)


def _state(shares: list[tuple[int, int, int]]) -> ClusterState:
    pods = []
    for i, (node, gpu, milli) in enumerate(shares):
        name = NODES[node]["metadata"]["name"]
        pod = make_pod(f"s{i}", 0, node_name=name, phase="Running", milli=milli)
        pod["metadata"]["annotations"][ASSIGNED_GPUS_ANNOTATION] = f"{gpu % 4}:{milli}"
        pods.append(pod)
    pods.append(make_pod("w", 2, node_name=NODES[0]["metadata"]["name"], phase="Running"))
    return ClusterState.from_objects(NODES, pods)


readings = st.lists(
    st.tuples(st.integers(0, len(NODES) - 1), st.lists(st.sampled_from([0, 250, 1000]), min_size=1, max_size=8)),
    max_size=6,
)
shares = st.lists(st.tuples(st.integers(0, len(NODES) - 1), st.integers(0, 3), st.sampled_from([250, 500])), max_size=6)


@settings(max_examples=150, deadline=None)
@given(shares=shares, seen=readings, gpus=st.integers(1, 8), names_form=st.booleans())
def test_whole_gpu_counts_from_the_observed_rows_equal_the_per_gpu_view(shares, seen, gpus, names_form):
    state = _state(shares)
    observed = [Observed(NODES[node]["metadata"]["name"], 0.0, tuple(free)) for node, free in seen]
    names = [*(n["metadata"]["name"] for n in NODES[::-1]), "ghost"]
    args = ExtenderArgs(pod={}, node_names=names) if names_form else ExtenderArgs(pod={}, nodes=NODES[::-1])
    demand = PodDemand(gpus=gpus)
    counted = node_view(state, args, demand, Fixed(observed))
    per_gpu = node_view(state, args, demand, Fixed(observed), per_gpu=True)
    assert counted.free.tolist() == per_gpu.free.tolist()
    for row in range(counted.table.n_nodes):
        assert np.array_equal(counted.free_milli_at(row), per_gpu.free_milli_at(row))
