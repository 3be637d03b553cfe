"""What every ``gpu-scheduler bench e2e*`` suite (and ``gpu-scheduler replay``) drives: a drain of pods
through the real kube-scheduler, ``serve`` started and stopped as :data:`STATES` says, the extender's
CPU seconds, and the poller that measures how far serve's published state trails the binds.

The pods live in :data:`NAMESPACE` on A100 nodes (:data:`A100`) spread over three zones (:func:`zone_of`).
"""

from __future__ import annotations

import collections
import os
import re
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scheduler_core.simulator.synthetic import CATALOGUE, make_pod
from testing.bind_watch import BindWatch
from testing.control_plane import ControlPlane
from testing.product import Processes
from testing.product_manifests import generated_scheduler_config

A100 = next(shape for shape in CATALOGUE if shape.model == "A100")
NAMESPACE = "bench"
STATES = ("live", "snapshot")
"""How serve learns the cluster: ``live`` is ``serve --watch`` (a list+watch of nodes and pods);
``snapshot`` is the node-state refresher (``gpu-scheduler refresh node-state --every REFRESH``)
writing a snapshot file that ``serve --snapshot`` re-reads every second, as before the live state."""


Env = dict[str, str] | None


@dataclass(frozen=True)
class Knobs:
    """How a run sets the product up: ``state`` (one of :data:`STATES`), the refresher's period
    ``refresh`` (``10s``), the scheduler's client qps and burst ``qps``, the extender's ``weight``."""

    state: str
    refresh: str
    qps: int
    weight: int


def drain(
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
    pods = [bench_pod(f"p-{i:05d}", milli) for i in range(n_pods)]
    for pod in pods:
        pod["metadata"].setdefault("labels", {}).update(labels or {})
    cluster.create_pods(pods, workers=8)
    watch = BindWatch(cluster.api, NAMESPACE)
    poller = VersionPoller(metrics) if metrics else None
    try:
        config = scheduler_config(url, knobs, sharing=sharing)
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


def bench_pod(name: str, milli: int) -> dict[str, Any]:
    """A one-GPU pod, or a share of ``milli``, asking for little CPU and memory (the nodes hold 1,000s)."""
    pod = make_pod(name, 0 if milli else 1, namespace=NAMESPACE, milli=milli)
    resources = pod["spec"]["containers"][0]["resources"]
    resources["requests"] = {"cpu": "10m", "memory": "16Mi", **{k: v for k, v in resources["limits"].items()}}
    return pod


def scheduler_config(url: str, knobs: Knobs, *, sharing: bool) -> dict[str, Any]:
    """What ``gpu-scheduler scheduler-config`` generates for ``url``; without a URL, the same without extenders."""
    argv = ["--url", url or "http://127.0.0.1:1", "--client-qps", str(knobs.qps), "--client-burst", str(knobs.qps),
            "--weight", str(knobs.weight), *(["--sharing"] if sharing else [])]  # fmt: skip
    config = generated_scheduler_config(argv)
    if not url:
        config.pop("extenders")
    return config


def start_serve(
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
        wait_until(snapshot.exists, 120, "the first snapshot")
    args = ["--watch"] if knobs.state == "live" else ["--snapshot", str(snapshot), "--refresh-s", "1"]
    if knobs.state == "live" or ledger:
        # Beside kube-scheduler in its pod, with its ServiceAccount; on a snapshot, as the extender Lambda.
        args += ["--kubeconfig", str(cluster.kubeconfig_of("scheduler" if knobs.state == "live" else "extender"))]
    if ledger:
        args += ["--ledger-table", ledger]
    return product.serve("serve", [*args, *extra], env)


def stop_serve(product: Processes) -> None:
    product.stop("serve")
    product.stop("refresher")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds process ``pid`` has used, from its own counters (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


def zone_of(i: int) -> str:
    return ("us-east-1a", "us-east-1b", "us-east-1c")[i % 3]


def wait_until(condition: Callable[[], Any], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")
        time.sleep(0.2)
