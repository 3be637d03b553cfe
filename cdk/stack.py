"""The one stack: wires the units together and makes every grant, with exact actions on exact resources."""

from __future__ import annotations

import json
from typing import Any

from aws_cdk import Aws, CfnOutput, Duration, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from adapters.metric_catalogue import CONSOLIDATOR, DELETION_COST, EXTENDER, NODE_STATE
from adapters.runtime import version
from adapters.settings import environment
from application.extender.settings import ExtenderSettings
from application.node_state.settings import NodeStateSettings
from cdk.acknowledgments import acknowledge_findings
from cdk.cluster_access import ClusterAccess, KubernetesIdentity
from cdk.config import DeployConfig
from cdk.extender_api import ExtenderApi
from cdk.functions import SchedulerFunction, Shared, retention
from cdk.lambda_code import LambdaPackage
from cdk.monitoring import Monitoring, Watched
from cdk.network import SchedulerNetwork
from cdk.refreshers import DeadLetterQueue, ScheduledRefresher
from cdk.state import SchedulerState
from manifests import access as lambda_identities
from manifests.reservation import reserving
from manifests.scheduler import all_manifests
from scheduler_core.extender.facade import SHARING_VERBS, VERBS


class GpuSchedulerStack(Stack):
    """Attributes: ``network``, ``state``, ``monitoring``, ``extender``, ``node_state``, ``deletion_cost``,
    ``consolidation`` (functions; the last None unless ``consolidation``), ``refreshers``, ``api``,
    ``access``, ``manifests`` (the Kubernetes documents, URL as a token)."""

    def __init__(
        self, scope: Construct, construct_id: str, *, config: DeployConfig, package: LambdaPackage, **kwargs: Any
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.config = config
        log_retention = retention(config.log_retention_days)
        self.network = self._network(log_retention)
        self.state = SchedulerState(self, "State")
        self.monitoring = Monitoring(
            self,
            "Monitoring",
            cluster_name=config.cluster_name,
            alarm_email=config.alarm_email,
            alarm_topic_arn=config.alarm_topic_arn,
            amp_workspace_id=config.amp_workspace_id,
            # Without private DNS the queries go to the aps-workspaces endpoint by its own name.
            amp_endpoint_url=self.network.endpoint_urls.get("aps-workspaces", ""),
        )
        cluster_arn = f"arn:{Aws.PARTITION}:eks:{Aws.REGION}:{Aws.ACCOUNT_ID}:cluster/{config.cluster_name}"
        deletion_cost_config = ssm.StringParameter(
            self,
            "DeletionCostConfig",
            description="gpu-scheduler deletion-cost workload config (JSON; re-read every 5 minutes)",
            string_value=json.dumps(config.deletion_cost_config, separators=(",", ":")),
        )

        common = Shared(
            package=package,
            layer_scope=self,
            log_retention_days=config.log_retention_days,
            network=self.network.functions,
        )
        self.extender = self._extender_function(package, common)
        node_state_dlq = DeadLetterQueue(self, "NodeStateDlq")
        self.node_state = self._node_state_function(common, node_state_dlq)
        deletion_cost_dlq = DeadLetterQueue(self, "DeletionCostDlq")
        self.deletion_cost = self._deletion_cost_function(common, deletion_cost_dlq, deletion_cost_config)
        self.refreshers = self._schedules(node_state_dlq, deletion_cost_dlq)
        self.consolidation = self._consolidation(common) if config.consolidation else None
        self.api = self._extender_api(log_retention)

        self._observe(cluster_arn)
        self._grant(cluster_arn, deletion_cost_config)
        self.manifests = all_manifests(
            config.scheduler_options(self.api.url, self.network.scheduler_security_group_id),
            admission_policy=config.admission_policy,
            stable_text=self._stable_text,
        )
        self.access = self._cluster_access(log_retention)
        acknowledge_findings(self)
        self._outputs()

    def _stable_text(self, text: str) -> str:
        """``text`` with each deploy-time token written as the CloudFormation it resolves to (``Ref`` and
        ``Fn::GetAtt`` by logical ID), not as its placeholder, whose number changes from one synth to the
        next: the scheduler's configuration digest then changes only with the configuration."""
        return json.dumps(self.resolve(text), sort_keys=True)

    def _network(self, log_retention: logs.RetentionDays) -> SchedulerNetwork:
        """The cluster's VPC (or a demo one) with the endpoints the Lambdas need, as the context names them."""
        config = self.config
        return SchedulerNetwork(
            self,
            "Network",
            services=config.vpc_endpoints,
            vpc_id=config.vpc_id,
            subnet_ids=config.subnet_ids,
            route_table_ids=config.route_table_ids,
            cluster_security_group_id=config.cluster_security_group_id,
            scheduler_security_group_id=config.scheduler_security_group_id,
            scheduler_pods=config.scheduler_pods,
            private_dns=config.vpc_endpoint_private_dns,
            log_retention=log_retention,
        )

    def _extender_function(self, package: LambdaPackage, common: Shared) -> SchedulerFunction:
        """The extender: filter and prioritize over the snapshot; with sharing also bind and preempt on the
        GPU ledger, which needs the cluster, the ledger and the refreshers' kubernetes layer."""
        config = self.config
        # The settings the deployment passes on (MAX_SNAPSHOT_AGE_S, SHARE_POLICY) are declared with the extender's.
        extender_environment = {"SNAPSHOT_URI": self.state.snapshot_uri, **environment(ExtenderSettings, config)}
        if config.consolidation:  # the consolidator's holds, obeyed by filter
            extender_environment["HOLDS_URI"] = self.state.holds_uri
        extender_layers: list[lambda_.ILayerVersion] = []
        if config.sharing:
            # bind writes the ledger and the Binding: the refreshers' kubernetes layer, loaded on the first bind.
            extender_environment |= {"LEDGER_TABLE": self.state.ledger.table_name, "CLUSTER_NAME": config.cluster_name}
            extender_environment |= self.network.sdk_environment("eks")
            base = package.layers(self, "extender")
            extender_layers = [layer for layer in package.layers(self, "node_state") if layer not in base]
        return SchedulerFunction(
            self,
            "Extender",
            name="extender",
            service=EXTENDER,
            description="kube-scheduler extender: filter and prioritize over the cluster snapshot"
            + ("; bind and preempt on the GPU ledger" if config.sharing else ""),
            environment=extender_environment,
            layers=extender_layers,
            # numpy work per request is CPU-bound: 1769 MB is one full vCPU.
            memory_mib=1769,
            # kube-scheduler gives up after httpTimeout: 3 s, and the bind's own 15 s where a share's first
            # bind on a GPU waits for its reservation pod's UUID (manifests.scheduler_configuration.extender_entries).
            timeout=Duration.seconds(20 if config.sharing and reserving(config.reservation_image) else 5),
            reserved_concurrency=config.extender_reserved_concurrency,
            snap_start=config.snap_start,
            **common,
        )

    def _node_state_function(self, common: Shared, dlq: DeadLetterQueue) -> SchedulerFunction:
        """The node-state refresher: GPU labels, the snapshot, utilisation; with sharing the ledger's reconcile
        and the placeholders."""
        config = self.config
        return SchedulerFunction(
            self,
            "NodeState",
            name="node_state",
            service=NODE_STATE,
            description="node-state refresher: GPU labels, cluster snapshot, utilisation",
            environment={
                "CLUSTER_NAME": config.cluster_name,
                "SNAPSHOT_URI": self.state.snapshot_uri,
                "AMP_QUERY_URL": self.monitoring.query_url,
                **(
                    {"LEDGER_TABLE": self.state.ledger.table_name, **environment(NodeStateSettings, config)}
                    if config.sharing
                    else {}
                ),
                **({"WATCH_S": str(config.watch_s)} if config.watch_s else {}),
                **self.network.sdk_environment("eks", "ec2"),
            },
            memory_mib=1769,
            # Watching, a run lasts WATCH_S; DEADLINE_MARGIN_S (10 s) ends it before the timeout anyway.
            timeout=Duration.seconds(max(90, config.watch_s + 15)),
            # Polling, one run at a time: the next tick redoes the work anyway. Watching, two: the next run
            # starts while this one still watches, and takes over (conditional snapshot writes).
            reserved_concurrency=2 if config.watch_s else 1,
            dead_letter_queue=dlq,
            **common,
        )

    def _deletion_cost_function(
        self, common: Shared, dlq: DeadLetterQueue, deletion_cost_config: ssm.StringParameter
    ) -> SchedulerFunction:
        """The deletion-cost refresher, reading its workload config from ``deletion_cost_config``."""
        return SchedulerFunction(
            self,
            "DeletionCost",
            name="deletion_cost",
            service=DELETION_COST,
            description="deletion-cost refresher: controller.kubernetes.io/pod-deletion-cost on managed pods",
            environment={
                "CLUSTER_NAME": self.config.cluster_name,
                "AMP_QUERY_URL": self.monitoring.query_url,
                "DELETION_COST_CONFIG_PARAMETER": deletion_cost_config.parameter_name,
                **self.network.sdk_environment("eks", "ssm"),
            },
            memory_mib=1024,
            timeout=Duration.seconds(60),  # two passes 30 s apart (PASSES, INTERVAL_S)
            reserved_concurrency=1,
            dead_letter_queue=dlq,
            **common,
        )

    def _consolidation(self, common: Shared) -> SchedulerFunction:
        """The consolidator (``consolidation``, off by default) on its rate, one run at a time, its holds in the
        snapshot bucket where the extender reads them."""
        dlq = DeadLetterQueue(self, "ConsolidationDlq")
        function = SchedulerFunction(
            self,
            "Consolidation",
            name="consolidation",
            service=CONSOLIDATOR,
            description="consolidator: evicts opted-in pods so that Pending GPU pods fit, within its budgets",
            environment={
                "CLUSTER_NAME": self.config.cluster_name,
                "HOLDS_URI": self.state.holds_uri,
                **({"DRY_RUN": "true"} if self.config.consolidation_dry_run else {}),
                **self.network.sdk_environment("eks"),  # S3 is a gateway endpoint: no variable
            },
            memory_mib=1024,
            timeout=Duration.seconds(60),
            # One run at a time: the holds book carries the hourly budget, read and written whole.
            reserved_concurrency=1,
            dead_letter_queue=dlq,
            **common,
        )
        schedule = ScheduledRefresher(
            self,
            "ConsolidationSchedule",
            function=function.function,
            dlq=dlq,
            rate_minutes=self.config.consolidation_schedule_minutes,
        )
        self.monitoring.notify(schedule.alarm)
        self.refreshers["consolidation"] = schedule
        return function

    def _schedules(
        self, node_state_dlq: DeadLetterQueue, deletion_cost_dlq: DeadLetterQueue
    ) -> dict[str, ScheduledRefresher]:
        """Each refresher on its EventBridge rate, its dead-letter queue's alarm sent to the alarm topic."""
        refreshers = {
            "node_state": ScheduledRefresher(
                self,
                "NodeStateSchedule",
                function=self.node_state.function,
                dlq=node_state_dlq,
                rate_minutes=self.config.node_state_schedule_minutes,
            ),
            "deletion_cost": ScheduledRefresher(
                self,
                "DeletionCostSchedule",
                function=self.deletion_cost.function,
                dlq=deletion_cost_dlq,
                rate_minutes=self.config.deletion_cost_schedule_minutes,
            ),
        }
        for refresher in refreshers.values():
            self.monitoring.notify(refresher.alarm)
        return refreshers

    def _extender_api(self, log_retention: logs.RetentionDays) -> ExtenderApi:
        """The private API in front of the extender: its ``live`` alias where SnapStart or provisioned
        concurrency needs a published version, else the function itself."""
        config, network = self.config, self.network
        handler: lambda_.IFunction = self.extender.function
        if config.extender_provisioned_concurrency or config.snap_start:
            # A published version behind an alias: SnapStart and provisioned concurrency apply only to versions.
            handler = lambda_.Alias(
                self,
                "ExtenderLive",
                alias_name="live",
                version=self.extender.function.current_version,
                provisioned_concurrent_executions=config.extender_provisioned_concurrency or None,
            )
        return ExtenderApi(
            self,
            "ExtenderApi",
            vpc=network.vpc,
            subnet_ids=network.subnet_ids,
            scheduler_security_group_id=network.scheduler_security_group_id,
            private_dns=config.execute_api_private_dns,
            imported_endpoint_id=config.execute_api_endpoint_id,
            handler=handler,
            verbs=VERBS + (SHARING_VERBS if config.sharing else ()),
            rate_limit=config.api_rate_limit,
            burst_limit=config.api_burst_limit,
            access_log_retention=log_retention,
        )

    def _observe(self, cluster_arn: str) -> None:
        """The dashboard and alarms on the functions and the API, and AMP's scraper of the cluster."""
        config = self.config
        self.monitoring.observe(
            Watched(
                extender=self.extender.function,
                node_state=self.node_state.function,
                deletion_cost=self.deletion_cost.function,
                stage=self.api.api.deployment_stage,
                max_snapshot_age_s=config.max_snapshot_age_s,
                ledger_conflicts_per_5m=config.ledger_conflicts_alarm_per_5m,
            )
        )
        if self.consolidation is not None:
            self.monitoring.observe_consolidation(self.consolidation.function)
        self.monitoring.scrape(
            cluster_name=config.cluster_name,
            cluster_arn=cluster_arn,
            subnet_ids=self.network.subnet_ids,
            security_group_ids=[self.network.cluster_security_group_id],
            dcgm_namespace=config.dcgm_exporter_namespace,
            ksm_namespace=config.kube_state_metrics_namespace,
        )

    def _cluster_access(self, log_retention: logs.RetentionDays) -> ClusterAccess:
        """Each function's Kubernetes identity, and with ``applyManifests`` the manifests applied."""
        config = self.config
        roles = {
            lambda_identities.EXTENDER.name: self.extender.role,
            lambda_identities.NODE_STATE.name: self.node_state.role,
            lambda_identities.DELETION_COST.name: self.deletion_cost.role,
        }
        if self.consolidation is not None:
            roles[lambda_identities.CONSOLIDATOR.name] = self.consolidation.role
        return ClusterAccess(
            self,
            "ClusterAccess",
            cluster_name=config.cluster_name,
            # One group per function, and none for the extender without sharing: it never calls Kubernetes.
            identities={
                _construct_name(identity.name): KubernetesIdentity(roles[identity.name], identity.group)
                for identity in lambda_identities.identities(sharing=config.sharing, consolidation=config.consolidation)
            },
            manifests=self.manifests if config.apply_manifests else (),
            log_retention=log_retention,
        )

    def _outputs(self) -> None:
        """What the operator configures from: the API's URL, the scheduler-config command, the IDs and ARNs."""
        network = self.network
        CfnOutput(
            self,
            "ExtenderUrl",
            value=self.api.url,
            description="urlPrefix for kube-scheduler: the endpoint-specific hostname <api>-<vpce>, which "
            "resolves with the endpoint's private DNS off",
        )
        CfnOutput(self, "SchedulerConfigCommand", value=self._config_command())
        CfnOutput(self, "Version", value=version(), description="the eks-gpu-scheduler version deployed (CHANGELOG.md)")
        CfnOutput(self, "SnapshotUri", value=self.state.snapshot_uri)
        CfnOutput(self, "LedgerTable", value=self.state.ledger.table_name)
        CfnOutput(self, "ExecuteApiEndpointId", value=self.api.endpoint_id)
        CfnOutput(
            self,
            "LambdaSecurityGroupId",
            value=network.lambda_security_group.security_group_id,
            description="the Lambdas' security group: admit it on 443 wherever the cluster API's endpoint has "
            "security groups other than the cluster security group",
        )
        if network.scheduler_security_group_id:
            CfnOutput(
                self,
                "SchedulerSecurityGroupId",
                value=network.scheduler_security_group_id,
                description="the one source the extender API's endpoint admits: the scheduler pods' security group "
                "(a SecurityGroupPolicy in the manifests), or their node group's (schedulerNodeSelector)",
            )
        CfnOutput(self, "AlarmTopicArn", value=self.monitoring.topic.topic_arn)
        if self.access.kubectl is not None:
            CfnOutput(
                self,
                "KubectlRoleArn",
                value=self.access.kubectl.role.role_arn,
                description="cluster-admin on the cluster for as long as the stack applies the manifests "
                "(applyManifests): whoever may invoke the kubectl provider's functions, or pass this role, acts as it",
            )

    def _grant(self, cluster_arn: str, deletion_cost_config: ssm.StringParameter) -> None:
        state = self.state
        snapshot_prefix_list = iam.PolicyStatement(
            # Without ListBucket a missing snapshot reads as 403, not 404; limited to the snapshot's key.
            actions=["s3:ListBucket"],
            resources=[state.bucket.bucket_arn],
            conditions={"StringEquals": {"s3:prefix": [state.snapshot_key]}},
        )
        read_snapshot = iam.PolicyStatement(actions=["s3:GetObject"], resources=[state.snapshot_arn])
        describe_cluster = iam.PolicyStatement(actions=["eks:DescribeCluster"], resources=[cluster_arn])
        query_amp = iam.PolicyStatement(actions=["aps:QueryMetrics"], resources=[self.monitoring.workspace_arn])

        for statement in (read_snapshot, snapshot_prefix_list):
            self.extender.role.add_to_policy(statement)
        if self.config.sharing:
            ledger = state.ledger.table_arn
            for statement in (
                describe_cluster,
                iam.PolicyStatement(
                    actions=["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:BatchGetItem"], resources=[ledger]
                ),
            ):
                self.extender.role.add_to_policy(statement)
            # Scan: the reconcile's view; PutItem: its conditional writes; GetItem: the watch's release of a
            # deleted share pod's share (LedgerStore.release reads the item, then writes it conditionally).
            self.node_state.role.add_to_policy(
                iam.PolicyStatement(
                    actions=["dynamodb:Scan", "dynamodb:GetItem", "dynamodb:PutItem"], resources=[ledger]
                )
            )
        for statement in (
            read_snapshot,
            snapshot_prefix_list,
            iam.PolicyStatement(actions=["s3:PutObject"], resources=[state.snapshot_arn]),
            describe_cluster,
            query_amp,
            # GPU facts for nodes without GFD labels. DescribeInstanceTypes has no resource-level permissions.
            iam.PolicyStatement(actions=["ec2:DescribeInstanceTypes"], resources=["*"]),
        ):
            self.node_state.role.add_to_policy(statement)
        for statement in (
            describe_cluster,
            query_amp,
            iam.PolicyStatement(actions=["ssm:GetParameter"], resources=[deletion_cost_config.parameter_arn]),
        ):
            self.deletion_cost.role.add_to_policy(statement)
        if self.consolidation is not None:
            self._grant_holds(describe_cluster)

    def _grant_holds(self, describe_cluster: iam.PolicyStatement) -> None:
        """The consolidator reads and writes the holds; the extender reads them. ListBucket on that key alone,
        so that no holds yet reads as 404 (an empty book), not 403."""
        state = self.state
        assert self.consolidation is not None
        holds_list = iam.PolicyStatement(
            actions=["s3:ListBucket"],
            resources=[state.bucket.bucket_arn],
            conditions={"StringEquals": {"s3:prefix": [state.holds_key]}},
        )
        read_holds = iam.PolicyStatement(actions=["s3:GetObject"], resources=[state.holds_arn])
        write_holds = iam.PolicyStatement(actions=["s3:PutObject"], resources=[state.holds_arn])
        for statement in (holds_list, read_holds, write_holds, describe_cluster):
            self.consolidation.role.add_to_policy(statement)
        for statement in (holds_list, read_holds):
            self.extender.role.add_to_policy(statement)

    def _config_command(self) -> str:
        """The ``scheduler-config`` line that writes what ``cdk.out/manifests/gpu-scheduler.yaml`` holds (from
        the same options)."""
        config = self.config
        options = config.scheduler_options(self.api.url, self.network.scheduler_security_group_id)
        flags = [f"--url {options.extender_url}"]
        flags += ["--sharing"] if options.sharing else []
        flags += ["--consolidation"] if options.consolidation else []
        flags += ["--gpu-pods-only"] if options.gpu_pods_only else []
        flags += [f"--security-group {options.security_group}"] if options.security_group else []
        flags += [f"--node-selector {key}={value}" for key, value in options.node_selector.items()]
        if options.sharing:
            flags += [f"--share-device {options.share_device}", f"--reservation-image {options.reservation_image}"]
        flags += [f"--weight {options.weight}", f"--image {options.image}"]
        flags += [] if config.admission_policy else ["--no-admission-policy"]
        return (
            f"gpu-scheduler scheduler-config {' '.join(flags)} --out gpu-scheduler.yaml && "
            "kubectl apply -f gpu-scheduler.yaml"
        )


def _construct_name(identity: str) -> str:
    """``node-state`` -> ``NodeState``: the function's construct name for a Kubernetes identity."""
    return "".join(part.capitalize() for part in identity.split("-"))
