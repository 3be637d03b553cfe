"""What the extender believes about the cluster cannot be forged by a tenant (issue: "Safe to deploy"):
an ``assigned-gpus`` annotation counts only on a pod this scheduler placed that requests that much
GPU; a snapshot dated in the future is refused; ``/healthz`` names no bucket or table."""

from __future__ import annotations

import io
import json
import time
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from adapters.snapshot_store import MAX_CLOCK_SKEW_S, SnapshotSource, open_store
from scheduler_core.errors import ClusterStateUnavailableError
from scheduler_core.extender.preemption import victim_frees
from scheduler_core.k8s.names import ASSIGNED_GPUS_ANNOTATION
from scheduler_core.state.cluster import ClusterState
from scheduler_core.state.snapshot import SnapshotFormatError, build_snapshot, read_snapshot, write_snapshot
from tests.conftest import make_pod
from tests.scheduler_core.k8s.test_mig import nodes
from tests.security.conftest import BUCKET, KEY, cluster_nodes

pytestmark = pytest.mark.server  # the API server double, moto

EVERY_GPU = ",".join(f"{gpu}:1000" for gpu in range(8))


def forged(
    name: str, gpus: int = 0, milli: int = 0, assigned: str = EVERY_GPU, scheduler: str = "gpu-scheduler"
) -> Any:
    pod = make_pod(name, gpus, milli=milli, node_name="a100-1", phase="Running")
    pod["spec"]["schedulerName"] = scheduler
    pod["metadata"]["annotations"][ASSIGNED_GPUS_ANNOTATION] = assigned
    return pod


def test_a_cpu_only_pod_cannot_zero_a_nodes_gpus() -> None:
    state = ClusterState.from_objects(cluster_nodes(), [forged("cpu-only")])
    assert int(state.free_gpus[state.table.index["a100-1"]]) == 8
    assert any("assigned-gpus ignored: the pod requests no GPU" in p for p in state.problems)


def test_a_forged_annotation_takes_no_more_than_the_pod_requests() -> None:
    hostile = [
        forged("other-scheduler", gpus=1, scheduler="default-scheduler"),
        forged("claims-more", gpus=1),  # asks for one GPU, claims all eight
        forged("whole-in-parts", gpus=1, assigned="0:500,1:500"),
    ]
    state = ClusterState.from_objects(cluster_nodes(), hostile)
    assert int(state.free_gpus[state.table.index["a100-1"]]) == 5  # one GPU each, as kube-scheduler counts them
    ignored = [p for p in state.problems if "assigned-gpus ignored" in p]
    assert len(ignored) == 3 and any("not scheduled by 'gpu-scheduler'" in p for p in ignored)
    assert any("assigns 8000 milli and the pod requests 1000" in p for p in ignored)
    assert any("requests whole GPUs and it assigns parts" in p for p in ignored)


def test_the_annotation_of_a_pod_this_scheduler_placed_still_counts() -> None:
    share = forged("share", milli=250, assigned="3:250")
    state = ClusterState.from_objects(cluster_nodes(), [share])
    assert not state.problems and int(state.free_gpus[state.table.index["a100-1"]]) == 7


def test_a_forged_annotation_does_not_tell_preempt_that_a_victim_frees_a_node() -> None:
    assert not victim_frees("u", "a100-1", {}, forged("cpu-only")).known
    assert victim_frees("u", "a100-1", {}, forged("share", milli=250, assigned="3:250")).pairs == ((3, 250),)


def test_the_reconcile_never_copies_a_forged_annotation_into_the_ledger(aws_session: Any) -> None:
    """The node-state refresher's run, with its ledger reconcile, over a forged pod and a true share."""
    from adapters.ec2_gpu import GpuInfoCatalog
    from adapters.gpu_ledger import LedgerStore
    from adapters.kube import connect_url
    from application.node_state import service
    from application.node_state.settings import NodeStateSettings
    from bench.ledger import TABLE, create_table
    from testing.kube_double import KubeApiDouble

    aws_session.client("s3").create_bucket(Bucket=BUCKET)
    create_table(aws_session.client("dynamodb"))
    ledger = LedgerStore(TABLE, aws_session.client("dynamodb"))
    uri = f"s3://{BUCKET}/{KEY}"
    with KubeApiDouble(tokens=["t"]) as api:
        api.load("nodes", cluster_nodes())
        api.load("pods", [forged("cpu-only"), forged("share", milli=250, assigned="3:250")])
        services = service.Services(
            kube=connect_url(api.url, "t", sleep=lambda _s: None),
            store=open_store(uri, s3_client=aws_session.client("s3")),
            catalog=GpuInfoCatalog(aws_session.client("ec2")),
            prometheus=None,
            ledger=ledger,
        )
        report = service.refresh(
            NodeStateSettings(cluster_name="prod", snapshot_uri=uri), services, time_left=lambda: 900.0
        )
    assert report.ledger_error == ""
    assert ledger.read("a100-1", 8).used == (0, 0, 0, 250, 0, 0, 0, 0)  # the share, and nothing forged


def test_a_snapshot_dated_in_the_future_is_refused(aws_session: Any) -> None:
    s3 = aws_session.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    ahead = time.time() + 10 * MAX_CLOCK_SKEW_S
    s3.put_object(
        Bucket=BUCKET,
        Key=KEY,
        Body=write_snapshot(build_snapshot(cluster_nodes(), [], cluster="prod", generated_at=ahead)),
    )
    source = SnapshotSource(open_store(f"s3://{BUCKET}/{KEY}", s3_client=s3))
    with pytest.raises(ClusterStateUnavailableError, match="in the future") as refused:
        source.current()
    assert refused.value.kind == "corrupt"
    skewed = time.time() + MAX_CLOCK_SKEW_S / 2  # a little skew between two clocks is fine
    s3.put_object(
        Bucket=BUCKET,
        Key=KEY,
        Body=write_snapshot(build_snapshot(cluster_nodes(), [], cluster="prod", generated_at=skewed)),
    )
    assert SnapshotSource(open_store(f"s3://{BUCKET}/{KEY}", s3_client=s3)).current().table.n_nodes == 3


def test_healthz_says_what_is_configured_without_naming_it(aws_session: Any, fresh_handler: Any, capsys: Any) -> None:
    from tests.conftest import FakeLambdaContext, api_gateway_event

    s3 = aws_session.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    handler = fresh_handler("lambdas.extender.handler", SNAPSHOT_URI=f"s3://{BUCKET}/{KEY}")
    response = handler.lambda_handler(api_gateway_event("GET", "/healthz"), FakeLambdaContext())
    capsys.readouterr()
    body = json.loads(response["body"])
    assert body["snapshot"] is True and body["ledger"] is False
    assert BUCKET not in response["body"] and KEY not in response["body"]


def test_a_bound_pod_with_a_bad_mig_resource_counts_nothing_and_is_reported() -> None:
    """A tenant's pod with a garbled MIG request takes no slice in the state; the problem names it."""
    pod = make_pod("garbled", 0, node_name="a100-1", phase="Running")
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.5gb"] = "9" * 50
    state = ClusterState.from_objects(cluster_nodes(), [pod])
    assert any("garbled" in problem and "nvidia.com/mig-1g.5gb" in problem for problem in state.problems)
    assert state.mig_used is not None and not state.mig_used.any()


def test_a_bad_mig_name_on_a_gpu_pod_loses_its_slices_not_its_gpu_or_cpu() -> None:
    """The pod's whole GPU and CPU still count where it runs; only its MIG request is dropped, and said."""
    pod = make_pod("odd-mig", 1, node_name="a100-1", phase="Running")
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.5gb.gfx"] = "1"
    state = ClusterState.from_objects(cluster_nodes(), [pod])
    row = state.table.index["a100-1"]
    assert state.used_gpus[row] == 1 and state.free_cpu is not None
    assert any("odd-mig" in p and "its MIG slices are not counted" in p for p in state.problems)


@pytest.mark.parametrize(
    ("member", "value", "complaint"),
    [
        ("mig_profiles_json", b'["1g.18gb", "1g.18gb", "3g.71gb"]', "distinct MIG profile names"),
        ("mig_profiles_json", b'["huge", "2g.35gb", "3g.71gb"]', "distinct MIG profile names"),
        ("mig_mode", np.array([0, 2, 1.5, 3, 4]), "MIG modes"),
        ("mig_mode", np.array([0, 2, 1, 3, 9]), "MIG modes"),
        ("mig_slices", -np.ones((5, 3), dtype=np.int32), "non-negative integers"),
        ("mig_used", np.full((5, 3), -1, dtype=np.int32), "non-negative integers"),
    ],
)
def test_a_snapshot_with_garbled_mig_members_is_refused(member: str, value: Any, complaint: str) -> None:
    """A forged or corrupt snapshot never gives the extender negative slices or a mode it cannot name."""
    data = write_snapshot(replace(ClusterState.from_objects(nodes(), []), generated_at=1.0))
    members = dict(np.load(io.BytesIO(data), allow_pickle=False))
    members[member] = np.frombuffer(value, dtype=np.uint8) if isinstance(value, bytes) else value
    buffer = io.BytesIO()
    np.savez(buffer, allow_pickle=False, **members)
    with pytest.raises(SnapshotFormatError, match=complaint):
        read_snapshot(buffer.getvalue())
