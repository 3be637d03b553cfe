"""``gpu-scheduler bench deletion-cost-run``: one deletion-cost refresher invocation, end to end.

The API double serves the managed pods from a separate process; a real Prometheus (Debian's
``prometheus``, when installed) serves the ``metrics`` policy's three series for every pod, backfilled
with ``promtool``. The refresher runs with its production defaults (one pass here, 200 writes at
10 per second), then again in steady state. Without Prometheus the run still happens, with no metrics
(only warm-up costs change), and the output says so.
"""

from __future__ import annotations

import logging
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import kube_double_process

if TYPE_CHECKING:
    import numpy as np

    from application.deletion_cost.service import PassReport

QUERIES = {
    "active_requests": 'sum by (namespace, pod) (app_active_requests{namespace="{namespace}"})',
    "cache_hit_rate": 'avg by (namespace, pod) (app_cache_hit_ratio{namespace="{namespace}"})',
    "avg_response_time_ms": 'avg by (namespace, pod) (app_latency_ms{namespace="{namespace}"})',
}


def run(n_pods: int, seed: int) -> dict[str, Any]:
    import numpy as np

    from adapters.amp import PrometheusClient
    from adapters.kube import connect_url
    from application.deletion_cost.service import CostServices, refresh
    from application.deletion_cost.settings import DeletionCostSettings
    from scheduler_core.deletion_cost.policy import CostConfig
    from testing.prometheus import MISSING, PROMETHEUS, PROMTOOL, prometheus_with

    logging.getLogger("application.deletion_cost.service").setLevel(logging.WARNING)
    rng = np.random.default_rng(seed)
    config = CostConfig.from_json(
        {"workloads": [{"namespace": "web", "selector": "app=frontend", "policy": "metrics", "queries": QUERIES}]}
    )
    with ExitStack() as stack:
        ready = stack.enter_context(kube_double_process("--nodes", "0", "--pods", "0", "--managed", str(n_pods)))
        amp_url, note = None, MISSING
        if PROMETHEUS and PROMTOOL:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            amp_url = stack.enter_context(prometheus_with(_metric_families(n_pods, rng), workdir, minutes=6))
            note = "metrics from a real Prometheus"
        services = CostServices(
            kube=connect_url(ready["url"], ready["token"]),
            prometheus=PrometheusClient(amp_url, timeout_s=30) if amp_url else None,
            config=lambda: config,
        )
        settings = DeletionCostSettings(kube_api_url=ready["url"], passes=1)
        runs = []
        for label in ("first run (production budget: 200 writes at 10/s)", "second run"):
            wall = time.perf_counter()
            report = refresh(settings, services, time_left=lambda: 900.0)
            (only,) = report.passes
            runs.append(_pass_figures(label, time.perf_counter() - wall, report.status, only))
    return {"benchmark": "deletion-cost-run", "managed_pods": n_pods, "metrics": note, "runs": runs}


def _metric_families(n_pods: int, rng: np.random.Generator) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """The three series the ``metrics`` policy queries (:data:`QUERIES`), one sample per managed pod, drawn
    from ``rng``: active requests (Poisson, mean 40), cache hit ratio (uniform), latency in ms (log-normal)."""
    names = [f"frontend-{i:05d}" for i in range(n_pods)]
    families: dict[str, dict[tuple[tuple[str, str], ...], float]] = {
        "app_active_requests": {}, "app_cache_hit_ratio": {}, "app_latency_ms": {}}  # fmt: skip
    for name, requests, hit, latency in zip(
        names, rng.poisson(40, n_pods), rng.random(n_pods), rng.lognormal(5, 1, n_pods), strict=True
    ):
        labels = (("namespace", "web"), ("pod", name))
        families["app_active_requests"][labels] = float(requests)
        families["app_cache_hit_ratio"][labels] = round(float(hit), 3)
        families["app_latency_ms"][labels] = round(float(latency), 1)
    return families


def _pass_figures(label: str, wall_s: float, status: str, only: PassReport) -> dict[str, Any]:
    """One refresher run's figures: its wall time and status, and what its one pass did."""
    return {
        "run": label,
        "wall_s": round(wall_s, 2),
        "status": status,
        "pods_seen": only.pods_seen,
        "planned": only.planned,
        "cost_patches": only.cost_patches,
        "deferred": only.deferred,
        "cost_unchanged": only.cost_unchanged,
        "metrics_missing": only.metrics_missing,
        "cost_ranges": only.cost_ranges,
        "phases_ms": only.phases_ms,
    }
