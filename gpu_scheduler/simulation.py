"""Running the trace simulator over seeds, in parallel: the figures behind `gpu-scheduler simulate` and the demo.

Per seed, then mean and median: unallocated GPU % at 100 % and 130 % arrived, fragmentation ratio at
80 % and 90 % arrived, and failed tasks; `plot` draws the curve.
"""

from __future__ import annotations

import json
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from scheduler_core.errors import InvalidArgsError
from scheduler_core.placement.model import Workload
from scheduler_core.simulator.simulate import SimResult, check_trace, simulate
from scheduler_core.simulator.traces import read_nodes, read_tasks


def parse_seeds(text: str, flag: str = "--seeds") -> list[int]:
    """``42-51`` or ``42,43,50``; an error names ``flag``.

    >>> parse_seeds("42-44"), parse_seeds("7,9")
    ([42, 43, 44], [7, 9])
    """
    try:
        if "-" in text:
            low, high = (int(part) for part in text.split("-", 1))
            if high < low:
                raise ValueError
            return list(range(low, high + 1))
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise InvalidArgsError(f"{flag}: expected a range like 42-51 or a list like 42,43, got {text!r}") from exc


def _one(nodes: Path, pods: Path, policy: str, seed: int, tune: float, tie: str) -> SimResult:
    cluster, tasks = read_nodes(nodes), read_tasks(pods)
    return simulate(cluster, tasks, policy, seed, tune=tune, tie=tie, workload=Workload.typical(tasks, cluster.models))


def run(nodes: Path, pods: Path, policy: str, seeds: list[int], tune: float, tie: str, jobs: int) -> dict[str, Any]:
    return run_many(nodes, pods, [policy], seeds, tune, tie, jobs)[0]


def run_many(
    nodes: Path,
    pods: Path,
    policies: list[str],
    seeds: list[int],
    tune: float,
    tie: str,
    jobs: int,
    *,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Every policy on every seed, ``jobs`` runs at a time; one report per policy, in order (a progress bar on
    stderr unless ``progress`` is False)."""
    check_trace(read_nodes(nodes), read_tasks(pods))  # fail fast, naming the file and line, before any worker starts
    arguments = [(nodes, pods, policy, seed, tune, tie) for policy in policies for seed in seeds]
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(_one, *a) for a in arguments]
        desc = f"{' vs '.join(policies)} on {pods.name}"
        results = [f.result() for f in tqdm(futures, desc=desc, unit="run", disable=not progress)]
    return [report(policy, pods, results[i * len(seeds) : (i + 1) * len(seeds)]) for i, policy in enumerate(policies)]


def report(policy: str, pods: Path, results: list[SimResult]) -> dict[str, Any]:
    def summary(values: list[float]) -> dict[str, Any]:
        """Mean and median over the seeds that reached the point (a run on a small trace may end short of
        130 % arrived); None where none did, and the seeds that did not, None too."""
        reached = [v for v in values if not np.isnan(v)]
        return {"mean": round(float(np.mean(reached)), 3) if reached else None,
                "median": round(float(np.median(reached)), 3) if reached else None,
                "seeds_reaching": len(reached),
                "per_seed": [None if np.isnan(v) else round(v, 3) for v in values]}  # fmt: skip

    curves = np.full((len(results), 131), np.nan)
    for i, r in enumerate(results):
        size = min(131, r.unallocated_pct.shape[0])
        curves[i, :size] = r.unallocated_pct[:size]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # arrived % values no seed reached: NaN, as meant
        bands = {q: np.nanpercentile(curves, q, axis=0) if len(results) else curves[0] for q in (25, 50, 75)}
    return {
        "policy": policy,
        "pods_csv": str(pods),
        "curve_unallocated_gpu_pct": {
            f"p{q}": [None if np.isnan(v) else round(float(v), 3) for v in values] for q, values in bands.items()
        },
        "seeds": [r.seed for r in results],
        "unallocated_gpu_pct": {str(a): summary([r.at("unallocated_pct", a) for r in results]) for a in (100, 130)},
        "frag_ratio_pct": {str(a): summary([r.at("frag_ratio_pct", a) for r in results]) for a in (80, 90)},
        "pods_failed": summary([float(r.failed) for r in results]),
        "seconds_per_seed": summary([r.seconds for r in results]),
    }


def write_json(document: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(document, indent=2) + "\n")


def plot(document: dict[str, Any], path: Path) -> None:
    """Unallocated GPU % against arrived %: the median over seeds and the 25-75 % band (the paper's
    Fig. 9(a))."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise InvalidArgsError("--plot needs matplotlib: pip install 'eks-gpu-scheduler[plot]'") from exc
    curve = document["curve_unallocated_gpu_pct"]
    arrived = np.arange(len(curve["p50"]))
    values = {key: np.array([np.nan if v is None else v for v in curve[key]]) for key in ("p25", "p50", "p75")}
    figure, axes = plt.subplots(figsize=(6, 4))
    axes.fill_between(arrived, values["p25"], values["p75"], alpha=0.3, label="25-75 %")
    axes.plot(arrived, values["p50"], label=f"{document['policy']} (median of {len(document['seeds'])} seeds)")
    axes.set_xlabel("arrived GPU demand, % of capacity")
    axes.set_ylabel("unallocated GPUs, %")
    axes.set_xlim(0, 130)
    axes.set_title(Path(document["pods_csv"]).name)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
