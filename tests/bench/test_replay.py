"""``bench/replay.py``'s translation of a trace into Kubernetes objects, read back by the product's own
parsers, and its sampling (the replay itself runs through a real kube-scheduler in tests/e2e/test_replay.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.replay import failure_reason, load, placed_gpus, trace_node, trace_pod
from scheduler_core.errors import InvalidArgsError
from scheduler_core.k8s.names import ASSIGNED_GPUS_ANNOTATION
from scheduler_core.k8s.nodes import NodeTable
from scheduler_core.k8s.pods import pod_demand
from scheduler_core.placement.model import Cluster, Task
from scheduler_core.simulator.traces import read_nodes, read_tasks, synthetic_trace, write_trace


@pytest.mark.parametrize(
    ("task", "gpus", "share", "models"),
    [
        (Task(8000, 16384, 0, 0), 0, 0, None),
        (Task(4000, 8192, 1, 250), 1, 250, None),
        (Task(4000, 8192, 1, 1000), 1, 0, None),
        (Task(32000, 65536, 8, 1000), 8, 0, None),
        (Task(4000, 8192, 1, 500, frozenset({"V100M16", "T4"})), 1, 500, ("T4", "V100M16")),
    ],
    ids=["cpu only", "a share", "one GPU", "eight GPUs", "a share of two models"],
)
def test_each_task_becomes_the_pod_the_product_reads_back(
    task: Task, gpus: int, share: int, models: tuple[str, ...] | None
) -> None:
    pod = trace_pod("t-000001", task)
    demand = pod_demand(pod)
    assert (demand.gpus, demand.share) == (gpus, share)
    assert (tuple(sorted(m.upper() for m in demand.models)) if demand.models else None) == (
        tuple(m.upper() for m in models) if models else None
    )
    requests = pod["spec"]["containers"][0]["resources"]["requests"]
    assert (requests["cpu"], requests["memory"]) == (f"{task.cpu}m", f"{task.mem}Mi")
    assert pod["spec"]["schedulerName"] == "gpu-scheduler"


def test_each_node_row_becomes_a_node_with_its_gpus_and_model() -> None:
    cluster = Cluster.build([96000, 64000], [786432, 262144], [8, 2], ["G2", "T4"])
    nodes = [trace_node(f"n-{i}", cluster, i) for i in range(2)]
    table = NodeTable.from_nodes(nodes)
    assert table.alloc_gpus.tolist() == [8, 2]
    assert [table.models[m] for m in table.model_id.tolist()] == ["G2", "T4"]
    assert nodes[0]["status"]["allocatable"]["cpu"] == "96000m"


def test_the_gpus_a_pod_took_come_from_its_annotation_else_the_simulators_rule() -> None:
    cluster = Cluster.build([96000], [786432], [4], ["G2"])
    cluster.gpu_left[0, :4] = [1000, 500, 1000, 0]
    share, whole = Task(1000, 1024, 1, 300), Task(1000, 1024, 2, 1000)
    assert placed_gpus(cluster, 0, share, {ASSIGNED_GPUS_ANNOTATION: "2:300"}) == [2]
    assert placed_gpus(cluster, 0, whole, {}) == [0, 2]
    assert placed_gpus(cluster, 0, Task(1000, 1024, 0, 0), {}) == []


def test_a_sample_is_a_seeded_fraction_and_the_whole_trace_is_what_simulate_reads(tmp_path: Path) -> None:
    cluster, tasks = synthetic_trace(40, 300, np.random.default_rng(3))
    nodes_csv, pods_csv = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    write_trace(cluster, tasks, nodes_csv, pods_csv)
    names, whole, all_tasks = load(nodes_csv, pods_csv, sample=1.0, seed=42)
    reference = read_nodes(nodes_csv)
    assert np.array_equal(whole.gpu_count, reference.gpu_count) and all_tasks == read_tasks(pods_csv)
    assert names == sorted(names) and len(names) == 40
    a = load(nodes_csv, pods_csv, sample=0.25, seed=42)
    b = load(nodes_csv, pods_csv, sample=0.25, seed=42)
    assert a[0] == b[0] and a[2] == b[2] and (len(a[0]), len(a[2])) == (10, 75)
    assert load(nodes_csv, pods_csv, sample=0.25, seed=43)[0] != a[0]
    with pytest.raises(InvalidArgsError, match="--sample: expected a fraction in"):
        load(nodes_csv, pods_csv, sample=0.0, seed=42)


def test_failures_count_together_whatever_order_the_scheduler_lists_their_reasons_in():
    share = Task(cpu=1000, mem=0, num_gpu=1, gpu_milli=810)
    first = (
        "0/1213 nodes are available: 3 Insufficient memory, 12 none of 8 GPUs has 810 milli free (the pod's share),"
        " 7 3 of 8 GPUs free, pod needs 4. preemption: 0/1213 nodes are available: 1213 No preemption victims found."
    )
    again = (
        "0/1213 nodes are available: 9 3 of 8 GPUs free, pod needs 4, 1 none of 4 GPUs has 810 milli free (the pod's"
        " share), 2 none of 8 GPUs has 810 milli free (the pod's share), 5 Insufficient memory."
    )
    expected = (
        "share 810: Insufficient memory; N of N GPUs free, pod needs N;"
        " none of N GPUs has N milli free (the pod's share)"
    )
    assert failure_reason(first, share) == failure_reason(again, share) == expected
    whole = Task(cpu=1000, mem=0, num_gpu=2, gpu_milli=1000)
    assert failure_reason("no answer within 30 s", whole) == "2 GPU: no answer within N s"
