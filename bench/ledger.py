"""``gpu-scheduler bench ledger``: GPU-ledger binds under contention, against moto's DynamoDB server.

``threads`` binders, each with its own client, record ``pods`` fractional pods on ``nodes`` 8-GPU nodes.
Most pods prefer the same few "hot" nodes, as bin-packing makes them do, so binders collide there. A
pod that loses both attempts on a node (or finds no room) moves to its next preferred node, as
kube-scheduler's retry would. Reported: per-bind latency (one ``LedgerStore.assign``: a consistent
read, then a conditional write, twice on a conflict) and conflicts per 1,000 binds. moto runs in its own
process on the same 2 cores, so absolute latencies are moto's, not DynamoDB's (single-digit ms).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from adapters.gpu_ledger import LedgerConflictError, LedgerStore, NoRoomError
from bench.timing import run_threads
from scheduler_core.state.ledger import Demand, NodeLedger

TABLE = "gpu-ledger"
SHARES = (100, 200, 250, 300, 500)


@dataclass
class Contention:
    results: dict[str, tuple[str, str]] = field(default_factory=dict)  # uid -> (node, annotation)
    outcome: Counter[str] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)
    ledgers: dict[str, NodeLedger] = field(default_factory=dict)
    wall_s: float = 0.0


def create_table(client: Any) -> None:
    """The bench's ledger table, as the product creates it."""
    from adapters.gpu_ledger import create_table as create

    create(client, TABLE)


def contend(endpoint: str, *, threads: int = 8, pods: int = 2000, nodes: int = 80, hot: int = 10) -> Contention:
    """Run the binders against a fresh table at ``endpoint``; return what they did and the final ledgers."""
    import boto3

    def client() -> Any:
        return boto3.client("dynamodb", region_name="us-east-1", endpoint_url=endpoint)

    create_table(client())
    names = [f"gpu-{i:03d}" for i in range(nodes)]
    run = Contention()
    lock = threading.Lock()

    def binder(worker: int) -> None:
        store, rng = LedgerStore(TABLE, client()), random.Random(worker)
        for i in range(worker, pods, threads):
            uid, demand = f"pod-{i}", Demand(1, rng.choice(SHARES))
            for node in rng.sample(names[:hot], 3) + rng.sample(names, 5):
                started = time.perf_counter()
                try:
                    assigned = store.assign(node, 8, uid, demand)
                except NoRoomError:
                    continue
                except LedgerConflictError:
                    with lock:
                        run.outcome["failed_on_conflict"] += 1
                        run.outcome["conflicts"] += 2
                    continue
                finally:
                    elapsed = 1000 * (time.perf_counter() - started)
                    with lock:
                        run.latencies_ms.append(elapsed)
                with lock:
                    run.results[uid] = (node, assigned.annotation)
                    run.outcome["conflicts"] += assigned.conflicts
                break
            else:
                with lock:
                    run.outcome["unplaced"] += 1

    run.wall_s = run_threads(binder, threads)
    reader = LedgerStore(TABLE, client())
    run.ledgers = {node: reader.read(node, 8) for node in names}
    return run


def _summary(contention: Contention) -> dict[str, Any]:
    latencies = np.array(contention.latencies_ms)
    binds = len(contention.results)
    return {
        "placed": binds,
        "unplaced": contention.outcome["unplaced"],
        "assign_calls": len(latencies),
        "assign_ms": {
            "p50": round(float(np.percentile(latencies, 50)), 2),
            "p99": round(float(np.percentile(latencies, 99)), 2),
        },
        "conflicts_per_1000_binds": round(1000 * contention.outcome["conflicts"] / max(binds, 1), 1),
        "binds_failed_after_two_conflicts": contention.outcome["failed_on_conflict"],
        "wall_s": round(contention.wall_s, 1),
        "binds_per_s": round(binds / contention.wall_s, 1),
    }


def run(threads: int, pods: int) -> dict[str, Any]:
    """The contended run, then one binder alone on a fresh server (the same moto, no queueing)."""
    import os

    from testing.moto import moto_server

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    with moto_server() as endpoint:
        contended = contend(endpoint, threads=threads, pods=pods)
    with moto_server() as endpoint:
        alone = contend(endpoint, threads=1, pods=max(pods // 10, 1))
    return {
        "suite": "ledger",
        "contended": {"threads": threads, "pods": pods, **_summary(contended)},
        "alone": {"threads": 1, "pods": max(pods // 10, 1), **_summary(alone)},
    }
