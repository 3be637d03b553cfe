"""``gpu-scheduler bench e2e-lambda-watch``: how stale the Lambda extender's snapshot is with the node-state
refresher watching (``WATCH_S``), and what that costs in Lambda-seconds.

The refresher runs as EventBridge runs it, on a compressed clock: an invocation every ``period_s``, each
``gpu-scheduler refresh node-state --once --watch WATCH`` in its own process (the service the Lambda
handler calls), against the real control plane, writing to S3 on moto's server
(:class:`testing.lambda_watch.Schedule`). Meanwhile a one-GPU pod is created on a node and deleted, again
and again, and the time until the extender's :class:`~adapters.snapshot_store.SnapshotSource` (ETag
re-checked every second, as on Lambda) shows each change is the staleness. ``churn`` other pods per
second come and go on the other nodes, so that the watch has traffic.

Cost: an invocation lasts its watch (counted from its start) plus the tail after it; per month, at a
1-minute rate, ``43,830 x (WATCH_S + tail)`` Lambda-seconds. Polling instead (``WATCH_S`` 0) costs the
run alone, measured here too on the same cluster.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from scheduler_core.simulator.synthetic import CATALOGUE, make_node, make_pod
from testing.control_plane import ControlPlane
from testing.kube_binaries import missing
from testing.lambda_watch import Schedule, probe, wait_stored
from testing.product import Processes

A100 = next(shape for shape in CATALOGUE if shape.model == "A100")
INVOCATIONS_PER_MONTH = 43_830  # a 1-minute rate: 60 x 24 x 365.25 / 12
DEPLOYED_WATCH_S = 75.0  # cdk/config.py's default: the next invocation, a minute later, takes over
GB_SECOND_USD = 0.0000133334  # arm64, us-east-1, first tier (aws.amazon.com/lambda/pricing, 2026)
MEMORY_GB = 1769 / 1024  # the node-state function's memory (cdk/stack.py)
BUCKET = "snapshots"


def run(
    *, nodes: int = 500, period_s: float = 20.0, watch_s: float = 25.0, invocations: int = 4, churn: float = 5.0
) -> dict[str, Any]:
    from adapters.snapshot_store import open_store
    from testing.moto import aws_env, moto_server, s3_client

    reason = missing()
    if reason:
        raise ValueError(f"bench e2e-lambda-watch needs a control plane: {reason}")
    with tempfile.TemporaryDirectory(prefix="bench-lambda-watch-") as tmp:
        work = Path(tmp)
        with moto_server() as endpoint, ControlPlane(work / "cluster") as cluster, Processes(work) as product:
            env = aws_env(endpoint)
            client = s3_client(endpoint)
            client.create_bucket(Bucket=BUCKET)
            names = [f"node-{i:04d}" for i in range(nodes)]
            cluster.add_nodes([make_node(name, A100, f"us-east-1{'abc'[i % 3]}") for i, name in enumerate(names)])
            cluster.ensure_namespaces(["probe", "churn"])
            poll = Schedule(product, cluster, env, f"s3://{BUCKET}/poll.npz", watch_s=0, period_s=1, count=1)
            (polled,) = poll.reports(timeout_s=120)
            uri = f"s3://{BUCKET}/snapshot.npz"
            store = open_store(uri, s3_client=client)
            schedule = Schedule(product, cluster, env, uri, watch_s=watch_s, period_s=period_s, count=invocations)
            wait_stored(store, 60)
            stop = threading.Event()
            churner = threading.Thread(target=_churn, args=(cluster, names[1:], churn, stop), daemon=True)
            churner.start()
            try:
                found = probe(
                    cluster, store, namespace="probe", node=names[0], duration_s=period_s * (invocations - 1) + 2
                )
            finally:
                stop.set()
                churner.join(timeout=10)
            reports = schedule.reports(timeout_s=watch_s + 120)
    over_s = statistics.median(report["run_ms"] / 1000 - watch_s for report in reports)
    watch_month = INVOCATIONS_PER_MONTH * (DEPLOYED_WATCH_S + max(0.0, over_s))
    poll_month = INVOCATIONS_PER_MONTH * polled["run_ms"] / 1000
    return {
        "benchmark": "e2e-lambda-watch", "nodes": nodes, "period_s": period_s, "watch_s": watch_s,
        "invocations": len(reports), "churn_pods_per_s": churn,
        "staleness": found.summary(),
        "publishes": [report["watch"]["publishes"] for report in reports],
        "kept_newer": [report["snapshots_kept_newer"] for report in reports],
        "watch_lag_p99_s": [report["watch"]["lag_p99_s"] for report in reports],
        "events": [report["watch"]["events"] for report in reports],
        "run_before_watch_s": [round(r["run_ms"] / 1000 - r["watch"]["seconds"], 2) for r in reports],
        "invocation_past_watch_s": round(over_s, 2),
        "poll_run_s": round(polled["run_ms"] / 1000, 2),
        "cost": {
            "deployed_watch_s": DEPLOYED_WATCH_S, "lambda_s_per_month_watch": round(watch_month),
            "lambda_s_per_month_poll": round(poll_month),
            "usd_per_month_watch": round(watch_month * MEMORY_GB * GB_SECOND_USD, 2),
            "usd_per_month_poll": round(poll_month * MEMORY_GB * GB_SECOND_USD, 2),
        },
    }  # fmt: skip


def _churn(cluster: ControlPlane, nodes: list[str], per_s: float, stop: threading.Event) -> None:
    """``per_s`` bound pods created per second on random nodes, each deleted about 2 s later."""
    rng = random.Random(7)
    alive: list[tuple[float, str]] = []
    index = 0
    while not stop.wait(1.0 / per_s if per_s > 0 else 1.0):
        if per_s <= 0:
            continue
        name = f"c-{index}"
        index += 1
        cluster.api.request(
            "POST", "/api/v1/namespaces/churn/pods", make_pod(name, 1, namespace="churn", node_name=rng.choice(nodes))
        )
        alive.append((time.monotonic(), name))
        while alive and time.monotonic() - alive[0][0] > 2.0:
            cluster.delete_pod("churn", alive.pop(0)[1])
