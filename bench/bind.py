"""``gpu-scheduler bench bind``: the extender's whole ``bind`` verb, ledger to Binding.

Each bind is ``Extender.respond("bind", body)`` with a :class:`shares.binder.LedgerBinder`: GET the
pod, the ledger's conditional write in moto's DynamoDB (server mode, its own process), the annotation
PATCH and the Binding POST to the in-repo API double over HTTP. ``threads`` extender instances (each
with its own clients, snapshot copy and ledger readings, as separate Lambda instances have) filter,
prioritize and bind ``pods`` fractional pods onto ``nodes`` 8-GPU nodes, most pods choosing among the
same ``hot`` few (see :func:`bind_all`). Reported: bind latency p50/p99, conflicts per 1,000 binds, the
binds answered ``Error`` by cause, and what the first bind pays to load the ``kubernetes`` client
(measured in a fresh interpreter).

Everything runs on this machine's two cores: moto, the API double and the binders compete for them, so
absolute times are an upper bound; the real DynamoDB and API server answer in single-digit ms.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from adapters.gpu_ledger import LedgerStore
from adapters.kube import connect_url
from adapters.kube_transport import RetryPolicy
from adapters.ledger_readings import LedgerReadings
from bench.ledger import SHARES, TABLE, create_table
from bench.timing import run_threads
from scheduler_core.extender.facade import BindOutcome, Extender
from scheduler_core.extender.wire import ExtenderArgs
from scheduler_core.simulator.synthetic import CATALOGUE, make_node, make_pod
from scheduler_core.state.cluster import ClusterState
from scheduler_core.state.ledger import NodeLedger
from shares.binder import LedgerBinder
from testing.kube_double import KubeApiDouble
from testing.moto import moto_server

TOKEN = "bench"


@dataclass
class BindRun:
    """What the binders did: every bind's latency and outcome, and the pods and ledger items after."""

    threads: int
    latencies_ms: list[float] = field(default_factory=list)
    outcome: Counter[str] = field(default_factory=Counter)  # "bound", or the error kind
    conflicts: int = 0
    unplaced: int = 0
    pods: list[dict[str, Any]] = field(default_factory=list)
    items: list[NodeLedger] = field(default_factory=list)
    wall_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        bound = sum(1 for pod in self.pods if pod["spec"].get("nodeName"))
        values = np.array(self.latencies_ms)
        return {
            "threads": self.threads,
            "pods": len(self.pods),
            "bound": bound,
            "unplaced": self.unplaced,
            "ledger_assignments": sum(len(item.assignments) for item in self.items),
            "ledger_problems": [problem for item in self.items for problem in item.problems()],
            "outcomes": dict(self.outcome),
            "bind_calls": len(values),
            "bind_ms": {
                "p50": round(float(np.percentile(values, 50)), 2),
                "p99": round(float(np.percentile(values, 99)), 2),
            },
            "conflicts_per_1000_binds": round(1000 * self.conflicts / max(bound, 1), 1),
            "wall_s": round(self.wall_s, 1),
            "binds_per_s": round(bound / self.wall_s, 1),
        }


def bind_all(
    endpoint: str, *, threads: int = 8, pods: int = 2000, nodes: int = 80, hot: int = 10, learn: bool = True
) -> BindRun:
    """Schedule ``pods`` shares from ``threads`` extender instances at once, against the DynamoDB at
    ``endpoint`` (a fresh table) and a fresh API double.

    Each thread is one Lambda instance: its own extender, clients and ledger readings, over one snapshot
    taken before the run (so it only learns of the others' binds from the ledger). Per pod it filters
    and prioritizes 8 candidate nodes (3 of the ``hot`` ones, 5 of all), binds to the best, and on an
    ``Error`` binds to the next, as kube-scheduler's retry would. ``learn=False`` keeps what the binds
    read from the ledger out of the instance's view (the snapshot alone), for comparison.
    """
    import boto3

    create_table(boto3.client("dynamodb", region_name="us-east-1", endpoint_url=endpoint))
    shape = next(shape for shape in CATALOGUE if shape.gpus == 8)
    names = [f"gpu-{i:03d}" for i in range(nodes)]
    node_objects = [make_node(name, shape, "us-east-1a") for name in names]
    snapshot = replace(ClusterState.from_objects(node_objects), generated_at=time.time())
    run = BindRun(threads)
    lock = threading.Lock()
    with KubeApiDouble(tokens=[TOKEN]) as api:
        api.load("nodes", node_objects)
        rng = random.Random(0)
        specs = [make_pod(f"p{i}", 0, milli=rng.choice(SHARES)) for i in range(pods)]
        api.load("pods", specs)

        def schedule(worker: int) -> None:
            extender = _lambda_instance(api.url, endpoint, snapshot, names[0], learn=learn)
            choose = random.Random(worker)
            for i in range(worker, pods, threads):
                pod = specs[i]
                candidates = choose.sample(names[:hot], 3) + choose.sample(names, 5)
                args = ExtenderArgs(pod=pod, node_names=candidates)
                feasible = extender.filter(args).kept
                scored = extender.prioritize(ExtenderArgs(pod=pod, node_names=feasible))
                by_score = sorted(zip(scored.values, scored.hosts, strict=True), key=lambda pair: -pair[0])
                _bind_best(extender, pod, [host for _, host in by_score], run, lock)

        run.wall_s = run_threads(schedule, threads)
        run.pods = api.objects("pods")
        reader = LedgerStore(TABLE, boto3.client("dynamodb", region_name="us-east-1", endpoint_url=endpoint))
        run.items = [reader.read(name, 8) for name in names]
    return run


def _lambda_instance(api_url: str, endpoint: str, snapshot: ClusterState, warm_node: str, *, learn: bool) -> Extender:
    """One Lambda instance over ``snapshot``: its own extender, Kubernetes client (to the API double at
    ``api_url``), DynamoDB client (``endpoint``) and ledger readings (kept out of its view unless ``learn``)."""
    import boto3

    def kube() -> Any:
        client = connect_url(api_url, TOKEN)
        client.retry = RetryPolicy(attempts=2, base_s=0.05, max_s=0.2, request_timeout_s=5.0)
        return client

    dynamodb = boto3.client("dynamodb", region_name="us-east-1", endpoint_url=endpoint)
    readings = LedgerReadings()
    binder = LedgerBinder(LedgerStore(TABLE, dynamodb), kube, lambda: snapshot, readings if learn else None)
    binder.kube.get_node(warm_node)  # connected and warm, as a warm Lambda is: the first bind is measured apart
    return Extender(cluster=lambda: snapshot, readings=readings, accounting=binder)


def _bind_best(extender: Extender, pod: dict[str, Any], hosts: list[str], run: BindRun, lock: threading.Lock) -> None:
    """Bind ``pod`` to the first of ``hosts`` (best first) that takes it, as kube-scheduler's retry after an
    ``Error`` would; each bind's latency and outcome into ``run`` (under ``lock``), and the pod as
    unplaced where none took it."""
    for host in hosts:
        meta = pod["metadata"]
        body = json.dumps(
            {"PodName": meta["name"], "PodNamespace": "default", "PodUID": meta["uid"], "Node": host}
        ).encode()
        started = time.perf_counter()
        reply = extender.respond("bind", body)
        elapsed = 1000 * (time.perf_counter() - started)
        assert isinstance(reply.outcome, BindOutcome)
        with lock:
            run.latencies_ms.append(elapsed)
            run.conflicts += reply.outcome.conflicts
            run.outcome[reply.outcome.error_kind or "bound"] += 1
        if not reply.outcome.error:
            return
    with lock:
        run.unplaced += 1


def first_bind_import_ms(runs: int = 3) -> float:
    """Median time to ``import kubernetes`` in a fresh interpreter: what the first bind of a Lambda pays."""
    code = "import time; t = time.perf_counter(); import kubernetes.client; print(1000 * (time.perf_counter() - t))"
    times = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
             for _ in range(runs)]  # fmt: skip
    return round(float(np.median(times)), 1)


def run(threads: int, pods: int, nodes: int = 80, hot: int = 10) -> dict[str, Any]:
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    with moto_server() as endpoint:
        contended = bind_all(endpoint, threads=threads, pods=pods, nodes=nodes, hot=hot).summary()
    with moto_server() as endpoint:
        snapshot_only = bind_all(endpoint, threads=threads, pods=pods, nodes=nodes, hot=hot, learn=False).summary()
    with moto_server() as endpoint:
        alone = bind_all(endpoint, threads=1, pods=max(pods // 10, 1), nodes=nodes, hot=hot).summary()
    return {
        "suite": "bind",
        "contended": contended,
        "contended_snapshot_only": snapshot_only,
        "alone": alone,
        "first_bind_kubernetes_import_ms": first_bind_import_ms(),
    }
