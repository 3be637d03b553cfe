"""``gpu-scheduler demo``: the stock kube-scheduler and gpu-scheduler on the same pods, in one screen.

Each step prints a header with the time since the start, and a line at least every few seconds while it
works (:class:`~gpu_scheduler.demo_output.Steps`):

1. **The cluster**: a synthetic EKS GPU cluster (p4d A100, p5 H100, g6e L40S and g4dn T4 nodes over three
   zones, some GPUs already taken) and a stream of pending GPU pods (1-8 GPUs; some name a model, some
   40 GiB per GPU). 96 nodes by default: under 100, the stock kube-scheduler scores every feasible node,
   as the model below does (from 100 up it scores an adaptive sample).
2. **The same pods, one at a time, placed twice** (:mod:`gpu_scheduler.demo_side_by_side`), with
   kube-scheduler's own scores modelled (:mod:`gpu_scheduler.kube_scoring`, checked pod by pod against
   the real one in the e2e suite):
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

import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpu_scheduler.demo_output import Steps
from gpu_scheduler.demo_side_by_side import format_side_by_side, node_uses, side_by_side
from gpu_scheduler.kube_scoring import request_of
from gpu_scheduler.simulation import run_many
from scheduler_core.scoring.policy import DEFAULT_SHARE_POLICY
from scheduler_core.simulator.synthetic import demo_pod_stream, synthetic_cluster
from scheduler_core.simulator.traces import openb_dir, synthetic_trace, write_trace

PLACEMENT_POLICIES = ("fgd", DEFAULT_SHARE_POLICY)
PLACEMENT_TRACE = "gpuspec10"
"""The openb trace for the sharing step: where ``fgd_cpu`` and FGD differ most (10 of 10 seeds better)."""
DEMO_CLUSTER = "demo-gpu-cluster"
"""The cluster name the demo's synth uses (``make synth``'s default): a demo VPC, nothing of yours."""


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
    _describe(nodes, bound, pending, steps)

    steps.step("The same pods, one at a time: the stock kube-scheduler, then gpu-scheduler")
    summary |= side_by_side(nodes, bound, pending, seed, mode, steps)
    steps.say(format_side_by_side(summary))

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
    failed = summary["server_exit_code"] != 0 or summary.get("synth", {}).get("exit_code", 0) != 0
    return 1 if failed else 0


def _describe(
    nodes: list[dict[str, Any]], bound: list[dict[str, Any]], pending: list[dict[str, Any]], steps: Steps
) -> None:
    """The first step's lines: the nodes by GPU model, the GPUs, and the pending pods by GPUs asked."""
    sizes = Counter(request_of(pod)[2] for pod in pending)
    shapes = Counter(node["metadata"]["name"].split("-")[0].upper() for node in nodes)
    gpus = sum(u.gpus for u in node_uses(nodes, []).values())
    steps.say(
        f"      {len(nodes)} GPU nodes ({', '.join(f'{n} {m}' for m, n in sorted(shapes.items()))}; {gpus} GPUs), "
        f"{len(bound)} of them partly used"
    )
    steps.say(
        f"      {len(pending)} pods waiting, in one order for both: "
        + ", ".join(f"{n} x {g} GPU{'s' if g > 1 else ''}" for g, n in sorted(sizes.items()))
    )
    steps.say("      (some name a model, some 40 GiB per GPU)")


def live_burst(*, nodes: int = 64, pods: int = 256, steps: Steps | None = None) -> dict[str, Any]:
    """The burst through a real control plane (``bench.e2e.run_burst``), or why it could not run."""
    try:
        from bench.e2e import run_burst
        from testing.kube_binaries import missing
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
