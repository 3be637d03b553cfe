import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_core.deletion_cost.policy import (
    INT32_MAX,
    INT32_MIN,
    CostConfig,
    CostPolicy,
    PodSignals,
    compute_costs,
    format_cost,
    parse_cost,
)
from scheduler_core.errors import ConfigError
from testing.reference import reference_cost

OLD = 3600.0  # seconds: past warm-up


def one(policy=None, *, age=OLD, ready=True, **metrics):
    signals = PodSignals.build({k: [v] for k, v in metrics.items()}, [age], [ready])
    result = compute_costs(policy or CostPolicy(), signals)
    return int(result.cost[0]) if result.has_value[0] else None


@pytest.mark.parametrize(
    ("metrics", "cost"),
    [
        pytest.param({"active_requests": 0, "cache_hit_rate": 0, "avg_response_time_ms": 1000}, 0, id="idle slow pod"),
        pytest.param({"active_requests": 2, "cache_hit_rate": 0.5, "avg_response_time_ms": 80}, 110, id="fast"),
        pytest.param(
            {"active_requests": 0, "cache_hit_rate": 0, "avg_response_time_ms": 99.99}, 50, id="just under 100 ms"
        ),
        pytest.param({"active_requests": 0, "cache_hit_rate": 0, "avg_response_time_ms": 100}, 20, id="exactly 100 ms"),
        pytest.param({"active_requests": 0, "cache_hit_rate": 0, "avg_response_time_ms": 499.9}, 20, id="under 500 ms"),
        pytest.param({"active_requests": 0, "cache_hit_rate": 0, "avg_response_time_ms": 500}, 0, id="exactly 500 ms"),
        pytest.param({"active_requests": 0, "cache_hit_rate": 1, "avg_response_time_ms": 600}, 100, id="hit rate 1"),
        pytest.param(
            {"active_requests": 0, "cache_hit_rate": 0.999, "avg_response_time_ms": 600}, 99, id="hit rate floors"
        ),
        pytest.param(
            {"active_requests": 0, "cache_hit_rate": 3.0, "avg_response_time_ms": 600},
            100,
            id="hit rate above 1 clamps",
        ),
        pytest.param({"active_requests": 500, "cache_hit_rate": 1, "avg_response_time_ms": 10}, 1000, id="the cap"),
        pytest.param(
            {"active_requests": 1e300, "cache_hit_rate": 1, "avg_response_time_ms": 10}, 1000, id="huge input"
        ),
        pytest.param(
            {"active_requests": 2.5, "cache_hit_rate": 0, "avg_response_time_ms": 600},
            12,
            id="fractional requests floor",
        ),
    ],
)
def test_metrics_policy(metrics, cost):
    assert one(**metrics) == cost


@pytest.mark.parametrize(
    "metrics",
    [
        pytest.param({"active_requests": math.nan, "cache_hit_rate": 0.5, "avg_response_time_ms": 50}, id="NaN"),
        pytest.param({"active_requests": -1, "cache_hit_rate": 0.5, "avg_response_time_ms": 50}, id="negative"),
        pytest.param({"cache_hit_rate": 0.5, "avg_response_time_ms": 50}, id="missing"),
    ],
)
def test_missing_nan_or_negative_metric_means_no_new_value_and_is_counted(metrics):
    assert one(**metrics) is None
    signals = PodSignals.build({k: [v, v] for k, v in metrics.items()}, [OLD, OLD], [True, True])
    assert compute_costs(CostPolicy(), signals).missing == 2


def test_connections_and_static_policies():
    assert one(CostPolicy(policy="connections"), active_connections=7) == 70
    assert one(CostPolicy(policy="connections"), active_connections=5000) == 1000
    assert one(CostPolicy(policy="static")) == 50
    assert one(CostPolicy(policy="static", static_cost=80)) == 80


def test_not_ready_beats_warm_up_which_beats_the_metrics():
    metrics = {"active_requests": 10, "cache_hit_rate": 1, "avg_response_time_ms": 10}
    assert one(age=30, **metrics) == -50
    assert one(age=30, ready=False, **metrics) == -100
    assert one(age=30) == -50, "a warming pod needs no metrics"


def test_int32_extremes_are_kept_inside_int32():
    wide = CostPolicy(
        policy="static", static_cost=INT32_MAX, cap=INT32_MAX, min_cost=INT32_MIN, not_ready_cost=INT32_MIN
    )
    assert one(wide) == INT32_MAX
    assert one(wide, ready=False) == INT32_MIN
    with pytest.raises(ConfigError, match="cap: must fit in int32"):
        CostPolicy(cap=INT32_MAX + 1).validated()


@pytest.mark.parametrize(("value", "text"), [(100, "100"), (-50, "-50"), (0, "0"), (INT32_MIN, "-2147483648")])
def test_costs_are_written_canonically(value, text):
    assert format_cost(value) == text
    assert parse_cost(text) == value


@pytest.mark.parametrize("text", ["+10", "007", "-0", "abc", "", "1.5", "2147483648", None])
def test_values_the_api_server_rejects_read_as_missing(text):
    assert parse_cost(text) is None


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["metrics", "connections", "static"]),
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.floats(-5, 500), st.just(math.nan)),
            st.one_of(st.none(), st.floats(-1, 2)),
            st.one_of(st.none(), st.sampled_from([0.0, 99.9, 100.0, 250.0, 499.99, 500.0, 900.0])),
            st.one_of(st.none(), st.floats(-1, 300)),
            st.floats(0, 200),
            st.booleans(),
        ),
        min_size=1,
        max_size=30,
    ),
)
def test_vectorised_costs_equal_the_reference(name, pods):
    policy = CostPolicy(policy=name)
    names = ("active_requests", "cache_hit_rate", "avg_response_time_ms", "active_connections")
    columns = {n: np.array([math.nan if p[i] is None else p[i] for p in pods]) for i, n in enumerate(names)}
    result = compute_costs(policy, PodSignals.build(columns, [p[4] for p in pods], [p[5] for p in pods]))
    got = [int(c) if ok else None for c, ok in zip(result.cost, result.has_value, strict=True)]
    expected = [
        reference_cost(policy, {n: p[i] for i, n in enumerate(names) if p[i] is not None}, p[4], p[5]) for p in pods
    ]
    assert got == expected


def test_config_reports_every_problem_with_its_path():
    document = {
        "hysteresis": -1,
        "workloads": [
            {"namespace": "ml", "selector": "app=x,broken", "policy": "magic", "weights": {"per_request": "five"}},
            {"selector": "app=y", "policy": "metrics", "queries": {"active_requests": "q", "latency": "q"}, "cap": 2.5},
        ],
    }
    with pytest.raises(ConfigError) as info:
        CostConfig.from_json(document)
    message = str(info.value)
    for fragment in (
        "hysteresis: expected a non-negative integer",
        "workloads[0].policy: expected one of metrics, connections, static, got 'magic'",
        "workloads[0].per_request: expected a number, got 'five'",
        "workloads[0].selector: 'broken' is not key=value",
        "workloads[1].cap: expected an integer, got 2.5",
        "workloads[1].queries.latency: unknown metric",
        "workloads[1].queries: policy 'metrics' needs a query for cache_hit_rate",
    ):
        assert fragment in message


def test_config_matches_pods_to_the_first_workload():
    config = CostConfig.from_json(
        {
            "workloads": [
                {"namespace": "ml", "selector": "app=cache", "policy": "static", "static_cost": 100},
                {"selector": "app=api", "policy": "connections"},
            ]
        }
    )
    assert config.workload_of("ml", {"app": "cache"}).policy.static_cost == 100
    assert config.workload_of("web", {"app": "cache"}) is None
    assert config.workload_of("web", {"app": "api", "tier": "x"}).policy.policy == "connections"


def test_signals_must_line_up():
    with pytest.raises(ValueError, match=r"active_requests: expected shape \(2,\) like age_s, got \(1,\)"):
        PodSignals.build({"active_requests": [1]}, [1, 2], [True, True])
