"""A runtime-only install (``pip install .``, no extras) runs every command but ``bench``, without moto or the doubles.

The venv is built once per run, outside the checkout, and every command runs from a folder outside it
too, so that nothing from the source tree can stand in for what the wheel lacks.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scheduler_core.simulator.traces import synthetic_trace, write_trace
from tests.conftest import REPO, make_nodes, make_pod

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The venv's bin folder, with the product installed from the checkout by its pins, runtime only."""
    venv = tmp_path_factory.mktemp("runtime-venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "-c", str(REPO / "requirements.lock"), str(REPO)], check=True, timeout=900)
    return venv / "bin"


def _run(bin_dir: Path, cwd: Path, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(cwd), "OPENB_DIR": str(cwd / "no-openb")}
    return subprocess.run(
        [str(bin_dir / "gpu-scheduler"), *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def _write(path: Path, document: Any) -> Path:
    path.write_text(json.dumps(document))
    return path


def test_the_installed_package_holds_neither_the_doubles_nor_the_benchmarks(runtime: Path, tmp_path: Path) -> None:
    probe = "import importlib.util as u; print([m for m in ('moto', 'testing', 'bench', 'tests') if u.find_spec(m)])"
    out = subprocess.run([str(runtime / "python"), "-c", probe], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


def test_serve_answers_a_filter_and_stops_on_sigterm(runtime: Path, tmp_path: Path) -> None:
    cluster = _write(tmp_path / "cluster.json", {"nodes": make_nodes("A100", "T4"), "pods": []})
    env = {"PATH": f"{runtime}:/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.Popen(
        [str(runtime / "gpu-scheduler"), "serve", "--port", "0", "--cluster", str(cluster)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        url = json.loads(proc.stdout.readline())["serving"]
        body = json.dumps({"Pod": make_pod("p", 2, models="A100"), "NodeNames": ["a100-0", "t4-1"]}).encode()
        request = urllib.request.Request(f"{url}/filter", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            reply = json.loads(response.read())
        assert reply["NodeNames"] == ["a100-0"] and "t4-1" in reply["FailedAndUnresolvableNodes"]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0


def test_every_other_command_runs(runtime: Path, tmp_path: Path) -> None:
    cluster = _write(tmp_path / "cluster.json", {"nodes": make_nodes("A100", "T4"), "pods": []})
    pod = _write(tmp_path / "pod.json", make_pod("p", 1))
    managed = make_pod("api-0", 0, namespace="web", node_name="n", phase="Running")
    managed["metadata"]["labels"] = {"gpu-scheduler.io/deletion-cost": "managed"}
    pods = _write(tmp_path / "pods.json", [managed])
    metrics = _write(tmp_path / "metrics.json", {"web/api-0": {"active_requests": 2, "cache_hit_rate": 0.5}})
    trace = synthetic_trace(20, 150, np.random.default_rng(1))
    write_trace(*trace, tmp_path / "nodes.csv", tmp_path / "pods.csv")
    commands = {
        "help": ["--help"],
        "explain": ["explain", "--pod", str(pod), "--cluster", str(cluster), "--json"],
        "deletion-costs": ["deletion-costs", "--pods", str(pods), "--metrics", str(metrics), "--json"],
        "scheduler-config": ["scheduler-config", "--url", "https://abc.execute-api.us-east-1.amazonaws.com/v1"],
        "simulate": ["simulate", "--nodes", str(tmp_path / "nodes.csv"), "--pods", str(tmp_path / "pods.csv"),
                     "--seeds", "1", "--policy", "fgd_cpu"],
        "simulate-locality": ["simulate-locality", "--services", "6", "--runs", "1", "--json"],
        "demo": ["demo", "--nodes", "12", "--pods", "10", "--json", "--placement-seeds", ""],
    }  # fmt: skip
    for name, argv in commands.items():
        done = _run(runtime, tmp_path, *argv)
        assert done.returncode == 0, f"{name}: {done.stderr[-2000:]}"
    explained = json.loads(_run(runtime, tmp_path, *commands["explain"]).stdout)
    assert {row["node"]: row["passed"] for row in explained["nodes"]} == {"a100-0": True, "t4-1": True}
    assert "kind: KubeSchedulerConfiguration" in _run(runtime, tmp_path, *commands["scheduler-config"]).stdout


def test_bench_says_it_needs_a_source_checkout(runtime: Path, tmp_path: Path) -> None:
    done = _run(runtime, tmp_path, "bench", "extender")
    assert done.returncode == 2
    assert "run from a source checkout" in done.stderr and "make bench" in done.stderr


def test_replay_says_it_needs_a_source_checkout(runtime: Path, tmp_path: Path) -> None:
    done = _run(runtime, tmp_path, "replay", "--nodes", "nodes.csv", "--pods", "pods.csv")
    assert done.returncode == 2
    assert "run from a source checkout" in done.stderr and "gpu-scheduler replay" in done.stderr
