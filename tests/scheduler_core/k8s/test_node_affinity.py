"""Required node affinity, against a slow loop-based reference written from kube-scheduler's Go code."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_core.k8s.node_affinity import match_nodes, required_affinity, unmet

ZONE = "topology.kubernetes.io/zone"


def pod_with(*terms: dict[str, Any]) -> dict[str, Any]:
    selector = {"nodeSelectorTerms": list(terms)}
    return {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": selector}}}}


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


def matches(pod: dict[str, Any], name: str, labels: dict[str, str]) -> bool:
    return bool(match_nodes(required_affinity(pod), [name], [labels])[0])


NODE = ("n1", {ZONE: "us-east-1b", "gpus": "8", "tier": "gold"})


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        pytest.param({"spec": {}}, True, id="no affinity admits every node"),
        pytest.param(pod_with(), False, id="a required affinity without terms admits no node"),
        pytest.param(pod_with({}), False, id="an empty term matches no node"),
        pytest.param(pod_with({"matchExpressions": [expr(ZONE, "In", "us-east-1b")]}), True, id="In the zone"),
        pytest.param(pod_with({"matchExpressions": [expr(ZONE, "NotIn", "us-east-1b")]}), False, id="NotIn the zone"),
        pytest.param(pod_with({"matchExpressions": [expr("absent", "NotIn", "x")]}), True, id="NotIn an absent label"),
        pytest.param(pod_with({"matchExpressions": [expr("absent", "In", "x")]}), False, id="In an absent label"),
        pytest.param(pod_with({"matchExpressions": [expr("tier", "Exists")]}), True, id="Exists"),
        pytest.param(pod_with({"matchExpressions": [expr("tier", "DoesNotExist")]}), False, id="DoesNotExist"),
        pytest.param(pod_with({"matchExpressions": [expr("gpus", "Gt", "4")]}), True, id="Gt compares integers"),
        pytest.param(pod_with({"matchExpressions": [expr("gpus", "Lt", "10")]}), True, id="Lt 8 < 10, not as text"),
        pytest.param(pod_with({"matchExpressions": [expr("tier", "Gt", "1")]}), False, id="Gt on a label not an int"),
        pytest.param(pod_with({"matchExpressions": [expr("absent", "Lt", "1")]}), False, id="Lt on an absent label"),
        pytest.param(
            pod_with({"matchExpressions": [expr("gpus", "Gt", "4"), expr("tier", "In", "silver")]}),
            False,
            id="expressions in a term are ANDed",
        ),
        pytest.param(
            pod_with(
                {"matchExpressions": [expr("tier", "In", "silver")]}, {"matchExpressions": [expr("gpus", "Gt", "4")]}
            ),
            True,
            id="terms are ORed",
        ),
        pytest.param(
            pod_with(
                {"matchExpressions": [expr("gpus", "Gt", "four")]}, {"matchExpressions": [expr("tier", "Exists")]}
            ),
            True,
            id="a term that does not parse matches nothing and the next term still counts",
        ),
        pytest.param(pod_with({"matchExpressions": [expr(ZONE, "In")]}), False, id="In without values does not parse"),
        pytest.param(pod_with({"matchExpressions": [expr("tier", "Exists", "gold")]}), False, id="Exists with values"),
        pytest.param(pod_with({"matchExpressions": [expr("gpus", "Gt", "4", "5")]}), False, id="Gt with two values"),
        pytest.param(pod_with({"matchExpressions": [expr("gpus", "Gt", " 4")]}), False, id="Gt on a padded number"),
        pytest.param(pod_with({"matchExpressions": [expr("tier", "Like", "g")]}), False, id="an unknown operator"),
        pytest.param(pod_with({"matchFields": [expr("metadata.name", "In", "n1")]}), True, id="matchFields by name"),
        pytest.param(pod_with({"matchFields": [expr("metadata.name", "NotIn", "n1")]}), False, id="NotIn by name"),
        pytest.param(pod_with({"matchFields": [expr("metadata.name", "In", "n1", "n2")]}), False, id="two names"),
        pytest.param(pod_with({"matchFields": [expr("metadata.name", "Exists")]}), False, id="Exists on a field"),
        pytest.param(
            pod_with(
                {"matchExpressions": [expr("tier", "Exists")], "matchFields": [expr("metadata.name", "In", "n2")]}
            ),
            False,
            id="fields and expressions of a term are ANDed",
        ),
    ],
)
def test_required_node_affinity_follows_kube_schedulers_rules(pod: dict[str, Any], expected: bool) -> None:
    assert matches(pod, *NODE) is expected
    assert reference(pod, *NODE) is expected  # the reference agrees with the table too


def test_a_nameless_node_skips_match_fields_as_go_does() -> None:
    pod = pod_with({"matchFields": [expr("metadata.name", "In", "n1")]})
    assert match_nodes(required_affinity(pod), ["", "n2"], [{}, {}]).tolist() == [True, False]


def test_integer_labels_follow_go_parse_int_not_python_int() -> None:
    pod = pod_with({"matchExpressions": [expr("gpus", "Gt", "4")]})
    values = ["+8", "8", "1_0", " 8", "٨", "9223372036854775807", "9223372036854775808", "-9"]
    names = [f"n{i}" for i in range(len(values))]
    got = match_nodes(required_affinity(pod), names, [{"gpus": v} for v in values]).tolist()
    assert got == [True, True, False, False, False, True, False, False]


def test_unmet_names_the_first_failing_expression_of_each_term_and_nothing_of_the_node() -> None:
    pod = pod_with(
        {"matchExpressions": [expr("tier", "Exists"), expr(ZONE, "NotIn", "us-east-1b")]},
        {"matchFields": [expr("metadata.name", "In", "other")]},
        {"matchExpressions": [expr("gpus", "Gt", "x")]},
    )
    reasons = unmet(required_affinity(pod), *NODE)
    assert reasons == [
        "topology.kubernetes.io/zone NotIn [us-east-1b]",
        "metadata.name In [other]",
        "a term that matches no node (nodeSelectorTerms[2].matchExpressions[0]: Gt needs an integer, got 'x')",
    ]
    assert unmet(required_affinity(pod_with({"matchExpressions": [expr("tier", "In", "gold")]})), *NODE) == []


def test_names_and_labels_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="names and labels: expected the same length, got 2 and 1"):
        match_nodes(None, ["a", "b"], [{}])


# ---- the reference -----------------------------------------------------------------------------
def reference(pod: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> bool:
    """kube-scheduler's RequiredNodeAffinity.Match for one node, transcribed loop by loop: parse each term
    (nodeSelectorRequirementsAsSelector / ...AsFieldSelector), skip empty and erroneous terms, OR the rest."""
    node_affinity = (pod.get("spec") or {}).get("affinity", {}).get("nodeAffinity", {})
    selector = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if selector is None:
        return True
    fields = {"metadata.name": name} if name else {}
    for term in selector.get("nodeSelectorTerms") or []:
        expressions, match_fields = term.get("matchExpressions") or [], term.get("matchFields") or []
        if not expressions and not match_fields:
            continue
        if not all(valid_label_requirement(e) for e in expressions):
            continue
        if not all(e["operator"] in ("In", "NotIn") and len(e.get("values") or []) == 1 for e in match_fields):
            continue
        ok = all(label_requirement_holds(e, labels) for e in expressions)
        if match_fields and fields:
            for e in match_fields:
                value = fields.get(e["key"], "")
                ok = ok and ((value == e["values"][0]) == (e["operator"] == "In"))
        if ok:
            return True
    return False


def valid_label_requirement(e: Mapping[str, Any]) -> bool:
    values = e.get("values") or []
    operator = e["operator"]
    if operator in ("In", "NotIn"):
        return len(values) > 0
    if operator in ("Exists", "DoesNotExist"):
        return len(values) == 0
    if operator in ("Gt", "Lt"):
        return len(values) == 1 and go_parse_int(values[0]) is not None
    return False


def label_requirement_holds(e: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    operator, key, values = e["operator"], e["key"], e.get("values") or []
    has = key in labels
    if operator == "In":
        return has and labels[key] in values
    if operator == "NotIn":
        return not has or labels[key] not in values
    if operator == "Exists":
        return has
    if operator == "DoesNotExist":
        return not has
    if not has:
        return False
    mine, theirs = go_parse_int(labels[key]), go_parse_int(values[0])
    if mine is None or theirs is None:
        return False
    return mine > theirs if operator == "Gt" else mine < theirs


def go_parse_int(text: str) -> int | None:
    """strconv.ParseInt(text, 10, 64), character by character."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not digits or any(c not in "0123456789" for c in digits):
        return None
    value = 0
    for c in digits:
        value = value * 10 + "0123456789".index(c)
    value = -value if text[:1] == "-" else value
    return value if -(2**63) <= value < 2**63 else None


KEYS = ["zone", "gpus", "tier"]
VALUES = ["a", "b", "1", "8", "-3", "+2", "x1", "", "99999999999999999999"]
NAMES = ["n0", "n1", "n2", ""]


@st.composite
def requirements(draw: Any, field: bool) -> dict[str, Any]:
    if field:
        key = draw(st.sampled_from(["metadata.name", "spec.unschedulable"]))
        operator = draw(st.sampled_from(["In", "NotIn", "Exists"]))
        values = draw(st.lists(st.sampled_from(NAMES), max_size=2))
    else:
        key = draw(st.sampled_from(KEYS))
        operator = draw(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Bogus"]))
        values = draw(st.lists(st.sampled_from(VALUES), max_size=3))
    return {"key": key, "operator": operator, "values": values}


@st.composite
def affinities(draw: Any) -> dict[str, Any]:
    if draw(st.booleans()) and draw(st.booleans()):
        return {"spec": {}}
    terms = draw(
        st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "matchExpressions": st.lists(requirements(False), max_size=3),
                    "matchFields": st.lists(requirements(True), max_size=2),
                },
            ),
            max_size=3,
        )
    )
    return pod_with(*terms)


clusters = st.lists(
    st.tuples(st.sampled_from(NAMES), st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=3)),
    max_size=6,
)


@settings(max_examples=400, deadline=None)
@given(affinities(), clusters)
def test_match_nodes_equals_the_loop_reference_on_random_clusters(pod: dict[str, Any], nodes: Sequence[Any]) -> None:
    names = [name for name, _ in nodes]
    labels = [node_labels for _, node_labels in nodes]
    affinity = required_affinity(pod)
    got = match_nodes(affinity, names, labels)
    assert got.dtype == np.bool_ and got.shape == (len(nodes),)
    assert got.tolist() == [reference(pod, name, node_labels) for name, node_labels in nodes]
    # Reordering the nodes only reorders the answer.
    order = np.arange(len(nodes))[::-1]
    assert match_nodes(affinity, [names[i] for i in order], [labels[i] for i in order]).tolist() == got[order].tolist()
    # A node is refused exactly when unmet() has a reason for it.
    assert [not unmet(affinity, n, lab) for n, lab in nodes] == got.tolist()
