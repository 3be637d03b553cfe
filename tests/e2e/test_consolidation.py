"""The consolidator through the real kube-scheduler and kube-controller-manager: Pending pods bind after
its moves, the replacements land where its plan said, and what may not be moved stays.

Six 8-GPU nodes, their pods placed before the scheduler runs and adopted by ReplicaSets (the
controller-manager recreates what is evicted), marked Running and Ready as a kubelet would:

- ``h100-0``: six one-GPU replicas of ``train`` (movable);
- ``h100-1``: two of ``infer`` (movable): the cheapest node to empty for an 8-GPU pod, two moves;
- ``h100-2``, ``h100-3``, ``h100-4``: one replica each, which would be cheaper still (one move) but may not
  move: ``pinned`` is marked ``karpenter.sh/do-not-disrupt``, ``guarded`` is under a PodDisruptionBudget
  that allows no disruption, ``static`` did not opt in;
- ``a100-0``, the only A100: eight replicas of ``batch`` (movable, any model).

Pending: ``big`` (8 GPUs, any model) and ``a100-job`` (one GPU, A100 only). No node fits either, though
the cluster has 23 free GPUs. ``gpu-scheduler serve --watch --holds FILE`` is the extender, as the second
scheduler's identity; ``gpu-scheduler consolidate`` runs as the consolidator's own (its RBAC and its
admission policy, as ``scheduler-config --consolidation`` generates them).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler_core.k8s.names import DO_NOT_DISRUPT_ANNOTATION, LABEL_MODEL, MOVABLE_LABEL
from scheduler_core.simulator.synthetic import CATALOGUE, make_node
from testing.control_plane import ControlPlane
from testing.kube_rest import KubeError
from testing.product import Processes
from tests.e2e.conftest import start_scheduler

NAMESPACE = "ml"
SHAPE = {shape.model: shape for shape in CATALOGUE}
NODES = [make_node(f"h100-{i}", SHAPE["H100"], "us-east-1a") for i in range(5)]
NODES.append(make_node("a100-0", SHAPE["A100"], "us-east-1a"))
# name: (node, replicas, movable, annotations)
WORKLOADS: dict[str, tuple[str, int, bool, dict[str, str]]] = {
    "train": ("h100-0", 6, True, {}),
    "infer": ("h100-1", 2, True, {}),
    "pinned": ("h100-2", 1, True, {DO_NOT_DISRUPT_ANNOTATION: "true"}),
    "guarded": ("h100-3", 1, True, {}),
    "static": ("h100-4", 1, False, {}),
    "batch": ("a100-0", 8, True, {}),
}
KEPT = ("pinned", "guarded", "static")


def template(app: str, gpus: int = 1) -> dict[str, Any]:
    """A pod's metadata and spec as its ReplicaSet's template has them."""
    _node, _replicas, movable, annotations = WORKLOADS.get(app, ("", 0, False, {}))
    labels = {"app": app, **({MOVABLE_LABEL: "true"} if movable else {})}
    resources = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"nvidia.com/gpu": str(gpus)}}
    return {
        "metadata": {"labels": labels, "annotations": dict(annotations)},
        "spec": {
            "schedulerName": "gpu-scheduler", "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "busybox", "resources": resources}],
        },
    }  # fmt: skip


def replica_set(app: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": app, "namespace": NAMESPACE},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": app}}, "template": template(app)},
    }  # fmt: skip


def pending_pod(name: str, gpus: int, model: str = "") -> dict[str, Any]:
    made = template(name, gpus)
    if model:
        made["metadata"]["annotations"][LABEL_MODEL] = model
    return {"metadata": {"name": name, "namespace": NAMESPACE, **made["metadata"]}, "spec": made["spec"]}


@pytest.fixture(scope="module")
def fragmented(cluster: ControlPlane, product: Processes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The cluster of the module docstring with ``big`` and ``a100-job`` refused; the holds file's path."""
    holds = tmp_path_factory.mktemp("holds") / "holds.json"
    cluster.add_nodes(NODES)
    cluster.start_controller_manager()
    kubeconfig = str(cluster.kubeconfig_of("scheduler"))
    url = product.serve("serve", ["--watch", "--kubeconfig", kubeconfig, "--holds", str(holds)])
    start_scheduler(cluster, url)
    cluster.ensure_namespaces([NAMESPACE])
    running = []
    for app, (node, replicas, _movable, _annotations) in WORKLOADS.items():
        for k in range(replicas):
            made = template(app)
            made["metadata"]["name"] = f"{app}-{k}"
            made["metadata"]["namespace"] = NAMESPACE
            made["spec"]["nodeName"] = node
            running.append(made)
    cluster.create_pods(running)
    for made in running:
        cluster.mark_running(NAMESPACE, made["metadata"]["name"])
    for app, (_node, replicas, _movable, _annotations) in WORKLOADS.items():
        cluster.api.request("POST", f"/apis/apps/v1/namespaces/{NAMESPACE}/replicasets", replica_set(app, replicas))
    budget = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "guarded"},
              "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "guarded"}}}}  # fmt: skip
    cluster.api.request("POST", f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets", budget)
    cluster.wait_for(lambda: all(p["metadata"].get("ownerReferences") for p in cluster.pods(NAMESPACE)), 60,
                     "the ReplicaSets to adopt their pods")  # fmt: skip
    cluster.create_pods([pending_pod("big", 8), pending_pod("a100-job", 1, "A100")])
    for name in ("big", "a100-job"):
        cluster.wait_for(lambda name=name: _unschedulable(cluster.pod(NAMESPACE, name)), 60, f"{name} refused")
    yield holds
    cluster.stop_scheduler()


def _unschedulable(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions)


def consolidate(cluster: ControlPlane, *flags: str) -> tuple[dict[str, Any], str]:
    """``gpu-scheduler consolidate FLAGS`` as the consolidator: its report and what it printed before it."""
    done = subprocess.run(
        [sys.executable, "-m", "gpu_scheduler", "consolidate", "--kubeconfig",
         str(cluster.kubeconfig_of("consolidator")), *flags],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    *text, last = done.stdout.splitlines()
    report: dict[str, Any] = json.loads(last)
    return report, "\n".join(text)


def placement(cluster: ControlPlane) -> dict[str, tuple[str, str]]:
    """Every pod of the namespace: uid -> (name, node)."""
    return {
        p["metadata"]["uid"]: (p["metadata"]["name"], p["spec"].get("nodeName") or "") for p in cluster.pods(NAMESPACE)
    }


def test_the_dry_run_prints_the_plan_and_changes_nothing(cluster: ControlPlane, fragmented: Path):
    before = placement(cluster)

    report, text = consolidate(cluster, "--dry-run", "--max-moves-per-run", "3")

    assert report["status"] == "ok" and report["dry_run"], report
    plans = {plan["pod"]: plan for plan in report["plans"]}
    assert set(plans) == {f"{NAMESPACE}/big", f"{NAMESPACE}/a100-job"}, json.dumps(report)
    assert plans[f"{NAMESPACE}/big"]["node"] == "h100-1"
    assert sorted(m["pod"] for m in plans[f"{NAMESPACE}/big"]["moves"]) == [
        f"{NAMESPACE}/infer-0",
        f"{NAMESPACE}/infer-1",
    ]
    assert plans[f"{NAMESPACE}/a100-job"]["node"] == "a100-0"
    assert [m["owner"] for m in plans[f"{NAMESPACE}/a100-job"]["moves"]] == ["ReplicaSet/batch"]
    assert report["unmovable"] == {
        "marked karpenter.sh/do-not-disrupt": 1,
        "a PodDisruptionBudget allows no disruption": 1,
        f'not opted in (label {MOVABLE_LABEL}: "true")': 1,
    }, report
    assert "move ml/infer-0 (ReplicaSet/infer) h100-1 ->" in text and "makes room on h100-1 for ml/big" in text, text
    assert placement(cluster) == before
    assert not fragmented.exists()


def test_after_the_moves_both_pods_bind_where_the_plan_said_and_the_replacements_land_where_it_sent_them(
    cluster: ControlPlane, fragmented: Path
):
    before = placement(cluster)
    kept = {uid: where for uid, where in before.items() if where[0].rsplit("-", 1)[0] in KEPT}

    report, _ = consolidate(cluster, "--holds", str(fragmented), "--settle-s", "2", "--max-moves-per-run", "3")

    assert report["status"] == "ok" and report["evictions"] == 3 and report["evictions_refused"] == 0, report
    plans = {plan["pod"].split("/")[1]: plan for plan in report["plans"]}
    for name, plan in plans.items():
        assert cluster.wait_bound(NAMESPACE, name, timeout_s=90) == plan["node"]
    moves = [move for plan in plans.values() for move in plan["moves"]]
    for move in moves:
        owner = move["owner"].split("/")[1]
        cluster.wait_for(lambda owner=owner, move=move: _replacement_on(cluster, owner, before, move["destination"]),
                         60, f"{move['pod']}'s replacement on {move['destination']}")  # fmt: skip
    after = placement(cluster)
    evicted = {move["pod"].split("/")[1] for move in moves}
    assert not evicted & {name for name, _node in after.values()}
    assert {uid: after.get(uid) for uid in kept} == kept, "a pod that may not move was moved"


def _replacement_on(cluster: ControlPlane, owner: str, before: dict[str, tuple[str, str]], node: str) -> bool:
    new = [
        p for p in cluster.pods(NAMESPACE)
        if p["metadata"]["uid"] not in before and p["metadata"].get("labels", {}).get("app") == owner
    ]  # fmt: skip
    return any(p["spec"].get("nodeName") == node for p in new) and all(p["spec"].get("nodeName") for p in new)


def test_a_second_run_with_nothing_pending_moves_nothing_and_counts_the_holds_kept(
    cluster: ControlPlane, fragmented: Path
):
    before = placement(cluster)

    report, _ = consolidate(cluster, "--holds", str(fragmented))

    assert report["status"] == "ok" and report["pending"] == 0 and report["evictions"] == 0, report
    assert report["plans"] == [] and report["holds_kept"] == 2 and report["holds_lapsed"] == 0, report
    assert placement(cluster) == before
    assert json.loads(fragmented.read_text())["holds"] == []


def test_with_nothing_pending_it_empties_a_node_and_every_replacement_lands_where_the_plan_sent_it(
    cluster: ControlPlane, fragmented: Path
):
    """``--empty-nodes 1``: the one node whose every pod may move (``h100-0``) is emptied for an autoscaler to
    remove; the replacements go where the plan said, and nothing of the profile lands back on it."""
    before = placement(cluster)
    budget = ("--max-moves-per-run", "10", "--max-moves-per-plan", "10", "--max-moves-per-hour", "50")

    report, _ = consolidate(cluster, "--holds", str(fragmented), "--settle-s", "2", "--empty-nodes", "1", *budget)

    assert report["status"] == "ok" and report["plans"] == [], report
    (emptied,) = report["emptied"]
    assert emptied["node"] == "h100-0" and report["evictions"] == len(emptied["moves"]) >= 6, report
    sent = sorted(m["destination"] for m in emptied["moves"])

    def settled() -> bool:
        new = [p for p in cluster.pods(NAMESPACE) if p["metadata"]["uid"] not in before]
        return len(new) == len(sent) and sorted(p["spec"].get("nodeName") or "" for p in new) == sent

    cluster.wait_for(settled, 90, "every replacement on the node the plan sent it to")
    assert not [name for name, node in placement(cluster).values() if node == "h100-0"]


@pytest.mark.parametrize(
    ("options", "namespace", "refusal"),
    [
        ({}, NAMESPACE, "by its UID"),
        ({"preconditions": {"uid": "x"}, "gracePeriodSeconds": 0}, NAMESPACE, "termination grace period"),
        ({"preconditions": {"uid": "x"}}, "kube-system", "evicts no pod in kube-system"),
    ],
)
def test_the_admission_policy_keeps_the_consolidators_evictions_to_their_shape(
    cluster: ControlPlane, fragmented: Path, options: dict[str, Any], namespace: str, refusal: str
):
    static = next(p for p in cluster.pods(NAMESPACE) if p["metadata"]["name"] == "static-0")
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "static-0", "namespace": namespace},
            "deleteOptions": options}  # fmt: skip
    with pytest.raises(KubeError) as refused:
        cluster.api_as("consolidator").request("POST", f"/api/v1/namespaces/{namespace}/pods/static-0/eviction", body)
    assert refused.value.status == 403 and refusal in str(refused.value), refused.value
    assert cluster.pod(NAMESPACE, "static-0")["metadata"]["uid"] == static["metadata"]["uid"]
