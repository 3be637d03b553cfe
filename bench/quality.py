"""``make bench-quality``: every policy on every public openb trace, seeds 42-51, against the released numbers.

Writes ``build/quality.json`` (every run), ``build/quality.md`` (the Markdown table of
``docs/research/fgd-fidelity.md``: unallocated GPU % at 100 % arrived, mean of the seeds, with the
authors' released mean beside it; also printed) and ``build/quality.png`` (the same as grouped bars,
released means as black ticks). Needs ``../shared/data/openb``; takes about 30 minutes on a 2-core
machine with ``--jobs 2``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from bench import check_choices
from scheduler_core.simulator.traces import openb_dir, openb_traces

ROOT = Path(__file__).resolve().parents[1]
POLICIES = {
    "random": "01-Random", "dotprod": "02-DotProd", "gpu_clustering": "03-GpuClustering",
    "gpu_packing": "04-GpuPacking", "bestfit": "05-BestFit", "fgd": "06-FGD", "fgd_cpu": "",
}  # fmt: skip
"""Each policy and its name in the released results ("": ours, which has none)."""


def _run(trace: str, policy: str, seed: int, tie_order: int | None = None) -> tuple[str, str, int, float, float]:
    from scheduler_core.placement.model import Workload
    from scheduler_core.simulator.simulate import simulate
    from scheduler_core.simulator.traces import read_nodes, read_tasks

    cluster = read_nodes(openb_dir() / "openb_node_list_gpu_node.csv")
    tasks = read_tasks(openb_dir() / f"openb_pod_list_{trace}.csv")
    result = simulate(
        cluster, tasks, policy, seed, workload=Workload.typical(tasks, cluster.models), tie_order=tie_order
    )
    return trace, policy, seed, result.at("unallocated_pct", 100), result.seconds


def share_packing_bounds(shares: Sequence[int], capacity: int = 1000) -> tuple[int, int]:
    """The GPUs ``shares`` (milli of one GPU each) need, at the least: Martello and Toth's L2 lower bound
    on the optimal bin packing, and what first-fit decreasing uses (an upper bound on the optimum).

    >>> share_packing_bounds([810, 810, 470, 470, 320, 160])
    (4, 4)
    >>> share_packing_bounds([600, 600, 600])  # no two fit together
    (3, 3)
    """
    items = np.sort(np.asarray(shares, dtype=np.int64))[::-1]
    lower = 0
    for alpha in np.unique(np.concatenate([[0], items[items <= capacity // 2]])).tolist():
        big = items[items > capacity - alpha]
        mid = items[(items > capacity / 2) & (items <= capacity - alpha)]
        small = items[(items >= alpha) & (items <= capacity / 2)]
        room = mid.shape[0] * capacity - int(mid.sum())
        lower = max(lower, big.shape[0] + mid.shape[0] + max(0, -(-(int(small.sum()) - room) // capacity)))
    free = np.empty(items.shape[0], dtype=np.int64)  # room left in each GPU opened so far
    used = 0
    for item in items.tolist():
        fits = np.flatnonzero(free[:used] >= item)
        if fits.size:
            free[fits[0]] -= item
        else:
            free[used] = capacity - item
            used += 1
    return lower, used


def released() -> dict[tuple[str, str], float]:
    path = openb_dir() / "published_results" / "fgd_unalloc_gpu_summary_derived.csv"
    with path.open() as handle:
        return {
            (row["workload"].removeprefix("openb_pod_list_"), row["sc_policy"]): float(row["unalloc_gpu_pct_mean"])
            for row in csv.DictReader(handle)
            if row["arrived_pct"] == "100"
        }


def main() -> int:
    args = _parser().parse_args()
    if not openb_dir().is_dir():
        raise SystemExit(f"{openb_dir()} is absent: the trace is research-use only and is not shipped here")
    published = released()
    try:
        traces = pick_traces(args.traces, openb_traces(openb_dir()), {trace for trace, _ in published})
    except ValueError as exc:
        raise SystemExit(str(exc)) from exc
    if args.floor:
        return floor(traces)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    try:
        check_choices(policies, list(POLICIES), "--policies")
    except ValueError as exc:
        raise SystemExit(str(exc)) from exc
    orders: list[int | None] = list(range(args.tie_orders)) if args.tie_orders > 0 else [None]
    jobs = [(t, p, 42 + s, o) for t in traces for p in policies for s in range(args.seeds) for o in orders]
    runs: list[dict[str, Any]] = []
    if args.resume:
        try:
            runs, jobs = reuse(args.out, jobs)
        except ValueError as exc:
            raise SystemExit(str(exc)) from exc
        print(f"--resume: {len(runs)} runs taken from {args.out}, {len(jobs)} to run")
    _run_jobs(jobs, runs, args.out, args.jobs)
    text = table(runs, policies, traces, published)
    if args.tie_orders > 0 and "fgd" in policies:
        text += "\n\n" + paired_table(runs, [p for p in policies if p != "fgd"], traces)
    args.out.with_suffix(".md").write_text(text + "\n")
    plot(runs, policies, traces, published, args.out.with_suffix(".png"))
    print(text)
    print(f"wrote {args.out}, {args.out.with_suffix('.md')} and {args.out.with_suffix('.png')}")
    return 0


def _parser() -> argparse.ArgumentParser:
    """The flags of ``make bench-quality`` (``python bench/quality.py``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10, help="seeds 42, 43, ...")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "quality.json")
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma list (default: all)")
    parser.add_argument(
        "--traces",
        default="public",
        help="public (those with released results, the default), unreleased (the directory's others), all,"
        " or a comma list",
    )
    parser.add_argument(
        "--tie-orders", type=int, default=0,
        help="per seed, this many tie orders (the same task order, ties shuffled anew), and the paired table "
        "against FGD with 95 %% intervals (0: the seed's own tie order, as the published runs)",
    )  # fmt: skip
    parser.add_argument(
        "--floor", action="store_true", help="only the GPU waste that packing each trace's shares must leave"
    )
    parser.add_argument(
        "--resume", action="store_true",
        help="take the runs already in --out (the same trace, policy, seed and tie order) and run only the rest",
    )  # fmt: skip
    return parser


def _run_jobs(jobs: Sequence[Job], runs: list[dict[str, Any]], out: Path, workers: int) -> None:
    """Run ``jobs`` on ``workers`` processes, each run appended to ``runs`` as it ends and ``runs`` written
    to ``out`` every 50 runs and at the end."""
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for (*_, order), (trace, policy, seed, unalloc, seconds) in zip(
            jobs, tqdm(pool.map(_run, *zip(*jobs, strict=True)) if jobs else [], total=len(jobs)), strict=True
        ):
            runs.append({"trace": trace, "policy": policy, "seed": seed, "tie_order": order,
                         "unalloc_100": unalloc, "seconds": seconds})  # fmt: skip
            if len(runs) % 50 == 0:  # a long run stopped part way keeps what it has
                _write(out, runs)
    _write(out, runs)


Job = tuple[str, str, int, int | None]


def reuse(path: Path, jobs: Sequence[Job]) -> tuple[list[dict[str, Any]], list[Job]]:
    """``--resume``: the runs in ``path`` that are among ``jobs`` (by trace, policy, seed and tie order), and
    the jobs still to run. Runs of other jobs are left out; a missing file reuses nothing.

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "q.json"
    >>> _write(path, [{"trace": "default", "policy": "fgd", "seed": 42, "tie_order": 0, "unalloc_100": 4.7,
    ...                "seconds": 1.0}])
    >>> runs, todo = reuse(path, [("default", "fgd", 42, 0), ("default", "fgd", 42, 1)])
    >>> [run["unalloc_100"] for run in runs], todo
    ([4.7], [('default', 'fgd', 42, 1)])
    """
    if not path.is_file():
        return [], list(jobs)
    try:
        stored = json.loads(path.read_text())["runs"]
        done = {(run["trace"], run["policy"], run["seed"], run["tie_order"]): run for run in stored}
    except (ValueError, KeyError, TypeError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else f"{type(exc).__name__}: {exc}"
        raise ValueError(f"--resume: {path} is not the JSON that --out writes: {reason}") from exc
    return [done[job] for job in jobs if job in done], [job for job in jobs if job not in done]


def _write(path: Path, runs: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"runs": runs}, indent=1) + "\n")


def pick_traces(spec: str, present: Sequence[str], public: set[str]) -> list[str]:
    """``--traces``: the public ones (with released results), the unreleased ones, all, or a comma list.

    >>> pick_traces("unreleased", ["cpu0", "default"], {"default"})
    ['cpu0']
    >>> pick_traces("default,gpu9", ["cpu0", "default"], {"default"})
    Traceback (most recent call last):
    ValueError: --traces: unknown gpu9; choose from cpu0, default
    """
    groups = {
        "public": [t for t in present if t in public],
        "unreleased": [t for t in present if t not in public],
        "all": list(present),
    }
    if spec in groups:
        return groups[spec]
    names = [name.strip() for name in spec.split(",") if name.strip()]
    check_choices(names, present, "--traces")
    return names


def _means(runs: list[dict[str, Any]], policies: list[str], traces: list[str]) -> dict[tuple[str, str], float]:
    """Mean unallocated GPU % at 100 % arrived per (trace, policy), over the seeds run."""
    means = {}
    for trace in traces:
        for policy in policies:
            values = [r["unalloc_100"] for r in runs if r["trace"] == trace and r["policy"] == policy]
            means[trace, policy] = sum(values) / len(values) if values else float("nan")
    return means


def table(
    runs: list[dict[str, Any]], policies: list[str], traces: list[str], published: dict[tuple[str, str], float]
) -> str:
    """The Markdown table of ``docs/research/fgd-fidelity.md``: per trace, each policy's mean, with the
    released mean beside it."""
    means = _means(runs, policies, traces)
    lines = ["| trace | " + " | ".join(f"{p} ({_kind(p)})" for p in policies) + " |"]
    lines.append("|---|" + "---:|" * len(policies))
    for trace in traces:
        cells = []
        for policy in policies:
            name = POLICIES.get(policy, "")
            mean = means[trace, policy]
            text = f"{mean:.2f}"
            if name:  # a published policy: its released mean, or "-" on a trace without released results
                known = published.get((trace, name))
                text += f" ({known:.2f})" if known is not None else " (-)"
            cells.append(text)
        lines.append(f"| {trace} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paired(runs: list[dict[str, Any]], trace: str, policy: str, against: str = "fgd") -> dict[str, float]:
    """``policy`` minus ``against`` on ``trace``, paired by (seed, tie order): the mean difference in
    unallocated GPU points at 100 % arrived and its 95 % interval (Student's t)."""
    base = {
        (r["seed"], r["tie_order"]): r["unalloc_100"] for r in runs if r["trace"] == trace and r["policy"] == against
    }
    ours = {
        (r["seed"], r["tie_order"]): r["unalloc_100"] for r in runs if r["trace"] == trace and r["policy"] == policy
    }
    keys = sorted(set(base) & set(ours), key=str)
    diffs = np.array([ours[k] - base[k] for k in keys])
    n = diffs.shape[0]
    mean = float(diffs.mean()) if n else float("nan")
    half = t_975(n - 1) * float(diffs.std(ddof=1)) / math.sqrt(n) if n > 1 else float("nan")
    return {"pairs": n, "mean": mean, "low": mean - half, "high": mean + half}


def verdict(interval: dict[str, float]) -> str:
    """``better`` when the whole interval is below 0 (fewer GPUs unallocated), ``worse`` above, else ``equal``."""
    if interval["high"] < 0:
        return "better"
    if interval["low"] > 0:
        return "worse"
    return "equal"


def t_975(df: int) -> float:
    """The 97.5 % quantile of Student's t with ``df`` degrees of freedom (Cornish-Fisher expansion around
    the normal quantile; within 0.001 of the exact value from df 5 up).

    >>> round(t_975(49), 3), round(t_975(9), 2)
    (2.01, 2.26)
    """
    z = 1.959964
    return float(z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
                 + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))  # fmt: skip


def paired_table(runs: list[dict[str, Any]], policies: list[str], traces: list[str]) -> str:
    """Per trace and policy: its mean over every (seed, tie order), FGD's, the paired difference with its
    95 % interval, and whether it is better, equal or worse than FGD at that confidence."""
    means = _means(runs, ["fgd", *policies], traces)
    lines = ["| trace | FGD | policy | its mean | minus FGD [95 % interval] | verdict |", "|---|---:|---|---:|---|---|"]
    for trace in traces:
        for policy in policies:
            found = paired(runs, trace, policy)
            lines.append(
                f"| {trace} | {means[trace, 'fgd']:.2f} | {policy} | {means[trace, policy]:.2f} | "
                f"{found['mean']:+.2f} [{found['low']:+.2f}, {found['high']:+.2f}] ({found['pairs']} pairs) | "
                f"{verdict(found)} |"
            )
    return "\n".join(lines)


def _kind(policy: str) -> str:
    """How the table and the plot label a policy: released (published) or ours."""
    return "released" if POLICIES[policy] else "ours"


def plot(
    runs: list[dict[str, Any]],
    policies: list[str],
    traces: list[str],
    published: dict[tuple[str, str], float],
    path: Path,
) -> None:
    """Grouped bars, one group per trace and one bar per policy (the mean over seeds), with each released
    mean as a black tick on its bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    means = _means(runs, policies, traces)
    width = 0.8 / len(policies)
    figure, axes = plt.subplots(figsize=(max(8.0, 1.1 * len(traces)), 4.5))
    for k, policy in enumerate(policies):
        x = np.arange(len(traces)) + (k - (len(policies) - 1) / 2) * width
        kind = _kind(policy)
        axes.bar(
            x, [means[t, policy] for t in traces], width, label=policy if kind == "released" else f"{policy} ({kind})"
        )
        released_values = [published.get((t, POLICIES.get(policy, "")), np.nan) for t in traces]
        label = "released" if k == 0 else None
        axes.scatter(x, released_values, marker="_", s=60, color="black", zorder=3, label=label)
    axes.set_xticks(np.arange(len(traces)), traces, rotation=30, ha="right")
    axes.set_ylabel("unallocated GPUs at 100 % arrived, %")
    axes.grid(axis="y", alpha=0.3)
    axes.legend(ncol=len(policies) + 1, fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def floor(traces: list[str]) -> int:
    """Per trace, the GPU capacity its shares leave unused however well they are packed, as % of the
    cluster's GPUs: at least the L2 bound's, and no more than first-fit decreasing's (offline, every
    share known in advance, CPU and GPU models ignored). Where the trace's GPU demand is under 100 % of
    the GPUs, every share has arrived by 100 % arrived, so the L2 figure bounds unallocated GPU % there."""
    from scheduler_core.simulator.traces import read_nodes, read_tasks

    total = read_nodes(openb_dir() / "openb_node_list_gpu_node.csv").total_gpus * 1000
    print("| trace | GPU demand, % of the GPUs | shares | GPUs they need: L2 bound / first-fit decreasing "
          "| unused in them, % of all GPUs |")  # fmt: skip
    print("|---|---:|---:|---:|---:|")
    for trace in traces:
        tasks = read_tasks(openb_dir() / f"openb_pod_list_{trace}.csv")
        shares = [t.gpu_milli for t in tasks if t.sharing]
        lower, ffd = share_packing_bounds(shares)
        waste = [100 * (bins * 1000 - sum(shares)) / total for bins in (lower, ffd)]
        demand = 100 * sum(t.gpu_demand for t in tasks) / total
        print(f"| {trace} | {demand:.0f} | {len(shares)} | {lower} / {ffd} | {waste[0]:.2f} - {waste[1]:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
