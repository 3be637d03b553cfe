"""Shares of a GPU (``gpu-scheduler.io/gpu-milli``) through the facade: where one fits and why not, the
share policies' scores (``fgd_cpu``, ``gpu_packing``), and what counts as used: the ledger's readings,
and whole GPUs left to kube-scheduler's own count."""

import numpy as np
import pytest

from scheduler_core.errors import ConfigError
from scheduler_core.extender.facade import Extender, ExtenderConfig
from scheduler_core.state.cluster import ClusterState
from tests.conftest import make_nodes, make_pod
from tests.scheduler_core.extender.conftest import body, call


# -- shares of a GPU (gpu-scheduler.io/gpu-milli) ----------------------------------------------------
def shared_state(generated_at=None):
    """t4-0 has 4 GPUs with 900, 600, 0 and 0 milli taken; a100-1 is empty; h100-2 runs a 1-GPU pod."""
    pods = [
        make_pod("s1", 0, milli=900, node_name="t4-0", phase="Running"),
        make_pod("s2", 0, milli=600, node_name="t4-0", phase="Running"),
        make_pod("w", 1, node_name="h100-2", phase="Running"),
    ]
    pods[0]["metadata"]["annotations"]["gpu-scheduler.io/assigned-gpus"] = "0:900"
    pods[1]["metadata"]["annotations"]["gpu-scheduler.io/assigned-gpus"] = "1:600"
    state = ClusterState.from_objects(make_nodes("T4", "A100", "H100"), pods)
    return ClusterState(state.table, state.used_gpus, state.utilization, free_milli=state.free_milli,
                        generated_at=generated_at)  # fmt: skip


def test_a_share_passes_where_one_gpu_has_room_and_says_why_not_elsewhere():
    state = shared_state()
    full = ClusterState(state.table, state.used_gpus + np.array([0, 8, 7]), state.utilization,
                        free_milli=state.free_milli * [[1], [0], [0]], generated_at=None)  # fmt: skip
    status, reply = call(
        Extender(cluster=lambda: full), "filter", body(make_pod("p", 0, milli=500), names=["t4-0", "a100-1"])
    )
    assert status == 200 and reply["NodeNames"] == ["t4-0"]
    assert reply["FailedNodes"] == {"a100-1": "none of 8 GPUs has 500 milli free (the pod's share)"}


def test_a_share_prefers_the_node_whose_shared_gpu_it_fills():
    """gpu_packing: a GPU already shared (t4-0's GPU 1, 400 free) before an idle node, before a partly used one."""
    state = shared_state()
    gpu_packing = ExtenderConfig(share_policy="gpu_packing")
    status, scores = call(Extender(gpu_packing, cluster=lambda: state), "prioritize",
                          body(make_pod("p", 0, milli=400), names=["a100-1", "t4-0", "h100-2"]))  # fmt: skip
    assert status == 200
    by_host = {p["Host"]: p["Score"] for p in scores}
    assert by_host["t4-0"] > by_host["h100-2"] > by_host["a100-1"]


def cpu_starved_state(hungry_cpu="46"):
    """Two T4 nodes (4 GPUs, 47.81 cores) with one whole-GPU pod each: t4-0's asks ``hungry_cpu`` cores,
    t4-1's one core. Three pods of 8 cores and 1 GPU are the typical shapes, with the two bound ones."""
    hungry = make_pod("hungry", 1, node_name="t4-0", phase="Running")
    hungry["spec"]["containers"][0]["resources"]["requests"]["cpu"] = hungry_cpu
    typical = [make_pod(f"t{i}", 1, node_name="t4-1", phase="Running") for i in range(3)]
    for pod in typical:
        pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "8"
    return ClusterState.from_objects(make_nodes("T4", "T4"), [hungry, *typical])


def share_scores(state, policy="fgd_cpu", cpu="500m", milli=500):
    pod = make_pod("p", 0, milli=milli)
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = cpu
    extender = Extender(ExtenderConfig(share_policy=policy), cluster=lambda: state)
    status, scores = call(extender, "prioritize", body(pod, names=["t4-0", "t4-1"]))
    assert status == 200, scores
    return {p["Host"]: p["Score"] for p in scores}


def test_fgd_cpu_puts_a_share_on_gpus_that_cpu_has_stranded():
    """t4-0 has 3 free GPUs but 1.81 cores: no typical pod (8 cores) can use them, so a share there
    strands nothing more. On t4-1 it would break a whole GPU the typical pods could still use."""
    state = cpu_starved_state()
    assert state.free_cpu.tolist() == [47810 - 46000, 47810 - 24000]
    scores = share_scores(state)
    assert scores["t4-0"] > scores["t4-1"]
    # With t4-0's CPU free as well, the stranding is gone: t4-0 is no longer preferred.
    roomy = share_scores(cpu_starved_state(hungry_cpu="1"))
    assert roomy["t4-0"] <= roomy["t4-1"]
    # gpu_packing sees two nodes with one busy GPU each, and cannot tell them apart: the tie goes to the
    # node first in the fixed order, the same one every time.
    packing = share_scores(state, policy="gpu_packing")
    assert sorted(packing.values()) == [9, 10] and packing == share_scores(state, policy="gpu_packing")


def cpu_only_scores(policy="fgd_cpu", cpu="4"):
    """A CPU-only pod asking ``cpu`` cores over four T4 nodes (4 GPUs, 47.81 cores each): t4-0 and t4-3
    have every GPU taken, t4-1 is empty, and t4-2 has 3 GPUs free but 9.81 cores, just enough for the
    typical pod (8 cores, 1 GPU)."""
    full = [make_pod(f"{node}-{i}", 1, node_name=node, phase="Running") for node in ("t4-0", "t4-3") for i in range(4)]
    for pod in full:
        pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "8"
    hungry = make_pod("hungry", 1, node_name="t4-2", phase="Running")
    hungry["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "38"
    state = ClusterState.from_objects(make_nodes("T4", "T4", "T4", "T4"), [*full, hungry])
    pod = make_pod("batch", 0)
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = cpu
    extender = Extender(ExtenderConfig(share_policy=policy), cluster=lambda: state)
    names = ["t4-0", "t4-1", "t4-2", "t4-3"]
    status, filtered = call(extender, "filter", body(pod, names=names))
    assert status == 200 and filtered["NodeNames"] == names  # CPU and memory are kube-scheduler's to check
    status, scores = call(extender, "prioritize", body(pod, names=names))
    assert status == 200, scores
    return {p["Host"]: p["Score"] for p in scores}


def test_fgd_cpu_places_whole_gpus_where_they_strand_the_least():
    """Whole GPUs by fgd_cpu, as simulate places them: t4-0's 3 free GPUs are stranded already (1.81
    cores left), so using one of them costs nothing, where t4-1's last GPU is one the typical pods could
    still use. Best fit (with another share policy) takes t4-1's, which fits exactly."""
    state = cpu_starved_state()
    pod = make_pod("p", 1)
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "500m"
    request = body(pod, names=["t4-0", "t4-1"])
    fgd = {p["Host"]: p["Score"] for p in call(Extender(cluster=lambda: state), "prioritize", request)[1]}
    # FGD 73 against 50, scaled over the two to 1 and 0, blended 0.7 to 0.3 with idle GPUs (utilisation).
    assert fgd == {"t4-0": 10, "t4-1": 3}
    best_fit = Extender(ExtenderConfig(share_policy="gpu_packing"), cluster=lambda: state)
    packing = {p["Host"]: p["Score"] for p in call(best_fit, "prioritize", request)[1]}
    assert packing == {"t4-0": 8, "t4-1": 10}


def test_fgd_cpu_sends_a_cpu_only_pod_where_its_cpu_strands_no_gpu():
    scores = cpu_only_scores()
    # Nodes with no free GPU first: one of the two at the top (the tie goes by NodeTable.tie_rank, as
    # for GPU pods, so that pods of every kind consolidate on the same nodes), the other next; then the
    # empty node, where 4 cores change nothing; last the node whose free GPUs the pod would strand.
    assert (scores["t4-3"], scores["t4-0"]) == (10, 9)
    assert 9 > scores["t4-1"] > scores["t4-2"]
    # A pod small enough to leave t4-2 room for the typical pod strands nothing there either.
    small = cpu_only_scores(cpu="1")
    assert small["t4-1"] == small["t4-2"] < 9
    # The other policies have no opinion on a pod without GPUs: 0 everywhere, as before.
    assert set(cpu_only_scores(policy="gpu_packing").values()) == {0}


def test_fgd_cpu_without_cpu_in_the_state_places_shares_as_gpu_packing_does():
    state = cpu_starved_state()
    blind = ClusterState(state.table, state.used_gpus, state.utilization, free_milli=state.free_milli)
    assert share_scores(blind) == share_scores(blind, policy="gpu_packing")
    no_shapes = ClusterState(state.table, state.used_gpus, state.utilization, free_milli=state.free_milli,
                             free_cpu=state.free_cpu)  # fmt: skip
    assert share_scores(no_shapes) == share_scores(state, policy="gpu_packing")
    # Shapes that ask for no GPU would score every node the same: gpu_packing places the share.
    shared = shared_state()
    cpu_only = ClusterState(shared.table, shared.used_gpus, shared.utilization, free_milli=shared.free_milli,
                            free_cpu=np.full(3, 40_000), shapes=(((1000, 0, 0, ""), 5),))  # fmt: skip
    request = body(make_pod("p", 0, milli=400), names=["a100-1", "t4-0", "h100-2"])
    by_policy = {
        policy: call(Extender(ExtenderConfig(share_policy=policy), cluster=lambda: cpu_only), "prioritize", request)[1]
        for policy in ("fgd_cpu", "gpu_packing")
    }
    assert by_policy["fgd_cpu"] == by_policy["gpu_packing"]
    assert len({p["Score"] for p in by_policy["gpu_packing"]}) == 3


def test_fgd_cpu_share_scores_equal_a_loop_over_each_gpu():
    """The extender's FGD score per node, against FGD_NOTES' definition computed GPU by GPU."""
    from scheduler_core.k8s.pods import PodDemand
    from scheduler_core.placement.model import Workload
    from scheduler_core.scoring.policy import Fragmentation, share_policy

    rng = np.random.default_rng(7)
    workload = Workload.from_shapes(
        [((4000, 1000, 1, ""), 5), ((8000, 500, 1, ""), 3), ((16000, 1000, 2, "A100"), 2)], ("A100", "T4", "")
    )
    for _ in range(30):
        n = 6
        gpu_count = rng.choice([1, 2, 4, 8], n)
        free = np.where(np.arange(8) < gpu_count[:, None], rng.choice([0, 150, 400, 700, 1000], (n, 8)), 0)
        cpu = rng.choice([1000, 6000, 20000, 60000], n).astype(np.int64)
        model = rng.choice([-1, 0, 1], n).astype(np.int64)
        share, pod_cpu = int(rng.choice([100, 300, 600])), 1000
        feasible = (free >= share).any(axis=1)
        fit = share_policy("fgd_cpu").preference(free.astype(np.int32), gpu_count, PodDemand(gpus=1, share=share),
                                                 feasible, Fragmentation(cpu, model, workload, pod_cpu))  # fmt: skip
        expected = {}
        for row in np.flatnonzero(feasible):
            before = workload.fragmentation(free[row : row + 1], cpu[row : row + 1], model[row : row + 1])[0]
            best = None
            for gpu in range(8):
                if free[row, gpu] >= share:
                    after = free[row : row + 1].copy()
                    after[0, gpu] -= share
                    f = workload.fragmentation(after, cpu[row : row + 1] - pod_cpu, model[row : row + 1])[0]
                    option = int(np.floor(100.0 / (1.0 + np.exp(-(before - f) / 1000.0))))
                    best = option if best is None else max(best, option)
            expected[row] = best
        low, high = min(expected.values()), max(expected.values())
        for row, value in expected.items():
            assert fit[row] == pytest.approx((value - low) / (high - low) if high > low else 1.0)
        assert (fit[~feasible] == 0).all()


def test_a_share_with_an_invalid_cpu_request_is_a_400_naming_the_field():
    state = cpu_starved_state()
    pod = make_pod("p", 0, milli=500)
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "half"
    status, reply = call(Extender(cluster=lambda: state), "prioritize", body(pod, names=["t4-0"]))
    assert status == 400 and "containers[0].resources.requests.cpu" in reply["Error"]


def test_a_thousand_milli_or_more_and_a_mixed_request_are_refused_naming_what_to_ask_instead():
    """1000 milli or more is no share: no device plugin gives such a pod a device, and no reservation pod
    holds its GPUs, so it is refused with what to ask for instead (issue "Safe to deploy, third pass")."""
    state = shared_state()
    status, reply = call(Extender(cluster=lambda: state), "filter",
                         body(make_pod("p", 0, milli=3000), names=["t4-0", "h100-2"]))  # fmt: skip
    assert status == 200 and reply["NodeNames"] == []
    assert reply["Error"] == (
        "gpu-scheduler.io/gpu-milli=3000: a share is 1..999 milli of one GPU; ask for whole GPUs as nvidia.com/gpu"
        " (3), which the device plugin gives their devices"
    )
    mixed = make_pod("m", 1, milli=500)
    status, reply = call(Extender(cluster=lambda: state), "filter", body(mixed, names=["t4-0"]))
    assert status == 200 and "requests both nvidia.com/gpu=1 and gpu-scheduler.io/gpu-milli=500" in reply["Error"]
    status, reply = call(Extender(cluster=lambda: state), "filter",
                         body(make_pod("odd", 0, milli=1500), names=["t4-0"]))  # fmt: skip
    assert "a share is 1..999 milli of one GPU" in reply["Error"] and "(a whole number of)" in reply["Error"]


def test_what_the_ledger_showed_counts_until_a_newer_snapshot_shows_it():
    from adapters.ledger_readings import LedgerReadings

    now = [1000.0]
    readings = LedgerReadings(margin_s=30.0, clock=lambda: now[0])
    states = [shared_state(generated_at=900.0)]
    extender = Extender(cluster=lambda: states[0], readings=readings)
    share = body(make_pod("p", 0, milli=500), names=["t4-0"])
    assert call(extender, "filter", share)[1]["NodeNames"] == ["t4-0"]  # GPUs 2 and 3 are empty
    readings.observe("t4-0", (1000, 400, 400, 400))  # binds here and elsewhere, read from the ledger
    assert call(extender, "filter", share)[1]["NodeNames"] == []  # GPU 0 is taken in the snapshot
    states[0] = shared_state(generated_at=1100.0)  # generated after the binds (the pods would now be in it)
    assert call(extender, "filter", share)[1]["NodeNames"] == ["t4-0"]
    assert readings.pending(1100.0) == []


def test_an_unknown_share_policy_is_refused_naming_the_choices():
    expected = "share_policy: share policy 'fgd': expected one of fgd_cpu, gpu_packing, bestfit, dotprod"
    with pytest.raises(ConfigError, match=expected):
        Extender(ExtenderConfig(share_policy="fgd"))


def test_full_node_objects_against_an_empty_state_count_every_gpu_free():
    empty = ClusterState.from_objects([])
    status, reply = call(Extender(cluster=lambda: empty), "filter", body(make_pod("p", 0, milli=500), make_nodes("T4")))
    assert status == 200 and [n["metadata"]["name"] for n in reply["Nodes"]["items"]] == ["t4-0"]


def test_kube_scheduler_keeps_the_count_of_whole_gpus_so_the_filter_never_refuses_a_node_for_it():
    """A state can be staler than kube-scheduler's own count (it includes the pods it has just placed):
    for nvidia.com/gpu the filter keeps every node with the right model and size, and the scores still
    read the state. For gpu-scheduler.io/gpu-milli the extender is the only one counting."""
    state = ClusterState.from_objects(
        make_nodes("A100", "A100"), [make_pod("r", 8, node_name="a100-0", phase="Running")]
    )
    extender = Extender(cluster=lambda: state)
    _, reply = call(extender, "filter", body(make_pod("whole", 2), names=["a100-0", "a100-1"]))
    assert reply["NodeNames"] == ["a100-0", "a100-1"] and reply["FailedNodes"] == {}
    _, scores = call(extender, "prioritize", body(make_pod("whole", 2), names=["a100-0", "a100-1"]))
    assert {p["Host"]: p["Score"] for p in scores} == {"a100-0": 0, "a100-1": 10}
    _, reply = call(extender, "filter", body(make_pod("milli", 0, milli=500), names=["a100-0", "a100-1"]))
    assert reply["FailedNodes"] == {"a100-0": "none of 8 GPUs has 500 milli free (the pod's share)"}
