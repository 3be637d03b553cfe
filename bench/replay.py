"""``gpu-scheduler replay``: the FGD protocol on a trace, through the production path.

The trace's GPU nodes become Ready nodes of a real kube-apiserver (``testing.control_plane``), with their
CPU, memory, GPUs and GPU model label. The pods arrive in the protocol's order: shuffled by the seed,
inflated by ``tune`` (:func:`scheduler_core.simulator.simulate.tune_order`, the same draws as
``simulate``), no departures. Each is submitted to the real kube-scheduler running the configuration
``gpu-scheduler scheduler-config --sharing`` generates, with ``gpu-scheduler serve --watch
--ledger-table`` as its extender (the GPU ledger in moto's DynamoDB server): whole GPUs as
``nvidia.com/gpu``, shares as ``gpu-scheduler.io/gpu-milli``, model constraints as the
``gpu.nvidia.com/model`` annotation, CPU-only tasks with no GPU resource at all.

One pod at a time: the next is submitted once the API server shows this one bound, or the scheduler
has marked it ``Unschedulable``, which the protocol counts as failed (the pod is deleted, as the
simulator drops it). Where each pod went, and on which GPUs (the ``assigned-gpus`` annotation the bind
writes; the lowest-index free GPUs for whole GPUs without one, as the simulator takes them), goes into
:class:`~scheduler_core.simulator.simulate.Recorder`, so the curves have ``simulate``'s definitions:
unallocated GPU % against arrived %, the fragmentation ratio, and pods failed. ``simulate --policy
fgd_cpu`` runs on the same (sampled) trace and seed beside it.
"""

from __future__ import annotations

import json
import math
import re
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from scheduler_core.errors import InvalidArgsError
from scheduler_core.k8s.annotations import parse_assigned_gpus
from scheduler_core.k8s.names import (
    ASSIGNED_GPUS_ANNOTATION,
    GPU_RESOURCE,
    LABEL_COUNT,
    LABEL_MODEL,
    LABEL_ZONE,
    MILLI_RESOURCE,
)
from scheduler_core.placement.model import Cluster, Task, whole_gpus
from scheduler_core.simulator.simulate import Recorder, SimResult, check_trace, simulate, tune_order
from scheduler_core.simulator.simulate import until as cut
from scheduler_core.simulator.traces import read_gpu_node_rows, read_tasks

if TYPE_CHECKING:  # imported where they are used: the trace helpers need no control plane
    from bench.e2e_harness import VersionPoller
    from testing.bind_watch import BindWatch
    from testing.control_plane import ControlPlane
    from testing.product import Processes

NAMESPACE = "replay"
TABLE = "gpu-ledger"
OUTCOME_TIMEOUT_S = 60.0
"""How long one pod may take to be bound or marked Unschedulable before it counts as failed."""
COMPARED_POLICY = "fgd_cpu"  # the product's default share policy, run by simulate beside the replay


def load(nodes_csv: Path, pods_csv: Path, *, sample: float, seed: int) -> tuple[list[str], Cluster, list[Task]]:
    """The GPU nodes' names and cluster (as ``simulate`` reads them) and the tasks; with ``sample`` < 1, a
    seeded fraction of each (in trace order, so that ``simulate`` on the same sample sees the same)."""
    if not 0 < sample <= 1:
        raise InvalidArgsError(f"--sample: expected a fraction in (0, 1], got {sample}")
    rows = read_gpu_node_rows(nodes_csv)
    tasks = read_tasks(pods_csv)
    if sample < 1:
        picker = np.random.default_rng([seed, 1])  # its own stream: the protocol's draws stay simulate's
        rows = [rows[i] for i in sorted(picker.choice(len(rows), max(1, round(sample * len(rows))), replace=False))]
        tasks = [tasks[i] for i in sorted(picker.choice(len(tasks), max(1, round(sample * len(tasks))), replace=False))]
    names = [(row.get("sn") or f"node-{i:05d}").lower() for i, row in enumerate(rows)]
    cluster = Cluster.build(
        [int(r["cpu_milli"]) for r in rows],
        [int(r["memory_mib"]) for r in rows],
        [int(r["gpu"]) for r in rows],
        [r["model"] for r in rows],
    )
    check_trace(cluster, tasks)
    return names, cluster, tasks


def trace_node(name: str, cluster: Cluster, row: int) -> dict[str, Any]:
    """A Ready v1 Node for one trace row: its CPU, memory and GPUs allocatable, its model labelled."""
    model = cluster.models[int(cluster.model_id[row])]
    gpus = int(cluster.gpu_count[row])
    resources = {"cpu": f"{int(cluster.cpu_left[row])}m", "memory": f"{int(cluster.mem_left[row])}Mi",
                 "pods": "1000", GPU_RESOURCE: str(gpus)}  # fmt: skip
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", LABEL_ZONE: "trace-zone",
              LABEL_MODEL: model, LABEL_COUNT: str(gpus)}  # fmt: skip
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def trace_pod(name: str, task: Task) -> dict[str, Any]:
    """The pod a user would write for ``task`` on the ``gpu-scheduler`` profile."""
    requests = {"cpu": f"{task.cpu}m", "memory": f"{task.mem}Mi"}
    limits: dict[str, str] = {}
    if task.sharing:
        requests[MILLI_RESOURCE] = limits[MILLI_RESOURCE] = str(task.gpu_milli)
    elif task.num_gpu:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(task.num_gpu)
    annotations = {LABEL_MODEL: ",".join(sorted(task.models))} if task.models else {}
    return {
        "metadata": {"name": name, "namespace": NAMESPACE, "annotations": annotations},
        "spec": {
            "schedulerName": "gpu-scheduler",
            "containers": [
                {
                    "name": "task",
                    "image": "registry.k8s.io/pause:3.9",
                    "resources": {"requests": requests, "limits": limits},
                }
            ],
        },
    }


def placed_gpus(cluster: Cluster, row: int, task: Task, annotations: dict[str, str]) -> list[int]:
    """The GPUs the pod took: the bind's annotation, else (whole GPUs kube-scheduler bound itself)
    the simulator's choice; none for a CPU-only pod."""
    if not task.num_gpu:
        return []
    text = annotations.get(ASSIGNED_GPUS_ANNOTATION)
    if text:
        return [gpu for gpu, _milli in parse_assigned_gpus(text)]
    return whole_gpus(cluster.gpu_left[row], task)


def run(
    nodes_csv: Path,
    pods_csv: Path,
    *,
    seed: int = 42,
    tune: float = 1.3,
    until: float = 100.0,
    sample: float = 1.0,
    progress: bool = True,
    serve_args: Sequence[str] = (),
    config_args: Sequence[str] = (),
    settle: bool = False,
) -> dict[str, Any]:
    """The replay (:func:`_replay`) and ``simulate --policy`` :data:`COMPARED_POLICY` on the same trace
    and seed, as one report."""
    from testing.kube_binaries import missing

    reason = missing()
    if reason:
        raise InvalidArgsError(f"replay needs a control plane: {reason}")
    names, cluster, tasks = load(nodes_csv, pods_csv, sample=sample, seed=seed)
    order = tune_order(tasks, cluster.total_gpus, tune, np.random.default_rng(seed))
    arrivals = cut(order, tasks, cluster.total_gpus, until)
    recorder = Recorder(cluster, tasks)
    started = time.perf_counter()
    replayer, state_lag = _replay(names, cluster, tasks, arrivals, recorder, serve_args, config_args,
                                  settle=settle, progress=progress)  # fmt: skip
    seconds = time.perf_counter() - started
    replayed = recorder.result("replay", seed, seconds)
    simulated = simulate(cluster, tasks, COMPARED_POLICY, seed, tune=tune, arrived_pct=until)
    return {
        "benchmark": "replay", "nodes_csv": str(nodes_csv), "pods_csv": str(pods_csv), "seed": seed,
        "tune": tune, "until": until, "sample": sample, "nodes": cluster.n_nodes, "gpus": cluster.total_gpus,
        "serve_args": list(serve_args), "config_args": list(config_args), "pods_submitted": len(arrivals),
        "outcomes": replayer.counts,
        "seconds": round(seconds, 1), "settle": settle, "state_lag": state_lag,
        "failed_by_reason": dict(replayer.reasons.most_common(12)),
        "replay": _curves(replayed, until), f"simulate_{COMPARED_POLICY}": _curves(simulated, until),
    }  # fmt: skip


def _replay(
    names: list[str],
    cluster: Cluster,
    tasks: list[Task],
    arrivals: Sequence[int],
    recorder: Recorder,
    serve_args: Sequence[str],
    config_args: Sequence[str],
    *,
    settle: bool,
    progress: bool,
) -> tuple[_Replayer, dict[str, Any]]:
    """Submit the tasks ``arrivals`` lists, in turn, through a control plane of their own (moto's DynamoDB
    for the ledger, the stand-in kubelet for reservation pods); the tallies, and how far serve's
    published state trailed the binds."""
    from tqdm import tqdm

    from bench.e2e_harness import VersionPoller
    from testing.bind_watch import BindWatch
    from testing.control_plane import ControlPlane
    from testing.moto import moto_server
    from testing.product import Processes
    from testing.reservation_kubelet import ReservationKubelet

    with tempfile.TemporaryDirectory(prefix="replay-") as tmp:
        work = Path(tmp)
        with (
            moto_server() as endpoint,
            ControlPlane(work / "cluster") as plane,
            Processes(work) as product,
            ReservationKubelet(plane),  # a share binds once its GPU's reservation pod reported the UUID
        ):
            url = _start_product(endpoint, plane, product, names, cluster, serve_args, config_args)
            watch = BindWatch(plane.api, NAMESPACE)
            poller = VersionPoller(url)
            replayer = _Replayer(plane, watch, poller, names, tasks, recorder, settle=settle)
            try:
                steps = tqdm(arrivals, desc="replay", unit="pod", disable=not progress, mininterval=1.0)
                for step, index in enumerate(steps):
                    replayer.submit(f"t-{step:06d}", index)
                state_lag = poller.lags(watch)
            finally:
                poller.close()
                watch.close()
    return replayer, state_lag


def _start_product(
    endpoint: str,
    plane: ControlPlane,
    product: Processes,
    names: list[str],
    cluster: Cluster,
    serve_args: Sequence[str],
    config_args: Sequence[str],
) -> str:
    """The trace's nodes in ``plane``, the ledger's table at ``endpoint``, ``serve --watch --ledger-table``
    and the scheduler on the generated ``--sharing`` configuration; serve's URL."""
    from adapters.gpu_ledger import create_table
    from testing.moto import aws_env, dynamodb_client
    from testing.product_manifests import generated_scheduler_config

    env = aws_env(endpoint)
    create_table(dynamodb_client(endpoint), TABLE)
    plane.add_nodes([trace_node(name, cluster, row) for row, name in enumerate(names)], workers=8)
    plane.ensure_namespaces([NAMESPACE])
    url = product.serve(
        "serve",
        [
            "--watch",
            "--kubeconfig",
            str(plane.kubeconfig_of("scheduler")),
            "--ledger-table",
            TABLE,
            *serve_args,
        ],
        env,
    )
    plane.start_scheduler(generated_scheduler_config(["--url", url, "--sharing", *config_args]))
    return url


class _Replayer:
    """Submits the trace's pods one at a time and tallies how each ended: ``counts`` by outcome, the
    failed ones' ``reasons``, and where each bound pod went (into ``recorder``)."""

    def __init__(
        self,
        plane: ControlPlane,
        watch: BindWatch,
        poller: VersionPoller,
        names: list[str],
        tasks: list[Task],
        recorder: Recorder,
        *,
        settle: bool,
    ) -> None:
        self.plane, self.watch, self.poller, self.settle = plane, watch, poller, settle
        self.tasks, self.recorder = tasks, recorder
        self.row_of = {name: row for row, name in enumerate(names)}
        self.counts = {"bound": 0, "unschedulable": 0, "timed_out": 0, "off_trace": 0}
        self.reasons: Counter[str] = Counter()

    def submit(self, name: str, index: int) -> None:
        """Submit task ``index`` as pod ``name`` and wait until it is bound or the scheduler gives up on it
        (dropped, as the simulator drops it); with ``settle``, also until serve's state shows the bind."""
        task = self.tasks[index]
        self.plane.api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", trace_pod(name, task))
        outcome = self.watch.outcome(name, OUTCOME_TIMEOUT_S)
        if outcome is None or outcome[0] == "unschedulable":
            self.counts["timed_out" if outcome is None else "unschedulable"] += 1
            message = outcome[1] if outcome else "no answer within the outcome timeout"
            self.reasons[failure_reason(message, task)] += 1
            self.plane.delete_pod(NAMESPACE, name)  # dropped, as the simulator drops it
            self.recorder.arrive(task, None)
            return
        row = self.row_of.get(outcome[1])
        if row is None:
            self.counts["off_trace"] += 1
            self.recorder.arrive(task, None)
            return
        self.counts["bound"] += 1
        if self.settle:
            self.poller.wait_for(self.watch.version_of.get(name, 0), OUTCOME_TIMEOUT_S)
        self.recorder.arrive(task, row, placed_gpus(self.recorder.state, row, task, self.watch.annotations_of[name]))


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def failure_reason(message: str, task: Task) -> str:
    """A failed pod's kind and the distinct reasons in the scheduler's message, numbers taken out and
    sorted, so that alike failures count together: kube-scheduler lists a pod's reasons, each after
    how many nodes gave it, in no fixed order, and adds what preemption found. A message in another
    form is kept whole, numbers taken out."""
    kind = "cpu-only" if not task.num_gpu else f"share {task.gpu_milli}" if task.sharing else f"{task.num_gpu} GPU"
    _, found, listed = message.split(". preemption:")[0].partition("nodes are available: ")
    if not found:
        return f"{kind}: " + re.sub(r"\d+", "N", message)[:200]
    parts = (re.sub(r"^\d+ ", "", part).rstrip(".") for part in re.split(r", (?=\d)", listed))
    reasons = {re.sub(r"\d+", "N", part) for part in parts}
    return f"{kind}: " + "; ".join(sorted(reasons))


def _curves(result: SimResult, until: float) -> dict[str, Any]:
    top = int(until)

    def value(curve: str, arrived: int) -> float | None:
        found = result.at(curve, arrived)
        return None if math.isnan(found) else round(found, 3)

    return {
        "unallocated_gpu_pct": {str(a): value("unallocated_pct", a) for a in (80, 90, top) if a <= top},
        "frag_ratio_pct": {str(a): value("frag_ratio_pct", a) for a in (80, 90) if a <= top},
        "pods": result.tasks,
        "pods_failed": result.failed,
        "curve_unallocated_gpu_pct": [
            None if math.isnan(v) else round(float(v), 3) for v in result.unallocated_pct[: top + 1]
        ],
    }


def plot(document: dict[str, Any], path: Path) -> None:
    """Unallocated GPU % against arrived %, the replay and ``simulate`` on one figure."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise InvalidArgsError("--plot needs matplotlib: pip install 'eks-gpu-scheduler[plot]'") from exc
    figure, axes = plt.subplots(figsize=(6, 4))
    for key, label in (
        ("replay", "replay, real kube-scheduler"),
        (f"simulate_{COMPARED_POLICY}", f"simulate {COMPARED_POLICY}"),
    ):
        curve = np.array([np.nan if v is None else v for v in document[key]["curve_unallocated_gpu_pct"]])
        axes.plot(np.arange(curve.shape[0]), curve, label=label)
    axes.set_xlabel("arrived GPU demand, % of capacity")
    axes.set_ylabel("unallocated GPUs, %")
    axes.set_title(f"{Path(document['pods_csv']).name}, seed {document['seed']}, sample {document['sample']:g}")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(args: Any) -> int:
    """The ``gpu-scheduler replay`` command (``gpu_scheduler/commands/replay.py`` parses the flags). A
    SIGTERM stops it as Ctrl-C does: everything it started is stopped on the way out."""

    signal.signal(signal.SIGTERM, _interrupt)
    document = run(args.nodes, args.pods, seed=args.seed, tune=args.tune, until=args.until, sample=args.sample,
                   serve_args=getattr(args, "serve_args", None) or (),
                   config_args=getattr(args, "config_args", None) or (),
                   settle=bool(getattr(args, "settle", False)))  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    if args.plot:
        plot(document, args.plot)
    print(json.dumps({k: v for k, v in document.items() if k not in ("replay", f"simulate_{COMPARED_POLICY}")}
                     | {k: {kk: vv for kk, vv in document[k].items() if kk != "curve_unallocated_gpu_pct"}
                        for k in ("replay", f"simulate_{COMPARED_POLICY}")}, indent=2))  # fmt: skip
    return 0
