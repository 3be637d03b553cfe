"""EKS access entries for the Lambda roles, and applying the manifests through aws_eks_v2."""

from __future__ import annotations

import json
from typing import Any

from aws_cdk import aws_iam as iam
from aws_cdk.assertions import Template

from cdk.cluster_access import CLUSTER_ADMIN_POLICY, ClusterAccess
from manifests.scheduler import LAMBDA_GROUP

from .conftest import bare_stack

DOCS = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "kube-system"}}]


def _template(manifests: list[dict[str, Any]]) -> Template:
    stack = bare_stack()
    roles = {
        name: iam.Role(stack, name, assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
        for name in ("Extender", "NodeState")
    }
    ClusterAccess(stack, "Access", cluster_name="gpu-prod", roles=roles, manifests=manifests)
    return Template.from_stack(stack)


WITHOUT, WITH = _template([]), _template(DOCS)


def _role_arn(template: Template, name: str) -> dict[str, list[str]]:
    (role_id,) = [k for k in template.find_resources("AWS::IAM::Role") if k.startswith(name)]
    return {"Fn::GetAtt": [role_id, "Arn"]}


def test_each_role_gets_a_standard_entry_in_the_lambda_group_with_no_access_policy() -> None:
    entries = WITHOUT.find_resources("AWS::EKS::AccessEntry").values()
    assert sorted(json.dumps(e["Properties"]["PrincipalArn"]) for e in entries) == sorted(
        json.dumps(_role_arn(WITHOUT, name)) for name in ("Extender", "NodeState")
    )
    for entry in entries:
        props = entry["Properties"]
        assert props["ClusterName"] == "gpu-prod"
        assert props["KubernetesGroups"] == [LAMBDA_GROUP]
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
