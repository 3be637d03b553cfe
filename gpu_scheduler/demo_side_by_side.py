"""The demo's second step: the same pods, one at a time, placed by the stock kube-scheduler and by
gpu-scheduler, with kube-scheduler's own scores modelled (:mod:`gpu_scheduler.kube_scoring`).

- :func:`place_stock`: NodeResourcesFit's ``LeastAllocated`` and BalancedAllocation; a pod's model and
  memory asked as node affinity on the nodes' GPU labels, as a cluster without the product must.
- :func:`place_product`: the generated profile's ``MostAllocated`` and BalancedAllocation, plus the
  extender's score x :data:`EXTENDER_WEIGHT` x 10, the extender being ``gpu-scheduler serve`` over HTTP
  (:class:`ExtenderClient`), which re-reads the state the demo rewrites after each bind.

Ties go at random, as ``selectHost`` breaks them. :func:`format_side_by_side` puts the two outcomes
side by side, each line explained.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from adapters.snapshot_store import FileSnapshotStore
from gpu_scheduler.demo_output import Steps
from gpu_scheduler.kube_scoring import PRODUCT, STOCK, NodeUse, best, request_of, total_scores
from scheduler_core.k8s.names import LABEL_MEMORY, LABEL_MODEL
from scheduler_core.k8s.pods import pod_demand
from scheduler_core.state.snapshot import build_snapshot, write_snapshot

EXTENDER_WEIGHT = 5
"""The extender's weight in the generated profile (``scheduler-config --weight``'s default)."""
Objects = list[dict[str, Any]]
"""Nodes or pods, as the API server serves them (JSON objects)."""


class ExtenderClient:
    """A keep-alive HTTP/1.1 client, as kube-scheduler's Go client is."""

    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self._conn = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
        self.latency_ms: dict[str, list[float]] = {"filter": [], "prioritize": []}

    def call(self, verb: str, payload: dict[str, Any]) -> Any:
        body = json.dumps(payload, separators=(",", ":")).encode()
        started = time.perf_counter()
        self._conn.request("POST", f"/{verb}", body=body, headers={"Content-Type": "application/json"})
        response = self._conn.getresponse()
        data = response.read()
        self.latency_ms[verb].append(1000 * (time.perf_counter() - started))
        if response.status != 200:
            raise RuntimeError(f"{verb} answered HTTP {response.status}: {data[:200]!r}")
        return json.loads(data)

    def close(self) -> None:
        self._conn.close()


def start_server(state_args: list[str], log: Path) -> tuple[subprocess.Popen[str], str]:
    """Start ``gpu-scheduler serve`` on a free loopback port, its log to ``log``; the process and its URL."""
    command = [sys.executable, "-m", "gpu_scheduler", "serve", "--port", "0", "--refresh-s", "0", *state_args]
    with log.open("w") as err:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=10)
        raise RuntimeError(f"gpu-scheduler serve exited with {proc.returncode} before it was ready: {_tail(log)}")
    return proc, json.loads(line)["serving"]


def _tail(log: Path) -> str:
    return " / ".join(log.read_text(errors="replace").strip().splitlines()[-3:]) or "(no output)"


class _Cluster:
    """The demo's API server: nodes, bound pods, and the state file the extender reads.

    ``names`` mode publishes a cluster snapshot (what the node-state refresher does in production)
    and sends ``NodeNames`` (``nodeCacheCapable: true``); ``nodes`` mode publishes a cluster JSON
    file and sends full Node objects (``nodeCacheCapable: false``).
    """

    def __init__(self, nodes: list[dict[str, Any]], bound: list[dict[str, Any]], mode: str, folder: Path) -> None:
        self.nodes, self.bound, self.mode = nodes, list(bound), mode
        self.by_name = {node["metadata"]["name"]: node for node in nodes}
        self.path = folder / ("snapshot.npz" if mode == "names" else "cluster.json")
        self.publish()

    @property
    def serve_args(self) -> list[str]:
        return ["--snapshot" if self.mode == "names" else "--cluster", str(self.path)]

    def publish(self) -> None:
        if self.mode == "names":
            snapshot = build_snapshot(self.nodes, self.bound, cluster="demo", generated_at=time.time())
            FileSnapshotStore(self.path).put(write_snapshot(snapshot))
        else:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"nodes": self.nodes, "pods": self.bound}, separators=(",", ":")))
            os.replace(tmp, self.path)

    def request(self, pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
        # Without its UID: the extender then makes no prediction about the pod (it lays one over its state
        # for a few seconds, until its state shows the pod), which the demo needs none of, since it rewrites
        # the state after each bind; with one, the outcome would hang on how fast each step ran.
        pod = {**pod, "metadata": {k: v for k, v in pod["metadata"].items() if k != "uid"}}
        if self.mode == "names":
            return {"Pod": pod, "Nodes": None, "NodeNames": names}
        return {"Pod": pod, "Nodes": {"metadata": {}, "items": [self.by_name[n] for n in names]}, "NodeNames": None}

    def kept(self, reply: dict[str, Any]) -> list[str]:
        if self.mode == "names":
            return list(reply.get("NodeNames") or [])
        return [node["metadata"]["name"] for node in (reply.get("Nodes") or {}).get("items") or []]

    def bind(self, pod: dict[str, Any], node: str) -> None:
        pod = {**pod, "spec": {**pod["spec"], "nodeName": node}, "status": {"phase": "Running"}}
        self.bound.append(pod)
        self.publish()


@dataclass
class Outcome:
    """Where one scheduler put the pods: the nodes' use after, and what waits."""

    uses: dict[str, NodeUse]
    placed: int = 0
    waiting: Counter[int] = field(default_factory=Counter)
    """Pods left Pending, by the GPUs each asks for."""

    def summary(self) -> dict[str, Any]:
        uses = list(self.uses.values())
        gpu_nodes = [u for u in uses if u.gpus]
        free = [u.gpus - u.used[2] for u in gpu_nodes]
        partly = [f for u, f in zip(gpu_nodes, free, strict=True) if 0 < f < u.gpus]
        return {
            "pods_placed": self.placed,
            "pods_pending": sum(self.waiting.values()),
            "pods_pending_by_gpus": {str(k): v for k, v in sorted(self.waiting.items())},
            "nodes_with_gpus_in_use": sum(u.used[2] > 0 for u in gpu_nodes),
            "gpus_free": sum(free),
            "gpus_free_on_partly_used_nodes": sum(partly),
            "eight_gpu_nodes_free": sum(u.gpus == 8 and u.used[2] == 0 for u in gpu_nodes),
        }


def _node_affinity_allows(node: NodeUse, pod: dict[str, Any]) -> bool:
    """The pod's model and memory, asked as node affinity on the nodes' GPU labels (the stock side)."""
    demand = pod_demand(pod)
    if demand.models and node.labels.get(LABEL_MODEL) not in demand.models:
        return False
    return not demand.min_memory_mib or int(node.labels.get(LABEL_MEMORY, "0")) >= demand.min_memory_mib


def place_stock(nodes: Objects, bound: Objects, pending: Objects, seed: int, steps: Steps) -> Outcome:
    """The stock kube-scheduler's placement of ``pending``, one pod at a time."""
    rng = np.random.default_rng(seed)
    outcome = Outcome(node_uses(nodes, bound))
    for i, pod in enumerate(pending, 1):
        request = request_of(pod)
        feasible = [u for u in outcome.uses.values() if u.fits(request) and _node_affinity_allows(u, pod)]
        if feasible:
            top = best(total_scores(feasible, request, STOCK))
            outcome.uses[top[int(rng.integers(len(top)))]].add(request)
            outcome.placed += 1
        else:
            outcome.waiting[request[2]] += 1
        steps.progress("stock kube-scheduler", i, len(pending), final=i == len(pending))
    return outcome


def place_product(
    nodes: Objects, bound: Objects, pending: Objects, seed: int, mode: str, steps: Steps
) -> tuple[Outcome, dict[str, list[float]], int]:
    """The product's placement of ``pending`` through ``gpu-scheduler serve``; the latency of each call and
    serve's exit code."""
    rng = np.random.default_rng(seed)
    outcome = Outcome(node_uses(nodes, bound))
    with tempfile.TemporaryDirectory(prefix="gpu-scheduler-demo-") as tmp:
        cluster = _Cluster(nodes, bound, mode, Path(tmp))
        log = Path(tmp) / "serve.log"
        proc, url = start_server(cluster.serve_args, log)
        client = ExtenderClient(url)
        try:
            for i, pod in enumerate(pending, 1):
                request = request_of(pod)
                feasible = [u.name for u in outcome.uses.values() if u.fits(request)]
                kept = cluster.kept(client.call("filter", cluster.request(pod, feasible))) if feasible else []
                if kept:
                    scores = client.call("prioritize", cluster.request(pod, kept))
                    extender = {entry["Host"]: entry["Score"] for entry in scores}
                    totals = total_scores([outcome.uses[n] for n in kept], request, PRODUCT, extender, EXTENDER_WEIGHT)
                    top = best(totals)
                    choice = top[int(rng.integers(len(top)))]
                    outcome.uses[choice].add(request)
                    outcome.placed += 1
                    cluster.bind(pod, choice)
                else:
                    outcome.waiting[request[2]] += 1
                steps.progress("gpu-scheduler", i, len(pending), final=i == len(pending))
        finally:
            client.close()
            proc.terminate()
            proc.wait(timeout=10)
        if proc.returncode:
            steps.say(f"      gpu-scheduler serve exited with {proc.returncode}: {_tail(log)}")
    return outcome, client.latency_ms, proc.returncode


def node_uses(nodes: Objects, bound: Objects) -> dict[str, NodeUse]:
    """Each node's capacity and what the ``bound`` pods already take of it, by node name."""
    uses = {node["metadata"]["name"]: NodeUse.of(node) for node in nodes}
    for pod in bound:
        uses[pod["spec"]["nodeName"]].add(request_of(pod))
    return uses


def side_by_side(
    nodes: Objects, bound: Objects, pending: Objects, seed: int, mode: str, steps: Steps
) -> dict[str, Any]:
    """Both placements of ``pending`` on the same cluster: each one's :meth:`Outcome.summary`, the latency
    of gpu-scheduler's calls over HTTP (p50 and p99, ms) and serve's exit code."""
    stock = place_stock(nodes, bound, pending, seed, steps)
    ours, latency, exit_code = place_product(nodes, bound, pending, seed, mode, steps)
    return {
        "stock": stock.summary(),
        "gpu_scheduler": ours.summary(),
        "latency_ms": {verb: {"calls": len(v), "p50": _pct(v, 50), "p99": _pct(v, 99)} for verb, v in latency.items()},
        "server_exit_code": exit_code,
    }


def _pct(values: Sequence[float], q: int) -> float | None:
    return round(float(np.percentile(values, q)), 2) if values else None


def format_side_by_side(s: dict[str, Any]) -> str:
    stock, ours = s["stock"], s["gpu_scheduler"]
    eight_stock, eight_ours = stock["pods_pending_by_gpus"].get("8", 0), ours["pods_pending_by_gpus"].get("8", 0)
    rows = [
        ("pods placed", "pods_placed"),
        ("pods left Pending", "pods_pending"),
        ("nodes with a GPU in use", "nodes_with_gpus_in_use"),
        ("free GPUs on partly used nodes", "gpus_free_on_partly_used_nodes"),
        ("8-GPU nodes left whole", "eight_gpu_nodes_free"),
    ]
    lines = [f"\n      {'':34}{'stock kube-scheduler':>22}{'gpu-scheduler':>16}"]
    lines += [f"      {label:34}{stock[key]:>22}{ours[key]:>16}" for label, key in rows]
    lines.insert(3, f"      {'  of them asking for 8 GPUs':34}{eight_stock:>22}{eight_ours:>16}")
    filter_p50 = s["latency_ms"]["filter"]["p50"]
    lines += [
        "",
        "      What it means: the stock scheduler sends each pod to the emptiest node (LeastAllocated):",
        "      the pods spread, and break up the 8-GPU nodes an 8-GPU pod needs whole, so those pods wait.",
        "      gpu-scheduler fills the nodes already in use and keeps whole nodes whole. Free GPUs on",
        "      partly used nodes are the fragments a large pod cannot use.",
        f"      gpu-scheduler's extender ran as `gpu-scheduler serve`: filter took {filter_p50} ms at p50 over HTTP",
        f"      ({s['latency_ms']['filter']['calls']} calls). kube-scheduler's own scores are modelled "
        "(gpu_scheduler/kube_scoring.py).",
    ]
    return "\n".join(lines)
