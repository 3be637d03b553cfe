"""Whole GPUs through the real kube-scheduler: model lists, GPU memory, plain counts, init and sidecar
containers, limits only and partly used nodes, with ``nodeCacheCapable`` true and false.

``gpu-scheduler serve --watch`` decides from the cluster as it is now. The pods go in one at a time,
in the order of :data:`CASES`, so that what each finds free is known: each placeable pod must bind to
a node its rules allow (and, where best fit decides, the tightest one); each unplaceable pod must get
a ``FailedScheduling`` event whose message names the rule that stopped it. Then, across all bound pods,
no node holds more GPUs than it has, as kube-scheduler counts them.

``serve`` runs with ``--share-policy gpu_packing``, so that whole GPUs go by best fit, whose choice
each case can name; with ``fgd_cpu`` (the default) FGD places them, which ``test_replay.py`` checks
against ``simulate`` through the same scheduler.

Sidecars here are a second app container: restartable init containers (``restartPolicy: Always``)
need Kubernetes 1.28, and the captures' 1.25 API server drops the field; the suite runs on both, so
``tests/scheduler_core/k8s/test_pods.py`` covers them.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from scheduler_core.simulator.synthetic import CATALOGUE, make_node, make_pod
from testing.control_plane import ControlPlane
from testing.product import Processes, requests_served
from tests.e2e.conftest import gpus_of, start_scheduler

SHAPE = {shape.model: shape for shape in CATALOGUE}
NODES = [
    make_node("a100-0", SHAPE["A100"], "us-east-1a"),
    make_node("a100-1", SHAPE["A100"], "us-east-1b"),
    make_node("h100-0", SHAPE["H100"], "us-east-1c"),
    make_node("l40s-0", SHAPE["L40S"], "us-east-1a"),
    make_node("t4-0", SHAPE["T4"], "us-east-1b"),
    # GPUs, but no model or memory labels from GFD or the refresher: fine for a plain count only.
    make_node("bare-0", SHAPE["A100"], "us-east-1c", gfd=False, project_labels=False),
]
ALLOCATABLE = {node["metadata"]["name"]: int(node["status"]["allocatable"]["nvidia.com/gpu"]) for node in NODES}
ALL = frozenset(ALLOCATABLE)
# Already running when the scheduler starts: 6 of a100-1's 8 GPUs and 2 of t4-0's 4.
RUNNING = [
    make_pod("busy-a100", 6, namespace="running", node_name="a100-1", phase="Running"),
    make_pod("busy-t4", 2, namespace="running", node_name="t4-0", phase="Running"),
]


def pod(name: str, gpus: int = 1, **kwargs: Any) -> dict[str, Any]:
    made = make_pod(name, gpus, **kwargs)
    made["spec"]["containers"][0]["resources"]["requests"].update(cpu="100m", memory="64Mi")
    return made


def with_init(gpus: int, init_gpus: int, **kwargs: Any) -> dict[str, Any]:
    made = pod("init-8", gpus, **kwargs)
    made["spec"]["initContainers"] = [
        {"name": "warm-up", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": str(init_gpus)}}}
    ]
    return made


def with_sidecar(gpus: int, sidecar_gpus: int) -> dict[str, Any]:
    made = pod("sidecar", gpus)
    made["spec"]["containers"].append(
        {"name": "exporter", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": str(sidecar_gpus)}}}
    )
    return made


def limits_only(gpus: int) -> dict[str, Any]:
    made = pod("limits-only", 0)
    made["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return made


@dataclass(frozen=True)
class Case:
    pod: dict[str, Any]
    allowed: frozenset[str] = frozenset()
    """Placeable: the nodes its rules allow. Empty: it must stay pending."""
    best: str = ""
    """Where best fit must put it, when one node is the tightest that fits."""
    rules: tuple[str, ...] = field(default_factory=tuple)
    """Unplaceable: what its FailedScheduling message must say."""
    explained: tuple[str, ...] = field(default_factory=tuple)
    """Unplaceable: what ``gpu-scheduler explain`` must say of its nodes (default: ``rules``)."""

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])


# Free at the start: a100-0 8, a100-1 2, h100-0 8, l40s-0 4, t4-0 2, bare-0 8.
CASES = (
    # The init container's 8 GPUs count, not the app's 1: best fit on 1 GPU would pick a100-1.
    Case(with_init(1, 8, models="A100"), frozenset({"a100-0"}), best="a100-0"),
    Case(pod("partly-used", 2, models="A100"), frozenset({"a100-1"}), best="a100-1"),
    Case(pod("model-h100", 2, models="H100"), frozenset({"h100-0"})),
    Case(pod("model-list", 2, models="L40S,T4"), frozenset({"l40s-0", "t4-0"}), best="t4-0"),
    Case(pod("memory-mib", 1, memory="45000"), frozenset({"h100-0", "l40s-0"}), best="l40s-0"),
    Case(pod("memory-quantity", 1, memory="40Gi"), frozenset({"a100-0", "a100-1", "h100-0", "l40s-0"})),
    Case(with_sidecar(2, 1), ALL),
    Case(limits_only(2), ALL),
    Case(pod("plain-count", 4), ALL),
    Case(pod("model-absent", 1, models="V100"), rules=("GPU model H100 not in V100", "no GPU model/memory labels")),
    Case(pod("memory-too-big", 1, memory="100Gi"), rules=("GPU memory", "< 102400 MiB per GPU requested")),
    Case(pod("too-many", 16), rules=("Insufficient nvidia.com/gpu",), explained=("allocatable, pod needs 16",)),
    # t4-0 is full by now: kube-scheduler's own count says so, the extender's model rule covers the rest.
    Case(
        pod("t4-full", 1, models="T4"),
        rules=("Insufficient nvidia.com/gpu", "not in T4"),
        explained=("0 of 4 GPUs free, pod needs 1 (kube-scheduler's count)", "not in T4"),
    ),
)
NAMESPACE = {False: "names", True: "full-nodes"}


@pytest.fixture(scope="module")
def serve_url(cluster: ControlPlane, product: Processes) -> str:
    cluster.add_nodes(NODES)
    cluster.create_pods(RUNNING)
    return product.serve(
        "serve", ["--watch", "--kubeconfig", str(cluster.kubeconfig_of("scheduler")), "--share-policy", "gpu_packing"]
    )


@pytest.fixture(scope="module", params=[False, True], ids=["node-names", "full-nodes"])
def outcomes(request: pytest.FixtureRequest, cluster: ControlPlane, serve_url: str) -> Iterator[dict[str, Any]]:
    """Each case's pod created in turn under the generated configuration, and what became of it."""
    full_nodes: bool = request.param
    namespace = NAMESPACE[full_nodes]
    before = requests_served(serve_url)
    config = start_scheduler(cluster, serve_url, *(["--full-nodes"] if full_nodes else []))
    found: dict[str, Any] = {"config": config, "bound": {}, "failed": {}}
    try:
        for case in CASES:
            made = copy.deepcopy(case.pod)
            made["metadata"]["namespace"] = namespace
            cluster.create_pods([made])
            if case.allowed:
                found["bound"][case.name] = cluster.wait_bound(namespace, case.name)
            else:
                found["failed"][case.name] = cluster.wait_failed(namespace, case.name)
        found["pods"] = cluster.pods(namespace) + cluster.pods("running")
        found["served"] = requests_served(serve_url) - before
        found["explained"] = {case.name: explain(cluster, namespace, case.name) for case in CASES if not case.allowed}
    finally:
        cluster.stop_scheduler()
    yield found
    cluster.delete_namespace_pods(namespace)


def explain(cluster: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    """``gpu-scheduler explain NAMESPACE/POD --kubeconfig F --json`` on the live pod."""
    done = subprocess.run(
        [sys.executable, "-m", "gpu_scheduler", "explain", f"{namespace}/{name}", "--kubeconfig",
         str(cluster.kubeconfig), "--json"], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_the_scheduler_runs_the_generated_configuration(outcomes: dict[str, Any], request: pytest.FixtureRequest):
    (extender,) = outcomes["config"]["extenders"]
    full_nodes = "full-nodes" in request.node.callspec.id
    assert extender["nodeCacheCapable"] is not full_nodes
    assert "managedResources" not in extender  # every pod of the profile reaches the extender
    # kube-scheduler calls the extender for each pod, but for too-many:
    # its own NodeResourcesFit leaves no node to send.
    assert outcomes["served"]["filter"] >= len(CASES) - 1
    # kube-scheduler skips scoring where one node is left, so only some of the bound pods were scored.
    assert outcomes["served"]["prioritize"] > 0


@pytest.mark.parametrize("case", [c for c in CASES if c.allowed], ids=lambda c: c.name)
def test_each_pod_binds_to_a_node_its_rules_allow(outcomes: dict[str, Any], case: Case):
    node = outcomes["bound"][case.name]
    assert node in case.allowed
    if case.best:
        assert node == case.best, f"best fit puts {case.name} on {case.best}, not {node}"


@pytest.mark.parametrize("case", [c for c in CASES if not c.allowed], ids=lambda c: c.name)
def test_each_unplaceable_pod_is_told_the_rule_that_stops_it(outcomes: dict[str, Any], case: Case):
    message = outcomes["failed"][case.name]
    assert message.startswith(f"0/{len(NODES)} nodes are available")
    for rule in case.rules:
        assert rule in message, f"{rule!r} not in {message!r}"


@pytest.mark.parametrize("case", [c for c in CASES if not c.allowed], ids=lambda c: c.name)
def test_explain_on_the_live_pod_agrees_with_the_scheduler(outcomes: dict[str, Any], case: Case):
    explained = outcomes["explained"][case.name]
    rows = {row["node"]: row for row in explained["nodes"]}
    assert set(rows) == ALL
    # Every node refused, by the extender's filter or by kube-scheduler's own count of nvidia.com/gpu,
    # which explain shows beside the extender's verdict.
    assert all(not row["passed"] or row["kube_scheduler"] for row in rows.values())
    reasons = " | ".join(row["reason"] or f"{row['kube_scheduler']} (kube-scheduler's count)" for row in rows.values())
    for rule in case.explained or case.rules:
        assert rule in reasons, f"{rule!r} not in {reasons!r}"


def test_no_node_holds_more_gpus_than_it_has(outcomes: dict[str, Any]):
    held: Counter[str] = Counter()
    for bound in outcomes["pods"]:
        if bound["spec"].get("nodeName"):
            held[bound["spec"]["nodeName"]] += gpus_of(bound)
    assert sum(held.values()) == 8 + sum(gpus_of(c.pod) for c in CASES if c.allowed)
    for node, gpus in held.items():
        assert gpus <= ALLOCATABLE[node], f"{node} holds {gpus} of {ALLOCATABLE[node]} GPUs"
