"""The bounds the annotation parsers set on what a tenant writes: length, JSON nesting, digits.

Every hostile value is an :class:`InvalidPodError` that names the annotation and what was wrong, in a
message of a few hundred characters; never a RecursionError, an OverflowError or the value echoed whole.
The ordinary forms are in ``tests/scheduler_core/scoring/test_locality.py``.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_core.errors import InvalidPodError
from scheduler_core.k8s.annotations import (
    MAX_ASSIGNED_GPUS_CHARS,
    MAX_PEERS_CHARS,
    MAX_PEERS_JSON_DEPTH,
    MAX_WEIGHT_CHARS,
    Peer,
    parse_assigned_gpus,
    parse_peers,
    trusted_assigned_gpus,
)

PEERS = "annotation gpu-scheduler.io/peers"
ASSIGNED = "annotation gpu-scheduler.io/assigned-gpus"
MAX_MESSAGE_CHARS = 400


def refused(parse: object, value: object) -> str:
    """The message ``parse(value)`` raises, checked to be short."""
    assert callable(parse)
    with pytest.raises(InvalidPodError) as raised:
        parse(value)
    message = str(raised.value)
    assert len(message) < MAX_MESSAGE_CHARS, message[:MAX_MESSAGE_CHARS]
    return message


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param(
            "[" * 100_000, f"100000 characters; at most {MAX_PEERS_CHARS}", id="100,000 brackets are too long"
        ),
        pytest.param(
            "[" * 5000,
            f"JSON nested 5000 deep; at most {MAX_PEERS_JSON_DEPTH}",
            id="5,000 brackets within the length are too deep",
        ),
        pytest.param('{"a":' * 2000 + "1" + "}" * 2000, "JSON nested 2000 deep", id="objects nested 2,000 deep"),
        pytest.param('[[{"selector": "app=a"}]]', "JSON nested 3 deep", id="one level too deep"),
        pytest.param('{"app=a": ' + "9" * 4000 + "}", "weight 999", id="a JSON weight of 4,000 digits"),
        pytest.param('{"app=a": ' + "9" * 5000 + "}", "weight 999", id="a JSON weight past int's 4,300 digits"),
        pytest.param(
            '[{"selector": "app=a", "weight": ' + "9" * 4000 + "}]", "weight 999", id="a list weight of 4,000 digits"
        ),
        pytest.param('{"app=a": "' + "9" * 5000 + '"}', "weight '999", id="a string weight of 5,000 digits"),
        pytest.param("app=a:" + "9" * 5000, "weight '999", id="a compact weight of 5,000 digits"),
        pytest.param("app=a:" + "0" * 32 + "1", "weight '000", id="a weight past 32 characters, even if small"),
        pytest.param('{"app=a": NaN}', "weight NaN of 'app=a'", id="a NaN literal"),
        pytest.param('{"app=a": -Infinity}', "weight -Infinity of 'app=a'", id="an Infinity literal"),
        pytest.param('{"app=a": 1e400}', "weight 1e400 of 'app=a'", id="a JSON weight past the float range"),
        pytest.param("app=a:١٢", "weight '١٢' of 'app=a'", id="Arabic-Indic digits"),
        pytest.param("app=a:1_000", "weight '1_000'", id="an underscore float() would take"),
        pytest.param('{"app\\n=a": 1}', "'app\\n' in 'app\\n=a' is not a label key", id="a newline ending a key"),
        pytest.param("x" * 1_000_000, "1000000 characters", id="a million characters"),
    ],
)
def test_hostile_peers_are_pod_errors_naming_the_annotation_and_the_fault(value, message):
    error = refused(parse_peers, value)
    assert error.startswith(PEERS) and message in error


def test_the_longest_real_peers_value_is_within_the_limit():
    """32 selectors of the longest label key (a 253-character prefix and a 63-character name) and value."""
    key = "a" * 253 + "/" + "b" * 63
    peers = [{"selector": f"{key}=v{i:02d}" + "c" * 60, "weight": 999.5} for i in range(32)]
    text = json.dumps(peers)
    assert len(text) <= MAX_PEERS_CHARS
    assert len(parse_peers(text)) == 32


@pytest.mark.parametrize(
    ("value", "weight"),
    [
        pytest.param('{"app=a": 1e2}', 100.0, id="a JSON exponent"),
        pytest.param('{"app=a": "2.5"}', 2.5, id="a weight as a JSON string"),
        pytest.param("app=a: 3 ", 3.0, id="spaces around a compact weight"),
        pytest.param("app=a:" + "0" * (MAX_WEIGHT_CHARS - 1) + "1", 1.0, id="a weight of 32 characters"),
    ],
)
def test_weights_inside_the_bounds_are_read(value, weight):
    assert parse_peers(value) == (Peer("app", "a", weight),)


@pytest.mark.parametrize("weight", ["²", "inf", "nan", "0x10", "-1", "1e", "."])
def test_what_float_refuses_or_reads_out_of_range_is_still_no_weight(weight):
    """The grammar that replaced ``float`` refuses these too (``float`` and the range did before)."""
    assert f"weight {weight!r} of 'app=a' must be a number in (0, 1000]" in refused(parse_peers, f"app=a:{weight}")


deep_json = st.recursive(
    st.integers(min_value=10**300, max_value=10**4000) | st.just("app=a") | st.floats(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.just("app=a"), inner, max_size=2),
    max_leaves=60,
)


@settings(max_examples=200, deadline=None)
@given(deep_json | st.text(alphabet='[]{}",:=0123456789eE.-+ ax١²_', max_size=3000))
def test_peers_never_raise_anything_but_a_pod_error(document):
    text = document if isinstance(document, str) else json.dumps(document)
    try:
        outcome: tuple[Peer, ...] | str = parse_peers(text)
    except InvalidPodError as exc:
        outcome = str(exc)
    if isinstance(outcome, str):
        assert outcome.startswith(PEERS) and len(outcome) < MAX_MESSAGE_CHARS
    else:
        assert all(0 < peer.weight <= 1000 for peer in outcome)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param("0:1000," * 1000, f"7000 characters; at most {MAX_ASSIGNED_GPUS_CHARS}", id="too long"),
        pytest.param("0:" + "9" * 5000, "5002 characters", id="a 5,000-digit milli is too long"),
    ],
)
def test_hostile_assigned_gpus_are_pod_errors_naming_the_annotation(value, message):
    error = refused(parse_assigned_gpus, value)
    assert error.startswith(ASSIGNED) and message in error


def test_an_assigned_gpus_value_of_a_megabyte_is_not_echoed_when_ignored():
    error = refused(lambda value: trusted_assigned_gpus(value, "gpu-scheduler", 1, 0), "0:1000," * 150_000)
    assert "1050000 characters" in error
