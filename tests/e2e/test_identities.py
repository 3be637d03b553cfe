"""Every component as the identity the product deploys for it, through the real API server.

The harness (``testing.control_plane``) gives each component a token of its own and applies the
product's RBAC and admission policies as ``gpu-scheduler scheduler-config`` generates them; the rest of
the suite runs ``serve``, the refreshers and kube-scheduler with those tokens. Here:

- the API server's own authorizer grants each Lambda group exactly the verbs of ``manifests/access.py``
  (SelfSubjectAccessReview over every resource and verb those roles could name);
- taking one verb away (``watch`` from the node-state refresher) makes the real refresher fail at it;
- on 1.30 and later the generated ValidatingAdmissionPolicies refuse, through the API server, every
  write an identity may not make (another label or annotation, a finalizer, an ownerReference, the
  ``assigned-gpus`` annotation through ``pods/status``), and let each one's own write through. Before
  1.30 (the captures' 1.25) the policies are not served, and the harness applies none.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from manifests.access import CONSOLIDATOR, DELETION_COST, EXTENDER, NODE_STATE, LambdaIdentity
from scheduler_core.k8s.names import ASSIGNED_GPUS_ANNOTATION, DELETION_COST_ANNOTATION, LABEL_MODEL
from scheduler_core.simulator.synthetic import CATALOGUE, make_node, make_pod
from testing.control_plane import ControlPlane
from testing.kube_rest import KubeRest
from testing.product_manifests import generated_manifests
from tests.e2e.conftest import let_tenant

NAMESPACE = "identities"
A100 = next(shape for shape in CATALOGUE if shape.model == "A100")
RESOURCES = ("pods", "pods/binding", "pods/status", "pods/eviction", "nodes", "nodes/status", "events", "secrets",
             "configmaps", "namespaces", "serviceaccounts", "deployments.apps", "poddisruptionbudgets.policy",
             *(f"{kind}.resource.k8s.io" for kind in (
                 "deviceclasses", "resourceslices", "resourceclaims", "resourceclaims/status")))  # fmt: skip
NAMED = {"deployments.apps": "karpenter"}
"""Resources granted by name only, and the name asked about (the deletion-cost refresher reads Karpenter's
Deployment and no other)."""
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")


def policies_served(cluster: ControlPlane) -> bool:
    assert cluster.binaries is not None
    return cluster.binaries.release[:2] >= (1, 30)


def allowed(api: KubeRest, resource: str, verb: str, object_name: str = "") -> bool:
    """What the API server's authorizer answers ``api``'s user for ``verb`` on ``resource`` (the object
    ``object_name``, where given)."""
    resource, _, group = resource.partition(".")
    name, _, sub = resource.partition("/")
    attributes = {"verb": verb, "resource": name, "namespace": NAMESPACE if name != "nodes" else "", "group": group}
    if object_name:
        attributes["name"] = object_name
    if sub:
        attributes["subresource"] = sub
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
              "spec": {"resourceAttributes": attributes}}  # fmt: skip
    answer = api.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review)
    return bool(answer["status"]["allowed"])


@pytest.mark.parametrize("identity", [EXTENDER, NODE_STATE, DELETION_COST, CONSOLIDATOR], ids=lambda i: i.name)
def test_each_lambda_identity_is_granted_exactly_its_functions_verbs(cluster: ControlPlane, identity: LambdaIdentity):
    expected = {(".".join(filter(None, (r, rule["apiGroups"][0]))), v)
                for rule in identity.rules for r in rule["resources"] for v in rule["verbs"]}  # fmt: skip
    api = cluster.api_as(identity.name)
    granted = {(r, v) for r in RESOURCES for v in VERBS if allowed(api, r, v, NAMED.get(r, ""))}
    assert granted == expected
    for resource, name in NAMED.items():  # by name only: no other object of that kind
        assert not any(allowed(api, resource, verb, f"not-{name}") for verb in VERBS)


def node_state_watch(cluster: ControlPlane, tmp_path: Path) -> dict[str, Any]:
    """One node-state run that watches for 2 s as its own identity, a node labelled meanwhile; its report."""
    snapshot = tmp_path / "snapshot.npz"
    refresher = subprocess.Popen(
        [sys.executable, "-m", "gpu_scheduler", "refresh", "node-state", "--once", "--no-ec2", "--watch", "2s",
         "--kubeconfig", str(cluster.kubeconfig_of("node-state")), "--snapshot", str(snapshot)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(1.0)
    cluster.api.patch("/api/v1/nodes/a100-watched", {"metadata": {"labels": {"touched": str(time.time_ns())}}})
    out, err = refresher.communicate(timeout=60)
    assert refresher.returncode == 0, err
    report: dict[str, Any] = json.loads(out.splitlines()[-1])
    return report


def test_taking_watch_from_the_node_state_role_fails_its_watch(cluster: ControlPlane, tmp_path: Path):
    cluster.add_nodes([make_node("a100-watched", A100, "us-east-1a")])
    documents = generated_manifests(["--url", "https://unused.invalid/extender", "--sharing"])
    (role,) = [d for d in documents if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-node-state")]
    assert node_state_watch(cluster, tmp_path)["watch"]["watch_errors"] == 0  # as the product grants it
    without_watch = {**role, "rules": [{**r, "verbs": [v for v in r["verbs"] if v != "watch"]} for r in role["rules"]]}
    try:
        cluster.apply_access([without_watch])
        api = cluster.api_as("node-state")
        cluster.wait_for(lambda: not allowed(api, "nodes", "watch"), 10, "the role without watch to take effect")
        report = node_state_watch(cluster, tmp_path)
        assert report["watch"]["watch_errors"] > 0 and report["watch"]["publishes"] == 0, report["watch"]
    finally:
        cluster.apply_access([role])


# ---- admission policies ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tenant(cluster: ControlPlane) -> KubeRest:
    """The tenant user, allowed to edit pods (and their status) in the test's namespace."""
    cluster.ensure_namespaces([NAMESPACE])
    rules = [{"apiGroups": [""], "resources": ["pods", "pods/status"], "verbs": ["get", "create", "update", "patch"]}]
    return let_tenant(cluster, NAMESPACE, "pod-editor", rules)


def patch_as(api: KubeRest, path: str, body: Any) -> tuple[int, str]:
    """The status and message of a merge patch as ``api``'s user. A policy's refusal is a 403 whose
    message names the policy (RBAC's names no policy)."""
    status, raw = api.raw("PATCH", path, json.dumps(body).encode(), "application/merge-patch+json")
    return status, (json.loads(raw).get("message", "") if raw else "")


@pytest.fixture(scope="module")
def policies(cluster: ControlPlane, tenant: KubeRest) -> bool:
    """Whether this API server enforces the product's admission policies, once they are in force (they
    load within a second or so of being created): a tenant's pod that claims GPUs is refused then."""
    if not policies_served(cluster):
        return False
    forged = make_pod("probe", 0, namespace=NAMESPACE)
    forged["metadata"]["annotations"][ASSIGNED_GPUS_ANNOTATION] = "0:1000"
    for attempt in range(40):
        forged["metadata"]["name"] = f"probe-{attempt}"
        status, raw = tenant.raw("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", json.dumps(forged).encode(),
                                 "application/json")  # fmt: skip
        if status == 403 and b"ValidatingAdmissionPolicy" in raw:
            return True
        time.sleep(0.5)
    raise AssertionError("the admission policies were not in force 20 s after they were created")


OWNER = {"apiVersion": "v1", "kind": "ConfigMap", "name": "missing", "uid": "00000000-0000-0000-0000-000000000000"}
FORBIDDEN = {
    "another label": {"metadata": {"labels": {"team": "x"}}},
    "an annotation": {"metadata": {"annotations": {"note": "x"}}},
    "a finalizer": {"metadata": {"finalizers": ["example.com/hold"]}},
    "an ownerReference": {"metadata": {"ownerReferences": [OWNER]}},
}


@pytest.mark.parametrize("change", sorted(FORBIDDEN))
def test_the_node_state_identity_may_change_only_the_gpu_labels_of_a_node(
    cluster: ControlPlane, policies: bool, change: str
):
    name = f"a100-{change.replace(' ', '-').lower()}"
    cluster.add_nodes([make_node(name, A100, "us-east-1a")])
    api, path = cluster.api_as("node-state"), f"/api/v1/nodes/{name}"
    status, message = patch_as(api, path, FORBIDDEN[change])
    if not policies:  # 1.25: no policies; RBAC alone lets the patch through
        assert status == 200
        return
    assert status == 403 and "gpu-scheduler-node-state-labels" in message, (status, message)
    assert "gpu-scheduler:node-state may" in message
    assert patch_as(api, path, {"metadata": {"labels": {LABEL_MODEL: "A100"}}})[0] == 200


@pytest.mark.parametrize("change", sorted(FORBIDDEN))
def test_the_deletion_cost_identity_may_change_only_the_cost_annotation(
    cluster: ControlPlane, policies: bool, change: str
):
    name = f"costed-{change.replace(' ', '-').lower()}"
    cluster.create_pods([make_pod(name, 0, namespace=NAMESPACE)])
    api, path = cluster.api_as("deletion-cost"), f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"
    status, message = patch_as(api, path, FORBIDDEN[change])
    if not policies:
        assert status == 200
        return
    assert status == 403 and "gpu-scheduler-deletion-cost-annotation" in message, (status, message)
    assert "gpu-scheduler:deletion-cost may" in message
    assert patch_as(api, path, {"metadata": {"annotations": {DELETION_COST_ANNOTATION: "10"}}})[0] == 200


def test_a_tenant_may_not_write_assigned_gpus_through_the_pod_or_its_status(
    cluster: ControlPlane, tenant: KubeRest, policies: bool
):
    cluster.create_pods([make_pod("tenants", 0, namespace=NAMESPACE)])
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/tenants"
    forged = {"metadata": {"annotations": {ASSIGNED_GPUS_ANNOTATION: "0:1000"}}}
    answers = [patch_as(tenant, path, forged), patch_as(tenant, f"{path}/status", forged)]
    if not policies:
        assert [status for status, _ in answers] == [200, 200]
        return
    for status, message in answers:
        assert status == 403 and "only the gpu-scheduler extender" in message, (status, message)
    assert patch_as(tenant, path, {"metadata": {"annotations": {"note": "mine"}}})[0] == 200  # the rest is theirs
    stored = cluster.pod(NAMESPACE, "tenants")["metadata"]["annotations"]
    assert ASSIGNED_GPUS_ANNOTATION not in stored and stored["note"] == "mine"


# ---- the product's own pods and PriorityClasses -----------------------------------------------------
def create_dry(api: KubeRest, pod: dict[str, Any]) -> tuple[int, str]:
    """The status and message of creating ``pod`` as ``api``'s user, admission and all, with nothing
    stored (``dryRun=All``)."""
    namespace = pod["metadata"]["namespace"]
    status, raw = api.raw(
        "POST", f"/api/v1/namespaces/{namespace}/pods?dryRun=All", json.dumps(pod).encode(), "application/json"
    )
    return status, (json.loads(raw).get("message", "") if raw else "")


@pytest.fixture(scope="module")
def runtime_class(cluster: ControlPlane) -> str:
    """The RuntimeClass the hostile shapes name (the RuntimeClass admission plugin refuses one that does not
    exist before any policy sees the pod): a privileged runtime, as a cluster may well have."""
    body = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia-privileged"},
            "handler": "nvidia"}  # fmt: skip
    status, raw = cluster.api.raw("POST", "/apis/node.k8s.io/v1/runtimeclasses", json.dumps(body).encode(),
                                  "application/json")  # fmt: skip
    assert status in (201, 409), raw[:300]
    return "nvidia-privileged"


KEEPERS = ("extender", "scheduler", "node-state")


def refused_by_the_policy(status: int, message: str, policy: str, refusal: str, what: str) -> None:
    """A 403 or 422 from the product's admission policies: the namespace's shape ``policy`` saying
    ``refusal``, or another of the product's policies that caught the same pod first (the API server names
    the first that denies; ``tests/security/test_reservation_pods.py`` shows the shape policy refuses each)."""
    assert status in (403, 422), (what, status, message)
    assert "ValidatingAdmissionPolicy 'gpu-scheduler-" in message, (what, message)
    assert f"'{policy}'" not in message or refusal in message, (what, message)


"""Who creates reservation pods (``manifests.reservation.keeper_access``); the node-state group alone creates
placeholders."""


@pytest.mark.parametrize("keeper", KEEPERS)
@pytest.mark.usefixtures("runtime_class")
def test_a_keeper_credential_runs_nothing_but_the_products_own_reservation_pod(cluster: ControlPlane, keeper: str):
    """Item 2 of "Safe to deploy, third pass", live: as each identity that may create reservation pods, every
    shape that would run code or gain privilege next to a GPU is refused by the shape policy, named in the
    refusal, and the product's own pod is admitted."""
    from manifests.reservation import reservation_pod
    from tests.security.test_reservation_pods import HOSTILE

    if not policies_served(cluster):
        pytest.skip("no ValidatingAdmissionPolicy before 1.30: the shapes are not checked there (docs/sharing.md)")
    api = cluster.api_as(keeper)
    status, message = create_dry(api, reservation_pod("a100-0", 3))
    assert status == 201, message
    for name, (change, refusal) in sorted(HOSTILE.items()):
        pod = reservation_pod("a100-0", 3)
        change(pod)
        status, message = create_dry(api, pod)
        refused_by_the_policy(status, message, "gpu-scheduler-reservation-pods", refusal, name)


@pytest.mark.usefixtures("runtime_class")
def test_the_node_state_credential_creates_nothing_but_the_products_own_placeholder(cluster: ControlPlane):
    """The same for placeholders, which the node-state group alone creates."""
    from manifests.placeholder import placeholder_pod
    from manifests.reservation import DEFAULT_IMAGE
    from tests.security.test_reservation_pods import PLACEHOLDER_HOSTILE

    if not policies_served(cluster):
        pytest.skip("no ValidatingAdmissionPolicy before 1.30: the shapes are not checked there (docs/sharing.md)")
    api = cluster.api_as("node-state")
    requirements = {"annotations": {LABEL_MODEL: "H100"}, "nodeSelector": {"pool": "gpu"}}
    status, message = create_dry(api, placeholder_pod("0a1b2c3d4e", 0, requirements, image=DEFAULT_IMAGE))
    assert status == 201, message
    for name, (change, refusal) in sorted(PLACEHOLDER_HOSTILE.items()):
        pod = placeholder_pod("0a1b2c3d4e", 0, requirements, image=DEFAULT_IMAGE)
        change(pod)
        status, message = create_dry(api, pod)
        refused_by_the_policy(status, message, "gpu-scheduler-placeholder-pods", refusal, name)


@pytest.mark.parametrize("priority_class", ["gpu-reservation", "gpu-share-placeholder"])
def test_a_tenant_pod_may_not_take_the_products_priority_classes(
    cluster: ControlPlane, tenant: KubeRest, priority_class: str
):
    """Item 4, live: the product's PriorityClasses are refused to a pod anywhere but the product's own
    namespace; a tenant's pod without them is admitted."""
    if not policies_served(cluster):
        pytest.skip("no ValidatingAdmissionPolicy before 1.30 (docs/security.md)")
    pod = make_pod("greedy", 1, namespace=NAMESPACE)
    pod["spec"]["priorityClassName"] = priority_class
    status, message = create_dry(tenant, pod)
    assert status == 403 and "gpu-scheduler-priority-classes" in message, (status, message)
    assert f"PriorityClass {priority_class} belongs to eks-gpu-scheduler" in message
    del pod["spec"]["priorityClassName"]
    status, message = create_dry(tenant, pod)
    assert status == 201, message


SGP_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "securitygrouppolicies.vpcresources.k8s.aws"},
    "spec": {
        "group": "vpcresources.k8s.aws",
        "scope": "Namespaced",
        "names": {"plural": "securitygrouppolicies", "singular": "securitygrouppolicy", "kind": "SecurityGroupPolicy"},
        # The VPC resource controller's CRD has a full schema; the admission policy is what is under test here.
        "versions": [
            {
                "name": "v1beta1",
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }
        ],
    },
}
"""A stand-in for the CRD EKS's VPC resource controller serves (``vpcresources.k8s.aws/v1beta1``)."""


def serve_security_group_policies(cluster: ControlPlane) -> None:
    """Install :data:`SGP_CRD` (or find it there) and wait until the API server serves its kind."""
    status, _ = cluster.api.raw(
        "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json.dumps(SGP_CRD).encode(),
        "application/json",
    )  # fmt: skip
    assert status in (201, 409)
    cluster.wait_for(
        lambda: (
            cluster.api.raw("GET", f"/apis/vpcresources.k8s.aws/v1beta1/namespaces/{NAMESPACE}/securitygrouppolicies")[
                0
            ]
            == 200
        ),
        timeout_s=30,
        what="the SecurityGroupPolicy CRD served",
    )


def create_sgp(api: KubeRest, namespace: str, name: str, spec: dict[str, Any]) -> tuple[int, str]:
    """The status and message of creating a SecurityGroupPolicy ``spec`` as ``api``'s user, admission and
    all, with nothing stored (``dryRun=All``)."""
    body = {"apiVersion": "vpcresources.k8s.aws/v1beta1", "kind": "SecurityGroupPolicy",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}  # fmt: skip
    path = f"/apis/vpcresources.k8s.aws/v1beta1/namespaces/{namespace}/securitygrouppolicies?dryRun=All"
    status, raw = api.raw("POST", path, json.dumps(body).encode(), "application/json")
    return status, (json.loads(raw).get("message", "") if raw else "")


def test_only_the_products_security_group_policy_may_name_the_group_the_extender_api_admits(
    cluster: ControlPlane, tenant: KubeRest
) -> None:
    """The manifests' ``gpu-scheduler-security-group`` policy (the harness applies the generated access
    documents with ``--security-group sg-00000000``): a tenant who may create SecurityGroupPolicies
    cannot put a pod of theirs in that group; an administrator cannot widen the product's own; the product's
    is admitted, and any other group is the tenant's business."""
    if not policies_served(cluster):
        pytest.skip("no ValidatingAdmissionPolicy before 1.30 (docs/security.md)")
    serve_security_group_policies(cluster)
    rules = [{"apiGroups": ["vpcresources.k8s.aws"], "resources": ["securitygrouppolicies"], "verbs": ["create"]}]
    let_tenant(cluster, NAMESPACE, "sgp-editor", rules)
    (product,) = [
        d
        for d in generated_manifests(["--url", "https://x.example/v1", "--security-group", "sg-00000000"])
        if d["kind"] == "SecurityGroupPolicy"
    ]
    mine = {"podSelector": {"matchLabels": {"app": "mine"}}, "securityGroups": {"groupIds": ["sg-00000000"]}}
    cluster.wait_for(lambda: create_sgp(tenant, NAMESPACE, "borrow", mine)[0] == 403, timeout_s=30, what="the policy")
    status, message = create_sgp(tenant, NAMESPACE, "borrow", mine)
    assert (
        "gpu-scheduler-security-group" in message
        and "only the SecurityGroupPolicy kube-system/gpu-scheduler" in message
    )
    # The same name as the product's, in the tenant's namespace: still refused.
    status, message = create_sgp(tenant, NAMESPACE, "gpu-scheduler", product["spec"])
    assert status == 403 and "gpu-scheduler-security-group" in message
    # Two groups, one of them the scheduler's: refused.
    both = {**mine, "securityGroups": {"groupIds": ["sg-11111111", "sg-00000000"]}}
    assert create_sgp(tenant, NAMESPACE, "both", both)[0] == 403
    # Any other group is no business of the product's.
    other = {**mine, "securityGroups": {"groupIds": ["sg-11111111"]}}
    assert create_sgp(tenant, NAMESPACE, "theirs", other) == (201, "")
    # The administrator: the product's own is admitted, a wider one in its place is not.
    assert create_sgp(cluster.api, "kube-system", "gpu-scheduler", product["spec"]) == (201, "")
    wider = {**product["spec"], "podSelector": {}}
    status, message = create_sgp(cluster.api, "kube-system", "gpu-scheduler", wider)
    assert status == 403 and "selects the gpu-scheduler pods only" in message
    by_account = {**product["spec"], "serviceAccountSelector": {"matchLabels": {"team": "a"}}}
    assert create_sgp(cluster.api, "kube-system", "gpu-scheduler", by_account)[0] == 403
