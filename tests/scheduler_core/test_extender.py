import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_core.cluster import ClusterState
from scheduler_core.errors import ConfigError
from scheduler_core.extender import Extender, ExtenderConfig
from scheduler_core.gpu_fit import ScoreWeights
from scheduler_core.wire import ExtenderArgs, HostPriority
from tests.conftest import (
    SCHEDULER_FIXTURES,
    SHARED,
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


def assert_protocol_correct_filter(request, reply):
    """kube-scheduler's rules: a subset of what was sent, in the same form, every rejection with a reason."""
    if request["Nodes"] is not None:
        sent = [n["metadata"]["name"] for n in request["Nodes"]["items"]]
        assert reply["NodeNames"] is None
        kept_objects = reply["Nodes"]["items"]
        assert all(obj in request["Nodes"]["items"] for obj in kept_objects), "kept nodes are the objects sent"
        kept = [n["metadata"]["name"] for n in kept_objects]
    else:
        sent = request["NodeNames"]
        assert reply["Nodes"] is None
        kept = reply["NodeNames"]
    failed, unresolvable = reply["FailedNodes"], reply["FailedAndUnresolvableNodes"]
    assert isinstance(reply["Error"], str)
    assert set(kept) <= set(sent)
    assert set(failed) <= set(sent) and set(unresolvable) <= set(sent)
    assert not set(failed) & set(unresolvable)
    if not reply["Error"]:
        assert set(kept) | set(failed) | set(unresolvable) == set(sent)
    assert all(isinstance(r, str) and r for r in [*failed.values(), *unresolvable.values()])


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
    _, reply = call(Extender(cluster=lambda: state), "filter", request.read_bytes())
    assert reply["FailedNodes"] == {"gpu-node-0": "0 of 8 GPUs free, pod needs 2"}
    assert [n["metadata"]["name"] for n in reply["Nodes"]["items"]] == ["gpu-node-1", "gpu-node-2"]
    status, scores = call(Extender(cluster=lambda: state), "prioritize", request.read_bytes())
    assert status == 200
    # gpu-node-2 has exactly 2 free: best fit; gpu-node-1 would leave 2 GPUs idle.
    assert {p["Host"]: p["Score"] for p in scores} == {"gpu-node-0": 0, "gpu-node-1": 8, "gpu-node-2": 10}


def test_names_are_resolved_against_cluster_state_and_unknown_names_fail():
    state = ClusterState.from_objects(make_nodes("A100", "T4"), [make_pod("r", 8, node_name="a100-0", phase="Running")])
    extender = Extender(cluster=lambda: state)
    status, reply = call(extender, "filter", body(make_pod("p", 2), names=["t4-1", "ghost", "a100-0"]))
    assert status == 200
    assert reply["NodeNames"] == ["t4-1"]
    assert reply["Nodes"] is None
    assert reply["FailedNodes"] == {
        "ghost": "node is not in the cluster state",
        "a100-0": "0 of 8 GPUs free, pod needs 2",
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
def test_filter_json_equals_the_wire_encoding(models, used, unknown, gpus, wanted):
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
        assert json.loads(outcome.to_json()) == outcome.reply.to_wire()
        assert outcome.nodes_in == len(args.node_names or args.nodes)
        scored = extender.prioritize(args)
        assert json.loads(scored.to_json()) == HostPriority.list_to_wire(scored.reply)
