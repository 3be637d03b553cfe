"""GPU sharing through the real kube-scheduler: the bind and preempt verbs, on the GPU ledger in moto's
server, under ``gpu-scheduler scheduler-config --sharing``.

``gpu-scheduler ledger create`` makes the table and ``gpu-scheduler serve --watch --ledger-table``
serves every verb. Each test works in its own namespace and leaves the ledger empty behind it.

Preemption is shown with whole GPUs: kube-scheduler finds victims with its own filter plugins, which
do not count ``gpu-scheduler.io/gpu-milli`` (NodeResourcesFit ignores it), so for a share it finds
nothing to evict and never asks the extender (docs/sharing.md, "preempt").
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from adapters.gpu_ledger import LedgerStore
from scheduler_core.simulator.synthetic import CATALOGUE, make_node, make_pod
from testing.bind_watch import BindWatch
from testing.control_plane import ControlPlane
from testing.moto import dynamodb_client
from testing.product import requests_served, share_usage
from tests.e2e.conftest import ServeSharing, start_scheduler

SHAPE = {shape.model: shape for shape in CATALOGUE}
TABLE = "gpu-ledger"
NODES = [
    *(make_node(f"a100-{i}", SHAPE["A100"], zone) for i, zone in enumerate(("us-east-1a", "us-east-1b", "us-east-1c"))),
    make_node("l40s-0", SHAPE["L40S"], "us-east-1a"),
    make_node("h100-0", SHAPE["H100"], "us-east-1b"),
]
# An H200 node under the device plugin's single MIG strategy: its 56 nvidia.com/gpu are 1g.18gb slices.
SINGLE = make_node("h200-single", SHAPE["H100"], "us-east-1c")
SINGLE["metadata"]["labels"] |= {
    "nvidia.com/mig.strategy": "single", "nvidia.com/gpu.product": "NVIDIA-H200-MIG-1g.18gb",
    "nvidia.com/gpu.memory": "16384", "nvidia.com/gpu.count": "56", "gpu.nvidia.com/model": "H200",
}  # fmt: skip
SINGLE["status"]["allocatable"]["nvidia.com/gpu"] = SINGLE["status"]["capacity"]["nvidia.com/gpu"] = "56"
NODES.append(SINGLE)


def cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpu_scheduler", *args], capture_output=True, text=True, timeout=60, env=env
    )


def share(name: str, milli: int, model: str, namespace: str) -> dict[str, Any]:
    pod = make_pod(name, 0, namespace=namespace, models=model, milli=milli)
    pod["spec"]["containers"][0]["resources"]["requests"].update(cpu="100m", memory="64Mi")
    return pod


def whole(name: str, gpus: int, model: str, namespace: str, **spec: Any) -> dict[str, Any]:
    pod = make_pod(name, gpus, namespace=namespace, models=model)
    pod["spec"]["containers"][0]["resources"]["requests"].update(cpu="100m", memory="64Mi")
    pod["spec"].update(spec)
    return pod


@pytest.fixture(scope="module")
def ledger(moto_env: dict[str, str]) -> LedgerStore:
    done = cli(["ledger", "create", "--table", TABLE], moto_env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"table": TABLE, "created": True}
    return LedgerStore(TABLE, dynamodb_client(moto_env["AWS_ENDPOINT_URL_DYNAMODB"]))


@pytest.fixture(scope="module")
def serve_url(cluster: ControlPlane, ledger: LedgerStore, serve_sharing: ServeSharing) -> Iterator[str]:
    cluster.add_nodes(NODES)
    url, config = serve_sharing(TABLE)
    extender, binder = config["extenders"]  # the bind has its own entry: it may wait for a GPU's UUID
    assert (binder["bindVerb"], extender["preemptVerb"]) == ("bind", "preempt")
    yield url
    cluster.stop_scheduler()


@pytest.fixture
def namespace(request: pytest.FixtureRequest, cluster: ControlPlane, ledger: LedgerStore) -> Iterator[str]:
    """A namespace of the test's own; after it, its pods are gone and the ledger holds nothing."""
    name = request.node.name.removeprefix("test_").replace("_", "-")[:60].rstrip("-")
    cluster.ensure_namespaces([name])
    yield name
    cluster.delete_namespace_pods(name)
    wait_until(lambda: not any(item.assignments for item in ledger.scan()), 10, "the ledger to empty")


def wait_until(condition: Any, timeout_s: float, what: str) -> float:
    """Seconds until ``condition()`` held; an error naming ``what`` after ``timeout_s``."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")
        time.sleep(0.1)
    return time.monotonic() - started


def all_bound(cluster: ControlPlane, namespace: str, count: int) -> bool:
    pods = cluster.pods(namespace)
    return len(pods) == count and all(p["spec"].get("nodeName") for p in pods)


def test_ledger_create_is_idempotent_and_show_prints_every_item(ledger: LedgerStore, moto_env: dict[str, str]):
    again = cli(["ledger", "create", "--table", TABLE], moto_env)
    assert again.returncode == 0 and json.loads(again.stdout) == {"table": TABLE, "created": False}
    shown = cli(["ledger", "show", "--table", TABLE], moto_env)
    assert shown.returncode == 0, shown.stderr
    assert [json.loads(line)["node"] for line in shown.stdout.splitlines()] == sorted(i.node for i in ledger.scan())
    no_region = cli(["ledger", "show", "--table", TABLE], {k: v for k, v in moto_env.items() if "REGION" not in k})
    assert no_region.returncode == 2 and "no AWS region" in no_region.stderr


def test_a_burst_of_shares_packs_with_no_gpu_over_1000_milli_and_the_ledger_equal_to_the_annotations(
    cluster: ControlPlane, serve_url: str, ledger: LedgerStore, namespace: str
):
    pods = [share(f"s{milli}-{i}", milli, "A100", namespace) for milli in (250, 500, 750) for i in range(8)]
    before = requests_served(serve_url)
    cluster.create_pods(pods)
    wait_until(lambda: all_bound(cluster, namespace, len(pods)), 60, "every share to bind")
    usage = share_usage(cluster.pods(namespace), ledger.scan())
    assert usage["gpus_over_1000_milli"] == 0
    assert usage["bound_without_annotation"] == 0
    assert usage["ledger_equals_annotations"], usage
    # 8 x (250 + 500 + 750) milli is 12 GPUs when each 750 gets a 250 beside it. The pods arrive in any
    # order; the worst one for best fit (the 250s first, then the 500s, then the 750s) takes 14.
    assert usage["gpus_used"] <= 14, usage
    assert requests_served(serve_url)["bind"] - before["bind"] >= len(pods)

    # Half of them go: their shares are free in the ledger within 10 s, with nothing else released.
    for pod in pods[::2]:
        cluster.delete_pod(namespace, pod["metadata"]["name"])
    wait_until(lambda: len(cluster.pods(namespace)) == len(pods) // 2, 30, "the deletions")
    freed_in = wait_until(
        lambda: share_usage(cluster.pods(namespace), ledger.scan())["ledger_equals_annotations"], 10, "the release"
    )
    assert freed_in <= 10


def test_a_share_that_fits_only_after_a_deletion_binds_within_10_s(
    cluster: ControlPlane, serve_url: str, namespace: str
):
    # kube-scheduler 1.33 retries the refused pod the moment the deletion reaches its informer, before
    # serve's state is rebuilt: filter waits for the deletion to be in its state (LiveState.catch_up)
    # instead of refusing again, after which the pod would wait for some later event (1.33.3 without
    # the wait: 10 to 15 s here, and in a quiet cluster up to the 5-minute flush).
    # l40s-0 is the only L40S node: eight half-GPU shares fill its four GPUs.
    cluster.create_pods([share(f"half-{i}", 500, "L40S", namespace) for i in range(8)])
    wait_until(lambda: all_bound(cluster, namespace, 8), 60, "the eight halves to bind")
    cluster.create_pods([share("waiting", 500, "L40S", namespace)])
    message = cluster.wait_failed(namespace, "waiting")
    assert "none of 4 GPUs has 500 milli free (the pod's share)" in message
    deleted_at = time.monotonic()
    cluster.delete_pod(namespace, "half-3")
    assert cluster.wait_bound(namespace, "waiting", timeout_s=10) == "l40s-0"
    assert time.monotonic() - deleted_at <= 10


def test_a_whole_gpu_pod_is_refused_where_shares_hold_gpus_by_kube_schedulers_own_count(
    cluster: ControlPlane, serve_url: str, ledger: LedgerStore, namespace: str
):
    cluster.create_pods([share("half", 500, "L40S", namespace)])
    assert cluster.wait_bound(namespace, "half") == "l40s-0"
    # The share's GPU has its reservation pod (nvidia.com/gpu: 1): kube-scheduler itself sees 3 of 4 free.
    cluster.create_pods([whole("four", 4, "L40S", namespace)])
    assert "1 Insufficient nvidia.com/gpu" in cluster.wait_failed(namespace, "four")
    # Whole-GPU pods the bind records are counted once, on the GPUs their annotation names: after one
    # GPU for "one", two are left for "two" (counted twice, "two" would be refused with 1 free).
    cluster.create_pods([whole("one", 1, "L40S", namespace)])
    assert cluster.wait_bound(namespace, "one") == "l40s-0"
    cluster.create_pods([whole("two", 2, "L40S", namespace)])
    assert cluster.wait_bound(namespace, "two") == "l40s-0"
    usage = share_usage([p for p in cluster.pods(namespace) if p["metadata"]["name"] != "four"], ledger.scan())
    assert usage["gpus_used"] == 4 and usage["gpus_over_1000_milli"] == 0 and usage["ledger_equals_annotations"]


def test_a_share_is_never_placed_on_a_mig_slice(cluster: ControlPlane, serve_url: str, namespace: str) -> None:
    """The only H200 node's GPUs are MIG slices (single strategy): a share of an H200 stays pending, told why,
    and its node holds no reservation pod; a whole H200 pod that accepts slices binds there."""
    cluster.create_pods([share("quarter-h200", 250, "H200", namespace)])
    assert "a slice takes no gpu-scheduler.io/gpu-milli share" in cluster.wait_failed(namespace, "quarter-h200")
    taker = whole("slice-taker", 1, "H200", namespace)
    taker["metadata"]["annotations"]["gpu-scheduler.io/accept-mig-slices"] = "true"
    cluster.create_pods([taker])
    assert cluster.wait_bound(namespace, "slice-taker") == "h200-single"
    reservations = cluster.pods("gpu-scheduler-reservations")
    assert not [p for p in reservations if p["spec"].get("nodeName") == "h200-single"]


def test_a_preemption_nominates_the_node_and_the_preemptor_binds_once_the_victim_is_gone(
    cluster: ControlPlane, serve_url: str, ledger: LedgerStore, namespace: str
):
    for name, value in (("e2e-low", 0), ("e2e-high", 1000)):
        cluster.api.request(
            "POST", "/apis/scheduling.k8s.io/v1/priorityclasses",
            {"metadata": {"name": name}, "value": value}, ok=(200, 201, 409),
        )  # fmt: skip
    # No kubelet confirms a graceful termination: the victim goes at once.
    victim = whole("victim", 8, "H100", namespace, priorityClassName="e2e-low", terminationGracePeriodSeconds=0)
    cluster.create_pods([victim])
    assert cluster.wait_bound(namespace, "victim") == "h100-0"
    victim_uid = cluster.pod(namespace, "victim")["metadata"]["uid"]
    watch = BindWatch(cluster.api, namespace)
    before = requests_served(serve_url)
    try:
        cluster.create_pods([whole("preemptor", 8, "H100", namespace, priorityClassName="e2e-high")])
        assert cluster.wait_bound(namespace, "preemptor", timeout_s=60) == "h100-0"
    finally:
        watch.close()
    assert watch.nominated.get("preemptor") == "h100-0"
    assert requests_served(serve_url)["preempt"] > before["preempt"]
    assert [p["metadata"]["name"] for p in cluster.pods(namespace)] == ["preemptor"]
    (item,) = [item for item in ledger.scan() if item.node == "h100-0"]
    preemptor_uid = cluster.pod(namespace, "preemptor")["metadata"]["uid"]
    assert set(item.assignments) == {preemptor_uid} and victim_uid not in item.assignments


def bind_request(url: str, pod: dict[str, Any], node: str) -> dict[str, Any]:
    """POST /bind to serve, as anyone who reaches it could."""
    import urllib.request

    meta = pod["metadata"]
    body = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}
    request = urllib.request.Request(f"{url}/bind", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        reply: dict[str, Any] = json.loads(response.read())
    return reply


def test_a_pod_of_another_scheduler_cannot_be_bound_through_the_bind_verb(
    cluster: ControlPlane, serve_url: str, ledger: LedgerStore, namespace: str
):
    outsider = share("outsider", 250, "A100", namespace)
    outsider["spec"]["schedulerName"] = "someone-else"  # no scheduler here places it
    cluster.create_pods([outsider])
    reply = bind_request(serve_url, cluster.pod(namespace, "outsider"), "a100-0")
    assert "not scheduled by 'gpu-scheduler'" in reply["Error"]
    stored = cluster.pod(namespace, "outsider")
    assert not stored["spec"].get("nodeName") and "gpu-scheduler.io/assigned-gpus" not in (
        stored["metadata"].get("annotations") or {}
    )
    assert not any(item.assignments for item in ledger.scan())


def test_two_concurrent_binds_of_one_pod_leave_one_placement_and_its_annotation(
    cluster: ControlPlane, serve_url: str, ledger: LedgerStore, namespace: str
):
    import threading

    cluster.stop_scheduler()  # only the two /bind calls may place these pods (bind checks what kube-scheduler does)
    try:
        for trial in range(5):
            pod = share(f"raced-{trial}", 250, "A100", namespace)
            cluster.create_pods([pod])
            live = cluster.pod(namespace, pod["metadata"]["name"])
            replies: dict[str, dict[str, Any]] = {}

            def bind(node: str, live: dict[str, Any] = live, replies: dict[str, Any] = replies) -> None:
                replies[node] = bind_request(serve_url, live, node)

            threads = [threading.Thread(target=bind, args=(node,)) for node in ("a100-0", "a100-1")]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            stored = cluster.pod(namespace, pod["metadata"]["name"])
            node = stored["spec"]["nodeName"]
            assert [n for n, reply in replies.items() if reply["Error"] == ""] == [node], replies
            uid = stored["metadata"]["uid"]
            holders = {item.node: dict(item.assignments)[uid] for item in ledger.scan() if uid in item.assignments}
            assert list(holders) == [node]  # the losing bind released its entry
            annotation = stored["metadata"]["annotations"]["gpu-scheduler.io/assigned-gpus"]
            assert annotation == ",".join(f"{gpu}:{milli}" for gpu, milli in holders[node])
    finally:
        start_scheduler(cluster, serve_url, "--sharing")  # as the module's fixture left it
