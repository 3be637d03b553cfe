import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_core.errors import ConfigError
from scheduler_core.extender.facade import Extender, ExtenderConfig
from scheduler_core.extender.wire import ExtenderArgs
from scheduler_core.scoring.gpu_fit import ScoreWeights
from scheduler_core.state.cluster import ClusterState
from tests.captured_requests import each_captured_request
from tests.conftest import (
    SCHEDULER_FIXTURES,
    SHARED,
    assert_protocol_correct_filter,
    load_fixture,
    make_nodes,
    make_pod,
    request_verb,
    requires_fixtures,
)
from tests.scheduler_core.extender.conftest import body, call


@each_captured_request
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


def unreadable(pod, message, case, verb="filter", status=200):
    """A case of a pod the extender cannot read: ``verb`` answers ``status`` with an Error that matches
    ``message`` (filter keeps kube-scheduler's form: a 200 that carries the Error)."""
    return pytest.param(verb, body(pod, []), status, message, id=case)


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
        unreadable(bad_pod(limits={"nvidia.com/gpu": "-2"}), "non-negative whole number, got '-2'", "negative GPUs"),
        unreadable(bad_pod(limits={"nvidia.com/gpu": "1.5"}), "whole number, got '1.5'", "fractional GPUs"),
        unreadable(make_pod("p", 1, memory="plenty"), "gpu.nvidia.com/memory: .*'plenty'", "garbage memory"),
        unreadable(make_pod("p", 1, models="A1%0"), "gpu.nvidia.com/model", "garbage model"),
        unreadable(make_pod("p", 1, models="A1%0"), "gpu.nvidia.com/model", "garbage in prioritize", "prioritize", 400),
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
