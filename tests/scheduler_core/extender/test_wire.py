import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_core.errors import InvalidArgsError
from scheduler_core.extender.facade import BindOutcome, Extender
from scheduler_core.extender.preemption import PreemptOutcome
from scheduler_core.extender.wire import (
    _NAMES_FORM,
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderPreemptionArgs,
    decode_json,
)
from scheduler_core.state.cluster import ClusterState
from tests.conftest import (
    captured_nodes,
    fixture_id,
    load_fixture,
    make_nodes,
    make_pod,
    requires_fixtures,
    scheduler_requests,
)


def test_keys_are_matched_case_insensitively_preferring_exact():
    args = ExtenderArgs.from_wire({"POD": {"metadata": {"name": "p"}}, "nodenames": ["a"], "NodeNames": ["b"]})
    assert args.node_names == ["b"]
    assert args.pod["metadata"]["name"] == "p"


def test_null_lists_and_maps_are_accepted():
    args = ExtenderArgs.from_wire({"Pod": {}, "Nodes": {"metadata": {}, "items": None}, "NodeNames": None})
    assert args.nodes == []
    assert not args.names_only


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param([], "request body: expected a JSON object, got a list", id="body is a list"),
        pytest.param({"Nodes": {"items": []}}, "Pod: required", id="missing Pod"),
        pytest.param({"Pod": "p", "NodeNames": []}, "Pod: expected a JSON object, got the string 'p'", id="Pod string"),
        pytest.param({"Pod": {}, "Nodes": [], "NodeNames": None}, "Nodes: expected a JSON object", id="Nodes list"),
        pytest.param({"Pod": {}, "Nodes": {"items": {}}}, "Nodes.items: expected a list", id="items object"),
        pytest.param({"Pod": {}, "NodeNames": [1]}, "NodeNames: expected a list of strings", id="names not strings"),
        pytest.param({"Pod": {}, "NodeNames": None, "Nodes": None}, "both null", id="no nodes at all"),
    ],
)
def test_malformed_args_name_the_field(body, message):
    with pytest.raises(InvalidArgsError, match=message):
        ExtenderArgs.from_wire(body)


FILTER_KEYS = ["Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"]


def filter_shape(reply):
    """What kube-scheduler's decoder reads of an ``ExtenderFilterResult``: its Go field names, which node
    form is ``null``, a NodeList's envelope, failure maps that are objects, and a string ``Error``."""
    nodes = reply["Nodes"]
    return {
        "keys": sorted(reply),
        "Nodes": None if nodes is None else (sorted(nodes), nodes["metadata"], type(nodes["items"]).__name__),
        "NodeNames": None if reply["NodeNames"] is None else type(reply["NodeNames"]).__name__,
        "maps": [type(reply[key]).__name__ for key in ("FailedNodes", "FailedAndUnresolvableNodes")],
        "Error": type(reply["Error"]).__name__,
    }


@pytest.mark.parametrize("names_only", [True, False], ids=["NodeNames form", "Nodes form"])
@pytest.mark.parametrize("error", [False, True], ids=["a decision", "an Error"])
def test_filter_reply_is_the_go_result_in_the_request_form(names_only, error):
    nodes = make_nodes("A100", "T4")
    extender = Extender(cluster=lambda: ClusterState.from_objects(nodes))
    pod = make_pod("p", 2, models="A100!" if error else "A100")
    args = ExtenderArgs(pod=pod, node_names=["a100-0", "t4-1"]) if names_only else ExtenderArgs(pod=pod, nodes=nodes)
    reply = json.loads(extender.filter(args).to_json())
    assert list(reply) == FILTER_KEYS
    kept = ([] if error else ["a100-0"]) if names_only else None
    assert reply["NodeNames"] == kept
    assert reply["Nodes"] == (None if names_only else {"metadata": {}, "items": [] if error else nodes[:1]})
    assert reply["FailedNodes"] == {}  # an object, never null
    assert reply["FailedAndUnresolvableNodes"] == ({} if error else {"t4-1": "GPU model T4 not in A100"})
    assert (reply["Error"] != "") == error


@requires_fixtures()
@pytest.mark.parametrize("path", scheduler_requests("filter"), ids=fixture_id)
def test_filter_replies_have_the_shape_of_the_replies_kube_scheduler_accepted(path):
    """The captured replies were read by a real kube-scheduler; ours to the same requests read alike."""
    captured = load_fixture(path.with_name(path.name.replace(".request.", ".response.")))
    state = ClusterState.from_objects(captured_nodes())
    ours = json.loads(Extender(cluster=lambda: state).filter(ExtenderArgs.from_wire(load_fixture(path))).to_json())
    assert filter_shape(ours) == filter_shape(captured)
    assert list(ours) == list(captured)  # Go does not mind the order; the captures' is the struct's


@requires_fixtures()
@pytest.mark.parametrize("path", scheduler_requests("prioritize"), ids=fixture_id)
def test_prioritize_replies_are_host_priority_lists_like_the_captured_ones(path):
    captured = load_fixture(path.with_name(path.name.replace(".request.", ".response.")))
    request = load_fixture(path)
    state = ClusterState.from_objects(captured_nodes())
    ours = json.loads(Extender(cluster=lambda: state).prioritize(ExtenderArgs.from_wire(request)).to_json())
    sent = request["NodeNames"] or [n["metadata"]["name"] for n in request["Nodes"]["items"]]
    assert sorted(entry["Host"] for entry in ours) == sorted(sent)  # one entry per node sent
    assert {tuple(entry) for entry in ours} == {tuple(entry) for entry in captured} == {("Host", "Score")}
    assert all(type(entry["Score"]) is int and 0 <= entry["Score"] <= 10 for entry in ours)


@requires_fixtures()
@pytest.mark.parametrize("path", scheduler_requests("filter") + scheduler_requests("prioritize"), ids=fixture_id)
def test_real_filter_and_prioritize_requests_parse(path):
    meta = load_fixture(path.with_name(path.name.replace(".request.", ".meta.")))
    args = ExtenderArgs.from_wire(load_fixture(path))
    assert args.names_only == (meta["nodes_field"] == "NodeNames")
    names = args.node_names if args.names_only else [n["metadata"]["name"] for n in args.nodes]
    assert names == meta["node_names"]


def general_path(body: bytes) -> ExtenderArgs | str:
    """What the general decoder makes of ``body``: the args, or the error's message."""
    try:
        return ExtenderArgs.from_wire(decode_json(body))
    except InvalidArgsError as exc:
        return str(exc)


def one_pass(body: bytes) -> ExtenderArgs | str:
    try:
        return ExtenderArgs.decode(body)
    except InvalidArgsError as exc:
        return str(exc)


@requires_fixtures()
@pytest.mark.parametrize("path", scheduler_requests("filter") + scheduler_requests("prioritize"), ids=fixture_id)
def test_real_requests_in_the_names_form_take_the_one_pass_decoder_and_read_the_same(path):
    raw = path.read_bytes()
    meta = load_fixture(path.with_name(path.name.replace(".request.", ".meta.")))
    if meta["nodes_field"] == "NodeNames":
        _NAMES_FORM.decode(raw)  # kube-scheduler's own bytes: no fallback on the hot path
    assert ExtenderArgs.decode(raw) == general_path(raw)


KEYS = ["Pod", "pod", "NodeNames", "nodeNames", "Nodes", "Other"]
VALUES = st.one_of(
    st.none(),
    st.dictionaries(st.sampled_from(["metadata", "spec"]), st.dictionaries(st.text(max_size=3), st.integers())),
    st.lists(st.text(max_size=4), max_size=4),
    st.lists(st.one_of(st.text(max_size=2), st.integers(), st.none()), max_size=3),
    st.text(max_size=3),
    st.integers(-(2**70), 2**70),
    st.just({"items": []}),
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=4))
def test_the_one_pass_decoder_reads_every_body_as_the_general_path_does(body):
    raw = json.dumps(body).encode()
    assert one_pass(raw) == general_path(raw)


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b'{"Pod":{},"NodeNames":["a"],"NodeNames":["b"]}', id="duplicated key: the last wins"),
        pytest.param(b'{"Pod":{"x":NaN},"NodeNames":["a"]}', id="NaN in the pod"),
        pytest.param(b'{"Pod":{},"NodeNames":["\xff"]}', id="invalid UTF-8"),
        pytest.param(b'{"Pod":{},"NodeNames":["\\ud800"]}', id="lone surrogate escape"),
        pytest.param(b'{"Pod":{},"NodeNames":["a"]} x', id="trailing bytes"),
        pytest.param(b'{"Pod":' + b"[" * 100_000 + b"]" * 100_000 + b',"NodeNames":[]}', id="deep nesting"),
        pytest.param(b'{"Pod":{},"Nodes":{"items":[]},"NodeNames":["a"]}', id="both forms"),
        pytest.param(b'{"Pod":{},"NodeNames":null}', id="names null"),
    ],
)
def test_odd_bodies_get_the_general_paths_answer(raw):
    assert one_pass(raw) == general_path(raw)


@requires_fixtures()
@pytest.mark.parametrize("path", scheduler_requests("bind"), ids=fixture_id)
def test_real_bind_request_round_trips(path):
    raw = load_fixture(path)
    args = ExtenderBindingArgs.from_wire(raw)
    assert args.to_wire() == raw
    captured = load_fixture(path.with_name(path.name.replace(".request.", ".response.")))
    assert json.loads(BindOutcome(args.pod_name, args.node).to_json()) == captured


@requires_fixtures()
@pytest.mark.parametrize("path", scheduler_requests("preempt"), ids=fixture_id)
def test_real_preempt_requests_in_both_forms_give_the_captured_reply(path):
    args = ExtenderPreemptionArgs.from_wire(load_fixture(path))
    expected = load_fixture(path.with_name(path.name.replace(".request.", ".response.")))
    if args.node_name_to_meta_victims is not None:
        meta = args.node_name_to_meta_victims
    else:
        assert args.node_name_to_victims is not None
        meta = {node: victims.to_meta() for node, victims in args.node_name_to_victims.items()}
    assert json.loads(json.dumps(PreemptOutcome(dict(meta)).to_wire())) == expected


def test_preempt_args_reject_bad_pdb_counts():
    body = {"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": [], "NumPDBViolations": -1}}}
    with pytest.raises(InvalidArgsError, match=r"NodeNameToMetaVictims\['n'\].NumPDBViolations"):
        ExtenderPreemptionArgs.from_wire(body)


@pytest.mark.parametrize("field", ["PodName", "PodNamespace", "PodUID", "Node"])
def test_bind_args_require_every_field(field):
    body = {"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "n"}
    del body[field]
    with pytest.raises(InvalidArgsError, match=f"{field}: expected a non-empty string, got null"):
        ExtenderBindingArgs.from_wire(body)
