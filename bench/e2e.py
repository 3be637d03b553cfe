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

import math
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from bench.e2e_harness import (
    A100,
    NAMESPACE,
    STATES,
    Knobs,
    bench_pod,
    cpu_seconds,
    drain,
    scheduler_config,
    start_serve,
    stop_serve,
    wait_until,
    zone_of,
)
from scheduler_core.simulator.synthetic import make_node
from testing.bind_watch import BindWatch
from testing.control_plane import ControlPlane
from testing.kube_binaries import missing
from testing.product import Processes, requests_served, share_usage

MODES = ("none", "pass-all", "ours")
PARTS = ("all", "whole", "shares")


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
            cluster.add_nodes([make_node(f"node-{i:04d}", A100, zone_of(i)) for i in range(nodes)])
            alone = drain(cluster, "", pods, knobs, stock=True)
            url = start_serve(cluster, product, work, knobs, ledger="")
            ours = drain(cluster, url, pods, knobs, metrics=url)
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
            cluster.add_nodes([make_node(f"node-{i:03d}", A100, zone_of(i)) for i in range(nodes)])
            cluster.ensure_namespaces([NAMESPACE])
            cluster.api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/services", _SPREAD_SERVICE, ok=(201, 409))
            url = start_serve(cluster, product, work, knobs, ledger="")
            trainers = {"app": "trainer"}
            used["none"] = drain(cluster, "", pods, knobs, labels=trainers)
            for weight in weights:
                used[str(weight)] = drain(cluster, url, pods, Knobs("live", "10s", 1000, weight), labels=trainers)
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
            cluster.add_nodes([make_node(f"share-{i:04d}", A100, zone_of(i)) for i in range(nodes)])
            args = ["--watch", "--kubeconfig", str(cluster.kubeconfig_of("scheduler")), "--ledger-table", table]
            urls = [product.serve(f"serve-{i}", args, env) for i in range(instances)]
            proxy = RoundRobinServer(urls)
            try:
                cluster.ensure_namespaces([NAMESPACE])
                cluster.create_pods([bench_pod(f"s-{i:05d}", 250) for i in range(pods)], workers=8)
                watch = BindWatch(cluster.api, NAMESPACE)
                started = time.monotonic()
                try:
                    cluster.start_scheduler(scheduler_config(proxy.url, knobs, sharing=True))
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
        cluster.add_nodes([make_node(f"node-{i:04d}", A100, zone_of(i)) for i in range(n_nodes)])
        pass_all = product.pass_all("pass-all", cluster.url, cluster.api.token)
        pass_all_cpu = partial(cpu_seconds, product.running["pass-all"].pid)
        results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
        for run in range(runs):
            for mode in MODES:
                if mode == "none":
                    results[mode].append(drain(cluster, "", n_pods, knobs))
                    continue
                if mode == "pass-all":
                    results[mode].append(drain(cluster, pass_all, n_pods, knobs, cpu=pass_all_cpu))
                    continue
                # Ours starts afresh for each of its runs, so that no other mode pays for its watch.
                ours = start_serve(cluster, product, work, knobs, ledger="")
                try:
                    # The staleness poller reads serve's /metrics every 20 ms, which costs serve about 0.5 s
                    # of CPU per drain: it polls the first run only, and the CPU figure is the others'.
                    metrics = ours if knobs.state == "live" and (run == 0 or runs == 1) else ""
                    serve_cpu = partial(cpu_seconds, product.running["serve"].pid)
                    results[mode].append(drain(cluster, ours, n_pods, knobs, metrics=metrics, cpu=serve_cpu))
                finally:
                    stop_serve(product)
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
        cluster.add_nodes([make_node(f"share-{i:04d}", A100, zone_of(i)) for i in range(n_nodes)])
        pass_all = product.pass_all("pass-all", cluster.url, cluster.api.token)
        passing = drain(cluster, pass_all, n_pods, knobs, sharing=True, milli=250)
        unreserved_url = start_serve(cluster, product, work, knobs, ledger=f"{table}-unreserved", env=env,
                                     extra=("--reservation-image", "none"))  # fmt: skip
        unreserved = drain(cluster, unreserved_url, n_pods, knobs, sharing=True, milli=250,
                           cpu=partial(cpu_seconds, product.running["serve"].pid))  # fmt: skip
        stop_serve(product)
        url = start_serve(cluster, product, work, knobs, ledger=table, env=env)
        ours = drain(cluster, url, n_pods, knobs, sharing=True, milli=250, keep=True,
                     cpu=partial(cpu_seconds, product.running["serve"].pid))  # fmt: skip
        after_burst = share_usage(cluster.pods(NAMESPACE), ledger.scan())
        reserved_burst = reservation_agreement(cluster.pods(NAMESPACE), cluster.pods(RESERVATIONS))
        churn = _churn(cluster, url, knobs, n_pods // 2, seed)
        time.sleep(10)
        after_churn = share_usage(cluster.pods(NAMESPACE), ledger.scan())
        reserved_churn = reservation_agreement(cluster.pods(NAMESPACE), cluster.pods(RESERVATIONS))
        stand_in = {"uuids_reported": kubelet.reported, "errors": kubelet.errors[:5]}
    reservations = _reservations(unreserved, ours, reserved_burst, reserved_churn, stand_in)
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


def _reservations(
    unreserved: dict[str, Any],
    ours: dict[str, Any],
    reserved_burst: dict[str, Any],
    reserved_churn: dict[str, Any],
    stand_in: dict[str, Any],
) -> dict[str, Any]:
    """What reservation pods cost and whether they are right: ours' drain without them (``unreserved``)
    and with them (``ours``), wall and serve CPU side by side with their ratios; whether each GPU holding
    shares has exactly one reservation pod after the burst and 10 s after the churn; what the stand-in
    kubelet reported."""
    return {
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
    wait_until(lambda: len(cluster.pods(NAMESPACE)) <= len(bound) - len(victims), 120, "the deletions")
    watch = BindWatch(cluster.api, NAMESPACE)
    try:
        cluster.start_scheduler(scheduler_config(url, knobs, sharing=True))
        cluster.create_pods([bench_pod(f"q-{i:05d}", 250) for i in range(count)], workers=8)
        complete = watch.wait(count, timeout_s=600)
        cluster.stop_scheduler()
    finally:
        watch.close()
    return {"deleted": len(victims), "submitted": count, "bound": len(watch.bound_at), "complete": complete}
