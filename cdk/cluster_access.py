"""How the Lambdas reach the cluster: one EKS access entry per function, each mapping its IAM role onto its
own Kubernetes group, and (optionally) applying the RBAC, admission-policy and second-scheduler manifests
through ``aws_eks_v2``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aws_cdk import Aws, CfnResource
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk.lambda_layer_kubectl_v33 import KubectlV33Layer
from constructs import Construct

CLUSTER_ADMIN_POLICY = "AmazonEKSClusterAdminPolicy"


@dataclass(frozen=True)
class KubernetesIdentity:
    """An IAM role and the Kubernetes group its access entry maps it to (``manifests.access``)."""

    role: iam.IRole
    group: str


class ClusterAccess(Construct):
    """Attributes: ``entries`` (one ``CfnAccessEntry`` per identity), and ``manifest``/``kubectl``/
    ``kubectl_access_entry``/``kubectl_logs`` when manifests are applied (None and empty otherwise).

    - Each of ``identities`` gets a STANDARD access entry in its own group and no access policy: what the
      group may do is exactly its ClusterRole in ``manifests.access``. A function that never calls
      Kubernetes is simply not in ``identities``.
    - With ``manifests``, the cluster is imported and the documents applied by the ``aws_eks_v2`` kubectl
      provider. Creating ClusterRoles needs cluster-admin, so the provider's role gets its own access entry
      with ``AmazonEKSClusterAdminPolicy``. The cluster needs access entries enabled (authentication mode
      ``API`` or ``API_AND_CONFIG_MAP``) and an API endpoint the provider can reach. The provider's
      functions get log groups with ``log_retention`` (by default Lambda would make ones kept for ever).
    - That entry is not deploy-time only: it is a resource of the stack, and stays (cluster-admin) for as
      long as the stack is deployed with manifests, between deploys too. CloudFormation cannot drop it
      after the first apply, because each later update of the manifests, and deleting the stack (which
      deletes what was applied), runs kubectl with the same role. Whoever may invoke the provider's
      functions, or pass its role to a function, acts as cluster-admin. Without ``manifests`` there is no
      provider and no such entry: the documents are applied by hand.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_name: str,
        identities: Mapping[str, KubernetesIdentity],
        manifests: Sequence[Mapping[str, Any]] = (),
        log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH,
    ) -> None:
        super().__init__(scope, construct_id)
        self.entries = {
            name: eks.CfnAccessEntry(
                self,
                f"{name}AccessEntry",
                cluster_name=cluster_name,
                principal_arn=identity.role.role_arn,
                kubernetes_groups=[identity.group],
                type="STANDARD",
            )
            for name, identity in identities.items()
        }
        self.manifest: eks.KubernetesManifest | None = None
        self.kubectl: eks.KubectlProvider | None = None
        self.kubectl_access_entry: eks.CfnAccessEntry | None = None
        self.kubectl_logs: list[logs.LogGroup] = []
        if not manifests:
            return
        # An imported cluster needs its provider made explicitly, then the cluster imported again with it.
        self.kubectl = eks.KubectlProvider(
            self,
            "Kubectl",
            cluster=eks.Cluster.from_cluster_attributes(self, "ClusterName", cluster_name=cluster_name),
            kubectl_layer=KubectlV33Layer(self, "KubectlLayer"),
        )
        self.kubectl_logs = _log_groups_for_functions(self, self.kubectl, log_retention)
        cluster = eks.Cluster.from_cluster_attributes(
            self, "Cluster", cluster_name=cluster_name, kubectl_provider=self.kubectl
        )
        self.kubectl_access_entry = admin = eks.CfnAccessEntry(
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


def _log_groups_for_functions(scope: Construct, owner: Construct, retention: logs.RetentionDays) -> list[logs.LogGroup]:
    """A log group with ``retention`` for every Lambda function under ``owner`` (CDK-owned constructs that
    take no log-group setting), set as the function's ``LoggingConfig.LogGroup``."""
    groups = []
    for child in owner.node.find_all():
        if not (CfnResource.is_cfn_resource(child) and child.cfn_resource_type == "AWS::Lambda::Function"):
            continue
        function_id = "".join(part.title().replace("-", "") for part in child.node.scope.node.id.split("-"))
        group = logs.LogGroup(scope, f"{owner.node.id}{function_id}Logs", retention=retention)
        child.add_property_override("LoggingConfig.LogGroup", group.log_group_name)
        groups.append(group)
    return groups
