"""``/bind`` re-checks what kube-scheduler's own filters would have refused (issue #42, item 5).

The review bound a pod with required node affinity ``topology.kubernetes.io/zone NotIn [us-east-1b]``
to a node in us-east-1b, and a 10,000-core pod to a 48-core node: bind checked the nodeSelector, the
taints and the GPU filter, not required node affinity nor resource fit. And it answered a bind for a pod
that does not exist differently from one with the wrong UID, telling anyone which pods exist.

Each test replays a hostile bind through ``serve`` and the Lambda handler (``tests/security/conftest.py``).
After every refusal the pod is unbound and unannotated, the ledger (moto) holds nothing, and the API
server (the in-repo double) saw no write.
"""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_core.k8s.names import ASSIGNED_GPUS_ANNOTATION, LABEL_ZONE
from tests.conftest import make_pod
from tests.security.conftest import World

NOTHING_HELD = {"t4-0": 0, "a100-1": 0, "l40s-2": 0}
# cluster_nodes(): t4-0 (T4, 4 GPUs, us-east-1a, 47810m CPU, 178Gi), a100-1 (A100, 8 GPUs, us-east-1b,
# 95690m, 1149Gi), l40s-2 (tainted).


def refused(world: World, pod: dict[str, Any], node: str, uid: str | None = None) -> str:
    """Bind and return the Error, checking that nothing changed anywhere."""
    status, reply = world.bind(pod, node, uid)
    assert status == 200 and reply["Error"], reply
    meta = pod["metadata"]
    try:
        stored = world.api.get("pods", meta["name"], meta["namespace"])
    except KeyError:
        stored = None  # a pod that does not exist stays that way
    if stored is not None:
        assert stored["spec"].get("nodeName") is None
        assert ASSIGNED_GPUS_ANNOTATION not in (stored["metadata"].get("annotations") or {})
    assert world.ledger_used() == NOTHING_HELD
    assert world.api_writes() == []
    return str(reply["Error"])


def bound(world: World, pod: dict[str, Any], node: str) -> None:
    """Bind, which must succeed: the refusals above are not a verb that refuses everything."""
    assert world.bind(pod, node) == (200, {"Error": ""})
    assert world.api.get("pods", pod["metadata"]["name"], pod["metadata"]["namespace"])["spec"]["nodeName"] == node


def with_affinity(pod: dict[str, Any], *terms: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
    }
    return pod


def expression(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


def test_a_node_in_a_zone_the_pods_required_affinity_excludes_is_refused(world: World) -> None:
    pod = with_affinity(
        make_pod("not-in-1b", 0, milli=250), {"matchExpressions": [expression(LABEL_ZONE, "NotIn", "us-east-1b")]}
    )
    world.api.load("pods", [pod])
    assert (
        "node a100-1 does not match the pod's required node affinity (topology.kubernetes.io/zone NotIn [us-east-1b])"
        in refused(world, pod, "a100-1")
    )
    assert world.ledger_used() == NOTHING_HELD
    bound(world, pod, "t4-0")  # us-east-1a: outside the excluded zone


def test_affinity_terms_are_ored_and_expressions_anded_with_fields_and_integer_comparisons(world: World) -> None:
    """Term 1: more than 4 GPUs AND in us-east-1a (no node is both); term 2: the node named l40s-2.
    a100-1 has 8 GPUs but is in us-east-1b, t4-0 is in us-east-1a with 4: neither term admits them."""
    terms = (
        {
            "matchExpressions": [
                expression("nvidia.com/gpu.count", "Gt", "4"),
                expression(LABEL_ZONE, "In", "us-east-1a"),
            ]
        },
        {"matchFields": [expression("metadata.name", "In", "l40s-2")]},
    )
    pod = with_affinity(make_pod("picky", 0, milli=250), *terms)
    world.api.load("pods", [pod])
    assert "(topology.kubernetes.io/zone In [us-east-1a]; metadata.name In [l40s-2])" in refused(world, pod, "a100-1")
    assert "(nvidia.com/gpu.count Gt [4]; metadata.name In [l40s-2])" in refused(world, pod, "t4-0")
    either = with_affinity(
        make_pod("either", 0, milli=250), terms[0], {"matchFields": [expression("metadata.name", "In", "t4-0")]}
    )
    world.api.load("pods", [either])
    bound(world, either, "t4-0")  # the second term admits it by name


def test_a_pod_whose_affinity_term_does_not_parse_matches_no_node(world: World) -> None:
    pod = with_affinity(
        make_pod("bad-term", 0, milli=250), {"matchExpressions": [expression(LABEL_ZONE, "Gt", "east")]}
    )
    world.api.load("pods", [pod])
    assert "a term that matches no node" in refused(world, pod, "t4-0")


def test_a_10000_core_pod_is_not_bound_to_a_48_core_node(world: World) -> None:
    pod = make_pod("huge-cpu", 1)
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "10000"
    world.api.load("pods", [pod])
    error = refused(world, pod, "t4-0")
    assert "node t4-0 is too small for the pod: it requests cpu 10000, more than the node's allocatable" in error


def test_memory_over_the_nodes_allocatable_is_refused(world: World) -> None:
    pod = make_pod("huge-memory", 0, milli=500)
    pod["spec"]["containers"][0]["resources"]["requests"]["memory"] = "200Gi"  # t4-0 has 178Gi
    world.api.load("pods", [pod])
    assert "it requests memory 200Gi, more than the node's allocatable" in refused(world, pod, "t4-0")
    bound(world, pod, "a100-1")  # 1149Gi


@pytest.mark.parametrize(
    "shape",
    [
        pytest.param("init", id="an init container larger than the node counts as kube-scheduler counts it"),
        pytest.param("sidecars", id="sidecars add to the app containers"),
        pytest.param("overhead", id="the pod overhead adds to the containers"),
        pytest.param("limits", id="a limit with no request is the request"),
    ],
)
def test_requests_are_counted_as_node_resources_fit_counts_them(world: World, shape: str) -> None:
    """Each pod's app container asks 1 core; what else it has takes it past t4-0's 47.81 cores."""
    pod = make_pod(f"cpu-{shape}", 0, milli=250)
    spec = pod["spec"]
    if shape == "init":
        spec["initContainers"] = [{"name": "warm", "resources": {"requests": {"cpu": "48"}}}]
    elif shape == "sidecars":
        sidecar = {"restartPolicy": "Always", "resources": {"requests": {"cpu": "23.5"}}}
        spec["initContainers"] = [{"name": "s1", **sidecar}, {"name": "s2", **sidecar}]
    elif shape == "overhead":
        spec["overhead"] = {"cpu": "46900m"}
    else:
        spec["containers"].append({"name": "greedy", "resources": {"limits": {"cpu": "47"}}})
    world.api.load("pods", [pod])
    assert "node t4-0 is too small for the pod: it requests cpu" in refused(world, pod, "t4-0")


def test_a_pod_that_does_not_exist_and_one_with_another_uid_get_the_same_answer(world: World) -> None:
    real = make_pod("real", 0, milli=250)
    world.api.load("pods", [real])
    ghost = make_pod("ghost", 0, milli=250)  # never created
    wrong_uid = refused(world, real, "t4-0", uid="uid-default-ghost")
    missing = refused(world, ghost, "t4-0")
    assert missing.replace("ghost", "real") == wrong_uid
    assert wrong_uid == "bind default/real to t4-0: no pod with that namespace, name and UID"
    # Neither the API's 404 text nor the pod's real UID leaks.
    assert "404" not in missing and real["metadata"]["uid"] not in wrong_uid
    other_namespace = make_pod("real", 0, milli=250, namespace="tenant-b")  # no such pod in tenant-b
    assert refused(world, other_namespace, "t4-0", uid=real["metadata"]["uid"]) == wrong_uid.replace(
        "default/", "tenant-b/"
    )
