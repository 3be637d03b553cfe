import pytest

from scheduler_core.errors import InvalidArgsError
from scheduler_core.extender.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    HostPriority,
)
from tests.conftest import fixture_id, load_fixture, requires_fixtures, scheduler_requests


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


def test_filter_result_wire_form_mirrors_the_request_form():
    names = ExtenderFilterResult(node_names=["a"], failed={"b": "full"}).to_wire()
    assert names == {
        "Nodes": None,
        "NodeNames": ["a"],
        "FailedNodes": {"b": "full"},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }
    nodes = ExtenderFilterResult(nodes=[{"metadata": {"name": "a"}}]).to_wire()
    assert nodes["Nodes"] == {"metadata": {}, "items": [{"metadata": {"name": "a"}}]}
    assert nodes["NodeNames"] is None


def test_host_priority_list_round_trips_and_checks_types():
    wire = HostPriority.list_to_wire([HostPriority("a", 3)])
    assert wire == [{"Host": "a", "Score": 3}]
    assert HostPriority.list_from_wire([{"host": "a", "score": 3}]) == [HostPriority("a", 3)]
    with pytest.raises(InvalidArgsError, match=r"HostPriorityList\[0\].Score: expected an integer"):
        HostPriority.list_from_wire([{"Host": "a", "Score": "3"}])


@requires_fixtures()
@pytest.mark.parametrize("path", scheduler_requests("filter") + scheduler_requests("prioritize"), ids=fixture_id)
def test_real_filter_and_prioritize_requests_parse(path):
    meta = load_fixture(path.with_name(path.name.replace(".request.", ".meta.")))
    args = ExtenderArgs.from_wire(load_fixture(path))
    assert args.names_only == (meta["nodes_field"] == "NodeNames")
    names = args.node_names if args.names_only else [n["metadata"]["name"] for n in args.nodes]
    assert names == meta["node_names"]


@requires_fixtures()
@pytest.mark.parametrize("path", scheduler_requests("filter"), ids=fixture_id)
def test_real_filter_responses_parse_as_filter_results(path):
    response = load_fixture(path.with_name(path.name.replace(".request.", ".response.")))
    result = ExtenderFilterResult.from_wire(response)
    assert ExtenderFilterResult.from_wire(result.to_wire()) == result


@requires_fixtures()
@pytest.mark.parametrize("path", scheduler_requests("bind"), ids=fixture_id)
def test_real_bind_request_round_trips(path):
    raw = load_fixture(path)
    args = ExtenderBindingArgs.from_wire(raw)
    assert args.to_wire() == raw
    assert ExtenderBindingResult().to_wire() == load_fixture(
        path.with_name(path.name.replace(".request.", ".response."))
    )


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
    assert ExtenderPreemptionResult(meta).to_wire() == expected


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
