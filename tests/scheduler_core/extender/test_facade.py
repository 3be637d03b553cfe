import json
import re
from collections.abc import Collection

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_core.errors import ConfigError
from scheduler_core.extender.facade import Extender, ExtenderConfig
from scheduler_core.extender.wire import ExtenderArgs
from scheduler_core.scoring.gpu_fit import ScoreWeights
from scheduler_core.state.cluster import ClusterState
from tests.conftest import (
    SCHEDULER_FIXTURES,
    SHARED,
    assert_protocol_correct_filter,
    fixture_id,
    load_fixture,
    make_nodes,
    make_pod,
    request_verb,
    requires_fixtures,
    scheduler_requests,
)


def body(pod, nodes=None, names=None):
    return json.dumps(
        {"Pod": pod, "Nodes": None if nodes is None else {"metadata": {}, "items": nodes}, "NodeNames": names}
    ).encode()


def call(extender, verb, payload):
    status, raw = extender.handle(verb, payload)
    return status, json.loads(raw)


@requires_fixtures()
@pytest.mark.parametrize("path", scheduler_requests("filter") + scheduler_requests("prioritize"), ids=fixture_id)
def test_every_captured_request_gets_a_protocol_correct_reply(path):
    request = load_fixture(path)
    status, reply = call(Extender(), request_verb(path), path.read_bytes())
    if request_verb(path) == "filter":
        assert status == 200
        assert_protocol_correct_filter(request, reply)
        if request["NodeNames"] is not None:
            assert "nodeCacheCapable" in reply["Error"], "NodeNames without cluster state is refused with Error"
    elif request["NodeNames"] is not None:
        assert status == 503
        assert "cluster state" in reply["Error"]
    else:
        assert status == 200
        assert [p["Host"] for p in reply] == [n["metadata"]["name"] for n in request["Nodes"]["items"]]
        assert all(isinstance(p["Score"], int) and 0 <= p["Score"] <= 10 for p in reply)


@requires_fixtures()
def test_captured_a100_pod_keeps_only_the_a100_node():
    path = SCHEDULER_FIXTURES / "01-filter-prioritize-nodecache-false" / "01-filter-gpu-a100-2.request.json"
    _, reply = call(Extender(), "filter", path.read_bytes())
    assert [n["metadata"]["name"] for n in reply["Nodes"]["items"]] == ["gpu-node-0"]
    assert reply["FailedAndUnresolvableNodes"] == {
        "gpu-node-1": "GPU model V100 not in A100",
        "gpu-node-2": "GPU model T4 not in A100",
    }


@requires_fixtures()
def test_real_pod_list_supplies_the_allocation_view():
    """gpu-node-0 is full after case 03 (2 + init 4 + 2 GPUs); gpu-node-2 has 2 of 4 used."""
    nodes = load_fixture(
        SCHEDULER_FIXTURES / "01-filter-prioritize-nodecache-false" / "01-filter-gpu-a100-2.request.json"
    )
    pods = load_fixture(SHARED / "fixtures" / "kube-apiserver" / "a3-pods-list-after-case3-small-cluster.json")
    state = ClusterState.from_objects(nodes["Nodes"]["items"], pods["items"])
    assert state.used_gpus.tolist() == [8, 0, 2]
    request = (
        SCHEDULER_FIXTURES
        / "03b-two-containers-no-init-nodecache-false"
        / "01-filter-multi-container-no-init.request.json"
    )
    # kube-scheduler counts nvidia.com/gpu itself, so the filter never refuses a node for its count...
    _, reply = call(Extender(cluster=lambda: state), "filter", request.read_bytes())
    assert reply["FailedNodes"] == {}
    assert [n["metadata"]["name"] for n in reply["Nodes"]["items"]] == ["gpu-node-0", "gpu-node-1", "gpu-node-2"]
    # ... but the scores read the state: gpu-node-0 has no room in it, gpu-node-2 has exactly 2 free,
    # gpu-node-1 would leave 2 GPUs idle. fgd_cpu (the default; the state has CPU and the pods' shapes)
    # sees no fragmentation either way, and gives its tie to best fit (min-max scaled over the two, then
    # blended with idle utilisation: 10 and 3); with another share policy whole GPUs go by best fit alone.
    status, scores = call(Extender(cluster=lambda: state), "prioritize", request.read_bytes())
    assert status == 200
    assert {p["Host"]: p["Score"] for p in scores} == {"gpu-node-0": 0, "gpu-node-1": 3, "gpu-node-2": 10}
    best_fit = Extender(ExtenderConfig(share_policy="gpu_packing"), cluster=lambda: state)
    status, scores = call(best_fit, "prioritize", request.read_bytes())
    assert {p["Host"]: p["Score"] for p in scores} == {"gpu-node-0": 0, "gpu-node-1": 8, "gpu-node-2": 10}


def test_whole_gpu_pods_are_refused_where_shares_hold_the_gpus_kube_scheduler_counts_as_free():
    """kube-scheduler counts nvidia.com/gpu but not shares (gpu-milli is ignoredByScheduler): on a node
    where shares hold GPUs the filter counts them; elsewhere it still leaves the count to kube-scheduler."""
    share = make_pod("share", 0, milli=250, node_name="a100-0", phase="Running")
    share["metadata"]["annotations"]["gpu-scheduler.io/assigned-gpus"] = "3:250"
    whole = make_pod("whole", 4, node_name="a100-1", phase="Running")
    state = ClusterState.from_objects(make_nodes("A100", "A100"), [share, whole])
    assert state.held_by_shares(np.array([0, 1])).tolist() == [1, 0]
    _, reply = call(Extender(cluster=lambda: state), "filter", body(make_pod("p", 8), names=["a100-0", "a100-1"]))
    assert reply["NodeNames"] == ["a100-1"]  # its 4 busy GPUs are kube-scheduler's to count
    assert reply["FailedNodes"] == {"a100-0": "7 of 8 GPUs free, pod needs 8"}
    _, reply = call(Extender(cluster=lambda: state), "filter", body(make_pod("p", 7), names=["a100-0", "a100-1"]))
    assert reply["NodeNames"] == ["a100-0", "a100-1"]


def test_names_are_resolved_against_cluster_state_and_unknown_names_fail():
    state = ClusterState.from_objects(make_nodes("A100", "T4"), [make_pod("r", 8, node_name="a100-0", phase="Running")])
    extender = Extender(cluster=lambda: state)
    # A share: gpu-scheduler.io/gpu-milli, which the extender counts itself.
    status, reply = call(extender, "filter", body(make_pod("p", 0, milli=500), names=["t4-1", "ghost", "a100-0"]))
    assert status == 200
    assert reply["NodeNames"] == ["t4-1"]
    assert reply["Nodes"] is None
    assert reply["FailedNodes"] == {
        "ghost": "node is not in the cluster state",
        "a100-0": "none of 8 GPUs has 500 milli free (the pod's share)",
    }
    status, scores = call(extender, "prioritize", body(make_pod("p", 2), names=["t4-1", "ghost"]))
    assert status == 200
    assert {p["Host"]: p["Score"] for p in scores} == {"t4-1": 10, "ghost": 0}


def test_pod_without_gpu_passes_every_node_unchanged():
    nodes = make_nodes("A100", "T4")
    status, reply = call(Extender(), "filter", body(make_pod("cpu", 0, models="A100"), nodes))
    assert status == 200
    assert reply["Nodes"]["items"] == nodes
    assert reply["FailedNodes"] == {} and reply["FailedAndUnresolvableNodes"] == {}


def test_prioritize_prefers_the_tightest_fit():
    state = ClusterState.from_objects(
        make_nodes("A100", "A100", "H100"),
        [
            make_pod("r1", 6, node_name="a100-0", phase="Running"),
            make_pod("r2", 4, node_name="a100-1", phase="Running"),
        ],
    )
    status, scores = call(
        Extender(cluster=lambda: state), "prioritize", body(make_pod("p", 2), make_nodes("A100", "A100", "H100"))
    )
    assert status == 200
    ranked = sorted(scores, key=lambda p: -p["Score"])
    assert [p["Host"] for p in ranked] == ["a100-0", "a100-1", "h100-2"]


# -- bad input: 400, or 200 with Error; never 500, never a traceback --------------------------------
def bad_pod(**resources):
    pod = make_pod("bad", 1)
    pod["spec"]["containers"][0]["resources"] = resources
    return pod


@pytest.mark.parametrize(
    ("verb", "payload", "status", "message"),
    [
        pytest.param("filter", b"not json", 400, "not valid JSON", id="non-JSON"),
        pytest.param("filter", b"\xff\xfe{", 400, "not valid JSON", id="invalid UTF-8"),
        pytest.param("filter", b"[" * 100_000 + b"]" * 100_000, 400, "nested too deeply", id="deeply nested"),
        pytest.param("filter", b"[]", 400, "expected a JSON object", id="wrong top-level type"),
        pytest.param("filter", b'{"Nodes": {"items": []}}', 400, "Pod: required", id="missing Pod"),
        pytest.param("filter", b'{"Pod": 3, "NodeNames": []}', 400, "Pod: expected a JSON object", id="Pod wrong type"),
        pytest.param(
            "filter", b'{"Pod": {}, "Nodes": {"items": ["x"]}}', 400, r"Nodes.items\[0\]", id="node wrong type"
        ),
        pytest.param(
            "prioritize", b'{"Pod": {}, "NodeNames": "a"}', 400, "NodeNames: expected a list", id="names wrong type"
        ),
        pytest.param("frobnicate", b"{}", 404, "unknown verb 'frobnicate'", id="unknown verb"),
        pytest.param(
            "filter",
            body(bad_pod(limits={"nvidia.com/gpu": "-2"}), []),
            200,
            "non-negative whole number, got '-2'",
            id="negative GPUs",
        ),
        pytest.param(
            "filter",
            body(bad_pod(limits={"nvidia.com/gpu": "1.5"}), []),
            200,
            "whole number, got '1.5'",
            id="fractional GPUs",
        ),
        pytest.param(
            "filter",
            body(make_pod("p", 1, memory="plenty"), []),
            200,
            "gpu.nvidia.com/memory: .*'plenty'",
            id="garbage memory",
        ),
        pytest.param(
            "filter", body(make_pod("p", 1, models="A1%0"), []), 200, "gpu.nvidia.com/model", id="garbage model"
        ),
        pytest.param(
            "prioritize",
            body(make_pod("p", 1, models="A1%0"), []),
            400,
            "gpu.nvidia.com/model",
            id="garbage in prioritize",
        ),
    ],
)
def test_bad_input_gets_a_clear_error_and_never_a_500(verb, payload, status, message):
    got_status, raw = Extender().handle(verb, payload)
    reply = json.loads(raw)
    assert got_status == status
    error = reply["Error"]
    assert re.search(message, error), error
    assert "Traceback" not in error


def test_body_over_the_limit_is_refused():
    extender = Extender(ExtenderConfig(max_body_bytes=1000))
    status, reply = call(extender, "filter", b" " * 1001)
    assert status == 400
    assert reply["Error"] == "request body is 1001 bytes; the limit is 1000"


def test_pod_error_in_filter_keeps_the_request_form():
    _, reply = call(Extender(), "filter", body(make_pod("p", 1, memory="x"), names=["a"]))
    assert reply["NodeNames"] == [] and reply["Nodes"] is None and reply["Error"]


def test_invalid_config_is_rejected_at_start_with_every_problem():
    with pytest.raises(ConfigError, match=r"weights.fit: .*; max_body_bytes: must be a positive integer"):
        Extender(ExtenderConfig(weights=ScoreWeights(fit=3.0), max_body_bytes=0))


# -- the direct JSON writer equals the wire type's encoding ----------------------------------------
@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from(["A100", "H100", "T4"]), min_size=1, max_size=12),
    st.lists(st.integers(0, 8), min_size=12, max_size=12),
    st.lists(st.text(alphabet='ab"\\\\é\u2028-', min_size=1, max_size=6), max_size=4),
    st.integers(0, 8),
    st.sampled_from([None, "A100", "H100,T4"]),
)
def test_filter_and_prioritize_json_read_as_the_decision_they_carry(models, used, unknown, gpus, wanted):
    """The direct writers against a slow reference: each outcome's fields, as a dict, through json.dumps."""
    nodes = make_nodes(*models)
    pods = [
        make_pod(f"r{i}", n, node_name=node["metadata"]["name"], phase="Running")
        for i, (n, node) in enumerate(zip(used, nodes, strict=False))
    ]
    state = ClusterState.from_objects(nodes, pods)
    extender = Extender(cluster=lambda: state)
    names = [n["metadata"]["name"] for n in nodes] + [u for u in unknown if u not in state.table.index]
    for args in (
        ExtenderArgs(pod=make_pod("p", gpus, models=wanted), node_names=names),
        ExtenderArgs(pod=make_pod("p", gpus, models=wanted), nodes=nodes),
    ):
        outcome = extender.filter(args)
        assert json.loads(outcome.to_json()) == reference_filter_reply(outcome)
        assert outcome.nodes_in == len(args.node_names or args.nodes)
        scored = extender.prioritize(args)
        pairs = zip(scored.hosts, scored.values, strict=True)
        assert json.loads(scored.to_json()) == [{"Host": host, "Score": score} for host, score in pairs]


def reference_filter_reply(outcome):
    """kube-scheduler's ``ExtenderFilterResult`` for ``outcome``, built as a dict."""
    result = outcome.result

    def hinted(texts):  # where no node passes, each refusal ends with what an autoscaler could add
        return {node: f"{text}; {outcome.hint}" if outcome.hint else text for node, text in texts.items()}

    failed = {**hinted(result.failed), **dict.fromkeys(outcome.unknown, "node is not in the cluster state")}
    return {
        "Nodes": None if outcome.names_only else {"metadata": {}, "items": outcome.kept},
        "NodeNames": outcome.kept if outcome.names_only else None,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": hinted(result.failed_unresolvable),
        "Error": outcome.error,
    }


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


def _with_uid(pod, uid):
    pod["metadata"]["uid"] = uid
    return pod


def test_the_only_node_a_filter_keeps_takes_the_pod_at_once_in_the_extenders_view():
    """kube-scheduler skips prioritize with one node left: that is where the pod goes, so the next pod
    sees it there before any watch or snapshot does."""
    from adapters.ledger_readings import LedgerReadings

    state = ClusterState.from_objects(make_nodes("A100", "T4"))
    readings = LedgerReadings()
    extender = Extender(cluster=lambda: state, readings=readings)
    _, reply = call(extender, "filter", body(_with_uid(make_pod("p", 3, models="T4"), "u-1"), names=["a100-0", "t4-1"]))
    assert reply["NodeNames"] == ["t4-1"]
    assert [(r.node, r.taken, r.uid) for r in readings.pending(None, assumed=True)] == [
        ("t4-1", ((0, 1000), (1, 1000), (2, 1000)), "u-1")
    ]
    _, scores = call(extender, "prioritize", body(make_pod("q", 1), names=["a100-0", "t4-1"]))
    assert {p["Host"]: p["Score"] for p in scores}["t4-1"] == 10  # one GPU left there: the best fit now


def test_prioritizes_one_best_node_is_assumed_and_a_tie_always_goes_to_the_same_node():
    from adapters.ledger_readings import LedgerReadings

    state = ClusterState.from_objects(make_nodes("A100", "A100", "A100"))
    readings = LedgerReadings()
    extender = Extender(cluster=lambda: state, readings=readings)
    names = ["a100-0", "a100-1", "a100-2"]
    first = call(extender, "prioritize", body(_with_uid(make_pod("p", 2), "u-1"), names=names))[1]
    again = call(Extender(cluster=lambda: state), "prioritize", body(make_pod("p", 2), names=names))[1]
    assert first == again  # every instance breaks the tie the same way
    winner = next(p["Host"] for p in first if p["Score"] == 10)
    assert sorted(p["Score"] for p in first) == [9, 9, 10]
    assert [(r.node, r.taken, r.uid) for r in readings.pending(None, assumed=True)] == [
        (winner, ((0, 1000), (1, 1000)), "u-1")
    ]
    # The next pod packs onto the assumed node: 6 GPUs left there, a better fit than 8.
    second = call(extender, "prioritize", body(_with_uid(make_pod("q", 2), "u-2"), names=names))[1]
    assert next(p["Host"] for p in second if p["Score"] == 10) == winner


def test_a_share_is_assumed_on_the_tightest_gpu_as_the_ledger_would_choose():
    from adapters.ledger_readings import LedgerReadings

    shares = [make_pod("s", 0, milli=600, node_name="t4-0", phase="Running")]
    shares[0]["metadata"]["annotations"]["gpu-scheduler.io/assigned-gpus"] = "0:600"
    state = ClusterState.from_objects(make_nodes("T4"), shares)
    readings = LedgerReadings()
    extender = Extender(ExtenderConfig(share_policy="gpu_packing"), cluster=lambda: state, readings=readings)
    _, reply = call(extender, "filter", body(_with_uid(make_pod("p", 0, milli=300), "u-3"), names=["t4-0"]))
    assert reply["NodeNames"] == ["t4-0"]
    assert [(r.taken, r.uid) for r in readings.pending(None, assumed=True)] == [(((0, 300),), "u-3")]  # 100 left


def test_an_assumed_pods_cpu_counts_for_the_next_pod_before_the_state_shows_it():
    """fgd_cpu reads each node's free CPU. Pod 1 (1 GPU, 30 cores) goes to t4-0, where the typical pod
    (8 cores, 1 GPU) still fits after it; the state does not show it yet. Pod 2 (1 GPU, 5 cores) would
    then leave t4-0 4.81 cores and one GPU nobody typical can use: with pod 1's CPU assumed, t4-1 is
    the better node. Without the assumption the two look alike."""
    from adapters.ledger_readings import LedgerReadings

    typical = [make_pod(f"t{i}", 1, node_name=node, phase="Running") for i, node in enumerate(["t4-0", "t4-1", "t4-1"])]
    for pod in typical:
        pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "8"
    state = ClusterState.from_objects(make_nodes("T4", "T4"), typical)

    def pod(name, cpu):
        made = _with_uid(make_pod(name, 1), f"u-{name}")
        made["spec"]["containers"][0]["resources"]["requests"]["cpu"] = cpu
        return made

    names = ["t4-0", "t4-1"]
    readings = LedgerReadings()
    extender = Extender(cluster=lambda: state, readings=readings)
    first = {p["Host"]: p["Score"] for p in call(extender, "prioritize", body(pod("one", "30"), names=names))[1]}
    assert first["t4-0"] == 10 > first["t4-1"]
    assert [(r.node, r.cpu) for r in readings.pending(None, assumed=True)] == [("t4-0", 30_000)]
    second = {p["Host"]: p["Score"] for p in call(extender, "prioritize", body(pod("two", "5"), names=names))[1]}
    assert second["t4-1"] == 10 and second["t4-0"] < 9
    # The GPUs alone assumed (pod 1 holding no CPU): a tie, which the fixed order breaks.
    gpus_only = LedgerReadings()
    gpus_only.assume("t4-0", readings.pending(None, assumed=True)[0].taken, "u-one")
    blind = Extender(cluster=lambda: state, readings=gpus_only)
    assert sorted(p["Score"] for p in call(blind, "prioritize", body(pod("two", "5"), names=names))[1]) == [9, 10]


def test_without_assume_nothing_is_laid_over_the_state():
    from adapters.ledger_readings import LedgerReadings

    state = ClusterState.from_objects(make_nodes("T4"))
    readings = LedgerReadings()
    extender = Extender(ExtenderConfig(assume=False), cluster=lambda: state, readings=readings)
    call(extender, "filter", body(_with_uid(make_pod("p", 1), "u-4"), names=["t4-0"]))
    assert readings.pending(None, assumed=True) == []


class CatchingUpSource:
    """A cluster source behind on a deletion: ``catch_up`` brings the state in which it is, and says
    so (``adapters.live_state.LiveState`` does this on its watch)."""

    def __init__(self, before: ClusterState, after: ClusterState, *, behind: bool = True) -> None:
        self.states, self.behind, self.waited = [before, after], behind, []

    def __call__(self) -> ClusterState:
        return self.states[0]

    def catch_up(self, timeout_s: float, nodes: Collection[str] = (), *, node_facts: bool = False) -> bool:
        self.waited.append(timeout_s)
        self.nodes, self.node_facts = list(nodes), node_facts
        if not self.behind:
            return False
        self.states.pop(0)
        self.behind = False
        return True


def halves_on_t4(count: int) -> ClusterState:
    """t4-0 (4 GPUs) holding ``count`` half-GPU shares, two a GPU."""
    shares = []
    for i in range(count):
        pod = make_pod(f"half-{i}", 0, milli=500, node_name="t4-0", phase="Running")
        pod["metadata"]["annotations"]["gpu-scheduler.io/assigned-gpus"] = f"{i // 2}:500"
        shares.append(pod)
    return ClusterState.from_objects(make_nodes("T4"), shares)


def test_filter_refusing_a_node_for_shares_in_use_decides_again_once_a_lagging_source_caught_up():
    full, freed = halves_on_t4(8), halves_on_t4(7)
    source = CatchingUpSource(full, freed)
    status, reply = call(Extender(cluster=source), "filter", body(make_pod("p", 0, milli=500), names=["t4-0"]))
    assert status == 200 and reply["NodeNames"] == ["t4-0"] and source.waited == [0.25]
    assert source.nodes == ["t4-0"]  # the nodes refused for use: a deletion may be on its way to one
    # Nothing pending: the refusal stands, after one question.
    source = CatchingUpSource(full, freed, behind=False)
    status, reply = call(Extender(cluster=source), "filter", body(make_pod("p", 0, milli=500), names=["t4-0"]))
    assert reply["NodeNames"] == [] and "500 milli free" in reply["FailedNodes"]["t4-0"] and source.waited == [0.25]


def test_filter_does_not_wait_on_a_refusal_no_deletion_can_change():
    # The wrong model is unresolvable: no freed GPU makes it fit, so the source is not asked.
    state = ClusterState.from_objects(make_nodes("T4"), [])
    source = CatchingUpSource(state, state)
    _, reply = call(Extender(cluster=source), "filter", body(make_pod("p", 1, models="A100"), names=["t4-0"]))
    assert "t4-0" in reply["FailedAndUnresolvableNodes"] and source.waited == []


def test_a_node_whose_allocatable_gpus_the_state_has_not_caught_up_with_is_decided_again():
    """kube-scheduler sent the node, so its own count of nvidia.com/gpu passed: a state that says the node
    has too few is behind on it (a new node whose device plugin reported its GPUs after it registered).
    Filter waits for the node's change instead of refusing it as unresolvable, which would leave the pod
    waiting minutes for another event."""
    registered = make_nodes("H100")
    registered[0]["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    before, after = ClusterState.from_objects(registered, []), ClusterState.from_objects(make_nodes("H100"), [])
    source = CatchingUpSource(before, after)
    _, reply = call(Extender(cluster=source), "filter", body(make_pod("p", 8, models="H100"), names=["h100-0"]))
    assert reply["NodeNames"] == ["h100-0"] and source.node_facts and source.nodes == ["h100-0"]


def test_filter_never_refuses_a_node_for_what_a_request_predicted_and_prioritize_forgets_it_in_time():
    """A request body is input from the network: four filter calls for invented 999-milli pods on an
    empty T4 used to make a real 250-milli pod fail there. Predictions move prioritize's scores only,
    for at most ASSUMED_TTL_S, and at most MAX_ASSUMED are kept."""
    from adapters.ledger_readings import LedgerReadings
    from scheduler_core.state.readings import ASSUMED_TTL_S, MAX_ASSUMED

    now = [1000.0]
    state = ClusterState.from_objects(make_nodes("T4"))
    readings = LedgerReadings(clock=lambda: now[0])
    extender = Extender(ExtenderConfig(share_policy="gpu_packing"), cluster=lambda: state, readings=readings)
    for i in range(4):
        call(extender, "filter", body(_with_uid(make_pod(f"ghost-{i}", 0, milli=999), f"ghost-{i}"), names=["t4-0"]))
    assert len(readings.pending(None, assumed=True)) == 4 and readings.pending(None) == []
    _, reply = call(extender, "filter", body(_with_uid(make_pod("real", 0, milli=250), "real"), names=["t4-0"]))
    assert reply["NodeNames"] == ["t4-0"], reply
    now[0] += ASSUMED_TTL_S + 0.1
    assert readings.pending(None, assumed=True) == []
    for i in range(MAX_ASSUMED + 50):
        readings.assume("t4-0", (), f"cpu-only-{i}", 100_000_000)
    kept = readings.pending(None, assumed=True)
    assert len(kept) == MAX_ASSUMED and kept[0].uid == "cpu-only-50"  # the oldest went first


ADD_AFFINITY = "add the node affinity `gpu-scheduler autoscaler-affinity` writes (docs/autoscalers.md)"


def test_a_pod_no_node_takes_is_told_what_an_autoscaler_could_add_and_what_to_write_for_it():
    """kube-scheduler's FailedScheduling event quotes the filter's refusals: where no node passes, each
    ends with the known instance types whose GPUs would, and, for a pod whose GPU needs an autoscaler
    cannot read, what to write."""
    from scheduler_core.k8s.autoscaler import autoscaler_affinity
    from scheduler_core.k8s.pods import pod_demand

    state = ClusterState.from_objects(make_nodes("T4", "A100"), [])
    extender = Extender(cluster=lambda: state)
    pod = make_pod("p", 1, models="L40S")
    _, reply = call(extender, "filter", body(pod, names=["t4-0", "a100-1"]))
    reasons = reply["FailedAndUnresolvableNodes"]
    assert reasons["t4-0"] == (
        "GPU model T4 not in L40S; instance types that fit: g6e.xlarge, g6e.12xlarge, g6e.48xlarge; an autoscaler "
        f"cannot see this pod's GPU needs: {ADD_AFFINITY}"
    )
    assert reasons["a100-1"].startswith("GPU model A100 not in L40S; instance types that fit: g6e.xlarge")
    terms, _ = autoscaler_affinity(pod, pod_demand(pod))
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": terms}}}  # fmt: skip
    _, reply = call(extender, "filter", body(pod, names=["t4-0"]))
    assert reply["FailedAndUnresolvableNodes"]["t4-0"].endswith(
        "instance types that fit: g6e.xlarge, g6e.12xlarge, g6e.48xlarge"
    )
    # A node that passes: the refusals of the others say nothing more.
    _, reply = call(extender, "filter", body(make_pod("p", 1, models="A100"), names=["t4-0", "a100-1"]))
    assert (
        reply["NodeNames"] == ["a100-1"] and reply["FailedAndUnresolvableNodes"]["t4-0"] == "GPU model T4 not in A100"
    )
    # Needs no known instance type meets: the figures.
    _, reply = call(extender, "filter", body(make_pod("p", 1, models="H100", memory="80Gi"), names=["t4-0"]))
    assert (
        "no instance type the product knows has H100 GPUs that report 81920 MiB"
        in reply["FailedAndUnresolvableNodes"]["t4-0"]
    )
    # A pod that names no model or memory: nothing to say.
    _, reply = call(extender, "filter", body(make_pod("p", 16), names=["t4-0"]))
    assert reply["FailedAndUnresolvableNodes"]["t4-0"] == "4 GPUs allocatable, pod needs 16"


def test_explain_says_what_an_autoscaler_could_add_where_no_node_passes():
    from scheduler_core.extender.explain import explain

    state = ClusterState.from_objects(make_nodes("T4"), [])
    explained = explain(Extender(cluster=lambda: state), make_pod("p", 1, models="L4"))
    assert explained.to_json()["autoscaler"].startswith("instance types that fit: g6.xlarge, g6.12xlarge")
    assert explain(Extender(cluster=lambda: state), make_pod("p", 1, models="T4")).autoscaler == ""
