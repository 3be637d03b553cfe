"""``gpu-scheduler bench e2e``: the product under a real kube-scheduler on loopback, throughput and packing.

Everything runs as a user runs it: the control plane from ``../shared/k8s`` (``testing.control_plane``),
the scheduler on the configuration ``gpu-scheduler scheduler-config`` generates (only its ``apiVersion``
rewritten for these binaries), ``gpu-scheduler serve`` as the extender on loopback, and the state it
decides from fed as the product feeds it (:data:`STATES`).

- **Throughput**, drain mode: the pods are created while the scheduler is stopped; it then starts, and
  the bind rate runs from the first bind to the last, as the API server reports them (a watch). No
  extender, a pass-all extender (names only, TCP_NODELAY) and ours, alternated, ``runs`` times each,
  with the scheduler's client qps and burst at ``qps``. Medians and the ratios ours/pass-all and ours/none;
  and the CPU seconds each extender process used per 1,000 pods bound (its own ``/proc`` counters, from
  the scheduler's start to the last bind), with their ratio: ours from the runs the staleness poller
  does not read (all but the first; it costs ``serve`` about 0.5 s per drain).
- **Packing**, whole GPUs: the nodes ours used for the pods, against ``ceil(demand / GPUs per node)``.
- **Staleness** (live state): for every bind the benchmark's own watch sees, how long until serve's
  published state includes it (serve's ``/metrics``, polled every 20 ms), in ours' first run.
- **Packing**, shares: quarter-GPU pods (``gpu-scheduler.io/gpu-milli: 250``) through the bind and
  preempt verbs on the GPU ledger (moto's server): the GPUs and nodes used against the ideal, pods/s
  (pass-all alongside, binding through its own verb), GPUs over 1000 milli, the ledger against the
  annotations; then half the pods deleted, as many new ones submitted, and the GPUs in use after.
  Ours drains twice, side by side: without reservation pods (``--reservation-image none``, the bind as
  it was before them) and with them (the default), each with the CPU seconds serve spent on it (from
  its own ``/proc`` counters); with them, whether each GPU holding shares has exactly one reservation
  pod after the burst, and 10 s after the churn (``testing.reservation_kubelet`` runs them).
"""

from __future__ import annotations

import collections
import math
import os
import re
import statistics
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from scheduler_core.simulator.synthetic import CATALOGUE, make_node, make_pod
from testing.control_plane import BindWatch, ControlPlane, generated_scheduler_config, missing
from testing.product import Processes, requests_served, share_usage

A100 = next(shape for shape in CATALOGUE if shape.model == "A100")
NAMESPACE = "bench"
STATES = ("live", "snapshot")
"""How serve learns the cluster: ``live`` is ``serve --watch`` (a list+watch of nodes and pods);
``snapshot`` is the node-state refresher (``gpu-scheduler refresh node-state --every REFRESH``)
writing a snapshot file that ``serve --snapshot`` re-reads every second, as before the live state."""
MODES = ("none", "pass-all", "ours")
PARTS = ("all", "whole", "shares")


Env = dict[str, str] | None


@dataclass(frozen=True)
class Knobs:
    state: str
    refresh: str
    qps: int
    weight: int


def run(
    *,
    nodes: int = 500,
    pods: int = 1000,
    runs: int = 3,
    share_nodes: int = 200,
    share_pods: int = 400,
    qps: int = 1000,
    refresh: str = "10s",
    seed: int = 42,
    state: str = "live",
    weight: int = 5,
    part: str = "all",
) -> dict[str, Any]:
    reason = missing()
    if reason:
        raise ValueError(f"bench e2e needs a control plane: {reason}")
    if state not in STATES:
        raise ValueError(f"--state: expected one of {', '.join(STATES)}, got {state!r}")
    if part not in PARTS:
        raise ValueError(f"--part: expected one of {', '.join(PARTS)}, got {part!r}")
    knobs = Knobs(state, refresh, qps, weight)
    found: dict[str, Any] = {"benchmark": "e2e", "state": state, "refresh": refresh, "qps": qps, "weight": weight}
    with tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp:
        work = Path(tmp)
        if part in ("all", "whole"):
            found |= _whole_gpus(work / "whole", nodes, pods, runs, knobs)
        if part in ("all", "shares"):
            found["packing_shares"] = _shares(work / "shares", share_nodes, share_pods, knobs, seed)
    return found


def run_burst(*, nodes: int = 64, pods: int = 256) -> dict[str, Any]:
    """``make demo``'s live step (and ``gpu-scheduler bench e2e-burst``): a burst of one-GPU pods through
    the real kube-scheduler, first with its stock scoring (``LeastAllocated``, no extender), then through
    ``serve --watch`` on the generated configuration; the nodes each used against the ideal, the bind
    rate, and how far serve's live state trailed the binds."""
    reason = missing()
    if reason:
        raise ValueError(f"the burst needs a control plane: {reason}")
    knobs = Knobs("live", "10s", 1000, 5)
    with tempfile.TemporaryDirectory(prefix="burst-") as tmp:
        work = Path(tmp)
        with ControlPlane(work / "cluster") as cluster, Processes(work) as product:
            cluster.add_nodes([make_node(f"node-{i:04d}", A100, _zone(i)) for i in range(nodes)])
            alone = _drain(cluster, "", pods, knobs, stock=True)
            url = _start_serve(cluster, product, work, knobs, ledger="")
            ours = _drain(cluster, url, pods, knobs, metrics=url)
    return {"benchmark": "e2e-burst", "nodes": nodes, "pods": pods, "gpus_per_node": A100.gpus,
            "ideal_nodes": math.ceil(pods / A100.gpus), "kube_scheduler_alone": alone,
            "gpu_scheduler": ours}  # fmt: skip


def run_weights(*, nodes: int = 24, pods: int = 48, weights: tuple[int, ...] = (1, 2, 5, 10)) -> dict[str, Any]:
    """``gpu-scheduler bench e2e-weights``: what the extender's weight in the generated profile changes.

    One-GPU pods behind one Service, so that kube-scheduler's PodTopologySpread system defaults (spread
    over hosts and zones, ``ScheduleAnyway``, plugin weight 2) pull them apart while the GPU policy and
    NodeResourcesFit's MostAllocated pull them together. For no extender and each weight, the pods are
    drained onto empty identical nodes and the nodes they used are counted against the ideal."""
    reason = missing()
    if reason:
        raise ValueError(f"bench e2e-weights needs a control plane: {reason}")
    knobs = Knobs("live", "10s", 1000, 5)
    used: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-e2e-weights-") as tmp:
        work = Path(tmp)
        with ControlPlane(work / "cluster") as cluster, Processes(work) as product:
            cluster.add_nodes([make_node(f"node-{i:03d}", A100, _zone(i)) for i in range(nodes)])
            cluster.ensure_namespaces([NAMESPACE])
            cluster.api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/services", _SPREAD_SERVICE, ok=(201, 409))
            url = _start_serve(cluster, product, work, knobs, ledger="")
            trainers = {"app": "trainer"}
            used["none"] = _drain(cluster, "", pods, knobs, labels=trainers)
            for weight in weights:
                used[str(weight)] = _drain(cluster, url, pods, Knobs("live", "10s", 1000, weight), labels=trainers)
    return {"benchmark": "e2e-weights", "nodes": nodes, "pods": pods, "ideal_nodes": math.ceil(pods / A100.gpus),
            "nodes_used": used}  # fmt: skip


def run_instances(*, instances: int = 8, nodes: int = 100, pods: int = 2000, timeout_s: float = 900) -> dict[str, Any]:
    """``gpu-scheduler bench e2e-instances``: ``instances`` ``serve --watch --ledger-table`` processes share
    one ledger behind a round-robin proxy, standing in for Lambda's instances, and bind ``pods``
    quarter-GPU shares through the real scheduler. Reported: nothing over-allocated, the ledger equal
    to the annotations, every pod bound or failed with a message, and the time it took."""
    from adapters.gpu_ledger import LedgerStore, create_table
    from testing.moto import aws_env, dynamodb_client, moto_server
    from testing.product import RoundRobinServer

    reason = missing()
    if reason:
        raise ValueError(f"bench e2e-instances needs a control plane: {reason}")
    knobs = Knobs("live", "10s", 1000, 5)
    table = "gpu-ledger"
    with tempfile.TemporaryDirectory(prefix="bench-e2e-instances-") as tmp:
        work = Path(tmp)
        with moto_server() as endpoint, ControlPlane(work / "cluster") as cluster, Processes(work) as product:
            env = aws_env(endpoint)
            ledger = LedgerStore(table, dynamodb_client(endpoint))
            create_table(ledger.client, table)
            cluster.add_nodes([make_node(f"share-{i:04d}", A100, _zone(i)) for i in range(nodes)])
            args = ["--watch", "--kubeconfig", str(cluster.kubeconfig_of("scheduler")), "--ledger-table", table]
            urls = [product.serve(f"serve-{i}", args, env) for i in range(instances)]
            proxy = RoundRobinServer(urls)
            try:
                cluster.ensure_namespaces([NAMESPACE])
                cluster.create_pods([_pod(f"s-{i:05d}", 250) for i in range(pods)], workers=8)
                watch = BindWatch(cluster.api, NAMESPACE)
                started = time.monotonic()
                try:
                    cluster.start_scheduler(_config(proxy.url, knobs, sharing=True))
                    complete = watch.wait(pods, timeout_s=timeout_s)
                    seconds = time.monotonic() - started
                    cluster.stop_scheduler()
                finally:
                    watch.close()
                stored = cluster.pods(NAMESPACE)
                usage = share_usage(stored, ledger.scan())
                unbound = [p for p in stored if not p["spec"].get("nodeName")]
                explained = sum(1 for p in unbound if cluster.failed_scheduling(NAMESPACE, p["metadata"]["name"]))
                served = {url: requests_served(url) for url in urls}
            finally:
                proxy.close()
    return {
        "benchmark": "e2e-instances", "instances": instances, "nodes": nodes, "pods": pods,
        "bound": len(watch.bound_at), "complete": complete, "seconds": round(seconds, 1),
        "unbound": len(unbound), "unbound_with_a_message": explained,
        "binds_per_instance": [served[url]["bind"] for url in urls], **usage,
    }  # fmt: skip


_SPREAD_SERVICE = {"metadata": {"name": "trainer"}, "spec": {"selector": {"app": "trainer"}, "ports": [{"port": 80}]}}


# -- whole GPUs: throughput, packing, staleness ---------------------------------------------------
def _whole_gpus(work: Path, n_nodes: int, n_pods: int, runs: int, knobs: Knobs) -> dict[str, Any]:
    work.mkdir(parents=True)
    with ControlPlane(work / "cluster") as cluster, Processes(work) as product:
        cluster.add_nodes([make_node(f"node-{i:04d}", A100, _zone(i)) for i in range(n_nodes)])
        pass_all = product.pass_all("pass-all", cluster.url, cluster.api.token)
        pass_all_cpu = partial(cpu_seconds, product.running["pass-all"].pid)
        results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
        for run in range(runs):
            for mode in MODES:
                if mode == "none":
                    results[mode].append(_drain(cluster, "", n_pods, knobs))
                    continue
                if mode == "pass-all":
                    results[mode].append(_drain(cluster, pass_all, n_pods, knobs, cpu=pass_all_cpu))
                    continue
                # Ours starts afresh for each of its runs, so that no other mode pays for its watch.
                ours = _start_serve(cluster, product, work, knobs, ledger="")
                try:
                    # The staleness poller reads serve's /metrics every 20 ms, which costs serve about 0.5 s
                    # of CPU per drain: it polls the first run only, and the CPU figure is the others'.
                    metrics = ours if knobs.state == "live" and (run == 0 or runs == 1) else ""
                    serve_cpu = partial(cpu_seconds, product.running["serve"].pid)
                    results[mode].append(_drain(cluster, ours, n_pods, knobs, metrics=metrics, cpu=serve_cpu))
                finally:
                    _stop_serve(product)
        medians = {mode: statistics.median(r["pods_per_s"] for r in results[mode]) for mode in MODES}
        unpolled = [r for r in results["ours"] if "staleness" not in r] or results["ours"]
        cpu_per_1000 = {
            mode: statistics.median(1000 * r["extender_cpu_s"] / max(1, r["bound"]) for r in runs_of)
            for mode, runs_of in (("pass-all", results["pass-all"]), ("ours", unpolled))
        }
        return {
            "throughput": {
                "nodes": n_nodes,
                "pods": n_pods,
                "runs": results,
                "median_pods_per_s": medians,
                "ours_over_pass_all": round(medians["ours"] / medians["pass-all"], 3),
                "ours_over_none": round(medians["ours"] / medians["none"], 3),
                # The extender process's own CPU (user + system, /proc) from the scheduler's start to the
                # last bind, per 1,000 pods bound: the figure this 2-core machine's noise does not move.
                "extender_cpu_s_per_1000_pods": {mode: round(value, 3) for mode, value in cpu_per_1000.items()},
                "ours_over_pass_all_cpu": round(cpu_per_1000["ours"] / cpu_per_1000["pass-all"], 3)
                if cpu_per_1000["pass-all"]
                else None,
            },
            "packing_whole_gpus": {
                "pods": n_pods,
                "gpus_per_node": A100.gpus,
                "ideal_nodes": math.ceil(n_pods / A100.gpus),
                "nodes_used": [r["nodes_used"] for r in results["ours"]],
            },
        }


def _drain(
    cluster: ControlPlane,
    url: str,
    n_pods: int,
    knobs: Knobs,
    *,
    sharing: bool = False,
    milli: int = 0,
    keep: bool = False,
    metrics: str = "",
    labels: dict[str, str] | None = None,
    stock: bool = False,
    cpu: Callable[[], float] | None = None,
) -> dict[str, Any]:
    """Create the pods with the scheduler stopped, start it, and time the binds; the pods are deleted
    after, unless ``keep``. With ``metrics`` (serve's URL), also how stale serve's state was. With
    ``labels`` the pods carry them, and the result has the pods per node, fullest first. ``stock``
    runs kube-scheduler's own scoring (no extender, no ``pluginConfig``). ``cpu`` reads a process's CPU
    seconds (serve's): the result has what it used from the scheduler's start to the last bind."""
    cluster.delete_namespace_pods(NAMESPACE)
    pods = [_pod(f"p-{i:05d}", milli) for i in range(n_pods)]
    for pod in pods:
        pod["metadata"].setdefault("labels", {}).update(labels or {})
    cluster.create_pods(pods, workers=8)
    watch = BindWatch(cluster.api, NAMESPACE)
    poller = VersionPoller(metrics) if metrics else None
    try:
        config = _config(url, knobs, sharing=sharing)
        if stock:
            config.pop("extenders", None)
            for profile in config["profiles"]:
                profile.pop("pluginConfig", None)
        cpu_before = cpu() if cpu is not None else 0.0
        cluster.start_scheduler(config)
        complete = watch.wait(n_pods, timeout_s=600)
        cpu_used = cpu() - cpu_before if cpu is not None else None
        cluster.stop_scheduler()
    finally:
        watch.close()
        if poller is not None:
            poller.close()
    stamps = sorted(watch.bound_at.values())
    span = stamps[-1] - stamps[0] if len(stamps) > 1 else float("nan")
    result: dict[str, Any] = {
        "bound": len(stamps),
        "complete": complete,
        "seconds": round(span, 3),
        "pods_per_s": round((len(stamps) - 1) / span, 1) if len(stamps) > 1 and span > 0 else 0.0,
        "nodes_used": len(set(watch.node_of.values())),
    }
    if cpu_used is not None:
        result["extender_cpu_s"] = round(cpu_used, 3)
    if poller is not None:
        result["staleness"] = poller.lags(watch)
    if labels:
        result["pods_per_node"] = sorted(collections.Counter(watch.node_of.values()).values(), reverse=True)
    if not keep:
        cluster.delete_namespace_pods(NAMESPACE)
    return result


def _pod(name: str, milli: int) -> dict[str, Any]:
    """A one-GPU pod, or a share of ``milli``, asking for little CPU and memory (the nodes hold 1,000s)."""
    pod = make_pod(name, 0 if milli else 1, namespace=NAMESPACE, milli=milli)
    resources = pod["spec"]["containers"][0]["resources"]
    resources["requests"] = {"cpu": "10m", "memory": "16Mi", **{k: v for k, v in resources["limits"].items()}}
    return pod


def _config(url: str, knobs: Knobs, *, sharing: bool) -> dict[str, Any]:
    """What ``gpu-scheduler scheduler-config`` generates for ``url``; without a URL, the same without extenders."""
    argv = ["--url", url or "http://127.0.0.1:1", "--client-qps", str(knobs.qps), "--client-burst", str(knobs.qps),
            "--weight", str(knobs.weight), *(["--sharing"] if sharing else [])]  # fmt: skip
    config = generated_scheduler_config(argv)
    if not url:
        config.pop("extenders")
    return config


def _start_serve(
    cluster: ControlPlane,
    product: Processes,
    work: Path,
    knobs: Knobs,
    *,
    ledger: str,
    env: Env = None,
    extra: tuple[str, ...] = (),
) -> str:
    """Serve as ``knobs.state`` says, with the refresher beside it where it is needed: the snapshot's
    writer, or the ledger's reconcile (the safety net under the live state's releases); serve's URL."""
    snapshot = work / "snapshot.npz"
    snapshot.unlink(missing_ok=True)  # the previous run's, of another cluster
    if knobs.state == "snapshot" or ledger:
        product.refresher(
            "refresher",
            ["node-state", "--kubeconfig", str(cluster.kubeconfig_of("node-state")), "--snapshot", str(snapshot),
             "--every", knobs.refresh, "--no-ec2", *(["--ledger-table", ledger] if ledger else [])], env,
        )  # fmt: skip
        _wait(snapshot.exists, 120, "the first snapshot")
    args = ["--watch"] if knobs.state == "live" else ["--snapshot", str(snapshot), "--refresh-s", "1"]
    if knobs.state == "live" or ledger:
        # Beside kube-scheduler in its pod, with its ServiceAccount; on a snapshot, as the extender Lambda.
        args += ["--kubeconfig", str(cluster.kubeconfig_of("scheduler" if knobs.state == "live" else "extender"))]
    if ledger:
        args += ["--ledger-table", ledger]
    return product.serve("serve", [*args, *extra], env)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds process ``pid`` has used, from its own counters (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stop_serve(product: Processes) -> None:
    product.stop("serve")
    product.stop("refresher")


class VersionPoller:
    """Polls serve's ``/metrics`` for the pods' resourceVersion its published state includes."""

    def __init__(self, url: str, every_s: float = 0.02) -> None:
        self.url, self.every_s = f"{url}/metrics", every_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pattern = re.compile(r'^gpu_scheduler_live_state_published_resource_version\{kind="pods"\} (\d+)$', re.M)
        while not self._stop.is_set():
            try:
                with urllib.request.urlopen(self.url, timeout=2) as response:
                    match = pattern.search(response.read().decode())
                if match:
                    self.samples.append((time.monotonic(), int(match.group(1))))
            except OSError:
                pass
            self._stop.wait(self.every_s)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def wait_for(self, version: int, timeout_s: float) -> bool:
        """Wait until a poll shows the published state at ``version`` or past it; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.samples and self.samples[-1][1] >= version:
                return True
            time.sleep(self.every_s / 2)
        return False

    def lags(self, watch: BindWatch) -> dict[str, Any]:
        """Seconds from each bind the benchmark's watch saw to the first poll whose state includes it."""
        lags = []
        for name, at in watch.bound_at.items():
            version = watch.version_of.get(name, 0)
            seen = next((t for t, v in self.samples if v >= version and t >= at - 1.0), None)
            if seen is not None:
                lags.append(max(0.0, seen - at))
        lags.sort()
        if not lags:
            return {"binds": 0}
        return {
            "binds": len(lags),
            "p50_s": round(lags[len(lags) // 2], 4),
            "p99_s": round(lags[min(len(lags) - 1, int(0.99 * len(lags)))], 4),
            "max_s": round(lags[-1], 4),
            "poll_every_s": self.every_s,
        }


# -- shares --------------------------------------------------------------------------------------
def _shares(work: Path, n_nodes: int, n_pods: int, knobs: Knobs, seed: int) -> dict[str, Any]:

    from adapters.gpu_ledger import LedgerStore, create_table
    from manifests.reservation import NAMESPACE as RESERVATIONS
    from testing.moto import aws_env, dynamodb_client, moto_server
    from testing.product import reservation_agreement
    from testing.reservation_kubelet import ReservationKubelet

    work.mkdir(parents=True)
    table = "gpu-ledger"
    with (
        moto_server() as endpoint,
        ControlPlane(work / "cluster") as cluster,
        Processes(work) as product,
        ReservationKubelet(cluster) as kubelet,
    ):
        env = aws_env(endpoint)
        ledger = LedgerStore(table, dynamodb_client(endpoint))
        for name in (table, f"{table}-unreserved"):  # a ledger each: the first run's releases may trail it
            create_table(ledger.client, name)
        cluster.add_nodes([make_node(f"share-{i:04d}", A100, _zone(i)) for i in range(n_nodes)])
        pass_all = product.pass_all("pass-all", cluster.url, cluster.api.token)
        passing = _drain(cluster, pass_all, n_pods, knobs, sharing=True, milli=250)
        unreserved_url = _start_serve(cluster, product, work, knobs, ledger=f"{table}-unreserved", env=env,
                                      extra=("--reservation-image", "none"))  # fmt: skip
        unreserved = _drain(cluster, unreserved_url, n_pods, knobs, sharing=True, milli=250,
                            cpu=partial(cpu_seconds, product.running["serve"].pid))  # fmt: skip
        _stop_serve(product)
        url = _start_serve(cluster, product, work, knobs, ledger=table, env=env)
        ours = _drain(cluster, url, n_pods, knobs, sharing=True, milli=250, keep=True,
                      cpu=partial(cpu_seconds, product.running["serve"].pid))  # fmt: skip
        after_burst = share_usage(cluster.pods(NAMESPACE), ledger.scan())
        reserved_burst = reservation_agreement(cluster.pods(NAMESPACE), cluster.pods(RESERVATIONS))
        churn = _churn(cluster, url, knobs, n_pods // 2, seed)
        time.sleep(10)
        after_churn = share_usage(cluster.pods(NAMESPACE), ledger.scan())
        reserved_churn = reservation_agreement(cluster.pods(NAMESPACE), cluster.pods(RESERVATIONS))
        stand_in = {"uuids_reported": kubelet.reported, "errors": kubelet.errors[:5]}
    reservations = {
        "without": {k: unreserved[k] for k in ("seconds", "pods_per_s", "extender_cpu_s")},
        "with": {k: ours[k] for k in ("seconds", "pods_per_s", "extender_cpu_s")},
        "wall_ratio": round(ours["seconds"] / unreserved["seconds"], 3) if unreserved["seconds"] else None,
        "cpu_ratio": round(ours["extender_cpu_s"] / unreserved["extender_cpu_s"], 3)
        if unreserved["extender_cpu_s"]
        else None,
        "after_burst": _agreement(reserved_burst),
        "after_churn_10s": _agreement(reserved_churn),
        "stand_in": stand_in,
    }
    return {
        "nodes": n_nodes,
        "pods": n_pods,
        "milli": 250,
        "ideal_gpus": math.ceil(n_pods * 250 / 1000),
        "pass_all": passing,
        "ours": ours,
        "ours_over_pass_all": round(ours["pods_per_s"] / passing["pods_per_s"], 3) if passing["pods_per_s"] else None,
        "after_burst": after_burst,
        "churn": churn,
        "after_churn": after_churn,
        "reservations": reservations,
    }


def _agreement(found: dict[str, Any]) -> dict[str, Any]:
    """:func:`testing.product.reservation_agreement` with the GPU lists cut to counts and a sample."""
    return {**found, "missing": len(found["missing"]), "orphans": len(found["orphans"]),
            "sample": (found["missing"] + found["orphans"])[:5]}  # fmt: skip


def _churn(cluster: ControlPlane, url: str, knobs: Knobs, count: int, seed: int) -> dict[str, Any]:
    """Delete ``count`` bound pods (seeded), then submit as many new ones with the scheduler running."""
    rng = np.random.default_rng(seed)
    bound = sorted(p["metadata"]["name"] for p in cluster.pods(NAMESPACE) if p["spec"].get("nodeName"))
    victims = [bound[i] for i in rng.choice(len(bound), size=min(count, len(bound)), replace=False)]
    for name in victims:
        cluster.delete_pod(NAMESPACE, name)
    _wait(lambda: len(cluster.pods(NAMESPACE)) <= len(bound) - len(victims), 120, "the deletions")
    watch = BindWatch(cluster.api, NAMESPACE)
    try:
        cluster.start_scheduler(_config(url, knobs, sharing=True))
        cluster.create_pods([_pod(f"q-{i:05d}", 250) for i in range(count)], workers=8)
        complete = watch.wait(count, timeout_s=600)
        cluster.stop_scheduler()
    finally:
        watch.close()
    return {"deleted": len(victims), "submitted": count, "bound": len(watch.bound_at), "complete": complete}


# -- helpers -------------------------------------------------------------------------------------
def _zone(i: int) -> str:
    return ("us-east-1a", "us-east-1b", "us-east-1c")[i % 3]


def _wait(condition: Callable[[], Any], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")
        time.sleep(0.2)
