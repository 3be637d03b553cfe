"""``gpu-scheduler bench node-state``: one refresher run over a large synthetic cluster.

The API double serves the cluster from a separate process, so the figures are the refresher's own:
wall time per phase from its report, and the peak resident memory of this process (what a Lambda's
memory setting must cover). S3 and EC2 are moto, in-process; no metrics endpoint is queried. Two
runs: the first labels every unlabelled GPU node, the second is the steady state (nothing to patch).
The 2-core machine runs the double and the refresher at once, so the wall times are pessimistic.
"""

from __future__ import annotations

import logging
import os
import resource
import time
from typing import TYPE_CHECKING, Any

from bench import kube_double_process

if TYPE_CHECKING:
    from application.node_state.run import RunReport


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run(n_nodes: int, n_pods: int, seed: int, concurrency: int) -> dict[str, Any]:
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    import boto3
    from moto import mock_aws

    from adapters.ec2_gpu import GpuInfoCatalog
    from adapters.kube import connect_url
    from adapters.snapshot_store import open_store
    from application.node_state.service import Services, refresh
    from application.node_state.settings import NodeStateSettings

    # One log line per labelled node is right for a Lambda, not for a benchmark's terminal.
    logging.getLogger("application.node_state.service").setLevel(logging.WARNING)
    started = time.perf_counter()
    with kube_double_process("--nodes", str(n_nodes), "--pods", str(n_pods), "--seed", str(seed)) as ready:
        setup_s = time.perf_counter() - started
        baseline_mb = _rss_mb()
        runs = []
        with mock_aws():
            session = boto3.session.Session(region_name="us-east-1")
            session.client("s3").create_bucket(Bucket="bench")
            services = Services(
                kube=connect_url(ready["url"], ready["token"]),
                store=open_store("s3://bench/snapshot.npz", s3_client=session.client("s3")),
                catalog=GpuInfoCatalog(session.client("ec2")),
                prometheus=None,
            )
            settings = NodeStateSettings(cluster_name="bench", snapshot_uri="s3://bench/snapshot.npz",
                                         patch_concurrency=concurrency)  # fmt: skip
            for label in ("first run (labels every GPU node)", "steady state (nothing to patch)"):
                wall = time.perf_counter()
                report = refresh(settings, services, time_left=lambda: 900.0)
                runs.append(_run_figures(label, time.perf_counter() - wall, report))
    return {
        "benchmark": "node-state",
        "nodes": n_nodes,
        "pods": n_pods,
        "patch_concurrency": concurrency,
        "double_setup_s": round(setup_s, 1),
        "rss_before_first_run_mb": round(baseline_mb, 1),
        "runs": runs,
        "targets": {"wall_s": 30, "peak_rss_mb": 1536},
    }


def _run_figures(label: str, wall_s: float, report: RunReport) -> dict[str, Any]:
    """One refresher run's figures: its wall time, what its report says, and this process's peak memory
    so far."""
    return {
        "run": label,
        "wall_s": round(wall_s, 2),
        "status": report.status,
        "nodes_seen": report.nodes_seen,
        "pods_seen": report.pods_seen,
        "nodes_labeled": report.nodes_labeled,
        "label_patch_failures": report.label_patch_failures,
        "snapshot_bytes": report.snapshot_bytes,
        "snapshot_write_ms": round(report.snapshot_write_ms, 1),
        "peak_rss_mb": round(_rss_mb(), 1),
        "phases_ms": report.phases_ms,
    }
