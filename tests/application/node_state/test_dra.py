"""The node-state refresher reads DRA on the API double, in the ``v1`` shapes of 1.34 (and ``v1beta2``'s):
every GPU a claim holds is in use in the snapshot, and a DRA node takes no share."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import numpy as np
import pytest

from scheduler_core.extender.view import node_view
from scheduler_core.extender.wire import ExtenderArgs
from scheduler_core.k8s.dra import dra_facts
from scheduler_core.k8s.pods import PodDemand
from scheduler_core.scoring.gpu_fit import Reason
from scheduler_core.state.readings import NoReadings
from testing.dra import allocated, device_classes, h200_devices, resource_slice
from testing.kube_double import KubeApiDouble
from tests.application.node_state.test_service import BUCKET, TOKEN, run, stored_snapshot
from tests.conftest import make_pod

pytestmark = pytest.mark.server  # the API server double, moto

NODES = ("h200-a", "h200-b", "h200-c")  # c: the device plugin only


def h200(name: str) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.memory": "143771",
              "nvidia.com/gpu.count": "8", "node.kubernetes.io/instance-type": "p5e.48xlarge"}  # fmt: skip
    return {"metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "190", "memory": "2000Gi"}}}  # fmt: skip


def claims(api: str) -> list[dict[str, Any]]:
    """One reserved, one allocated but not yet reserved, a firstAvailable sub-request's, two MIG devices of one
    GPU, and an admin-access claim (which holds nothing)."""
    fallback = allocated(api, "ml", "fallback", "h200-b", ["gpu-2"], reserved_for="trainer")
    fallback["status"]["allocation"]["devices"]["results"][0]["request"] = "gpu/whole"  # <request>/<sub-request>
    return [
        allocated(api, "ml", "reserved", "h200-a", ["gpu-0"], reserved_for="server"),
        allocated(api, "ml", "pending", "h200-a", ["gpu-1"]),
        fallback,
        allocated(api, "ml", "slice-1", "h200-a", ["gpu-7-mig-1g18gb-0"], reserved_for="notebook-1"),
        allocated(api, "ml", "slice-2", "h200-a", ["gpu-7-mig-1g18gb-5"], reserved_for="notebook-2"),
        allocated(api, "ml", "monitor", "h200-b", ["gpu-3"], admin=True),
    ]


def dra_api_double(api: str) -> KubeApiDouble:
    double = KubeApiDouble(tokens=[TOKEN], dra_api=api)
    double.load("nodes", [h200(name) for name in NODES])
    a = resource_slice(api, "h200-a", h200_devices("h200-a", 8, {7: ["1g.18gb"] * 7}))
    double.load("resourceslices", [a, resource_slice(api, "h200-b", h200_devices("h200-b", 8))])
    double.load("deviceclasses", device_classes(api))
    double.load("resourceclaims", claims(api))
    whole = make_pod("whole", 2, node_name="h200-b", phase="Running")  # the device plugin's, on a DRA node
    share = make_pod("share", 0, milli=250, node_name="h200-c", phase="Running")
    share["metadata"]["annotations"]["gpu-scheduler.io/assigned-gpus"] = "3:250"
    double.load("pods", [whole, share])
    return double


@pytest.fixture
def aws(aws_session: boto3.session.Session) -> boto3.session.Session:
    aws_session.client("s3").create_bucket(Bucket=BUCKET)
    return aws_session


@pytest.fixture(params=["resource.k8s.io/v1", "resource.k8s.io/v1beta2"])
def dra_api(request: pytest.FixtureRequest) -> Iterator[KubeApiDouble]:
    with dra_api_double(request.param) as double:
        yield double


def test_the_snapshot_counts_every_gpu_a_claim_holds_and_dra_nodes_refuse_shares(
    aws: Any, dra_api: KubeApiDouble
) -> None:
    report = run(aws, dra_api)
    assert report.status == "ok", report.error
    assert report.dra == {"api": dra_api.dra_api, "nodes": 2, "gpus_published": 16, "gpus_claimed": 4,
                          "extended_resource": False}  # fmt: skip
    snapshot = stored_snapshot(aws)
    rows = snapshot.table.rows_of(list(NODES))
    # allocatable - claims - whole-GPU pods - GPUs that shares hold
    assert snapshot.free_gpus[rows].tolist() == [8 - 3, 8 - 1 - 2, 8 - 1]
    assert snapshot.claimed_gpus[rows].tolist() == [3, 1, 0] and snapshot.whole_gpus[rows].tolist() == [0, 2, 0]
    held = snapshot.held_by_shares(rows)
    assert held is not None and held.tolist() == [3, 1, 1]
    nodes = [h200(name) for name in NODES]
    demand = PodDemand(gpus=6)
    view = node_view(snapshot, ExtenderArgs(pod={}, nodes=nodes), demand, NoReadings())
    verdict = view.filter(demand, held > 0)
    assert verdict.reason.tolist() == [Reason.TOO_FEW_FREE, Reason.TOO_FEW_FREE, Reason.FITS]
    share = PodDemand(share=500, milli_managed=True)
    view = node_view(snapshot, ExtenderArgs(pod={}, nodes=nodes), share, NoReadings())
    assert view.filter(share).reason.tolist() == [Reason.DRA_MANAGED, Reason.DRA_MANAGED, Reason.FITS]


def test_the_same_objects_read_straight_agree_with_the_run(aws: Any, dra_api: KubeApiDouble) -> None:
    run(aws, dra_api)
    api = dra_api.dra_api
    slices = [resource_slice(api, "h200-a", h200_devices("h200-a", 8, {7: ["1g.18gb"] * 7})),
              resource_slice(api, "h200-b", h200_devices("h200-b", 8))]  # fmt: skip
    facts = dra_facts(slices, claims(api), device_classes(api))
    snapshot = stored_snapshot(aws)
    rows = snapshot.table.rows_of(list(NODES))
    assert snapshot.claimed_gpus[rows].tolist() == [facts.claimed.get(n, 0) for n in NODES]
    assert snapshot.dra_gpus[rows].tolist() == [facts.published.get(n, 0) for n in NODES]


def test_without_dra_served_nothing_of_it_is_read(aws: Any) -> None:
    with dra_api_double("") as double:
        report = run(aws, double)
    assert report.status == "ok" and report.dra == {}
    snapshot = stored_snapshot(aws)
    assert snapshot.dra_gpus is None and snapshot.claimed_gpus is None
    assert snapshot.free_gpus[snapshot.table.rows_of(list(NODES))].tolist() == [8, 6, 7]
    paths = {r.path for r in double.requests}
    assert "/apis/resource.k8s.io" in paths and not any(p.startswith("/apis/resource.k8s.io/") for p in paths)


def test_a_list_of_claims_that_fails_fails_the_run_and_keeps_the_snapshot(aws: Any) -> None:
    with dra_api_double("resource.k8s.io/v1") as double:
        assert run(aws, double).status == "ok"
        before = stored_snapshot(aws)
        double.fail_next("GET", r"/resourceclaims", 403, times=10)
        report = run(aws, double)
    assert report.status == "failed" and "listing the cluster failed" in report.error
    assert np.array_equal(stored_snapshot(aws).claimed_gpus, before.claimed_gpus)
