"""Pod requests and node fit for CPU, memory and pod slots, as NodeResourcesFit computes them."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_core.errors import InvalidPodError
from scheduler_core.k8s.pod_requests import effective_cpu_milli
from scheduler_core.k8s.resources import NO_LIMIT, RESOURCES, insufficient, node_allocatable, pod_requests

GI = 2**30


def container(cpu: str | None = None, memory: str | None = None, *, limits: bool = False, sidecar: bool = False):
    amounts = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    c: dict[str, Any] = {"name": "c", "resources": {"limits" if limits else "requests": amounts}}
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param({}, [0, 0, 1], id="a pod without containers still takes a pod slot"),
        pytest.param({"containers": [container("1", "1Gi"), container("500m", "512Mi")]}, [1500, GI + GI // 2, 1],
                     id="app containers add up"),
        pytest.param({"containers": [container("1", "1Gi")], "initContainers": [container("4", "8Gi")]},
                     [4000, 8 * GI, 1], id="a larger init container wins"),
        pytest.param({"containers": [container("2", "4Gi")], "initContainers": [container("1", "1Gi")]},
                     [2000, 4 * GI, 1], id="a smaller init container does not"),
        pytest.param({"containers": [container("2")], "initContainers": [container("1", sidecar=True)]},
                     [3000, 0, 1], id="a sidecar runs beside the app containers"),
        pytest.param({"containers": [container("1")],
                      "initContainers": [container("2", sidecar=True), container("3")]},
                     [5000, 0, 1], id="an init container after a sidecar runs beside it"),
        pytest.param({"containers": [container("3", "3")], "overhead": {"cpu": "250m", "memory": "1Ki"}},
                     [3250, 1027, 1], id="the overhead is added"),
        pytest.param({"containers": [container("2", "2Gi", limits=True)]}, [2000, 2 * GI, 1],
                     id="a limit without a request is the request"),
        pytest.param({"containers": [container("8", "8Gi")], "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}},
                     [2000, GI, 1], id="pod-level requests replace the containers'"),
        pytest.param({"containers": [container("0.0005", "0.5")]}, [1, 1, 1], id="fractions round up"),
    ],
)  # fmt: skip
def test_pod_requests_follow_kube_schedulers_pod_requests(spec: dict[str, Any], expected: list[int]) -> None:
    assert pod_requests({"spec": spec}).tolist() == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param({"containers": {}}, r"pod spec.containers: expected a list of containers", id="not a list"),
        pytest.param({"containers": [container("lots")]}, r"containers\[0\].resources.requests.cpu", id="bad cpu"),
        pytest.param({"containers": [container(memory="-1Gi")]}, r"containers\[0\].resources.requests.memory: must not",
                     id="negative memory"),
        pytest.param({"overhead": {"memory": "a lot"}}, r"spec.overhead.memory", id="bad overhead"),
    ],
)  # fmt: skip
def test_unreadable_requests_are_invalid_pods_naming_the_field(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidPodError, match=message):
        pod_requests({"spec": spec})


def test_node_allocatable_is_unlimited_where_absent_or_unreadable() -> None:
    nodes = [
        {"status": {"allocatable": {"cpu": "47810m", "memory": "178Gi", "pods": "110"}}},
        {"status": {"allocatable": {"cpu": "many", "memory": "1Gi"}}},
        {},
    ]
    assert node_allocatable(nodes).tolist() == [
        [47810, 178 * GI, 110],
        [NO_LIMIT, GI, NO_LIMIT],
        [NO_LIMIT] * 3,
    ]


def test_insufficient_refuses_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match=r"got \(3,\) and \(2, 2\)"):
        insufficient(np.zeros(3, dtype=np.int64), np.zeros((2, 2), dtype=np.int64))


# ---- references ------------------------------------------------------------------------------------
CPUS = [None, "0", "100m", "250m", "1", "1.5", "3", "0.0005", "2e1"]
MEMORIES = [None, "0", "1", "1Ki", "100Mi", "2Gi", "1.5Gi", "500M", "1e3", "0.5"]


@st.composite
def containers(draw: Any) -> dict[str, Any]:
    resources = {}
    for section in ("requests", "limits"):
        amounts = {}
        for resource, choices in (("cpu", CPUS), ("memory", MEMORIES)):
            value = draw(st.sampled_from(choices))
            if value is not None:
                amounts[resource] = value
        resources[section] = amounts
    c = {"name": "c", "resources": resources}
    if draw(st.booleans()):
        c["restartPolicy"] = "Always"
    return c


specs = st.fixed_dictionaries(
    {"containers": st.lists(containers(), max_size=3), "initContainers": st.lists(containers(), max_size=3)},
    optional={"overhead": st.fixed_dictionaries({"cpu": st.sampled_from(CPUS[1:])})},
)


def reference_requests(spec: dict[str, Any]) -> list[int]:
    """The pod's request per phase of its life, then the largest: each init container's phase (with the
    sidecars started before it, itself included when it is one), and the running phase (every sidecar
    and every app container)."""

    def amount(c: dict[str, Any], resource: str) -> int:
        r = c.get("resources") or {}
        value = (r.get("requests") or {}).get(resource, (r.get("limits") or {}).get(resource))
        if value is None:
            return 0
        scale = 1000 if resource == "cpu" else 1
        # The suffixes the strategies use, two-letter ones first ("Mi" before "M"); "1e3" is Decimal's own.
        for suffix, factor in (("Ki", 2**10), ("Mi", 2**20), ("Gi", 2**30), ("m", Decimal("0.001")), ("M", 10**6)):
            if value.endswith(suffix):
                return math.ceil(Decimal(value[: -len(suffix)]) * factor * scale)
        return math.ceil(Decimal(value) * scale)

    result = []
    for resource in ("cpu", "memory"):
        inits = spec.get("initContainers") or []
        phases = []
        for i, c in enumerate(inits):
            before = sum(amount(s, resource) for s in inits[:i] if s.get("restartPolicy") == "Always")
            phases.append(before + amount(c, resource))
        sidecars = sum(amount(s, resource) for s in inits if s.get("restartPolicy") == "Always")
        phases.append(sidecars + sum(amount(c, resource) for c in spec.get("containers") or []))
        overhead = spec.get("overhead", {}).get(resource)
        result.append(
            max(phases) + (amount({"resources": {"requests": {resource: overhead}}}, resource) if overhead else 0)
        )
    return [*result, 1]


@settings(max_examples=300, deadline=None)
@given(specs)
def test_pod_requests_equal_the_phase_by_phase_reference(spec: dict[str, Any]) -> None:
    got = pod_requests({"spec": spec})
    assert got.tolist() == reference_requests(spec)
    assert got[0] == effective_cpu_milli(spec)  # the CPU the state counts for a bound pod, computed the same way


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 10**12), min_size=len(RESOURCES), max_size=len(RESOURCES)),
    st.lists(
        st.lists(st.one_of(st.integers(-(10**12), 10**12), st.just(NO_LIMIT)), min_size=3, max_size=3), max_size=6
    ),
)
def test_insufficient_equals_the_loop_reference(asked: list[int], free: list[list[int]]) -> None:
    got = insufficient(np.array(asked, dtype=np.int64), np.array(free, dtype=np.int64).reshape(-1, 3))
    expected = [[r > 0 and r > f for r, f in zip(asked, row, strict=True)] for row in free]
    assert got.tolist() == expected
