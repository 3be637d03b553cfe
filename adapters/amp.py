"""PromQL instant queries against Amazon Managed Service for Prometheus, signed with SigV4 (``aps``).

AMP speaks the Prometheus HTTP API under ``https://aps-workspaces.REGION.amazonaws.com/workspaces/WS``,
so the same client works against any Prometheus: tests run it against a real one on loopback. The
query goes as a form-encoded POST to ``/api/v1/query`` (no URL length limit for long PromQL), and is
signed when AWS credentials are available.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from adapters.errors import AdapterError
from scheduler_core.k8s.limits import MAX_GPUS_PER_NODE
from scheduler_core.k8s.quantity import plain_int

DEFAULT_UTILIZATION_QUERY = "avg by ({node_label}, {gpu_label}) (avg_over_time(DCGM_FI_DEV_GPU_UTIL[{window}]))"
DEFAULT_NODE_LABEL = "Hostname"  # dcgm-exporter's label for the node it runs on
DEFAULT_GPU_LABEL = "gpu"  # dcgm-exporter's GPU index label
DEFAULT_WINDOW = "5m"


class PrometheusQueryError(AdapterError):
    """The query failed: transport, HTTP status, or a Prometheus ``error`` response."""


@dataclass(frozen=True)
class Sample:
    labels: Mapping[str, str]
    value: float


class PrometheusClient:
    """Instant queries at ``base_url`` (an AMP workspace URL or a Prometheus server).

    Parameters
    ----------
    credentials : botocore credentials (refreshable ones are frozen per request), or None to send
        unsigned requests.
    """

    def __init__(self, base_url: str, *, region: str = "", credentials: Any = None, timeout_s: float = 10.0) -> None:
        self.url = base_url.rstrip("/") + "/api/v1/query"
        self.region = region
        self.credentials = credentials
        self.timeout_s = timeout_s

    def signed_headers(self, body: bytes) -> dict[str, str]:
        headers = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"}
        if self.credentials is None:
            return headers
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        request = AWSRequest(method="POST", url=self.url, data=body, headers=headers)
        SigV4Auth(self.credentials.get_frozen_credentials(), "aps", self.region).add_auth(request)
        return dict(request.headers.items())

    def query(self, promql: str, *, at: float | None = None) -> list[Sample]:
        """Run an instant query; a vector result becomes samples (NaN and Inf values are dropped)."""
        params = {"query": promql} | ({"time": f"{at:.3f}"} if at is not None else {})
        body = urllib.parse.urlencode(params).encode()
        request = urllib.request.Request(self.url, data=body, method="POST", headers=self.signed_headers(body))
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                payload = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode(errors="replace")
            raise PrometheusQueryError(f"{self.url}: HTTP {exc.code}: {detail}") from exc
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise PrometheusQueryError(f"{self.url}: {exc}") from exc
        if not isinstance(payload, dict) or payload.get("status") != "success":
            error = payload.get("error") if isinstance(payload, dict) else payload
            raise PrometheusQueryError(f"{self.url}: query failed: {error}")
        data = payload.get("data") or {}
        if data.get("resultType") != "vector":
            raise PrometheusQueryError(f"expected a vector result, got {data.get('resultType')!r} for {promql!r}")
        samples = []
        for item in data.get("result") or []:
            try:
                value = float(item["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            if math.isfinite(value):
                samples.append(Sample(dict(item.get("metric") or {}), value))
        return samples


def utilization_query(
    template: str = DEFAULT_UTILIZATION_QUERY,
    *,
    node_label: str = DEFAULT_NODE_LABEL,
    gpu_label: str = DEFAULT_GPU_LABEL,
    window: str = DEFAULT_WINDOW,
) -> str:
    """Fill the query template's ``{node_label}``, ``{gpu_label}`` and ``{window}``."""
    return template.format(node_label=node_label, gpu_label=gpu_label, window=window)


def utilization_by_node(
    samples: Iterable[Sample], *, node_label: str = DEFAULT_NODE_LABEL, gpu_label: str = DEFAULT_GPU_LABEL
) -> tuple[dict[str, list[float]], list[str]]:
    """Per-GPU utilisation in [0, 1] by node from ``DCGM_FI_DEV_GPU_UTIL`` percentages.

    GPUs with no sample are NaN (unknown). Samples without the node or GPU label are reported.

    >>> by_node, problems = utilization_by_node([Sample({"Hostname": "n1", "gpu": "1"}, 50.0)])
    >>> by_node["n1"][1], problems
    (0.5, [])
    """
    per_node: dict[str, dict[int, float]] = {}
    problems: list[str] = []
    for sample in samples:
        node, gpu = sample.labels.get(node_label), sample.labels.get(gpu_label)
        index = plain_int(gpu, max_digits=4)
        if not node or index is None:
            problems.append(f"sample without {node_label!r} or a numeric {gpu_label!r}: {dict(sample.labels)}")
            continue
        if index >= MAX_GPUS_PER_NODE:  # no node has that GPU: a list that long would size nothing real
            problems.append(f"sample of GPU {index} on {node!r}: past the cap of {MAX_GPUS_PER_NODE} GPUs per node")
            continue
        per_node.setdefault(node, {})[index] = min(max(sample.value / 100.0, 0.0), 1.0)
    by_node = {}
    for node, gpus in per_node.items():
        values = [math.nan] * (max(gpus) + 1)
        for index, value in gpus.items():
            values[index] = value
        by_node[node] = values
    return by_node, problems
