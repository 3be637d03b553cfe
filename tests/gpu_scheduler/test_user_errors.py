"""What a new user can get wrong, and what the CLI says then (issue "A platform team's first hour"): one line
naming what was wrong and exit 2, never a traceback, never a silent 0; and the inputs they have at hand
(``kubectl get nodes,pods -A -o json``, a pod's YAML) taken as they are."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_scheduler.cli import main
from tests.conftest import make_nodes, make_pod

GPU_SCHEDULER = [sys.executable, "-m", "gpu_scheduler"]
REPO = Path(__file__).resolve().parents[2]


def one_line_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run ``argv`` in this process; assert exit 2 with one line on stderr and no traceback; that line."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    err = capsys.readouterr().err.strip()
    assert code == 2, (code, err)
    assert "Traceback" not in err and err, err
    return err.splitlines()[-1]


def kubectl_list(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``kubectl get nodes,pods -A -o json`` prints: a v1 List of both, each item with its kind."""
    items = [{"apiVersion": "v1", "kind": "Node", **n} for n in nodes] + [
        {"apiVersion": "v1", "kind": "Pod", **p} for p in pods
    ]
    return {"apiVersion": "v1", "kind": "List", "items": items, "metadata": {"resourceVersion": ""}}


def test_version_is_pyprojects_and_the_changelog_has_it() -> None:
    import tomllib

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    done = subprocess.run([*GPU_SCHEDULER, "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == f"gpu-scheduler {declared}"
    assert f"\n## {declared} " in (REPO / "CHANGELOG.md").read_text(), "each version has its CHANGELOG entry"


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_a_port_out_of_range_is_a_usage_error(capsys: pytest.CaptureFixture[str], port: str) -> None:
    assert "argument --port: expected a port number in 0..65535" in one_line_exit_2(capsys, ["serve", "--port", port])


def test_a_port_in_use_is_one_line() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        done = subprocess.run([*GPU_SCHEDULER, "serve", "--port", str(port)], capture_output=True, text=True,
                              timeout=60)  # fmt: skip
    finally:
        taken.close()
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"gpu-scheduler serve: cannot listen on 127.0.0.1:{port}: Address already in use"
    )


def test_a_missing_kubeconfig_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    line = one_line_exit_2(capsys, ["explain", "team/pod", "--kubeconfig", str(missing)])
    assert f"kubeconfig {missing}" in line
    assert one_line_exit_2(capsys, ["serve", "--watch", "--kubeconfig", str(missing)]).endswith("no such file")


@pytest.mark.parametrize(
    ("which", "row", "message"),
    [
        (
            "pods",
            "p1,abc,1024,1,1000,,LS,Running,0,1,0",
            "pods.csv:3: column cpu_milli: expected a non-negative integer",
        ),
        ("pods", "p1,1000,1024,1,1500,,LS,Running,0,1,0", "pods.csv:3: num_gpu=1, gpu_milli=1500"),
        (
            "nodes",
            "n1,64000,262144,two,T4",
            "nodes.csv:3: column gpu: expected a non-negative integer, got 'two'",
        ),
    ],
    ids=["a pod's CPU", "a pod's share", "a node's GPUs"],
)
def test_a_bad_csv_cell_is_named_by_line_and_column(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, which: str, row: str, message: str
) -> None:
    nodes = ["sn,cpu_milli,memory_mib,gpu,model", "n0,64000,262144,2,T4"]
    pods = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
            "scheduled_time", "p0,1000,1024,1,500,,LS,Running,0,1,0"]  # fmt: skip
    (nodes if which == "nodes" else pods).append(row)
    (tmp_path / "nodes.csv").write_text("\n".join(nodes) + "\n")
    (tmp_path / "pods.csv").write_text("\n".join(pods) + "\n")
    argv = ["simulate", "--nodes", str(tmp_path / "nodes.csv"), "--pods", str(tmp_path / "pods.csv")]
    assert message in one_line_exit_2(capsys, argv)


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path) -> None:
    """``gpu-scheduler explain ... | head``: no ``BrokenPipeError`` traceback, exit 141 as a shell tool's."""
    cluster, pod = tmp_path / "cluster.json", tmp_path / "pod.json"
    cluster.write_text(
        json.dumps({"nodes": make_nodes(*["T4"] * 2000), "pods": []})
    )  # a reply far past a pipe's 64 KiB
    pod.write_text(json.dumps(make_pod("p", 1)))
    read, write = os.pipe()
    process = subprocess.Popen([*GPU_SCHEDULER, "explain", "--pod", str(pod), "--cluster", str(cluster), "--json"],
                               stdout=write, stderr=subprocess.PIPE)  # fmt: skip
    os.close(write)
    assert os.read(read, 10)
    os.close(read)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 141 and b"Traceback" not in err, err[-500:]


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    """What ``kubectl get nodes,pods -A -o json`` prints for two A100 nodes and a T4 one, a pod on each A100,
    and a node whose labels say a negative memory and whose GPU count is no number."""
    nodes = make_nodes("A100", "A100", "T4")
    broken = make_nodes("L40S")[0]
    broken["metadata"]["name"] = "broken"
    broken["metadata"]["labels"]["nvidia.com/gpu.memory"] = "-5"
    broken["status"]["allocatable"]["nvidia.com/gpu"] = "abc"
    pods = [make_pod("r", 7, node_name="a100-0", phase="Running"), make_pod("pending", 1)]
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(kubectl_list([*nodes, broken], pods)))
    return path


def test_explain_takes_kubectls_list_and_a_yaml_pod(capsys: pytest.CaptureFixture[str], cluster: Path) -> None:
    pod = cluster.parent / "pod.yaml"
    pod.write_text(yaml.safe_dump(make_pod("train", 2, models="A100")))
    assert main(["explain", "--pod", str(pod), "--cluster", str(cluster), "--json"]) == 0
    rows = {row["node"]: row for row in json.loads(capsys.readouterr().out)["nodes"]}
    assert set(rows) == {"a100-0", "a100-1", "t4-2", "broken"}
    assert rows["a100-1"]["passed"] and rows["a100-0"]["gpus_used"] == 7  # the List's pod is counted


def test_a_hand_written_pod_may_give_its_quantities_as_numbers(
    capsys: pytest.CaptureFixture[str], cluster: Path
) -> None:
    """``cpu: 0.5`` and ``nvidia.com/gpu: 2`` unquoted, as the API server accepts them: read as it would."""
    pod = cluster.parent / "pod.yaml"
    pod.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: hand, namespace: ml}\nspec:\n  containers:\n  - name: m\n"
        "    resources:\n      limits: {nvidia.com/gpu: 2}\n      requests: {cpu: 0.5, memory: 1Gi}\n"
    )
    assert main(["explain", "--pod", str(pod), "--cluster", str(cluster), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpus"] == 2


def test_explain_counts_the_nodes_kube_schedulers_own_count_refuses(
    capsys: pytest.CaptureFixture[str], cluster: Path
) -> None:
    """Whole GPUs on nodes without shares: the extender leaves their count to kube-scheduler, and explain's
    count of the nodes that pass is what kube-scheduler would do: a100-0 has 1 GPU free of 8."""
    pod = cluster.parent / "pod.json"
    pod.write_text(json.dumps(make_pod("train", 2, models="A100")))
    assert main(["explain", "--pod", str(pod), "--cluster", str(cluster)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith(
        "1 of 4 nodes pass (1 more pass the extender, but not kube-scheduler's count of free GPUs)"
    ), out


def test_explain_says_what_it_cannot_read_of_a_node(capsys: pytest.CaptureFixture[str], cluster: Path) -> None:
    pod = cluster.parent / "pod.json"
    pod.write_text(json.dumps(make_pod("cpu", 0)))
    assert main(["explain", "--pod", str(pod), "--cluster", str(cluster)]) == 0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith("broken ")]
    assert "node data: label nvidia.com/gpu.memory='-5' is not a non-negative integer" in row, row
    assert "warning: 1 node(s) with data the product cannot use: broken: label nvidia.com/gpu.memory" in out


def test_an_unknown_gpu_model_is_an_error_naming_the_known_ones(
    capsys: pytest.CaptureFixture[str], cluster: Path
) -> None:
    """``H1OO`` (letters O for zeros) exited 0, every node refused for its model, the pod Pending for good."""
    pod = cluster.parent / "pod.json"
    pod.write_text(json.dumps(make_pod("typo", 1, models="H1OO")))
    line = one_line_exit_2(capsys, ["explain", "--pod", str(pod), "--cluster", str(cluster)])
    assert "H1OO is no GPU model a node of this cluster has nor one the product knows (known: A100, " in line
    pod.write_text(json.dumps(make_pod("new", 1, models="H1OO,A100")))  # one known model: the filter decides
    assert main(["explain", "--pod", str(pod), "--cluster", str(cluster)]) == 0


def test_simulate_on_a_small_trace_prints_figures_not_nan(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    nodes = ["sn,cpu_milli,memory_mib,gpu,model", *(f"n{i},64000,262144,2,T4" for i in range(10))]
    pods = [
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli",
        *(f"p{i},4000,8192,1,{250 * (1 + i % 4)}" for i in range(12)),
    ]
    (tmp_path / "nodes.csv").write_text("\n".join(nodes) + "\n")
    (tmp_path / "pods.csv").write_text("\n".join(pods) + "\n")
    argv = ["simulate", "--nodes", str(tmp_path / "nodes.csv"), "--pods", str(tmp_path / "pods.csv"), "--seeds", "1-3"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "nan" not in out
    mean = next(line for line in out.splitlines() if line.strip().startswith("mean"))
    assert float(mean.split()[1]) >= 0
