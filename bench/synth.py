"""``gpu-scheduler bench synth``: how long ``make synth`` takes and how much memory it needs.

Each run is a fresh ``python cdk/app.py`` (as ``make synth`` runs it), with cdk-nag attached, against
the Lambda package in ``--package-dir``. Wall time covers the interpreter start, jsii's Node.js start,
construction, cdk-nag and writing ``cdk.out``. Peak memory is the largest resident set of any one
process (Python or the Node.js jsii runtime), from ``getrusage(RUSAGE_CHILDREN)``; the two run side by
side, so add them for the machine's total.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "demo VPC": ["-c", "clusterName=bench"],
    "imported VPC, applyManifests": [
        "-c", "clusterName=bench", "-c", "vpcId=vpc-0123456789abcdef0",
        "-c", "subnetIds=subnet-0aaaaaaaaaaaaaaaa,subnet-0bbbbbbbbbbbbbbbb",
        "-c", "clusterSecurityGroupId=sg-0cccccccccccccccc", "-c", "schedulerSecurityGroupId=sg-0dddddddddddddddd",
        "-c", "routeTableIds=rtb-0aaaaaaaaaaaaaaaa,rtb-0bbbbbbbbbbbbbbbb", "-c", "applyManifests=true",
    ],
}  # fmt: skip


def _one(args: list[str], package_dir: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-synth-") as outdir:
        # A fresh child per run: RUSAGE_CHILDREN's maxrss is the largest of all children so far, so
        # each run is measured in its own grandchild.
        code = (
            "import json, resource, subprocess, sys, time\n"
            "t = time.perf_counter()\n"
            "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
            "wall = time.perf_counter() - t\n"
            "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024\n"
            "print(json.dumps({'rc': p.returncode, 'wall_s': wall, 'peak_rss_mb': rss, 'out': p.stdout[-4000:],"
            " 'err': p.stderr[-2000:]}))\n"
        )
        command = [sys.executable, str(ROOT / "cdk" / "app.py"), *args, "-c", f"packageDir={package_dir}"]
        env = {**os.environ, "CDK_OUTDIR": outdir}
        result = json.loads(subprocess.run([sys.executable, "-c", code, *command], env=env, capture_output=True,
                                           text=True, check=True).stdout)  # fmt: skip
    if result["rc"] != 0:
        raise RuntimeError(f"synth failed: {result['err']}")
    summary = json.loads(result["out"])
    return {
        "wall_s": round(result["wall_s"], 2),
        "peak_rss_mb": round(result["peak_rss_mb"], 1),
        "resources": summary["resources"],
    }


def run(runs: int, package_dir: Path) -> dict[str, Any]:
    started = time.time()
    cases = {}
    for name, args in CASES.items():
        samples = [_one(args, package_dir) for _ in range(runs)]
        walls = sorted(s["wall_s"] for s in samples)
        cases[name] = {
            "resources": samples[0]["resources"],
            "wall_s_median": walls[len(walls) // 2],
            "wall_s_min": walls[0],
            "peak_rss_mb_max": max(s["peak_rss_mb"] for s in samples),
        }
    return {"suite": "synth", "runs": runs, "package_dir": str(package_dir), "cases": cases,
            "total_s": round(time.time() - started, 1)}  # fmt: skip
