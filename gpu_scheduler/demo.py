"""``gpu-scheduler demo``: the stock kube-scheduler and gpu-scheduler on the same pods, in one screen.

Each step prints a header with the time since the start, and a line at least every few seconds while it
works (:class:`Steps`):

1. **The cluster**: a synthetic EKS GPU cluster (p4d A100, p5 H100, g6e L40S and g4dn T4 nodes over three
   zones, some GPUs already taken) and a stream of pending GPU pods (1-8 GPUs; some name a model, some
   40 GiB per GPU). 96 nodes by default: under 100, the stock kube-scheduler scores every feasible node,
   as the model below does (from 100 up it scores an adaptive sample).
2. **The same pods, one at a time, placed twice**, with kube-scheduler's own scores modelled
   (:mod:`gpu_scheduler.kube_scoring`, checked pod by pod against the real one in the e2e suite):
   - the stock kube-scheduler: NodeResourcesFit's ``LeastAllocated`` and BalancedAllocation; a pod's
     model and memory asked as node affinity on the nodes' GPU labels, as a cluster without the product
     must;
   - gpu-scheduler: the generated profile's ``MostAllocated`` (GPUs included) and BalancedAllocation, plus
     the extender's score x 5 x 10, the extender being ``gpu-scheduler serve`` over HTTP (``filter`` with
     ``NodeNames``, then ``prioritize``), which re-reads a snapshot the demo rewrites after each bind, as
     the node-state refresher does in production. Ties go at random, as ``selectHost`` breaks them.
   Then the two outcomes side by side, each line explained.
3. **GPU sharing**: FGD beside the product's share policy (``fgd_cpu``) by the FGD paper's protocol, on
   openb ``gpuspec10`` (where the two differ most, ``docs/research/fgd-fidelity.md``) when
   ``../shared/data/openb`` is there, and on a synthetic openb-like trace otherwise.
4. **The live path**, where kube-apiserver, kube-scheduler and kube-controller-manager are found
   (``$KUBE_BIN_DIR``, ``docs/testing.md``): a burst of one-GPU pods through the real kube-scheduler on its
   stock scoring, then through ``serve --watch`` on the generated configuration (:func:`live_burst`).
   Without them, one line that says how to turn it on.
5. With ``--synth`` (``make demo``): the CDK app synthesised, in two lines.

Then what was seen, and what to run next.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from adapters.snapshot_store import FileSnapshotStore
from gpu_scheduler.kube_scoring import PRODUCT, STOCK, NodeUse, best, request_of, total_scores
from gpu_scheduler.simulation import run_many
from scheduler_core.k8s.names import LABEL_MEMORY, LABEL_MODEL
from scheduler_core.k8s.pods import pod_demand
from scheduler_core.scoring.policy import DEFAULT_SHARE_POLICY
from scheduler_core.simulator.synthetic import demo_pod_stream, synthetic_cluster
from scheduler_core.simulator.traces import openb_dir, synthetic_trace, write_trace
from scheduler_core.state.snapshot import build_snapshot, write_snapshot

PLACEMENT_POLICIES = ("fgd", DEFAULT_SHARE_POLICY)
PLACEMENT_TRACE = "gpuspec10"
"""The openb trace for the sharing step: where ``fgd_cpu`` and FGD differ most (10 of 10 seeds better)."""
EXTENDER_WEIGHT = 5
"""The extender's weight in the generated profile (``scheduler-config --weight``'s default)."""
DEMO_CLUSTER = "demo-gpu-cluster"
"""The cluster name the demo's synth uses (``make synth``'s default): a demo VPC, nothing of yours."""
TICK_S = 5.0
"""The most time a step goes without printing a line."""


class Steps:
    """The demo's output: numbered step headers with the time since the start, and progress lines."""

    def __init__(self, total: int, *, quiet: bool = False) -> None:
        self.total, self.quiet, self.number = total, quiet, 0
        self.started = time.monotonic()
        self._last = self.started

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def say(self, text: str = "") -> None:
        if not self.quiet:
            print(text, flush=True)
        self._last = time.monotonic()

    def step(self, title: str) -> None:
        self.number += 1
        self.say(f"\n[{self.number}/{self.total} {self.elapsed():5.1f} s] {title}")

    def progress(self, what: str, done: int, total: int, *, final: bool = False) -> None:
        """``what: done/total`` when the last line is :data:`TICK_S` old, and at the end."""
        if final or time.monotonic() - self._last >= TICK_S:
            self.say(f"      {what}: {done}/{total}{' done' if final else ''} ({self.elapsed():.0f} s)")

    @contextmanager
    def working(self, what: str) -> Iterator[None]:
        """A line every :data:`TICK_S` while the block runs (a subprocess, a pool of simulations)."""
        stop = threading.Event()

        def tick() -> None:
            started = time.monotonic()
            while not stop.wait(TICK_S):
                self.say(f"      {what}: still working ({time.monotonic() - started:.0f} s)")

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            yield
        finally:
            stop.set()
            ticker.join()


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


def place_stock(
    nodes: list[dict[str, Any]], bound: list[dict[str, Any]], pending: list[dict[str, Any]], seed: int, steps: Steps
) -> Outcome:
    """The stock kube-scheduler's placement of ``pending``, one pod at a time."""
    rng = np.random.default_rng(seed)
    outcome = Outcome(_uses(nodes, bound))
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
    nodes: list[dict[str, Any]],
    bound: list[dict[str, Any]],
    pending: list[dict[str, Any]],
    seed: int,
    mode: str,
    steps: Steps,
) -> tuple[Outcome, dict[str, list[float]], int]:
    """The product's placement of ``pending`` through ``gpu-scheduler serve``; the latency of each call and
    serve's exit code."""
    rng = np.random.default_rng(seed)
    outcome = Outcome(_uses(nodes, bound))
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


def _uses(nodes: list[dict[str, Any]], bound: list[dict[str, Any]]) -> dict[str, NodeUse]:
    uses = {node["metadata"]["name"]: NodeUse.of(node) for node in nodes}
    for pod in bound:
        uses[pod["spec"]["nodeName"]].add(request_of(pod))
    return uses


def run_demo(
    *,
    n_nodes: int = 96,
    n_pods: int = 150,
    seed: int = 7,
    mode: str = "names",
    as_json: bool = False,
    placement_seeds: tuple[int, ...] = (42, 43, 44),
    live: bool = True,
    synth: bool = False,
) -> int:
    if mode not in ("names", "nodes"):
        raise ValueError(f"mode: expected 'names' or 'nodes', got {mode!r}")
    steps = Steps(3 + bool(placement_seeds) + synth, quiet=as_json)
    steps.say("eks-gpu-scheduler demo: the stock kube-scheduler and gpu-scheduler on the same pods")
    rng = np.random.default_rng(seed)
    nodes, bound = synthetic_cluster(n_nodes, rng)
    pending = demo_pod_stream(n_pods, rng)
    summary: dict[str, Any] = {"nodes": n_nodes, "pods": n_pods, "seed": seed, "mode": mode}

    steps.step("The cluster and the pods")
    sizes = Counter(request_of(pod)[2] for pod in pending)
    shapes = Counter(node["metadata"]["name"].split("-")[0].upper() for node in nodes)
    gpus = sum(u.gpus for u in _uses(nodes, []).values())
    steps.say(
        f"      {n_nodes} GPU nodes ({', '.join(f'{n} {m}' for m, n in sorted(shapes.items()))}; {gpus} GPUs), "
        f"{len(bound)} of them partly used"
    )
    steps.say(
        f"      {n_pods} pods waiting, in one order for both: "
        + ", ".join(f"{n} x {g} GPU{'s' if g > 1 else ''}" for g, n in sorted(sizes.items()))
    )
    steps.say("      (some name a model, some 40 GiB per GPU)")

    steps.step("The same pods, one at a time: the stock kube-scheduler, then gpu-scheduler")
    stock = place_stock(nodes, bound, pending, seed, steps)
    ours, latency, exit_code = place_product(nodes, bound, pending, seed, mode, steps)
    summary |= {"stock": stock.summary(), "gpu_scheduler": ours.summary()}
    summary["latency_ms"] = {
        verb: {"calls": len(v), "p50": _pct(v, 50), "p99": _pct(v, 99)} for verb, v in latency.items()
    }
    summary["server_exit_code"] = exit_code
    steps.say(_format_side_by_side(summary))

    if placement_seeds:
        steps.step(f"GPU sharing: FGD beside gpu-scheduler's {DEFAULT_SHARE_POLICY}, the FGD paper's protocol")
        summary["placement"] = placement_comparison(placement_seeds, steps=steps)
        steps.say(_format_placement(summary["placement"]))

    steps.step("The live path: a real kube-apiserver and kube-scheduler")
    summary["live"] = live_burst(steps=steps) if live else {"skipped": "--no-live", "off": True}
    steps.say(_format_live(summary["live"]))

    if synth:
        steps.step("The CDK app: synth, cdk-nag, the manifests")
        summary["synth"] = synthesise(steps)
        steps.say(_format_synth(summary["synth"]))

    steps.say(_format_next(summary, steps.elapsed()))
    if as_json:
        print(json.dumps(summary, indent=2))
    failed = exit_code != 0 or summary.get("synth", {}).get("exit_code", 0) != 0
    return 1 if failed else 0


def _pct(values: Sequence[float], q: int) -> float | None:
    return round(float(np.percentile(values, q)), 2) if values else None


def _format_side_by_side(s: dict[str, Any]) -> str:
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


def live_burst(*, nodes: int = 64, pods: int = 256, steps: Steps | None = None) -> dict[str, Any]:
    """The burst through a real control plane (``bench.e2e.run_burst``), or why it could not run."""
    try:
        from bench.e2e import run_burst
        from testing.control_plane import missing
    except ModuleNotFoundError as exc:
        return {"skipped": f"it runs from a source checkout (make demo): {exc.name} is not importable"}
    reason = missing()
    if reason:
        return {"skipped": reason}
    steps = steps or Steps(0, quiet=True)
    steps.say(f"      {pods} one-GPU pods at once on {nodes} empty 8-GPU nodes, stock scoring then gpu-scheduler")
    with steps.working("the live burst"):
        return run_burst(nodes=nodes, pods=pods)


def _format_live(live: dict[str, Any]) -> str:
    if live.get("off"):
        return "      off (--no-live)"
    if "skipped" in live:
        return (
            f"      off: {live['skipped']}.\n      To turn it on, put kube-apiserver, kube-scheduler and "
            "kube-controller-manager v1.33\n      in $KUBE_BIN_DIR (docs/testing.md says how to build them) "
            "and run make demo again."
        )
    alone, ours = live["kube_scheduler_alone"], live["gpu_scheduler"]
    staleness = ours.get("staleness", {})
    return "\n".join([
        f"      stock kube-scheduler: {alone['nodes_used']:>4} nodes used, {alone['pods_per_s']:.0f} pods/s",
        f"      gpu-scheduler:        {ours['nodes_used']:>4} nodes used, {ours['pods_per_s']:.0f} pods/s "
        f"(the fewest possible: {live['ideal_nodes']})",
        f"      serve --watch trailed the binds by {1000 * staleness.get('p50_s', 0):.0f} ms at p50, "
        f"{1000 * staleness.get('p99_s', 0):.0f} ms at p99 ({staleness.get('binds', 0)} binds)",
        "      What it means: the real kube-scheduler, on the configuration the product generates, packs a",
        "      burst onto the fewest nodes; on its own it spreads the pods over every node.",
    ])  # fmt: skip


def placement_comparison(
    seeds: tuple[int, ...], *, openb: Path | None = None, jobs: int = 2, steps: Steps | None = None
) -> dict[str, Any]:
    """FGD and ours on the same trace and seeds, by the FGD protocol (inflated to 1.3x, no departures):
    unallocated GPU % at 100 % and 130 % arrived, per seed and on average, failed tasks, and seconds per
    run. openb :data:`PLACEMENT_TRACE` when ``openb`` (default :func:`~scheduler_core.simulator.traces.openb_dir`)
    holds it, else a synthetic look-alike (150 nodes, 1,200 tasks)."""
    openb = openb or openb_dir()
    steps = steps or Steps(0, quiet=True)
    with tempfile.TemporaryDirectory(prefix="gpu-scheduler-placement-") as tmp:
        pods = openb / f"openb_pod_list_{PLACEMENT_TRACE}.csv"
        if pods.is_file():
            nodes = openb / "openb_node_list_gpu_node.csv"
            trace = f"openb {PLACEMENT_TRACE} ({openb})"
        else:
            nodes, pods = Path(tmp) / "nodes.csv", Path(tmp) / "pods.csv"
            write_trace(*synthetic_trace(150, 1200, np.random.default_rng(0)), nodes, pods)
            trace = f"synthetic, openb-like (150 nodes, 1,200 tasks; {openb} is absent)"
        runs = len(PLACEMENT_POLICIES) * len(seeds)
        steps.say(f"      trace: {trace}; seeds {', '.join(map(str, seeds))}; {runs} runs")
        with steps.working("the simulations"):
            reports = run_many(
                nodes, pods, list(PLACEMENT_POLICIES), list(seeds), 1.3, "shuffled", jobs, progress=False
            )
    return {
        "trace": trace,
        "seeds": list(seeds),
        "policies": {
            r["policy"]: {
                "unallocated_gpu_pct_100": r["unallocated_gpu_pct"]["100"]["mean"],
                "unallocated_gpu_pct_100_per_seed": r["unallocated_gpu_pct"]["100"]["per_seed"],
                "unallocated_gpu_pct_130": r["unallocated_gpu_pct"]["130"]["mean"],
                "pods_failed": r["pods_failed"]["mean"],
                "seconds_per_run": r["seconds_per_seed"]["mean"],
            }
            for r in reports
        },
    }


def _format_placement(p: dict[str, Any]) -> str:
    fgd, ours = p["policies"]["fgd"], p["policies"][DEFAULT_SHARE_POLICY]
    lines = [""]
    for name, r in (("FGD", fgd), (f"gpu-scheduler ({DEFAULT_SHARE_POLICY})", ours)):
        seeds = ", ".join("n/a" if v is None else f"{v:.2f}" for v in r["unallocated_gpu_pct_100_per_seed"])
        lines.append(f"      {name:24} {_num(r['unallocated_gpu_pct_100'])} % of GPUs unallocated (per seed: {seeds})")
    pairs = [
        (a, b)
        for a, b in zip(fgd["unallocated_gpu_pct_100_per_seed"], ours["unallocated_gpu_pct_100_per_seed"], strict=True)
        if a is not None and b is not None
    ]
    better = sum(b < a for a, b in pairs)
    worse = sum(b > a for a, b in pairs)
    lines += [
        f"      seed by seed, gpu-scheduler leaves fewer unallocated on {better} of {len(pairs)}, more on {worse}",
        "      What it means: once the arriving demand reaches the cluster's capacity, this share of the",
        "      GPUs is free but in pieces no task fits. FGD (the paper's policy) and fgd_cpu score alike, but",
        "      fgd_cpu keeps CPU-only tasks off nodes whose free GPUs need that CPU",
        "      (docs/research/fgd-fidelity.md).",
    ]
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "  n/a" if value is None else f"{value:5.2f}"


def synthesise(steps: Steps, context: Sequence[str] = (), outdir: Path | None = None) -> dict[str, Any]:
    """``cdk/app.py`` as ``make synth`` runs it without ``CONTEXT`` (for :data:`DEMO_CLUSTER` in a demo VPC;
    the Lambda package already built, its architecture taken from it), with ``context`` (``key=value``)
    added: its report, or its last line of error."""
    root = Path(__file__).resolve().parents[1]
    command = [sys.executable, str(root / "cdk" / "app.py"), "-c", f"lambdaArchitecture={_arch(root)}"]
    command += [arg for item in (f"clusterName={DEMO_CLUSTER}", *context) for arg in ("-c", item)]
    env = {**os.environ, **({"CDK_OUTDIR": str(outdir)} if outdir else {})}
    with steps.working("cdk synth"):
        done = subprocess.run(command, capture_output=True, text=True, cwd=root, check=False, env=env)
    if done.returncode != 0:
        return {"exit_code": done.returncode, "error": (done.stderr.strip().splitlines() or ["(no output)"])[-1]}
    report: dict[str, Any] = json.loads(done.stdout)
    report["exit_code"] = 0
    return report


def _arch(root: Path) -> str:
    package = root / "build" / "lambda" / "package.json"
    return str(json.loads(package.read_text()).get("arch", "arm64")) if package.is_file() else "arm64"


def _format_synth(report: dict[str, Any]) -> str:
    if report["exit_code"]:
        return f"      synth failed ({report['exit_code']}): {report['error']}"
    nag = ", ".join(
        f"{name} {r['conclusion']}, {r['violations']} open, {r['acknowledged']} acknowledged with reasons"
        for name, r in report["cdk_nag"].items()
    )
    return "\n".join([
        f"      stack {report['stack']}: {report['resources']} resources; cdk-nag {nag}",
        f"      written: {_short(report['template'])}, {_short(report['manifests'])}",
    ])  # fmt: skip


def _short(path: str) -> str:
    """``path`` relative to the working directory where it is under it."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path


def _format_next(s: dict[str, Any], elapsed: float) -> str:
    stock, ours = s["stock"], s["gpu_scheduler"]
    lines = [
        f"\nWhat you saw ({elapsed:.0f} s): of the same {s['pods']} pods the stock kube-scheduler left "
        f"{stock['pods_pending']} Pending, gpu-scheduler {ours['pods_pending']};",
        f"  free GPUs left in fragments: {stock['gpus_free_on_partly_used_nodes']} against "
        f"{ours['gpus_free_on_partly_used_nodes']}.",
    ]
    if "placement" in s:
        fgd, mine = (s["placement"]["policies"][p]["unallocated_gpu_pct_100"] for p in PLACEMENT_POLICIES)
        lines.append(
            f"  Shares: {_num(fgd).strip()} % of GPUs unallocated with FGD, {_num(mine).strip()} % with gpu-scheduler."
        )
    lines += [
        "What to run next (README.md, examples/README.md):",
        "  . .venv/bin/activate",
        "  gpu-scheduler explain --pod examples/pods/eight-gpus.yaml --cluster examples/cluster.json",
        "  kubectl get nodes,pods -A -o json > my-cluster.json      # your own cluster, read-only",
        "  gpu-scheduler explain --pod my-pod.yaml --cluster my-cluster.json",
        "  docs/deploy.md: the deploy, and the way back",
    ]
    return "\n".join(lines)
