"""Hostile values in the pod fields a tenant writes, through every verb (issue #42 items 6 and 8: "No 5xx
from any pod a tenant can create").

Each value goes through ``serve`` over loopback and through the Lambda handler, to ``filter``,
``prioritize`` and ``preempt`` in the request's ``Pod``, and to ``bind`` in the pod the API server holds.
Each answer is a 200 with ``Error`` (filter, bind) or a 400 (prioritize, preempt) that names the
annotation or field, in a few hundred characters, and nothing changes: no API write, no ledger write,
no binding, and the extender decides a benign pod exactly as before. Before the parsers bounded what they
read, deep JSON raised RecursionError, a 4,000-digit weight OverflowError, a million-digit CPU
``decimal.Overflow`` (all a 500), Arabic-Indic digits were read as numbers, and a megabyte value came
back whole in the reply.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from scheduler_core.k8s.names import ASSIGNED_GPUS_ANNOTATION, LABEL_MEMORY, LABEL_MODEL, PEERS_ANNOTATION
from tests.conftest import make_pod
from tests.security.conftest import World

NODES = ["t4-0", "a100-1", "l40s-2"]
NOTHING_HELD = {"t4-0": 0, "a100-1": 0, "l40s-2": 0}
MAX_ERROR_CHARS = 400  # the value is cut, never echoed whole


def annotated(key: str, value: Any) -> Callable[[], tuple[dict[str, Any], str]]:
    """A one-GPU pod with annotation ``key`` set to ``value``, and the name the reply must give."""

    def build() -> tuple[dict[str, Any], str]:
        pod = make_pod("hostile", 1)
        pod["metadata"]["annotations"][key] = value
        return pod, f"annotation {key}"

    return build


def resource(name: str, value: Any) -> Callable[[], tuple[dict[str, Any], str]]:
    """A pod whose container limits ``name`` (nvidia.com/gpu or gpu-milli) at ``value``, and the field."""

    def build() -> tuple[dict[str, Any], str]:
        pod = make_pod("hostile", 0, milli=250) if name.endswith("gpu-milli") else make_pod("hostile", 1)
        pod["spec"]["containers"][0]["resources"]["limits"][name] = value
        return pod, f"containers[0].resources.limits.{name}"

    return build


HOSTILE = [
    pytest.param(annotated(PEERS_ANNOTATION, "[" * 100_000), id="peers nested 100,000 deep"),
    pytest.param(annotated(PEERS_ANNOTATION, "[" * 5000), id="peers nested 5,000 deep within the length limit"),
    pytest.param(annotated(PEERS_ANNOTATION, '{"a":' * 2000 + "1" + "}" * 2000), id="peers objects nested 2,000 deep"),
    pytest.param(annotated(PEERS_ANNOTATION, '{"app=a": ' + "9" * 4000 + "}"), id="peers weight of 4,000 digits"),
    pytest.param(
        annotated(PEERS_ANNOTATION, '[{"selector": "app=a", "weight": ' + "9" * 4000 + "}]"),
        id="peers list weight of 4,000 digits",
    ),
    pytest.param(annotated(PEERS_ANNOTATION, "app=a:١٢"), id="peers weight in Arabic-Indic digits"),
    pytest.param(annotated(PEERS_ANNOTATION, "app=a:1_000"), id="peers weight with an underscore"),
    pytest.param(annotated(PEERS_ANNOTATION, "x" * 1_000_000), id="peers of a million characters"),
    pytest.param(annotated(LABEL_MODEL, "x" * 1_000_000), id="model list of a million characters"),
    pytest.param(annotated(LABEL_MEMORY, "١٢Gi"), id="memory in Arabic-Indic digits"),
    pytest.param(annotated(LABEL_MEMORY, "9" * 5000), id="memory of 5,000 digits"),
    pytest.param(annotated(LABEL_MEMORY, "0." + "0" * 10_000 + "1Ei"), id="memory with 10,000 decimals"),
    pytest.param(resource("nvidia.com/gpu", "١٢"), id="GPU limit in Arabic-Indic digits"),
    pytest.param(resource("gpu-scheduler.io/gpu-milli", "٥٠٠"), id="milli limit in Arabic-Indic digits"),
]


def benign_decisions(world: World) -> tuple[Any, Any]:
    """filter and prioritize of a pod with no UID (so the extender assumes nothing for it): what the
    extender believes about every node."""
    probe = make_pod("probe", 2)
    del probe["metadata"]["uid"]
    body = json.dumps({"Pod": probe, "NodeNames": NODES}).encode()
    return world.call("filter", body), world.call("prioritize", body)


def named(reply: Any, field: str) -> str:
    error = str(reply["Error"])
    assert field in error, error
    assert len(error) < MAX_ERROR_CHARS, error[:MAX_ERROR_CHARS]
    return error


@pytest.mark.parametrize("build", HOSTILE)
def test_a_hostile_pod_field_is_refused_by_every_verb_naming_it_and_changes_nothing(
    world: World, build: Callable[[], tuple[dict[str, Any], str]]
) -> None:
    before = benign_decisions(world)
    pod, field = build()
    request = json.dumps({"Pod": pod, "NodeNames": NODES}).encode()

    status, reply = world.call("filter", request)
    assert status == 200 and reply["NodeNames"] == []
    named(reply, field)
    for verb in ("prioritize", "preempt"):
        body = request
        if verb == "preempt":
            victims = {"t4-0": {"Pods": [{"UID": "victim"}], "NumPDBViolations": 0}}
            body = json.dumps({"Pod": pod, "NodeNameToMetaVictims": victims}).encode()
        status, reply = world.call(verb, body)
        assert status == 400, (verb, status)
        named(reply, field)

    world.api.load("pods", [pod])
    status, reply = world.bind(pod, "a100-1")
    assert status == 200
    named(reply, field)

    if world.transport == "serve":
        assert world.dynamodb_calls == []  # refused before the ledger is read
    stored = world.api.get("pods", "hostile", "default")
    assert stored["spec"].get("nodeName") is None
    assert ASSIGNED_GPUS_ANNOTATION not in stored["metadata"]["annotations"]
    assert world.api_writes() == []
    assert world.ledger_used() == NOTHING_HELD
    assert benign_decisions(world) == before


def test_a_million_digit_cpu_request_is_no_500_and_bind_refuses_it_naming_the_field(world: World) -> None:
    """kube-scheduler reads a pod's CPU itself, so filter and prioritize do not refuse a pod for it (an
    unreadable CPU counts 0, as ``assumed_cpu_milli`` documents); bind refuses it. A million digits used
    to overflow Decimal: a 500 from prioritize, which assumes the CPU its top node takes, and from bind."""
    before = benign_decisions(world)
    pod = make_pod("hostile", 1)
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "4" * 1_000_000
    body = json.dumps({"Pod": pod, "NodeNames": NODES}).encode()
    status, reply = world.call("filter", body)
    assert status == 200 and reply["Error"] == "" and reply["NodeNames"] == NODES  # read as 0, not refused
    status, reply = world.call("prioritize", body)
    assert status == 200 and [score["Host"] for score in reply] == NODES
    world.api.load("pods", [pod])
    status, reply = world.bind(pod, "a100-1")
    assert status == 200
    assert "out of range" in named(reply, "containers[0].resources.requests.cpu")
    assert world.api.get("pods", "hostile", "default")["spec"].get("nodeName") is None
    assert world.api_writes() == []
    assert world.ledger_used() == NOTHING_HELD
    assert benign_decisions(world)[0] == before[0]  # prioritize's assumption is dropped with the failed bind
