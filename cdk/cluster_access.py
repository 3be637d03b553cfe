"""How the Lambdas reach the cluster: EKS access entries mapping their IAM roles onto one Kubernetes group,
and (optionally) applying the RBAC and second-scheduler manifests through ``aws_eks_v2``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aws_cdk import Aws
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk.lambda_layer_kubectl_v33 import KubectlV33Layer
from constructs import Construct

from manifests.scheduler import LAMBDA_GROUP

CLUSTER_ADMIN_POLICY = "AmazonEKSClusterAdminPolicy"


class ClusterAccess(Construct):
    """Attributes: ``entries`` (one ``CfnAccessEntry`` per role), and ``manifest``/``kubectl`` when
    manifests are applied.

    - Each role in ``roles`` gets a STANDARD access entry in group ``group`` and no access policy: what the
      group may do is exactly the RBAC in ``manifests.scheduler.extender_rbac``.
    - With ``manifests``, the cluster is imported and the documents applied by the ``aws_eks_v2`` kubectl
      provider. Creating ClusterRoles needs cluster-admin, so the provider's role gets its own access entry
      with ``AmazonEKSClusterAdminPolicy``. The cluster needs access entries enabled (authentication mode
      ``API`` or ``API_AND_CONFIG_MAP``) and an API endpoint the provider can reach.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_name: str,
        roles: Mapping[str, iam.IRole],
        group: str = LAMBDA_GROUP,
        manifests: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        super().__init__(scope, construct_id)
        self.entries = {
            name: eks.CfnAccessEntry(
                self,
                f"{name}AccessEntry",
                cluster_name=cluster_name,
                principal_arn=role.role_arn,
                kubernetes_groups=[group],
                type="STANDARD",
            )
            for name, role in roles.items()
        }
        self.manifest: eks.KubernetesManifest | None = None
        self.kubectl: eks.KubectlProvider | None = None
        if not manifests:
            return
        # An imported cluster needs its provider made explicitly, then the cluster imported again with it.
        self.kubectl = eks.KubectlProvider(
            self,
            "Kubectl",
            cluster=eks.Cluster.from_cluster_attributes(self, "ClusterName", cluster_name=cluster_name),
            kubectl_layer=KubectlV33Layer(self, "KubectlLayer"),
        )
        cluster = eks.Cluster.from_cluster_attributes(
            self, "Cluster", cluster_name=cluster_name, kubectl_provider=self.kubectl
        )
        admin = eks.CfnAccessEntry(
            self,
            "KubectlAccessEntry",
            cluster_name=cluster_name,
            principal_arn=self.kubectl.role.role_arn,
            type="STANDARD",
            access_policies=[
                eks.CfnAccessEntry.AccessPolicyProperty(
                    policy_arn=f"arn:{Aws.PARTITION}:eks::aws:cluster-access-policy/{CLUSTER_ADMIN_POLICY}",
                    access_scope=eks.CfnAccessEntry.AccessScopeProperty(type="cluster"),
                )
            ],
        )
        self.manifest = eks.KubernetesManifest(
            self, "Manifests", cluster=cluster, manifest=[dict(m) for m in manifests], overwrite=True
        )
        self.manifest.node.add_dependency(admin)
