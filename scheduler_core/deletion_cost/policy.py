"""Pod deletion costs: which pods a ReplicaSet scale-down should remove first.

``controller.kubernetes.io/pod-deletion-cost`` is an int32; the ReplicaSet controller deletes pods
with a lower cost first. The policies, vectorised over pods (arrays of shape ``(n_pods,)``):

- ``metrics`` (the source's formula)::

      cost = floor(5 * active_requests) + floor(100 * cache_hit_rate)
             + 50 if avg_response_time_ms < 100, else + 20 if < 500, else + 0

  capped at ``cap`` (1000). The 5, 100, 50 and 20 are the policy's weights.
- ``connections``: ``floor(10 * active_connections)``, capped at ``cap``.
- ``static``: a fixed value per workload, e.g. 50 for data locality.

Then, in order of precedence: a pod that is not Ready gets ``not_ready_cost`` (-100); a pod younger than
``warmup_s`` (60 s) gets ``warmup_cost`` (-50). A metric the policy needs that is missing, NaN or negative
means "no new value" for that pod: the caller keeps its current cost, and the pod is counted. Costs are
clamped to ``[min_cost, cap]`` and to int32, and written canonically (:func:`format_cost`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler_core.errors import ConfigError, Validatable

POLICIES = ("metrics", "connections", "static")
METRICS_NEEDED = {
    "metrics": ("active_requests", "cache_hit_rate", "avg_response_time_ms"),
    "connections": ("active_connections",),
    "static": (),
}
ALL_METRICS = ("active_requests", "cache_hit_rate", "avg_response_time_ms", "active_connections")
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
# The ranges costs are reported in (name, lowest, highest), by the refresher's PodsByCostRange metric and by
# the AMP scrape's relabelling of the annotation (cdk/prometheus.py), so the two views agree.
COST_RANGES = (("warming", -(2**31), -1), ("default", 0, 0), ("medium", 1, 99), ("high", 100, 2**31 - 1))


@dataclass(frozen=True)
class CostPolicy(Validatable):
    """One workload's policy, weights and bounds (defaults are the source's)."""

    policy: str = "metrics"
    per_request: float = 5.0
    hit_rate_points: float = 100.0
    fast_ms: float = 100.0
    fast_bonus: int = 50
    ok_ms: float = 500.0
    ok_bonus: int = 20
    per_connection: float = 10.0
    static_cost: int = 50
    cap: int = 1000
    min_cost: int = -100
    warmup_s: float = 60.0
    warmup_cost: int = -50
    not_ready_cost: int = -100

    def problems(self, path: str = "policy") -> list[str]:
        """Every invalid field, with its path."""
        found = []
        if self.policy not in POLICIES:
            found.append(f"{path}.policy: expected one of {', '.join(POLICIES)}, got {self.policy!r}")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "policy":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                found.append(f"{path}.{f.name}: expected a number, got {value!r}")
            elif f.type == "int" and value != int(value):
                found.append(f"{path}.{f.name}: expected an integer, got {value!r}")
            elif not INT32_MIN <= value <= INT32_MAX:
                found.append(f"{path}.{f.name}: must fit in int32, got {value!r}")
        if not found:
            if self.min_cost > self.cap:
                found.append(f"{path}: min_cost {self.min_cost} is above cap {self.cap}")
            if self.ok_ms < self.fast_ms:
                found.append(f"{path}: ok_ms {self.ok_ms} is below fast_ms {self.fast_ms}")
            for name in ("per_request", "hit_rate_points", "per_connection", "warmup_s"):
                if getattr(self, name) < 0:
                    found.append(f"{path}.{name}: must not be negative, got {getattr(self, name)!r}")
        return found

    @classmethod
    def from_json(cls, document: Any, path: str = "policy") -> tuple[CostPolicy, list[str]]:
        """Build from ``{"policy": "metrics", "weights": {...}, "cap": 1000, ...}``; problems listed."""
        if not isinstance(document, Mapping):
            return cls(), [f"{path}: expected an object, got {type(document).__name__}"]
        known = {f.name for f in fields(cls)}
        values = dict(document.get("weights") or {}) if isinstance(document.get("weights"), Mapping) else {}
        problems = [] if isinstance(document.get("weights", {}), Mapping) else [f"{path}.weights: expected an object"]
        values.update({k: v for k, v in document.items() if k not in ("weights", "queries", "namespace", "selector")})
        unknown = sorted(set(values) - known)
        problems += [f"{path}.{name}: unknown field" for name in unknown]
        policy = cls(**{k: v for k, v in values.items() if k in known})
        return policy, problems + policy.problems(path)


@dataclass(frozen=True, eq=False)
class CostResult:
    """Costs per pod.

    Attributes
    ----------
    cost : ndarray of shape (n_pods,), int64
        The new cost; meaningful only where ``has_value``.
    has_value : ndarray of shape (n_pods,), bool
        False where a needed metric was missing, NaN or negative: keep the current cost.
    """

    cost: npt.NDArray[np.int64]
    has_value: npt.NDArray[np.bool_]

    @property
    def missing(self) -> int:
        return int((~self.has_value).sum())


@dataclass(frozen=True, eq=False)
class PodSignals:
    """Per-pod inputs, each of shape (n_pods,): metrics (NaN when absent), age and readiness."""

    metrics: Mapping[str, npt.NDArray[np.float64]]
    age_s: npt.NDArray[np.float64]
    ready: npt.NDArray[np.bool_]
    n_pods: int = field(default=0)

    @classmethod
    def build(cls, metrics: Mapping[str, npt.ArrayLike], age_s: npt.ArrayLike, ready: npt.ArrayLike) -> PodSignals:
        """Validate shapes: every array must have the same length."""
        age = np.asarray(age_s, dtype=np.float64)
        ready_arr = np.asarray(ready, dtype=bool)
        n_pods = age.shape[0] if age.ndim == 1 else -1
        arrays = {name: np.asarray(values, dtype=np.float64) for name, values in metrics.items()}
        for name, array in {"age_s": age, "ready": ready_arr, **arrays}.items():
            if array.shape != (n_pods,):
                raise ValueError(f"{name}: expected shape ({n_pods},) like age_s, got {array.shape}")
        unknown = set(arrays) - set(ALL_METRICS)
        if unknown:
            raise ValueError(f"unknown metrics {sorted(unknown)}; expected some of {', '.join(ALL_METRICS)}")
        return cls(arrays, age, ready_arr, n_pods)


def compute_costs(policy: CostPolicy, signals: PodSignals) -> CostResult:
    """Costs for every pod at once (see the module docstring).

    >>> signals = PodSignals.build({"active_requests": [2, 40, np.nan], "cache_hit_rate": [0.5, 1, 1],
    ...                             "avg_response_time_ms": [80, 300, 50]}, age_s=[600, 600, 600],
    ...                            ready=[True, True, True])
    >>> result = compute_costs(CostPolicy(), signals)
    >>> result.cost[result.has_value].tolist(), result.missing
    ([110, 320], 1)
    """
    policy.validated()
    n_pods = signals.n_pods
    nan = np.full(n_pods, np.nan)
    metric = {name: signals.metrics.get(name, nan) for name in ALL_METRICS}
    needed = METRICS_NEEDED[policy.policy]
    # NaN compares False, so "x >= 0" is false for missing, NaN and negative values alike.
    usable = np.ones(n_pods, dtype=bool)
    for name in needed:
        usable &= metric[name] >= 0
    safe = {name: np.where(metric[name] >= 0, metric[name], 0.0) for name in needed}
    if policy.policy == "metrics":
        # A hit rate is a ratio: clamp what a bad exporter may report above 1 back to 1.
        hit = np.minimum(safe["cache_hit_rate"], 1.0)
        latency = safe["avg_response_time_ms"]
        bonus = np.where(
            latency < policy.fast_ms, policy.fast_bonus, np.where(latency < policy.ok_ms, policy.ok_bonus, 0)
        )
        raw = np.floor(policy.per_request * safe["active_requests"]) + np.floor(policy.hit_rate_points * hit) + bonus
    elif policy.policy == "connections":
        raw = np.floor(policy.per_connection * safe["active_connections"])
    else:
        raw = np.full(n_pods, float(policy.static_cost))
    # Clamp before converting: 5 x 1e300 requests must not overflow int64.
    cost = np.clip(raw, policy.min_cost, policy.cap)
    young = signals.age_s < policy.warmup_s
    cost = np.where(young, policy.warmup_cost, cost)
    cost = np.where(~signals.ready, policy.not_ready_cost, cost)
    has_value = usable | young | ~signals.ready
    # The overrides are configured values; keep every cost inside int32 whatever they are.
    cost = np.clip(cost, INT32_MIN, INT32_MAX).astype(np.int64)
    return CostResult(cost=cost, has_value=has_value)


def format_cost(cost: int) -> str:
    """The canonical int32 string the API server accepts: no ``+``, no leading zeros.

    >>> format_cost(100), format_cost(-50), format_cost(0)
    ('100', '-50', '0')
    """
    value = int(cost)
    if not INT32_MIN <= value <= INT32_MAX:
        raise ValueError(f"pod deletion cost {value} does not fit in int32")
    return str(value)


def parse_cost(text: object) -> int | None:
    """The current cost from an annotation value, or None when missing or invalid (counts as 0).

    >>> parse_cost("100"), parse_cost("+10"), parse_cost("007"), parse_cost(None)
    (100, None, None, None)
    """
    if not isinstance(text, str) or not text:
        return None
    digits = text[1:] if text.startswith("-") else text
    if not digits.isascii() or not digits.isdigit() or (len(digits) > 1 and digits[0] == "0") or text == "-0":
        return None
    value = int(text)
    return value if INT32_MIN <= value <= INT32_MAX else None


@dataclass(frozen=True)
class Workload:
    """Pods in ``namespace`` (empty: any) whose labels match ``selector`` (``key=value`` pairs)."""

    namespace: str
    selector: Mapping[str, str]
    policy: CostPolicy
    queries: Mapping[str, str] = field(default_factory=dict)

    def matches(self, namespace: str, labels: Mapping[str, Any]) -> bool:
        if self.namespace and namespace != self.namespace:
            return False
        return all(labels.get(key) == value for key, value in self.selector.items())


@dataclass(frozen=True)
class CostConfig:
    """Workloads and their policies; a pod takes the first workload that matches it."""

    workloads: tuple[Workload, ...] = (Workload("", {}, CostPolicy()),)
    hysteresis: int = 10

    @classmethod
    def from_json(cls, document: Any) -> CostConfig:
        """``{"hysteresis": 10, "workloads": [{"namespace", "selector": "app=x,tier=y", "policy",
        "weights": {...}, "cap", "queries": {"active_requests": "PromQL with {namespace} {pod}"}}]}``.

        Raises :class:`ConfigError` listing every problem with its field path.
        """
        problems: list[str] = []
        if not isinstance(document, Mapping):
            raise ConfigError(f"deletion-cost config: expected an object, got {type(document).__name__}")
        hysteresis = document.get("hysteresis", 10)
        if isinstance(hysteresis, bool) or not isinstance(hysteresis, int) or hysteresis < 0:
            problems.append(f"hysteresis: expected a non-negative integer, got {hysteresis!r}")
        raw = document.get("workloads")
        if not isinstance(raw, list) or not raw:
            problems.append("workloads: expected a non-empty list")
            raw = []
        workloads = []
        for i, item in enumerate(raw):
            path = f"workloads[{i}]"
            policy, found = CostPolicy.from_json(item, path)
            problems += found
            if not isinstance(item, Mapping):
                continue
            namespace = item.get("namespace", "")
            if not isinstance(namespace, str):
                problems.append(f"{path}.namespace: expected a string, got {namespace!r}")
                namespace = ""
            selector: dict[str, str] = {}
            text = item.get("selector", "")
            if not isinstance(text, str):
                problems.append(f"{path}.selector: expected 'key=value,...', got {text!r}")
                text = ""
            for part in filter(None, (p.strip() for p in text.split(","))):
                key, sep, value = part.partition("=")
                if not sep or not key.strip():
                    problems.append(f"{path}.selector: {part!r} is not key=value")
                else:
                    selector[key.strip()] = value.strip()
            queries = item.get("queries", {})
            if not isinstance(queries, Mapping) or not all(isinstance(q, str) for q in queries.values()):
                problems.append(f"{path}.queries: expected an object of metric name to PromQL")
                queries = {}
            for name in queries:
                if name not in ALL_METRICS:
                    problems.append(f"{path}.queries.{name}: unknown metric; expected one of {', '.join(ALL_METRICS)}")
            for name in METRICS_NEEDED.get(policy.policy, ()):
                if queries and name not in queries:
                    problems.append(f"{path}.queries: policy {policy.policy!r} needs a query for {name}")
            workloads.append(Workload(namespace, selector, policy, dict(queries)))
        if problems:
            raise ConfigError("; ".join(problems))
        return cls(workloads=tuple(workloads), hysteresis=int(hysteresis))

    def workload_of(self, namespace: str, labels: Mapping[str, Any]) -> Workload | None:
        return next((w for w in self.workloads if w.matches(namespace, labels)), None)
