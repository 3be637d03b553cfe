"""The Kubernetes API double against the real kube-apiserver responses in ../shared/fixtures.

Each test replays a captured request at the double and compares the reply with what the real
server answered: byte for byte where nothing but the server's own bookkeeping (managedFields)
differs.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from testing.kube_double import KubeApiDouble
from testing.kube_double_objects import merge_patch
from testing.kube_double_requests import parse_label_selector
from tests.conftest import APISERVER_FIXTURES, NODE_PAGES, load_fixture

pytestmark = [
    pytest.mark.server,  # the API server double
    pytest.mark.skipif(not APISERVER_FIXTURES.is_dir(), reason=f"{APISERVER_FIXTURES} is absent"),
]
TOKEN = "admin-token"


def fixture(name: str) -> bytes:
    return (APISERVER_FIXTURES / f"{name}.json").read_bytes()


def meta(name: str) -> dict[str, Any]:
    return load_fixture(APISERVER_FIXTURES / f"{name}.meta.json")


def call(api: KubeApiDouble, name: str, *, token: str | None = TOKEN) -> tuple[int, bytes]:
    """Replay the captured request ``name`` (method, path, query, content type, body) at the double."""
    recorded = meta(name)
    url = f"{api.url}{recorded['path']}" + (f"?{recorded['query']}" if recorded["query"] else "")
    body_file = recorded.get("request_body_file")
    body = (APISERVER_FIXTURES / body_file).read_bytes() if body_file else None
    headers = {"Accept": "application/json"}
    if "Content-Type" in recorded["request_headers"]:
        headers["Content-Type"] = recorded["request_headers"]["Content-Type"]
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=body, method=recorded["method"], headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def large_cluster_nodes() -> list[dict[str, Any]]:
    return [item for page in NODE_PAGES for item in load_fixture(page.with_suffix(".json"))["items"]]


@pytest.fixture
def api() -> Any:
    with KubeApiDouble(tokens=[TOKEN]) as double:
        double.load("nodes", large_cluster_nodes())
        double.load(
            "pods",
            load_fixture(APISERVER_FIXTURES / "b3-pods-fieldselector-assigned-nonterminal-limit50.json")["items"],
        )
        double.set_resource_version(615)
        yield double


def without_managed_fields(body: bytes) -> dict[str, Any]:
    obj = json.loads(body)
    obj["metadata"].pop("managedFields", None)
    return obj


def test_node_pages_are_byte_identical_to_the_real_server(api: KubeApiDouble) -> None:
    # limit=25 then continue: 25/25/25/5 items, remainingItemCount 55/30/5, no continue on the last page.
    for page in NODE_PAGES:
        status, body = call(api, page.name)
        assert status == 200
        assert body == fixture(page.name), page.name


def test_a_continued_list_is_served_from_the_first_pages_snapshot(api: KubeApiDouble) -> None:
    call(api, NODE_PAGES[0].name)
    node = api.get("nodes", "gpu-t4-09")
    api.load("nodes", [{**node, "metadata": {**node["metadata"], "labels": {"changed": "yes"}}}])
    status, body = call(api, NODE_PAGES[2].name)  # the page that holds gpu-t4-09
    assert status == 200 and body == fixture(NODE_PAGES[2].name)


def test_an_expired_continue_token_is_410(api: KubeApiDouble) -> None:
    call(api, NODE_PAGES[0].name)
    for _ in range(10):  # newer snapshots push the first one out, as etcd compaction does
        api.set_resource_version(api.resource_version + 1)
        call(api, NODE_PAGES[0].name)
    api.set_resource_version(615)
    status, body = call(api, NODE_PAGES[1].name)
    assert status == 410 and json.loads(body)["reason"] == "Expired"


@pytest.mark.parametrize(
    "name", ["b2a-nodes-labelselector-gpu-count-exists", "b2b-nodes-labelselector-model-in-a100-h100-zone-a"]
)
def test_label_selectors_select_what_the_real_server_selected(api: KubeApiDouble, name: str) -> None:
    status, body = call(api, name)
    assert status == 200 and body == fixture(name)


def test_field_selector_on_assigned_non_terminal_pods(api: KubeApiDouble) -> None:
    # The capture excluded a Succeeded pod, a Failed pod and two unbound pods: add such pods here.
    extra = [
        {
            "metadata": {"name": "done", "namespace": "default"},
            "spec": {"nodeName": "gpu-t4-01"},
            "status": {"phase": "Succeeded"},
        },
        {
            "metadata": {"name": "failed", "namespace": "default"},
            "spec": {"nodeName": "gpu-t4-01"},
            "status": {"phase": "Failed"},
        },
        {"metadata": {"name": "unbound", "namespace": "default"}, "spec": {}, "status": {"phase": "Pending"}},
    ]
    api.load("pods", extra)
    api.set_resource_version(615)
    status, body = call(api, "b3-pods-fieldselector-assigned-nonterminal-limit50")
    assert status == 200 and body == fixture("b3-pods-fieldselector-assigned-nonterminal-limit50")


def test_merge_then_strategic_merge_patch_give_the_real_nodes(api: KubeApiDouble) -> None:
    for name in ("b4a-node-patch-labels-merge-patch", "b4b-node-patch-labels-strategic-merge-patch"):
        status, body = call(api, name)
        assert status == 200
        # Same object, resourceVersion included (616 then 617); only the server's managedFields differ.
        assert without_managed_fields(body) == without_managed_fields(fixture(name)), name


def test_deletion_cost_patches_are_validated_like_the_real_server(api: KubeApiDouble) -> None:
    api.load("nodes", [])
    call(api, "b4a-node-patch-labels-merge-patch")
    call(api, "b4b-node-patch-labels-strategic-merge-patch")
    status, body = call(api, "b5a-pod-patch-deletion-cost-100-ok")
    assert status == 200
    assert without_managed_fields(body) == without_managed_fields(fixture("b5a-pod-patch-deletion-cost-100-ok"))
    for name in ("b5b-pod-patch-deletion-cost-abc-422", "b5c-pod-patch-deletion-cost-plus10-422"):
        status, body = call(api, name)
        assert (status, body) == (422, fixture(name)), name
    # A rejected patch changes nothing.
    assert (
        api.get("pods", "gpu-a100-2-large", "default")["metadata"]["annotations"][
            "controller.kubernetes.io/pod-deletion-cost"
        ]
        == "100"
    )


def test_put_with_a_stale_resource_version_is_the_real_409(api: KubeApiDouble) -> None:
    request = json.loads((APISERVER_FIXTURES / "b6b-node-put-stale-resourceversion-409.request.json").read_bytes())
    stale = large_cluster_nodes()
    node = next(n for n in stale if n["metadata"]["name"] == "gpu-t4-01")
    assert node["metadata"]["resourceVersion"] == request["metadata"]["resourceVersion"]
    api.load("nodes", [node | {"metadata": {**node["metadata"], "resourceVersion": "600"}}])
    status, body = call(api, "b6b-node-put-stale-resourceversion-409")
    assert (status, body) == (409, fixture("b6b-node-put-stale-resourceversion-409"))


@pytest.mark.parametrize(
    ("name", "token", "code"),
    [
        ("b6c-pod-get-missing-404", TOKEN, 404),
        ("b6d-nodes-list-bad-token-401", "invalid-token-for-fixture", 401),
        ("b6e-pods-list-empty-bearer-anonymous-403", "", 403),
    ],
)
def test_error_status_bodies_match(api: KubeApiDouble, name: str, token: str, code: int) -> None:
    assert call(api, name, token=token) == (code, fixture(name))


def test_bindings_answer_like_the_real_server() -> None:
    pod = {"metadata": {"name": "filler-t4-2gpu", "namespace": "default", "uid": "u1"}, "spec": {}, "status": {}}
    other = {"metadata": {"name": "unbound-uid-test", "namespace": "default", "uid": "u2"}, "spec": {}, "status": {}}
    with KubeApiDouble(tokens=[TOKEN]) as api:
        api.load("pods", [pod, other])
        for name, code in (
            ("b7a-binding-create-201", 201),
            ("b7b-binding-already-bound-409", 409),
            ("b7c-binding-wrong-uid-accepted-201", 201),
            ("b7d-binding-missing-pod-404", 404),
        ):
            assert call(api, name) == (code, fixture(name)), name
        bound = api.get("pods", "filler-t4-2gpu", "default")
        assert bound["spec"]["nodeName"] == "gpu-node-2"
        assert {"type": "PodScheduled", "status": "True"}.items() <= bound["status"]["conditions"][0].items()


def test_injected_faults_answer_then_clear(api: KubeApiDouble) -> None:
    api.fail_next("GET", r"^/api/v1/nodes\?", 429, retry_after="1")
    status, body = call(api, NODE_PAGES[0].name)
    assert status == 429 and json.loads(body)["code"] == 429
    assert call(api, NODE_PAGES[0].name)[0] == 200


def test_label_values_are_validated() -> None:
    with KubeApiDouble(tokens=[TOKEN]) as api:
        api.load("nodes", [{"metadata": {"name": "n1", "labels": {}}}])
        request = urllib.request.Request(
            f"{api.url}/api/v1/nodes/n1",
            data=json.dumps({"metadata": {"labels": {"gpu.nvidia.com/model": "A 100"}}}).encode(),
            method="PATCH",
            headers={"Content-Type": "application/merge-patch+json", "Authorization": f"Bearer {TOKEN}"},
        )
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=10)
        assert caught.value.code == 422
        assert api.get("nodes", "n1")["metadata"]["labels"] == {}


def test_selectors_and_patches_in_isolation() -> None:
    match = parse_label_selector("a in (x,y),b!=z,!c")
    assert match({"metadata": {"labels": {"a": "x"}}})
    assert not match({"metadata": {"labels": {"a": "x", "c": "1"}}})
    assert not match({"metadata": {"labels": {"a": "q"}}})
    assert merge_patch({"a": {"b": 1, "c": 2}}, {"a": {"b": None, "d": 3}}) == {"a": {"c": 2, "d": 3}}
    merged = merge_patch(
        {"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}]}},
        {"spec": {"containers": [{"name": "b", "image": "2"}]}},
        strategic=True,
    )
    assert merged["spec"]["containers"] == [{"name": "a", "image": "1"}, {"name": "b", "image": "2"}]
