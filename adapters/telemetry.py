"""The extender's metrics behind one small interface, written two ways: EMF for the Lambda, Prometheus
text for ``gpu-scheduler serve``.

:class:`Telemetry` takes a catalogued metric (:mod:`adapters.metric_catalogue`) by its CloudWatch name;
the shared extender service (``application/extender/service.py``) decides what to record, and each
implementation only writes it:

- :class:`EmfTelemetry`: Powertools ``Metrics`` (one EMF document per invocation), and a document of its
  own for a metric with an extra dimension (``reason``), as the dashboards and alarms read them;
- :class:`PrometheusTelemetry`: an in-process registry that ``serve`` exposes on ``GET /metrics``.

The Prometheus names and types are derived from the catalogue by one rule
(:func:`adapters.metric_catalogue.prometheus_name`, documented there and in the generated table of
``docs/metrics.md``): ``FilterLatencyMs`` is the histogram ``gpu_scheduler_extender_filter_latency_ms``
(``le`` in ms), ``Unschedulable{reason}`` the counter ``gpu_scheduler_extender_unschedulable_total{reason}``.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from adapters.metric_catalogue import (
    CATALOGUE,
    EXTENDER,
    PROMETHEUS_PREFIX,
    emit_count,
    prometheus_name,
    prometheus_type,
    spec,
)

LATENCY_BUCKETS_MS = (1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0)
"""Upper bounds of the latency histograms, in ms: kube-scheduler gives an extender 3 s (``httpTimeout``)."""


class Telemetry(Protocol):
    """Where the extender service's metrics go."""

    def record(self, name: str, value: float, label: str = "") -> None:
        """One value of the catalogued metric ``name``; ``label`` is the value of its extra dimension
        (``reason``) for a metric that has one, and ignored otherwise."""


class EmfTelemetry:
    """Powertools EMF: ``metrics`` collects the invocation's set (flushed by ``@metrics.log_metrics``);
    a metric with an extra dimension goes out as a document of its own, whose dimensions are its own."""

    def __init__(self, metrics: Any, *, namespace: str, service: str, catalogued_as: str = EXTENDER) -> None:
        self.metrics, self.namespace, self.service, self.catalogued_as = metrics, namespace, service, catalogued_as

    def record(self, name: str, value: float, label: str = "") -> None:
        from aws_lambda_powertools.metrics import MetricUnit

        item = spec(name, self.catalogued_as)
        if item.dimensions:  # every such metric is a count (emit_count)
            emit_count(name, value, namespace=self.namespace, service=self.service, **{item.dimensions[0]: label})
        else:
            self.metrics.add_metric(name=name, unit=MetricUnit(item.unit), value=value)


class PrometheusTelemetry:
    """An in-process registry of the catalogued metrics, written as Prometheus text by :meth:`text`.

    Thread-safe: ``serve`` answers each connection on its own thread.

    >>> registry = PrometheusTelemetry()
    >>> registry.record("Unschedulable", 1, "stale")
    >>> print(registry.text(), end="")
    # HELP gpu_scheduler_extender_unschedulable_total filter calls with no feasible node, by the main reason
    # TYPE gpu_scheduler_extender_unschedulable_total counter
    gpu_scheduler_extender_unschedulable_total{reason="stale"} 1
    """

    def __init__(self, catalogued_as: str = EXTENDER, prefix: str = PROMETHEUS_PREFIX) -> None:
        self.catalogued_as, self.prefix = catalogued_as, prefix
        self._specs = {item.name: item for item in CATALOGUE if item.service == catalogued_as}  # on the hot path
        self._lock = threading.Lock()
        self._values: dict[str, dict[str, float]] = {}  # name -> label value ("" without) -> counter or gauge
        self._histograms: dict[str, list[float]] = {}  # name -> per-bucket counts, then +Inf, sum

    def record(self, name: str, value: float, label: str = "") -> None:
        item = self._specs.get(name) or spec(name, self.catalogued_as)  # spec() raises, naming the metric
        label = label if item.dimensions else ""
        with self._lock:
            if item.unit == "Milliseconds":
                counts = self._histograms.setdefault(name, [0.0] * (len(LATENCY_BUCKETS_MS) + 2))
                for i, bound in enumerate(LATENCY_BUCKETS_MS):
                    counts[i] += value <= bound
                counts[-2] += 1  # +Inf: every observation
                counts[-1] += value
            elif item.unit == "Count":
                series = self._values.setdefault(name, {})
                series[label] = series.get(label, 0.0) + value
            else:
                self._values.setdefault(name, {})[label] = value

    def text(self) -> str:
        """Every metric recorded so far, in the catalogue's order, as Prometheus text exposition."""
        with self._lock:
            values = {name: dict(series) for name, series in self._values.items()}
            histograms = {name: list(counts) for name, counts in self._histograms.items()}
        lines: list[str] = []
        for name in [
            m.name for m in CATALOGUE if m.service == self.catalogued_as and (m.name in values or m.name in histograms)
        ]:
            item = spec(name, self.catalogued_as)
            metric = prometheus_name(item, self.prefix)
            lines += [f"# HELP {metric} {item.description}", f"# TYPE {metric} {prometheus_type(item)}"]
            if name in histograms:
                counts = histograms[name]
                bounds = [*map(_number, LATENCY_BUCKETS_MS), "+Inf"]
                lines += [
                    f'{metric}_bucket{{le="{le}"}} {_number(n)}' for le, n in zip(bounds, counts[:-1], strict=True)
                ]
                lines += [f"{metric}_sum {_number(counts[-1])}", f"{metric}_count {_number(counts[-2])}"]
                continue
            key = item.dimensions[0] if item.dimensions else ""
            for label, value in sorted(values[name].items()):
                labels = f'{{{key}="{_escape(label)}"}}' if key else ""
                lines.append(f"{metric}{labels} {_number(value)}")
        return "".join(line + "\n" for line in lines)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _escape(label: str) -> str:
    """A label value as the text format quotes it: backslash, double quote and newline escaped."""
    return label.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
