"""The Kubernetes access adapter: EKS tokens (moto STS/EKS), and the real client against the API double."""

from __future__ import annotations

import base64
import urllib.parse
from typing import Any

import pytest

from adapters import kube
from adapters.kube import EksTokenSource, connect_eks, connect_url, describe_cluster
from adapters.kube_transport import DeadlineReachedError, KubeApiError, ListExpiredError, RetryPolicy
from scheduler_core.simulator.synthetic import CATALOGUE, make_node, make_pod
from testing.kube_double import KubeApiDouble

pytestmark = pytest.mark.server  # the API server double

TOKEN = "test-token"


@pytest.fixture
def aws(aws_session: Any) -> Any:
    return aws_session


def decode_token(token: str) -> urllib.parse.SplitResult:
    assert token.startswith("k8s-aws-v1.")
    body = token.removeprefix("k8s-aws-v1.")
    assert "=" not in body  # base64url without padding
    return urllib.parse.urlsplit(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode())


def test_eks_token_is_a_presigned_get_caller_identity_bound_to_the_cluster(aws: Any) -> None:
    token = EksTokenSource(aws.client("sts"), "prod-gpu").token()
    url = decode_token(token)
    query = dict(urllib.parse.parse_qsl(url.query))
    assert url.hostname and url.hostname.startswith("sts.")
    assert query["Action"] == "GetCallerIdentity"
    assert query["X-Amz-Expires"] == "60"
    assert "x-k8s-aws-id" in query["X-Amz-SignedHeaders"].split(";")


def test_eks_token_is_remade_before_it_expires(aws: Any) -> None:
    now = [1000.0]
    sts = aws.client("sts")
    signed: list[int] = []
    sts.meta.events.register("before-sign.sts.GetCallerIdentity", lambda **_: signed.append(1))
    source = EksTokenSource(sts, "prod-gpu", clock=lambda: now[0])
    first = source.token()
    now[0] += 30
    assert source.token() == first and len(signed) == 1
    now[0] += 16  # 46 s old: re-made, well inside the 60 s validity
    decode_token(source.token())
    assert len(signed) == 2


def test_cluster_endpoint_is_described_once(aws: Any) -> None:
    eks = aws.client("eks")
    eks.create_cluster(name="prod-gpu", roleArn="arn:aws:iam::123456789012:role/eks", resourcesVpcConfig={})
    calls = []
    eks.meta.events.register("before-call.eks.DescribeCluster", lambda **_: calls.append(1))
    kube._ENDPOINTS.clear()
    first = describe_cluster(eks, "prod-gpu")
    assert describe_cluster(eks, "prod-gpu") is first
    assert len(calls) == 1
    assert first.endpoint.startswith("https://")
    with open(first.ca_file, "rb") as handle:
        assert handle.read()


def test_connect_eks_sends_fresh_eks_tokens(aws: Any) -> None:
    aws.client("eks").create_cluster(
        name="prod-gpu", roleArn="arn:aws:iam::123456789012:role/eks", resourcesVpcConfig={}
    )
    kube._ENDPOINTS.clear()
    seen: list[str] = []

    def authenticate(token: str) -> bool:
        seen.append(token)
        return "GetCallerIdentity" in decode_token(token).query

    with KubeApiDouble(authenticate=authenticate) as api:
        api.load("nodes", [make_node("n1", CATALOGUE[0], "us-east-1a")])
        client = connect_eks("prod-gpu", session=aws)
        client.api_client.configuration.host = api.url  # moto's endpoint cannot be reached
        assert [n["metadata"]["name"] for n in client.list_all("nodes")] == ["n1"]
    assert seen and seen[0].startswith("k8s-aws-v1.")


@pytest.fixture
def api() -> Any:
    with KubeApiDouble(tokens=[TOKEN]) as double:
        double.load("nodes", [make_node(f"node-{i:04d}", CATALOGUE[i % 4], "us-east-1a") for i in range(1203)])
        yield double


def client_for(api: KubeApiDouble, **options: Any) -> kube.KubeClient:
    options.setdefault("sleep", lambda _s: None)
    return connect_url(api.url, TOKEN, **options)


def test_lists_page_with_continue_until_the_end(api: KubeApiDouble) -> None:
    names = [n["metadata"]["name"] for n in client_for(api).list_all("nodes")]
    assert names == [f"node-{i:04d}" for i in range(1203)]
    lists = [r for r in api.requests if r.path == "/api/v1/nodes"]
    assert [r.query.get("limit") for r in lists] == ["500", "500", "500"]
    assert "continue" not in lists[0].query and all(r.query.get("continue") for r in lists[1:])


def test_field_selector_reaches_the_server(api: KubeApiDouble) -> None:
    api.load(
        "pods",
        [
            make_pod("bound", 1, node_name="node-0001", phase="Running"),
            make_pod("done", 1, node_name="node-0001", phase="Succeeded"),
            make_pod("pending", 1),
        ],
    )
    pods = client_for(api).list_all(
        "pods", field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
    )
    assert [p["metadata"]["name"] for p in pods] == ["bound"]


@pytest.mark.parametrize("code", [429, 500, 503, 409])
def test_transient_errors_are_retried(api: KubeApiDouble, code: int) -> None:
    api.fail_next("PATCH", r"/nodes/node-0001$", code, times=2, retry_after="0")
    client = client_for(api)
    client.patch_node_labels("node-0001", {"gpu.nvidia.com/model": "A100"})
    assert api.get("nodes", "node-0001")["metadata"]["labels"]["gpu.nvidia.com/model"] == "A100"
    assert client.retries == 2
    patches = [r for r in api.requests if r.method == "PATCH"]
    assert [r.status for r in patches] == [code, code, 200]
    assert patches[-1].content_type == "application/merge-patch+json"


def test_retries_are_bounded(api: KubeApiDouble) -> None:
    api.fail_next("PATCH", r"/nodes/node-0001$", 503, times=10)
    with pytest.raises(KubeApiError) as caught:
        client_for(api, retry=RetryPolicy(attempts=3)).patch_node_labels("node-0001", {"a": "b"})
    assert caught.value.status == 503
    assert len([r for r in api.requests if r.method == "PATCH"]) == 3


def test_client_errors_are_not_retried_and_carry_the_status(api: KubeApiDouble) -> None:
    client = client_for(api)
    with pytest.raises(KubeApiError) as caught:
        client.patch_node_labels("no-such-node", {"a": "b"})
    assert (caught.value.status, caught.value.reason) == (404, "NotFound")
    assert 'nodes "no-such-node" not found' in caught.value.message
    assert client.retries == 0


def test_bad_token_is_a_401_error(api: KubeApiDouble) -> None:
    with pytest.raises(KubeApiError) as caught:
        connect_url(api.url, "wrong").list_all("nodes")
    assert caught.value.status == 401


def test_an_expired_continuation_starts_the_list_over(api: KubeApiDouble) -> None:
    api.fail_next("GET", r"^/api/v1/nodes\?.*continue=", 410, times=1)
    nodes = client_for(api).list_all("nodes")
    assert len(nodes) == 1203  # each node once: the pages before the 410 were dropped
    statuses = [r.status for r in api.requests if r.path == "/api/v1/nodes"]
    assert statuses == [200, 410, 200, 200, 200]


def test_a_list_that_keeps_expiring_fails(api: KubeApiDouble) -> None:
    api.fail_next("GET", r"^/api/v1/nodes\?.*continue=", 410, times=10)
    with pytest.raises(ListExpiredError):
        client_for(api).list_all("nodes", restarts=1)


def test_no_call_starts_without_time_left(api: KubeApiDouble) -> None:
    client = client_for(api, deadline=lambda: 0.5)
    with pytest.raises(DeadlineReachedError):
        client.patch_node_labels("node-0001", {"a": "b"})
    assert not api.writes()


def test_retries_stop_at_the_deadline(api: KubeApiDouble) -> None:
    left = [5.0]

    def sleep(seconds: float) -> None:
        left[0] -= 10  # every wait eats the rest of the time

    api.fail_next("PATCH", r"/nodes/node-0001$", 503, times=5, retry_after="1")
    client = client_for(api, deadline=lambda: left[0], sleep=sleep)
    with pytest.raises(DeadlineReachedError):
        client.patch_node_labels("node-0001", {"a": "b"})
    assert len([r for r in api.requests if r.method == "PATCH"]) == 1


def test_scheduling_projection_keys_are_the_cores_names() -> None:
    from adapters.kube_types import SchedulingAnnotations
    from scheduler_core.k8s.names import (
        ASSIGNED_GPUS_ANNOTATION,
        LABEL_MEMORY,
        LABEL_MODEL,
        PEERS_ANNOTATION,
        RESERVED_GPU_ANNOTATION,
        VISIBLE_DEVICES_ANNOTATION,
    )

    assert set(SchedulingAnnotations.__annotations__) == {
        ASSIGNED_GPUS_ANNOTATION, LABEL_MODEL, LABEL_MEMORY, PEERS_ANNOTATION, VISIBLE_DEVICES_ANNOTATION,
        RESERVED_GPU_ANNOTATION}  # fmt: skip


def test_projected_pods_account_exactly_like_full_pods(api: KubeApiDouble) -> None:
    import numpy as np

    from adapters.kube_types import SchedulingPod
    from scheduler_core.state.snapshot import build_snapshot
    from testing.synthetic import eks_cluster

    nodes, pods = eks_cluster(60, 1500, np.random.default_rng(3))
    # MIG's resources are open-ended names: the projection keeps them (a mixed node, and pods on it).
    nodes[0]["metadata"]["labels"]["nvidia.com/mig.strategy"] = "mixed"
    nodes[0]["status"]["allocatable"] |= {"nvidia.com/mig-1g.10gb": "16", "nvidia.com/mig-3g.40gb": "8"}
    for i, profile in enumerate(("1g.10gb", "1g.10gb", "3g.40gb")):
        slices = make_pod(f"slices-{i}", 0, node_name=nodes[0]["metadata"]["name"], phase="Running")
        slices["spec"]["containers"][0]["resources"]["limits"] = {f"nvidia.com/mig-{profile}": "1"}
        pods.append(slices)
    # KEP-5004: a pod whose nvidia.com/gpu a DRA claim serves says so in its status; the claim counts them.
    served = make_pod("served-by-claim", 4, node_name=nodes[1]["metadata"]["name"], phase="Running")
    mapping = {"containerName": "main", "resourceName": "nvidia.com/gpu", "requestName": "r0"}
    served["status"]["extendedResourceClaimStatus"] = {"resourceClaimName": "x", "requestMappings": [mapping]}
    pods.append(served)
    with KubeApiDouble(tokens=[TOKEN]) as double:
        double.load("nodes", nodes)
        double.load("pods", pods)
        client = connect_url(double.url, TOKEN)
        projected = client.list_all("pods", item_type=SchedulingPod)
        full = client.list_all("pods")
    assert "managedFields" not in projected[0]["metadata"] and "env" not in projected[0]["spec"]["containers"][0]
    a = build_snapshot(nodes, projected, cluster="c", generated_at=0.0)
    b = build_snapshot(nodes, full, cluster="c", generated_at=0.0)
    assert a.free_milli.tolist() == b.free_milli.tolist()
    assert a.free_cpu.tolist() == b.free_cpu.tolist() and a.shapes == b.shapes
    assert a.shapes, "the synthetic cluster runs GPU pods"
    assert a.apps.apps == b.apps.apps and a.apps.node_entries.tolist() == b.apps.node_entries.tolist()
    assert a.problems == b.problems
    assert a.mig_used is not None and b.mig_used is not None and a.mig_used.tolist() == b.mig_used.tolist()
    assert a.mig_used.sum() == 3
    assert b.whole_gpus is not None and a.whole_gpus is not None and a.whole_gpus.tolist() == b.whole_gpus.tolist()
    without = build_snapshot(nodes, [p for p in full if p["metadata"]["name"] != "served-by-claim"], cluster="c",
                             generated_at=0.0)  # fmt: skip
    assert without.whole_gpus is not None and without.whole_gpus.tolist() == a.whole_gpus.tolist()


def test_a_page_that_does_not_fit_the_projection_is_decoded_in_full(api: KubeApiDouble) -> None:
    from adapters.kube_types import SchedulingPod

    odd = make_pod("odd", 1, node_name="node-0001", phase="Running")
    odd["metadata"]["labels"] = {"app": 7}  # not a string: the projection refuses the page
    api.load("pods", [odd, make_pod("fine", 1, node_name="node-0001", phase="Running")])
    pods = client_for(api).list_all("pods", item_type=SchedulingPod)
    assert [p["metadata"]["name"] for p in pods] == ["fine", "odd"]
    assert pods[1]["metadata"]["labels"] == {"app": 7}
