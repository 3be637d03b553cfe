"""The node-state refresher in watch mode (``WATCH_S``), on the real control plane, with S3 on moto's server.

Each invocation is its own ``gpu-scheduler refresh node-state --once --watch`` process, started on a
compressed schedule so that consecutive ones overlap as they do on Lambda (a 1-minute rate and a 75 s
watch; here 6 s and 9 s). What the extender sees is read as it reads it: a
:class:`~adapters.snapshot_store.SnapshotSource` re-checking the ETag every second.
"""

from __future__ import annotations

import time

import pytest

from adapters.gpu_ledger import LedgerStore
from adapters.snapshot_store import open_store
from scheduler_core.k8s.names import ASSIGNED_GPUS_ANNOTATION
from scheduler_core.simulator.synthetic import CATALOGUE, make_node, make_pod
from scheduler_core.state.ledger import Demand
from testing.control_plane import ControlPlane
from testing.lambda_watch import Schedule, probe, wait_stored
from testing.moto import dynamodb_client, s3_client
from testing.product import Processes
from tests.e2e.test_sharing import cli, wait_until

A100 = next(shape for shape in CATALOGUE if shape.model == "A100")
BUCKET, TABLE = "snapshots", "watch-ledger"


@pytest.fixture(scope="module")
def nodes(cluster: ControlPlane) -> list[str]:
    names = [f"watch-{i}" for i in range(3)]
    cluster.add_nodes([make_node(name, A100, "us-east-1a") for name in names])
    cluster.ensure_namespaces(["watch"])
    return names


@pytest.fixture
def bucket(moto_env: dict[str, str], request: pytest.FixtureRequest) -> str:
    """A snapshot URI of the test's own."""
    client = s3_client(moto_env["AWS_ENDPOINT_URL_S3"])
    if BUCKET not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
        client.create_bucket(Bucket=BUCKET)
    return f"s3://{BUCKET}/{request.node.name}.npz"


def test_watching_invocations_hand_over_and_keep_the_extender_within_seconds(
    cluster: ControlPlane, product: Processes, moto_env: dict[str, str], nodes: list[str], bucket: str
) -> None:
    store = open_store(bucket, s3_client=s3_client(moto_env["AWS_ENDPOINT_URL_S3"]))
    schedule = Schedule(product, cluster, moto_env, bucket, watch_s=9, period_s=6, count=4)
    wait_stored(store, 30)
    found = probe(cluster, store, namespace="watch", node=nodes[0], duration_s=20)
    reports = schedule.reports(timeout_s=60)

    assert found.missed == 0 and len(found.lags_s) >= 6, found.summary()
    assert max(found.lags_s) <= 10.0, f"the issue's bound for the Lambda path: {found.summary()}"
    assert found.went_back == [], "an older snapshot replaced a newer one"
    assert len(reports) == 4 and all(report["status"] == "ok" for report in reports)
    assert all(report["watch"]["publishes"] > 0 for report in reports[:3]), [r["watch"] for r in reports]


def test_a_share_pod_deleted_is_freed_in_the_ledger_by_the_watch(
    cluster: ControlPlane, product: Processes, moto_env: dict[str, str], nodes: list[str], bucket: str
) -> None:
    done = cli(["ledger", "create", "--table", TABLE], moto_env)
    assert done.returncode == 0, done.stderr
    ledger = LedgerStore(TABLE, dynamodb_client(moto_env["AWS_ENDPOINT_URL_DYNAMODB"]))
    pod = make_pod("share", 0, namespace="watch", milli=250, node_name=nodes[1])
    pod["metadata"]["annotations"] = {ASSIGNED_GPUS_ANNOTATION: "3:250"}
    created = cluster.api.request("POST", "/api/v1/namespaces/watch/pods", pod)
    uid = created["metadata"]["uid"]
    ledger.assign(nodes[1], 8, uid, Demand(1, 250))
    store = open_store(bucket, s3_client=s3_client(moto_env["AWS_ENDPOINT_URL_S3"]))
    schedule = Schedule(product, cluster, moto_env, bucket, watch_s=30, period_s=60, count=1,
                        extra=["--ledger-table", TABLE])  # fmt: skip
    wait_stored(store, 30)
    assert uid in held(ledger, nodes[1]), "the run's reconcile keeps a bound pod's share"
    time.sleep(1.0)  # the run is over: the watch is on
    cluster.delete_pod("watch", "share")
    freed_after = wait_until(lambda: uid not in held(ledger, nodes[1]), 10, "the share to be freed")
    product.stop(schedule.names[0])
    assert freed_after < 10


def held(ledger: LedgerStore, node: str) -> set[str]:
    items = {item.node: item for item in ledger.scan()}
    return set(items[node].assignments) if node in items else set()
