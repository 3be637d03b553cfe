"""EKS access entries for the Lambda roles, one Kubernetes group each; the RBAC and admission policies those
groups get (``manifests.access``); and applying the manifests through aws_eks_v2."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest
from aws_cdk import aws_iam as iam
from aws_cdk.assertions import Template

from cdk.cluster_access import CLUSTER_ADMIN_POLICY, ClusterAccess, KubernetesIdentity
from manifests.access import (
    COST_ANNOTATIONS,
    DELETION_COST,
    EXTENDER,
    NODE_LABELS,
    NODE_STATE,
    admission_policies,
    identities,
    lambda_rbac,
)
from manifests.scheduler import all_manifests
from manifests.scheduler_options import SchedulerOptions
from scheduler_core.k8s.names import ASSIGNED_GPUS_ANNOTATION, DELETION_COST_ANNOTATION, VISIBLE_DEVICES_ANNOTATION

from .conftest import bare_stack

DOCS = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "kube-system"}}]
GROUPS = {"Extender": "gpu-scheduler:extender", "NodeState": "gpu-scheduler:node-state"}


def _template(manifests: list[dict[str, Any]]) -> Template:
    stack = bare_stack()
    access = {
        name: KubernetesIdentity(iam.Role(stack, name, assumed_by=iam.ServicePrincipal("lambda.amazonaws.com")), group)
        for name, group in GROUPS.items()
    }
    ClusterAccess(stack, "Access", cluster_name="gpu-prod", identities=access, manifests=manifests)
    return Template.from_stack(stack)


WITHOUT, WITH = _template([]), _template(DOCS)


def _role_arn(template: Template, name: str) -> dict[str, list[str]]:
    (role_id,) = [k for k in template.find_resources("AWS::IAM::Role") if k.startswith(name)]
    return {"Fn::GetAtt": [role_id, "Arn"]}


def test_each_role_gets_a_standard_entry_in_its_own_group_with_no_access_policy() -> None:
    entries = WITHOUT.find_resources("AWS::EKS::AccessEntry").values()
    by_role = {json.dumps(e["Properties"]["PrincipalArn"]): e["Properties"] for e in entries}
    assert len(by_role) == len(GROUPS)
    for name, group in GROUPS.items():
        props = by_role[json.dumps(_role_arn(WITHOUT, name))]
        assert props["ClusterName"] == "gpu-prod"
        assert props["KubernetesGroups"] == [group]
        assert props["Type"] == "STANDARD"
        assert "AccessPolicies" not in props  # what the group may do is the RBAC manifest, nothing more


def test_without_manifests_nothing_is_applied_to_the_cluster() -> None:
    WITHOUT.resource_count_is("Custom::AWSCDK-EKS-KubernetesResource", 0)
    WITHOUT.resource_count_is("AWS::Lambda::Function", 0)


def test_manifests_are_applied_by_the_kubectl_provider_with_a_cluster_admin_entry() -> None:
    (manifest,) = WITH.find_resources("Custom::AWSCDK-EKS-KubernetesResource").values()
    applied = json.loads(manifest["Properties"]["Manifest"])
    for doc in applied:  # aws_eks_v2 labels what it applies, so it can prune what a later deploy drops
        labels = doc["metadata"].pop("labels")
        assert all(key.startswith("aws.cdk.eks/prune-") for key in labels)
    assert applied == DOCS
    assert manifest["Properties"]["ClusterName"] == "gpu-prod"
    admin = [e for e in WITH.find_resources("AWS::EKS::AccessEntry").values() if "AccessPolicies" in e["Properties"]]
    (entry,) = admin
    (policy,) = entry["Properties"]["AccessPolicies"]
    assert policy["AccessScope"] == {"Type": "cluster"}
    assert json.dumps(policy["PolicyArn"]).endswith(f'cluster-access-policy/{CLUSTER_ADMIN_POLICY}"]]}}')
    # The manifests wait for the provider's access entry.
    (admin_id,) = [
        k for k, e in WITH.find_resources("AWS::EKS::AccessEntry").items() if "AccessPolicies" in e["Properties"]
    ]
    assert admin_id in manifest["DependsOn"]


def test_the_kubectl_providers_functions_log_to_groups_with_a_retention() -> None:
    functions = WITH.find_resources("AWS::Lambda::Function")
    groups = WITH.find_resources("AWS::Logs::LogGroup")
    assert len(functions) == 2  # the kubectl handler and the provider framework's onEvent
    for function in functions.values():
        (group_id,) = [v for k, v in function["Properties"]["LoggingConfig"].items() if k == "LogGroup"]
        assert groups[group_id["Ref"]]["Properties"]["RetentionInDays"] == 30


# ---- what each group may do -------------------------------------------------------------------------
def _granted(docs: list[dict[str, Any]], group: str) -> set[tuple[str, str]]:
    """(resource, verb) pairs the ClusterRoles bound to ``group`` allow; a resource outside the core group
    is named ``group/resource``."""
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    granted = set()
    for binding in (d for d in docs if d["kind"] == "ClusterRoleBinding"):
        if {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group} in binding["subjects"]:
            for rule in roles[binding["roleRef"]["name"]]["rules"]:
                (api_group,) = rule["apiGroups"]
                prefix = f"{api_group}/" if api_group else ""
                granted |= {(prefix + r, v) for r in rule["resources"] for v in rule["verbs"]}
    return granted


def test_each_group_may_do_only_what_its_function_calls() -> None:
    docs = lambda_rbac(sharing=True)
    assert _granted(docs, EXTENDER.group) == {("pods", "get"), ("nodes", "get"), ("pods/binding", "create")}
    dra = {(f"resource.k8s.io/{kind}", verb) for kind in ("deviceclasses", "resourceslices", "resourceclaims")
           for verb in ("list", "watch")}  # fmt: skip
    assert _granted(docs, NODE_STATE.group) == {
        ("nodes", "list"), ("nodes", "watch"), ("nodes", "patch"), ("pods", "list"), ("pods", "watch"), *dra
    }  # fmt: skip
    assert _granted(docs, DELETION_COST.group) == {
        ("pods", "list"), ("pods", "get"), ("pods", "patch"), ("apps/deployments", "get")
    }  # fmt: skip
    assert not any(resource == "events" for group in (EXTENDER, NODE_STATE, DELETION_COST)
                   for resource, _ in _granted(docs, group.group))  # fmt: skip


def test_without_sharing_the_extender_has_no_cluster_identity() -> None:
    assert EXTENDER not in identities(sharing=False)
    assert _granted(lambda_rbac(sharing=False), EXTENDER.group) == set()
    assert [i.group for i in identities(sharing=True)] == [EXTENDER.group, NODE_STATE.group, DELETION_COST.group]


@pytest.mark.parametrize("sharing", [False, True], ids=["whole GPUs", "sharing"])
def test_the_rbac_and_admission_policies_validate_against_the_kubernetes_schemas(sharing: bool) -> None:
    for doc in [*lambda_rbac(sharing=sharing), *admission_policies(sharing=sharing)]:
        kubernetes_validate.validate(doc, "1.33", strict=True)


def _policies(sharing: bool) -> dict[str, dict[str, Any]]:
    docs = admission_policies(sharing=sharing)
    policies = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    bindings = {d["spec"]["policyName"]: d["spec"] for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert set(bindings) == set(policies)
    for name, spec in policies.items():
        assert spec["failurePolicy"] == "Fail", name
        assert bindings[name]["validationActions"] == ["Deny"], name
    return policies


def _expressions(spec: dict[str, Any]) -> str:
    return " ".join(
        [v["expression"] for v in spec.get("validations", [])] + [v["expression"] for v in spec.get("variables", [])]
    )


def test_each_identity_may_change_only_its_own_label_or_annotation() -> None:
    policies = _policies(sharing=True)
    node_state = policies["gpu-scheduler-node-state-labels"]
    assert node_state["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}
    ]
    assert [c["expression"] for c in node_state["matchConditions"]] == [
        "'gpu-scheduler:node-state' in request.userInfo.groups"
    ]
    text = _expressions(node_state)
    assert "metadata.labels" in text and all(f"'{label}'" in text for label in NODE_LABELS)
    assert "object.spec == oldObject.spec" in text and "metadata.annotations" in text  # the rest is frozen
    cost = policies["gpu-scheduler-deletion-cost-annotation"]
    assert cost["matchConstraints"]["resourceRules"][0]["resources"] == ["pods"]
    assert cost["matchConditions"][0]["expression"] == "'gpu-scheduler:deletion-cost' in request.userInfo.groups"
    text = _expressions(cost)
    allowed = ", ".join(f"'{key}'" for key in COST_ANNOTATIONS)
    assert f"k in [{allowed}]" in text and "metadata.labels" in text
    assert COST_ANNOTATIONS[0] == DELETION_COST_ANNOTATION and "karpenter.sh/disruption-cost" in COST_ANNOTATIONS
    bindings = policies["gpu-scheduler-extender-bindings"]
    assert bindings["matchConstraints"]["resourceRules"][0]["resources"] == ["pods/binding"]
    assert f"k in ['{ASSIGNED_GPUS_ANNOTATION}', '{VISIBLE_DEVICES_ANNOTATION}'" in _expressions(bindings)


def test_nobody_but_the_extender_may_touch_the_assigned_gpus_annotation() -> None:
    for sharing in (False, True):
        guard = _policies(sharing)["gpu-scheduler-assigned-gpus"]
        rules = guard["matchConstraints"]["resourceRules"]
        assert [(r["resources"], r["operations"]) for r in rules] == [
            (["pods"], ["CREATE", "UPDATE"]),
            (["pods/status"], ["UPDATE"]),
            (["pods/binding"], ["CREATE"]),
        ]
        assert [c["expression"] for c in guard["matchConditions"]] == [
            "!('gpu-scheduler:extender' in request.userInfo.groups)",
            "request.userInfo.username != 'system:serviceaccount:kube-system:gpu-scheduler'",
        ]
        assert ASSIGNED_GPUS_ANNOTATION in _expressions(guard) and VISIBLE_DEVICES_ANNOTATION in _expressions(guard)
        # oldObject is null on CREATE: it is read only behind the UPDATE check.
        (old,) = [v["expression"] for v in guard["variables"] if v["name"] == "oldAssigned"]
        assert old.startswith("request.operation == 'UPDATE' && ")
    assert "gpu-scheduler-extender-bindings" not in _policies(sharing=False)


def test_the_admission_policies_ship_with_the_manifests_unless_turned_off() -> None:
    options = SchedulerOptions(extender_url="https://a-vpce-b.execute-api.us-east-1.amazonaws.com/v1")
    kinds = [d["kind"] for d in all_manifests(options)]
    assert kinds.count("ValidatingAdmissionPolicy") == 3
    assert "ValidatingAdmissionPolicy" not in [d["kind"] for d in all_manifests(options, admission_policy=False)]
