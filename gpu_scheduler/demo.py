"""``gpu-scheduler demo``: a synthetic GPU cluster scheduled through a real local extender.

The demo plays kube-scheduler and the API server around a ``gpu-scheduler serve`` subprocess:

1. writes a synthetic cluster (mixed A100/H100/L40S/T4 nodes over 3 zones, partly used) as a snapshot;
2. starts ``serve --snapshot FILE --port 0`` (``--cluster FILE`` with ``--mode nodes``) and reads the
   bound address from its stdout;
3. for each pending pod, in kube-scheduler's order: the in-tree resource fit on ``nvidia.com/gpu``
   (kube-scheduler counts it itself), ``POST /filter`` with ``NodeNames``
   (``nodeCacheCapable: true``; full Node objects with ``--mode nodes``), ``POST /prioritize`` when
   more than one node is left, then the highest score (ties broken at random, as ``selectHost``
   does), then "binds" the pod by publishing a new snapshot, which the server re-reads;
4. prints placements, free and stranded GPUs, and client-side latency per verb.

Only the extender's score ranks nodes here; a real kube-scheduler adds its own plugin scores.

Then, from a source checkout with ``../shared/k8s`` (or ``$KUBE_BIN_DIR``) and etcd, the live path
(:func:`live_burst`): a burst of one-GPU pods through a real kube-apiserver and kube-scheduler, first on
kube-scheduler's own scoring and then through ``gpu-scheduler serve --watch`` on the generated
configuration, with the nodes each used against the ideal. Without them it says what is missing.

Then it compares placement quality for GPU sharing (:func:`placement_comparison`): FGD against ours
(``fgd_cpu``) by the FGD paper's protocol, on the openb ``default`` trace when ``../shared/data/openb``
is there, and on a synthetic openb-like trace otherwise.
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
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from adapters.snapshot_store import FileSnapshotStore
from gpu_scheduler.simulation import run_many
from gpu_scheduler.synthetic import demo_pod_stream, synthetic_cluster
from gpu_scheduler.traces import openb_dir, synthetic_trace, write_trace
from scheduler_core.k8s.pods import effective_gpu_request, pod_demand
from scheduler_core.scoring.gpu_fit import filter_nodes
from scheduler_core.scoring.policy import DEFAULT_SHARE_POLICY
from scheduler_core.state.cluster import ClusterState
from scheduler_core.state.snapshot import build_snapshot, write_snapshot

PLACEMENT_POLICIES = ("fgd", DEFAULT_SHARE_POLICY)
FGD_RELEASED_DEFAULT = 4.77
"""The authors' released mean for FGD on ``default`` at 100 % arrived (FGD_NOTES.md section 7)."""


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


def start_server(state_args: list[str]) -> tuple[subprocess.Popen[str], str]:
    """Start ``gpu-scheduler serve`` on a free loopback port; return the process and its URL."""
    command = [sys.executable, "-m", "gpu_scheduler", "serve", "--port", "0", "--refresh-s", "0", *state_args]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=10)
        raise RuntimeError(f"gpu-scheduler serve exited with code {proc.returncode} before it was ready")
    return proc, json.loads(line)["serving"]


class _Cluster:
    """The demo's API server: nodes, bound pods, and the state file the extender reads.

    ``names`` mode publishes a cluster snapshot (what the node-state refresher does in production)
    and sends ``NodeNames`` (``nodeCacheCapable: true``); ``nodes`` mode publishes a cluster JSON
    file and sends full Node objects (``nodeCacheCapable: false``).
    """

    def __init__(self, nodes: list[dict[str, Any]], bound: list[dict[str, Any]], mode: str, folder: Path) -> None:
        self.nodes, self.bound, self.mode = nodes, bound, mode
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
        if self.mode == "names":
            return {"Pod": pod, "Nodes": None, "NodeNames": names}
        return {"Pod": pod, "Nodes": {"metadata": {}, "items": [self.by_name[n] for n in names]}, "NodeNames": None}

    def kept(self, reply: dict[str, Any]) -> list[str]:
        if self.mode == "names":
            return list(reply.get("NodeNames") or [])
        return [node["metadata"]["name"] for node in (reply.get("Nodes") or {}).get("items") or []]

    def bind(self, pod: dict[str, Any], node: str) -> None:
        pod["spec"]["nodeName"] = node
        pod["status"]["phase"] = "Running"
        self.bound.append(pod)
        self.publish()


def run_demo(
    *,
    n_nodes: int = 200,
    n_pods: int = 350,
    seed: int = 7,
    mode: str = "names",
    as_json: bool = False,
    placement_seeds: tuple[int, ...] = (42, 43),
    live: bool = True,
) -> int:
    if mode not in ("names", "nodes"):
        raise ValueError(f"mode: expected 'names' or 'nodes', got {mode!r}")
    rng = np.random.default_rng(seed)
    nodes, bound = synthetic_cluster(n_nodes, rng)
    pending = demo_pod_stream(n_pods, rng)
    alloc = {node["metadata"]["name"]: int(node["status"]["allocatable"]["nvidia.com/gpu"]) for node in nodes}
    used = Counter({name: 0 for name in alloc})
    for pod in bound:
        used[pod["spec"]["nodeName"]] += effective_gpu_request(pod["spec"])

    unplaced: Counter[str] = Counter()
    unplaced_pods: list[dict[str, Any]] = []
    placed = 0
    with tempfile.TemporaryDirectory(prefix="gpu-scheduler-demo-") as tmp:
        cluster = _Cluster(nodes, bound, mode, Path(tmp))
        proc, url = start_server(cluster.serve_args)
        client = ExtenderClient(url)
        started = time.perf_counter()
        try:
            for pod in tqdm(pending, desc="scheduling", unit="pod", file=sys.stderr, disable=None):
                gpus = effective_gpu_request(pod["spec"])
                # kube-scheduler's in-tree NodeResourcesFit runs first and keeps only nodes with room.
                candidates = [name for name in alloc if alloc[name] - used[name] >= gpus]
                if not candidates:
                    unplaced[f"in-tree: no node has {gpus} free GPU(s)"] += 1
                    unplaced_pods.append(pod)
                    continue
                reply = client.call("filter", cluster.request(pod, candidates))
                kept = cluster.kept(reply)
                if reply.get("Error") or not kept:
                    unplaced[f"extender: {reply.get('Error') or _wanted(pod, gpus)}"] += 1
                    unplaced_pods.append(pod)
                    continue
                if len(kept) == 1:
                    choice = kept[0]
                else:
                    scores = client.call("prioritize", cluster.request(pod, kept))
                    best = max(entry["Score"] for entry in scores)
                    top = [entry["Host"] for entry in scores if entry["Score"] == best]
                    choice = top[int(rng.integers(len(top)))]
                cluster.bind(pod, choice)
                used[choice] += gpus
                placed += 1
            elapsed = time.perf_counter() - started
        finally:
            client.close()
            proc.terminate()
            proc.wait(timeout=10)

    summary = _summary(nodes, bound, unplaced_pods, placed, unplaced, client.latency_ms, elapsed)
    summary["mode"] = mode
    summary["server_exit_code"] = proc.returncode
    if not as_json:
        print(_format(summary), flush=True)
    if live:
        summary["live"] = live_burst()
        if not as_json:
            print(_format_live(summary["live"]), flush=True)
    if placement_seeds:
        summary["placement"] = placement_comparison(placement_seeds)
        if not as_json:
            print(_format_placement(summary["placement"]))
    if as_json:
        print(json.dumps(summary, indent=2))
    return 0 if proc.returncode == 0 else 1


def live_burst(*, nodes: int = 64, pods: int = 256) -> dict[str, Any]:
    """The burst through a real control plane (``bench.e2e.run_burst``), or why it could not run."""
    try:
        from bench.e2e import run_burst
        from testing.control_plane import missing
    except ModuleNotFoundError as exc:
        return {"skipped": f"the live step runs from a source checkout (make demo): {exc.name} is not importable"}
    reason = missing()
    if reason:
        return {"skipped": reason}
    print(f"live: {pods} one-GPU pods on {nodes} nodes through a real kube-scheduler...", file=sys.stderr, flush=True)
    return run_burst(nodes=nodes, pods=pods)


def _format_live(live: dict[str, Any]) -> str:
    if "skipped" in live:
        return f"\nLive path through a real kube-scheduler: skipped ({live['skipped']})"
    alone, ours = live["kube_scheduler_alone"], live["gpu_scheduler"]
    staleness = ours.get("staleness", {})
    return "\n".join([
        f"\nLive path: {live['pods']} one-GPU pods at once on {live['nodes']} empty {live['gpus_per_node']}-GPU "
        "nodes, through a real kube-apiserver and kube-scheduler",
        f"  kube-scheduler's own scoring: {alone['nodes_used']:>4} nodes used, {alone['pods_per_s']:.0f} pods/s",
        f"  gpu-scheduler, serve --watch: {ours['nodes_used']:>4} nodes used, {ours['pods_per_s']:.0f} pods/s "
        f"(ideal {live['ideal_nodes']} nodes)",
        f"  live state behind the binds: p50 {1000 * staleness.get('p50_s', 0):.0f} ms, "
        f"p99 {1000 * staleness.get('p99_s', 0):.0f} ms over {staleness.get('binds', 0)} binds",
    ])  # fmt: skip


def placement_comparison(seeds: tuple[int, ...], *, openb: Path | None = None, jobs: int = 2) -> dict[str, Any]:
    """FGD and ours on the same trace and seeds, by the FGD protocol (inflated to 1.3x, no departures):
    unallocated GPU % at 100 % and 130 % arrived, failed tasks, and seconds per run. The openb
    ``default`` trace when ``openb`` (default :func:`~gpu_scheduler.traces.openb_dir`) holds it, else a
    synthetic look-alike (150 nodes, 1,200 tasks)."""
    openb = openb or openb_dir()
    with tempfile.TemporaryDirectory(prefix="gpu-scheduler-placement-") as tmp:
        if (openb / "openb_pod_list_default.csv").is_file():
            nodes, pods = openb / "openb_node_list_gpu_node.csv", openb / "openb_pod_list_default.csv"
            trace = f"openb default ({openb})"
        else:
            nodes, pods = Path(tmp) / "nodes.csv", Path(tmp) / "pods.csv"
            write_trace(*synthetic_trace(150, 1200, np.random.default_rng(0)), nodes, pods)
            trace = f"synthetic, openb-like (150 nodes, 1,200 tasks; {openb} is absent)"
        reports = run_many(nodes, pods, list(PLACEMENT_POLICIES), list(seeds), 1.3, "shuffled", jobs)
    return {
        "trace": trace,
        "seeds": list(seeds),
        "released_fgd_unallocated_gpu_pct_100": FGD_RELEASED_DEFAULT if trace.startswith("openb") else None,
        "policies": {
            r["policy"]: {
                "unallocated_gpu_pct_100": r["unallocated_gpu_pct"]["100"]["mean"],
                "unallocated_gpu_pct_130": r["unallocated_gpu_pct"]["130"]["mean"],
                "pods_failed": r["pods_failed"]["mean"],
                "seconds_per_run": r["seconds_per_seed"]["mean"],
            }
            for r in reports
        },
    }


def _summary(
    nodes: list[dict[str, Any]],
    bound: list[dict[str, Any]],
    unplaced_pods: list[dict[str, Any]],
    placed: int,
    unplaced: Counter[str],
    latency_ms: dict[str, list[float]],
    elapsed_s: float,
) -> dict[str, Any]:
    state = ClusterState.from_objects(nodes, bound)
    free = state.free_gpus
    # A free GPU is stranded when no pod that was left waiting could use the node it is on.
    usable = np.zeros(state.table.n_nodes, dtype=bool)
    for demand in {_demand_key(pod): pod_demand(pod) for pod in unplaced_pods}.values():
        usable |= filter_nodes(state.table, free, demand).feasible
    return {
        "nodes": state.table.n_nodes,
        "pods_placed": placed,
        "pods_unplaced": sum(unplaced.values()),
        "unplaced_by_reason": dict(unplaced.most_common()),
        "gpus_total": int(state.table.alloc_gpus.sum()),
        "gpus_free": int(free.sum()),
        "gpus_stranded": int(free[~usable].sum()),
        "nodes_partly_used": int(((free > 0) & (free < state.table.alloc_gpus)).sum()),
        "latency_ms": {
            verb: {
                "calls": len(values),
                "p50": round(float(np.percentile(values, 50)), 2) if values else None,
                "p99": round(float(np.percentile(values, 99)), 2) if values else None,
            }
            for verb, values in latency_ms.items()
        },
        "elapsed_s": round(elapsed_s, 1),
    }


def _wanted(pod: dict[str, Any], gpus: int) -> str:
    demand = pod_demand(pod)
    models = ",".join(sorted(demand.models)) if demand.models else "any"
    memory = f" with >= {demand.min_memory_mib} MiB" if demand.min_memory_mib else ""
    return f"no node with {gpus} free GPU(s) has model {models}{memory}"


def _demand_key(pod: dict[str, Any]) -> str:
    return json.dumps([pod["spec"]["containers"][0]["resources"], pod["metadata"].get("annotations")], sort_keys=True)


def _format(s: dict[str, Any]) -> str:
    lines = [
        f"eks-gpu-scheduler demo: {s['nodes']} nodes, {s['pods_placed'] + s['pods_unplaced']} GPU pods "
        f"in {s['elapsed_s']} s",
        f"  placed      {s['pods_placed']}",
        f"  unplaced    {s['pods_unplaced']}",
    ]
    lines += [f"      {count:4d}  {reason}" for reason, count in s["unplaced_by_reason"].items()]
    lines += [
        f"  GPUs        {s['gpus_total']} total, {s['gpus_free']} free, {s['gpus_stranded']} stranded "
        "(free, but on nodes no waiting pod fits)",
        f"  nodes partly used: {s['nodes_partly_used']}",
        "  latency per call (client side, HTTP round trip; "
        + ("NodeNames with a snapshot" if s["mode"] == "names" else "full Node objects")
        + "; each filter after a bind",
        "  also re-reads the state the demo rewrote, as the extender re-reads a fresh snapshot):",
    ]
    for verb, stats in s["latency_ms"].items():
        lines.append(f"      {verb:<10} calls {stats['calls']:4d}  p50 {stats['p50']} ms  p99 {stats['p99']} ms")
    lines.append(f"  server exited with code {s['server_exit_code']}")
    return "\n".join(lines)


def _format_placement(p: dict[str, Any]) -> str:
    lines = [
        "",
        f"GPU-sharing placement, FGD vs ours (FGD protocol, mean of seeds {', '.join(map(str, p['seeds']))}):",
        f"  trace: {p['trace']}",
    ]
    for name, r in p["policies"].items():
        label = f"{name} (ours)" if name == DEFAULT_SHARE_POLICY else name
        lines.append(
            f"      {label:<15} unallocated GPUs {r['unallocated_gpu_pct_100']:5.2f} % at 100 % arrived, "
            f"{r['unallocated_gpu_pct_130']:5.2f} % at 130 %; {r['pods_failed']:.0f} tasks failed; "
            f"{r['seconds_per_run']:.1f} s per run"
        )
    if p["released_fgd_unallocated_gpu_pct_100"] is not None:
        lines.append(
            f"  the authors' released FGD figure at 100 %: {p['released_fgd_unallocated_gpu_pct_100']} % (10 seeds)"
        )
    return "\n".join(lines)
